"""The HTTP front process: /metrics answered without the daemon, the rest forwarded to it."""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest
import requests
from helpers import Daemon, parse_metrics, series, start_daemon, value_of, wait_until

from exporter.server.front import Answers, encode_answers

TEXT = ("text/plain; version=0.0.4; charset=utf-8", False)
GZIP = ("text/plain; version=0.0.4; charset=utf-8", True)


def front_pids(daemon: Daemon) -> list[int]:
    # Each thread has its own list: a front started again is the watcher thread's child.
    tasks = Path(f"/proc/{daemon.process.pid}/task").glob("*/children")
    return sorted(int(child) for task in tasks for child in task.read_text().split())


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def daemon():
    running = start_daemon("--simulate", "mixed", "--collect.interval", "0.5")
    yield running
    running.stop()


def test_each_daemon_has_one_front_process(daemon: Daemon) -> None:
    assert len(front_pids(daemon)) == 1


def test_scrapes_are_answered_while_the_daemon_is_stopped(daemon: Daemon) -> None:
    daemon.get("/metrics")  # forwarded: the daemon encodes it and hands it to the front
    wait_until(lambda: daemon.get("/metrics").ok, what="a second scrape")
    os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        answer = daemon.get("/metrics", timeout=5)
        assert answer.status_code == 200
        assert set(series(parse_metrics(answer.text), "gpu_up").values()) == {1}
        # Everything else is the daemon's to answer: it waits while the daemon is stopped.
        with pytest.raises(requests.exceptions.ReadTimeout):
            daemon.get("/readyz", timeout=1)
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    assert daemon.get("/readyz").text == "ready\n"


def test_a_front_that_dies_is_started_again(daemon: Daemon) -> None:
    (first,) = front_pids(daemon)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: front_pids(daemon) and front_pids(daemon) != [first], what="a new front")
    wait_until(lambda: daemon.get("/metrics").ok, what="scrapes again")
    assert "the HTTP front exited with status -9; starting it again" in daemon.log()
    assert daemon.process.poll() is None


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
