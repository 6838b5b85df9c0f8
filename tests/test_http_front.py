"""The HTTP front process: /metrics answered without the daemon, the rest forwarded to it."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import requests
from helpers import Daemon, parse_metrics, series, start_daemon, value_of, wait_until

from exporter.server.front import Answers, encode_answers

TEXT = ("text/plain; version=0.0.4; charset=utf-8", False)
GZIP = ("text/plain; version=0.0.4; charset=utf-8", True)


def front_pids(daemon: Daemon) -> list[int]:
    # Each thread has its own list: a front started again is the watcher thread's child.
    children = []
    for task in Path(f"/proc/{daemon.process.pid}/task").glob("*/children"):
        try:
            children += task.read_text().split()
        except FileNotFoundError:
            continue  # a thread that ended since the listing (a connection's) had no child
    return sorted(int(child) for child in children)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def pause(daemon: Daemon) -> None:
    """SIGSTOP the daemon and wait until every thread of it has stopped.

    kill() returns before the stop: one thread takes the signal when it next runs and then
    stops the others, and on a busy machine the rest may answer requests meanwhile.
    """
    os.kill(daemon.process.pid, signal.SIGSTOP)

    def stopped() -> bool:
        states = []
        for stat in Path(f"/proc/{daemon.process.pid}/task").glob("*/stat"):
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                states.append(stat.read_text().rpartition(")")[2].split()[0])
        return bool(states) and all(state in ("T", "t") for state in states)

    wait_until(stopped, what="the daemon to stop")


@pytest.fixture
def daemon():
    running = start_daemon("--simulate", "mixed", "--collect.interval", "0.5")
    yield running
    running.stop()


def test_each_daemon_has_one_front_process(daemon: Daemon) -> None:
    assert len(front_pids(daemon)) == 1


def test_scrapes_are_answered_while_the_daemon_is_stopped() -> None:
    # One snapshot for the whole test: no new one replaces the answer the front holds.
    daemon = start_daemon("--simulate", "mixed", "--collect.interval", "10m")
    try:
        daemon.get("/metrics")  # forwarded: the daemon encodes it and hands it to the front
        pause(daemon)
        try:
            answers: list[requests.Response] = []

            def scraped() -> bool:
                # The front reads the handed answer on a thread of its own: a scrape that
                # comes first is forwarded to the stopped daemon, and times out; retried.
                try:
                    answers.append(daemon.get("/metrics", timeout=2))
                except requests.exceptions.Timeout:
                    return False
                return True

            wait_until(scraped, timeout=30, what="a scrape answered without the daemon")
            assert answers[0].status_code == 200
            assert set(series(parse_metrics(answers[0].text), "gpu_up").values()) == {1}
            # Everything else is the daemon's to answer: it waits while the daemon is stopped.
            with pytest.raises(requests.exceptions.ReadTimeout):
                daemon.get("/readyz", timeout=1)
        finally:
            os.kill(daemon.process.pid, signal.SIGCONT)
        assert daemon.get("/readyz").text == "ready\n"
    finally:
        daemon.stop()  # SIGTERM right after SIGCONT: it must still stop


def test_a_front_that_dies_is_started_again(daemon: Daemon) -> None:
    (first,) = front_pids(daemon)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: front_pids(daemon) and front_pids(daemon) != [first], what="a new front")
    wait_until(lambda: daemon.get("/metrics").ok, what="scrapes again")
    wait_until(
        lambda: "the HTTP front exited with status -9; starting it again" in daemon.log(),
        what="the restart to be logged",
    )
    assert daemon.process.poll() is None


def test_head_of_metrics_answers_the_headers_of_a_scrape(daemon: Daemon) -> None:
    scrape = daemon.get("/metrics")
    head = requests.head(daemon.url + "metrics", timeout=10)
    assert scrape.status_code == head.status_code == 200
    assert head.headers["Content-Type"] == scrape.headers["Content-Type"]
    assert int(head.headers["Content-Length"]) > 1000
    assert head.content == b""
    openmetrics = {"Accept": "application/openmetrics-text;version=1.0.0"}
    head = requests.head(daemon.url + "metrics", headers=openmetrics, timeout=10)
    assert head.status_code == 200
    assert head.headers["Content-Type"].startswith("application/openmetrics-text")


def test_the_front_ends_with_the_daemon() -> None:
    daemon = start_daemon("--simulate", "mixed")
    (front,) = front_pids(daemon)
    daemon.process.kill()
    daemon.process.wait()
    wait_until(lambda: not alive(front), what="the front to exit")


def test_the_fronts_own_resources_are_exported(daemon: Daemon) -> None:
    (front,) = front_pids(daemon)
    samples = daemon.metrics()
    assert value_of(samples, "gpuload_http_process_resident_memory_bytes") > 0
    started = value_of(samples, "gpuload_http_process_start_time_seconds")
    assert started is not None and started >= value_of(samples, "process_start_time_seconds")
    assert Path(f"/proc/{front}").exists()


def test_a_forwarded_request_keeps_its_query_and_body(daemon: Daemon) -> None:
    filtered = daemon.get("/metrics", params={"name[]": "gpu_up"})
    names = {name for name, _ in parse_metrics(filtered.text)}
    assert names == {"gpu_up"}
    assert daemon.get("/no-such-page").status_code == 404


def test_answers_keep_the_newest_generation() -> None:
    answers = Answers()
    sender, receiver = socket.socketpair()
    reading = threading.Thread(target=answers.follow, args=(receiver,))
    reading.start()
    with sender:
        sender.sendall(encode_answers(2, {TEXT: b"two"}))
        sender.sendall(encode_answers(2, {GZIP: b"two, zipped"}))  # the same snapshot: added
        sender.sendall(encode_answers(1, {TEXT: b"one"}))  # late: dropped
    reading.join(10)
    assert not reading.is_alive(), "follow did not end when the daemon closed the channel"
    assert answers.get(TEXT) == (2, b"two")
    assert answers.get(GZIP) == (2, b"two, zipped")
    answers.update(3, {GZIP: b"three"})  # a new snapshot replaces every format
    assert answers.get(TEXT) is None
    assert answers.get(GZIP) == (3, b"three")


def exchange(daemon: Daemon, request: bytes) -> bytes:
    """Send raw bytes to the front; everything it answers until it closes."""
    host, port = daemon.url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(request)
        return b"".join(iter(lambda: connection.recv(1 << 16), b""))


def test_one_connection_carries_several_requests(daemon: Daemon) -> None:
    answer = exchange(
        daemon,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert answer.endswith(b"ok\n")
    assert b"ready\n" in answer
    assert answer.count(b"Connection: close") == 1


def test_an_http_1_0_request_closes_its_connection(daemon: Daemon) -> None:
    answer = exchange(daemon, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NONSENSE\r\n\r\n", b"400 Bad Request"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", b"400 Bad Request"),
        (b"POST / HTTP/1.1\r\nContent-Length: lots\r\n\r\n", b"400 Bad Request"),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"400 Bad Request",
        ),
        (b"POST / HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n", b"413 Content Too Large"),
        (b"GET /" + b"a" * 17000 + b" HTTP/1.1\r\n\r\n", b"431 Request Header Fields Too Large"),
        (
            b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 101 + b"\r\n",
            b"431 Request Header Fields Too Large",
        ),
    ],
)
def test_a_bad_request_is_answered_and_the_front_goes_on(
    daemon: Daemon, request_bytes: bytes, status: bytes
) -> None:
    answer = exchange(daemon, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status + b"\r\n")
    assert answer.split(b"\r\n\r\n", 1)[1]  # says what was wrong
    assert daemon.get("/healthz").text == "ok\n"


def test_a_forwarded_body_reaches_the_daemon_whole(daemon: Daemon) -> None:
    # The daemon answers POST /metrics itself (prometheus_client: 405); the front must have
    # sent the whole body, or the daemon would wait for the rest and the front time out.
    body = b"x" * 100_000
    answer = exchange(
        daemon,
        b"POST /metrics HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body,
    )
    assert answer.startswith(b"HTTP/1.1 405 ")


def frame_options(daemon: Daemon) -> str | None:
    """The header the web config adds; None while no front answers."""
    try:
        return daemon.get("/healthz", timeout=5).headers.get("X-Frame-Options")
    except requests.exceptions.RequestException:
        return None


def test_a_front_that_cannot_start_is_retried_until_it_can(tmp_path: Path) -> None:
    web_config = tmp_path / "web.yml"
    web_config.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    daemon = start_daemon("--simulate", "mixed", "--web.config.file", str(web_config))
    try:
        assert daemon.get("/healthz").headers["X-Frame-Options"] == "deny"
        web_config.write_text("tls_server_config: [not, a, mapping]\n")
        (front,) = front_pids(daemon)
        os.kill(front, signal.SIGKILL)
        wait_until(lambda: "ERROR exporter.server.front: web config" in daemon.log(), what="log")
        assert daemon.process.poll() is None
        web_config.write_text("http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n")
        # Quick exits are retried after 1, 2, 4 ... 30 s: the mended config is read within
        # 30 s of being written, whenever the test got to write it.
        wait_until(
            lambda: frame_options(daemon) == "sameorigin",
            timeout=60,
            what="a front started with the mended web config",
        )
    finally:
        daemon.stop()


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def _raw_scrape(url: str, *parts: bytes, pause: float = 0.0, timeout: float = 10) -> bytes:
    """Send the request in ``parts`` (``pause`` seconds apart), read until the front closes."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as connection:
        for part in parts:
            connection.sendall(part)
            time.sleep(pause)
        answer = b""
        while chunk := connection.recv(1 << 16):
            answer += chunk
    return answer


def test_a_scrape_answered_on_the_accepting_thread_is_the_threads_answer_byte_for_byte() -> None:
    # A 10 min interval: every answer below is of the one snapshot taken at start.
    daemon = start_daemon("--simulate", "mixed", "--collect.interval", "10m")
    try:
        head = (
            "GET /metrics HTTP/1.1\r\nHost: x\r\n"
            f"Accept: {PROMETHEUS_ACCEPT}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        ).encode()
        first = _raw_scrape(daemon.url, head)  # a format not seen yet: forwarded to the daemon
        # With the daemon stopped, every answer below is one the front holds: none is forwarded.
        pause(daemon)
        try:
            held: list[bytes] = []

            def answered() -> bool:
                # The front takes the handed answer on a thread of its own: a scrape that
                # comes first is forwarded to the stopped daemon and times out; retried.
                try:
                    held.append(_raw_scrape(daemon.url, head, timeout=2))
                except TimeoutError:
                    return False
                return True

            wait_until(answered, timeout=30, what="the front to hold the answer")
            whole = _raw_scrape(daemon.url, head)  # whole at accept: answered on that thread
            # The head in two parts: not whole when accepted, so read by the connection's thread.
            split = _raw_scrape(daemon.url, head[:20], head[20:], pause=0.2)
        finally:
            os.kill(daemon.process.pid, signal.SIGCONT)
        assert daemon.get("/readyz").text == "ready\n"
    finally:
        daemon.stop()  # SIGTERM right after SIGCONT: it must still stop
    assert held[0] == whole
    assert whole == split
    assert whole.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in whole
    body = whole.partition(b"\r\n\r\n")[2]
    assert gzip.decompress(body).decode().endswith("# EOF\n")
    assert body == first.partition(b"\r\n\r\n")[2]


def test_a_connection_answered_at_accept_goes_on_serving_its_next_requests(
    daemon: Daemon,
) -> None:
    host, port = daemon.url.split("//")[1].rstrip("/").split(":")
    request = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {PROMETHEUS_ACCEPT}\r\n\r\n".encode()
    requests.get(daemon.url + "metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=5)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        reader = connection.makefile("rb")
        for _ in range(3):  # the first at accept, the next ones on the connection's thread
            connection.sendall(request)
            status = reader.readline()
            headers = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.lower()] = value.strip()
            body = reader.read(int(headers["content-length"]))
            assert status == b"HTTP/1.1 200 OK\r\n"
            assert "connection" not in headers  # kept alive
            assert body.decode().endswith("# EOF\n")


def test_requests_other_than_a_held_scrape_are_answered_as_before(daemon: Daemon) -> None:
    requests.get(daemon.url + "metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=5)
    filtered = requests.get(
        daemon.url + "metrics?name[]=gpu_up", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=5
    )
    assert filtered.ok and "gpu_up" in filtered.text and "gpu_temperature" not in filtered.text
    with_body = _raw_scrape(
        daemon.url,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    )
    assert with_body.startswith(b"HTTP/1.1 200 OK\r\n")
    head = _raw_scrape(
        daemon.url, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    bad = _raw_scrape(daemon.url, b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n")
    assert bad.startswith(b"HTTP/1.1 400 ")


def test_while_the_front_restarts_a_scrape_gets_503_at_once(tmp_path: Path) -> None:
    """Not a scrape left in the listen backlog until its timeout: the restart delay grows."""
    web_config = tmp_path / "web.yml"
    web_config.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    daemon = start_daemon("--simulate", "mixed", "--web.config.file", str(web_config))
    try:
        # A front that cannot start: the daemon starts it again after 1, 2, 4 ... 30 s.
        web_config.write_text("tls_server_config: [not, a, mapping]\n")
        (front,) = front_pids(daemon)
        os.kill(front, signal.SIGKILL)
        wait_until(lambda: "ERROR exporter.server.front: web config" in daemon.log(), what="log")
        answers = [requests.get(daemon.url + "metrics", timeout=10) for _ in range(3)]
        assert [answer.status_code for answer in answers] == [503, 503, 503]
        assert answers[0].headers["Retry-After"] == "1"
        assert answers[0].text == "gpuload: the HTTP front is restarting\n"
    finally:
        daemon.stop()
