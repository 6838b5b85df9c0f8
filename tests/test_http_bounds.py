"""Clients that hold connections open or send huge heads: the servers stay bounded and answer.

Each server (`gpuload serve`'s front, and its daemon behind it, and `gpuload relay`) is held by
2,000 connections that trickle a request head a byte a second, and by 30 that send 99 header
lines of 64 KB; the legitimate requests must still be answered, the resident memory must stay
under the chart's memory requests, and no slow connection may outlive its deadline, however
often it sends.
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
import yaml
from helpers import ROOT, Daemon, start_daemon, wait_until
from relay_helpers import notification, start_relay_process, write_config

from exporter.server.wsgi import MAX_CONNECTIONS, REQUEST_TIMEOUT

SLOW = 2000
LARGE = 30
LEGITIMATE = 5


def chart_request_bytes(component: str) -> int:
    """The chart's memory request of the exporter (`resources`) or the relay."""
    values = yaml.safe_load((ROOT / "helm/gpuload/values.yaml").read_text())
    section = values[component]
    quantity = section["resources"]["requests"]["memory"]
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2]) * 1024 * 1024


def status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * (1024 if line.endswith("kB") else 1)
    raise AssertionError(f"no {name} in /proc/{pid}/status")


def children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task").glob("*/children")
    return [int(child) for task in tasks for child in task.read_text().split()]


class Attack:
    """Slow connections trickling a head, and connections sending heads far over the limit."""

    def __init__(self, address: tuple[str, int], first_line: bytes) -> None:
        self._address = address
        self._first_line = first_line
        self.slow: list[socket.socket] = []
        self.ended: set[int] = set()  # indexes of slow connections the server closed
        self.large_answers: list[bytes] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Attack:
        for _ in range(SLOW):
            connection = socket.create_connection(self._address, timeout=30)
            connection.sendall(self._first_line)
            connection.setblocking(False)
            self.slow.append(connection)
        self._threads.append(threading.Thread(target=self._trickle, daemon=True))
        self._threads += [threading.Thread(target=self._large, daemon=True) for _ in range(LARGE)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        for connection in self.slow:
            connection.close()

    def _trickle(self) -> None:
        """A header byte a second on every slow connection, never ending its head."""
        while not self._stop.wait(1.0):
            for index, connection in enumerate(self.slow):
                if index in self.ended:
                    continue
                try:
                    if connection.recv(1 << 16, socket.MSG_PEEK) == b"":
                        self.ended.add(index)
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.ended.add(index)
                    continue
                with contextlib.suppress(BlockingIOError):
                    try:
                        connection.send(b"X")
                    except OSError:
                        self.ended.add(index)

    def _large(self) -> None:
        """Heads of 99 lines of 64 KB, one connection after another."""
        line = b"X-Large: " + b"a" * 65536 + b"\r\n"
        while not self._stop.is_set():
            with socket.create_connection(self._address, timeout=30) as connection:
                with contextlib.suppress(OSError):
                    connection.sendall(self._first_line + line * 99 + b"\r\n")
                with contextlib.suppress(OSError):
                    self.large_answers.append(connection.recv(200))


@pytest.fixture(autouse=True)
def enough_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = SLOW + LARGE + 200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"{wanted} file descriptors needed, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def hold_and_check(
    address: tuple[str, int],
    first_line: bytes,
    pids: Callable[[], list[int]],
    legitimate: Callable[[], None],
    memory_request: int,
) -> None:
    with Attack(address, first_line) as attack:
        # Legitimate requests while the slow connections are held and the large heads come:
        # each one must be answered (a count, not a duration: it holds on a busy machine).
        for _ in range(LEGITIMATE):
            legitimate()
            time.sleep(0.2)
        threads = {pid: status_field(pid, "Threads") for pid in pids()}
        # Every slow connection the server held is closed by its deadline, though each one
        # sent a byte a second (a timeout per read would never end them).
        wait_until(
            lambda: len(attack.ended) == SLOW,
            timeout=REQUEST_TIMEOUT * 4,
            what=f"the server to close every slow connection ({len(attack.ended)} closed)",
        )
        legitimate()
        peak = sum(status_field(pid, "VmHWM") for pid in pids())
        print(f"peak RSS {peak / 2**20:.1f} MiB, threads {threads}")
        assert peak < memory_request, f"peak RSS {peak / 2**20:.1f} MiB"
        # A thread per connection held, at most: the server held at most MAX_CONNECTIONS.
        assert all(count < MAX_CONNECTIONS + 64 for count in threads.values()), threads
        assert attack.large_answers
        for answer in attack.large_answers:
            assert answer in (b"",) or answer.startswith(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            ), answer[:80]


def test_the_exporter_answers_scrapes_while_slow_and_large_clients_hold_it() -> None:
    daemon: Daemon = start_daemon("--simulate", "training")
    try:
        host, port = daemon.url.removeprefix("http://").rstrip("/").rsplit(":", 1)

        def scrape() -> None:
            answer = daemon.get("/metrics")
            assert answer.status_code == 200 and "gpu_up{" in answer.text
            assert daemon.get("/api/v1/status").status_code == 200  # forwarded to the daemon

        def processes() -> list[int]:
            return [daemon.process.pid, *children(daemon.process.pid)]

        hold_and_check(
            (host, int(port)),
            b"GET /metrics HTTP/1.1\r\n",
            processes,
            scrape,
            chart_request_bytes("exporter"),
        )
    finally:
        daemon.stop()
    assert "Traceback" not in daemon.log()


def test_the_relay_accepts_notifications_while_slow_and_large_clients_hold_it(
    tmp_path: Path,
) -> None:
    # A target nothing listens at: the notifications wait in the queue.
    hook = {"type": "webhook", "url": "http://127.0.0.1:9/hook"}
    config = write_config(tmp_path, {"targets": {"hook": hook}, "route": {"targets": ["hook"]}})
    relay = start_relay_process(config)
    try:
        host, port = relay.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        sent = [0]

        def post() -> None:
            sent[0] += 1
            body = json.dumps(notification(group=f"g{sent[0]}")).encode()
            answer = requests.post(relay.url + "alerts", data=body, timeout=10)
            assert answer.status_code == 200, answer.text

        hold_and_check(
            (host, int(port)),
            b"POST /alerts HTTP/1.1\r\n",
            lambda: [relay.process.pid],
            post,
            chart_request_bytes("relay"),
        )
    finally:
        relay.process.terminate()
        relay.process.wait(timeout=30)
    assert "Traceback" not in "".join(relay.lines)


def test_the_documented_bounds_are_the_servers() -> None:
    from exporter.server import wsgi

    text = (ROOT / "docs/security.md").read_text()
    assert f"| connections held | {wsgi.MAX_CONNECTIONS} per listener |" in text
    assert f"| a request's head and body | within {wsgi.REQUEST_TIMEOUT:g} s of" in text
    assert f"| idle kept-alive connection | {wsgi.KEEP_ALIVE_TIMEOUT:g} s |" in text
    head = f"{wsgi.MAX_HEAD // 1024} KiB and {wsgi.MAX_HEADER_LINES} lines"
    assert f"| request head | {head} |" in text
    assert f"{wsgi.MAX_BODY // 2**20} MiB on the exporter" in text
    assert f"| an answer the client does not read | {wsgi.SEND_TIMEOUT:g} s |" in text


def test_when_full_the_longest_waiting_connection_makes_room_and_else_none_is_admitted() -> None:
    from exporter.server.wsgi import Connections

    connections = Connections(limit=3)
    pairs = [socket.socketpair() for _ in range(5)]
    try:
        first, second, third = (connections.admit(mine) for mine, _ in pairs[:3])
        assert first and second and third
        connections.answering(second)
        connections.answering(third)
        # Full: the first, the only one waiting for a request, is shut down for the fourth.
        assert connections.admit(pairs[3][0]) is not None
        assert pairs[0][0].recv(1) == b""  # its reader sees the end at once
        assert len(connections) == 3
        # Full of connections being answered and one waiting (the fourth): it goes too...
        fifth = connections.admit(pairs[4][0])
        assert fifth is not None
        connections.answering(fifth)
        assert pairs[3][0].recv(1) == b""
        # ... and with every one being answered, a new connection is not admitted.
        extra, _ = socket.socketpair()
        with extra, _:
            assert connections.admit(extra) is None
        connections.leave(second)
        assert len(connections) == 2
    finally:
        connections.close()
        for mine, theirs in pairs:
            mine.close()
            theirs.close()
