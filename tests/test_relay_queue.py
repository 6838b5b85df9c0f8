"""The queue's group commit: enqueues that wait for a commit in progress share the next one.

To gather a batch without timing, another connection holds SQLite's write lock (as the
``gpuload relay queue`` command may): the first enqueue commits alone and waits for the lock,
and the enqueues that arrive meanwhile join the next batch.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import wait_until
from relay_helpers import FakeTarget, alert, notification, post, running_relay

from exporter.relay.queue import QUEUED, Queue

NOW = 1_767_322_800.0
MAX_AGE = 3600.0

Rows = list[tuple[str, str, str]]
Results = list[tuple[str, bool]]
T = TypeVar("T")


@contextmanager
def write_lock_held(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection's write transaction on the queue file, rolled back at the end."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def in_thread(function: Callable[..., T], *args: Any) -> Future[T]:
    """Call `function` on a daemon thread: a test that deadlocks fails on a timeout, not hangs."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as error:  # noqa: BLE001 - handed to the test through the future
            future.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return future


def enqueue_later(queue: Queue, rows: Rows) -> Future[Results]:
    return in_thread(queue.enqueue, rows, NOW, MAX_AGE)


def stored(queue: Queue) -> dict[str, str]:
    return {entry.dedup_key: entry.body for entry in queue.entries(QUEUED)}


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    opened = Queue(str(tmp_path / "relay.db"))
    yield opened
    opened.close()


def test_enqueues_waiting_for_a_commit_share_the_next_one_and_each_lands_once(
    queue: Queue, tmp_path: Path
) -> None:
    before = queue.commits
    with write_lock_held(tmp_path / "relay.db"):
        # Every sender also re-sends one shared notification: one of them queues it.
        futures = [
            enqueue_later(queue, [(f"t{n}", f"k{n}", f"body {n}"), ("hook", "shared", "same")])
            for n in range(20)
        ]
        wait_until(lambda: queue.waiting == 19, what="19 enqueues behind the first")
        assert not any(future.done() for future in futures)
    results = [future.result(timeout=15) for future in futures]

    assert queue.commits - before == 2
    for n, result in enumerate(results):
        assert result[0] == (f"t{n}", True)
        assert result[1][0] == "hook"
    assert sum(result[1][1] for result in results) == 1
    assert stored(queue) == {**{f"k{n}": f"body {n}" for n in range(20)}, "shared": "same"}


def test_an_error_in_a_group_commit_fails_every_enqueue_in_it_and_keeps_none(
    queue: Queue, tmp_path: Path
) -> None:
    path = tmp_path / "relay.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute(
        "CREATE TRIGGER poison BEFORE INSERT ON notifications WHEN NEW.body = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
    )
    other.close()
    before = queue.commits
    with write_lock_held(path):
        # Two first: one commits alone once the lock is free, the other waits for the next.
        first = [enqueue_later(queue, [("hook", f"first{n}", "fine")]) for n in range(2)]
        wait_until(lambda: queue.waiting == 1, what="one enqueue behind the first")
        rest = [enqueue_later(queue, [("hook", f"k{n}", "fine")]) for n in range(9)]
        rest.append(enqueue_later(queue, [("hook", "bad", "poison")]))
        wait_until(lambda: queue.waiting == 11, what="eleven enqueues behind the first")
    outcomes = [future.exception(timeout=15) for future in first + rest]

    failed = [error for error in outcomes if error is not None]
    assert len(failed) == 11
    assert all(isinstance(error, sqlite3.IntegrityError) for error in failed)
    assert all("poisoned row" in str(error) for error in failed)
    assert queue.commits - before == 1
    committed = [f"first{n}" for n in range(2) if outcomes[n] is None]
    assert list(stored(queue)) == committed
    # The failed batch left no transaction open: the next enqueue commits.
    assert queue.enqueue([("hook", "k0", "fine")], NOW, MAX_AGE) == [("hook", True)]
    assert list(stored(queue)) == [*committed, "k0"]


def test_group_committed_notifications_are_on_disk_for_the_next_open(tmp_path: Path) -> None:
    path = str(tmp_path / "relay.db")
    queue = Queue(path)

    def send(n: int) -> list[Results]:
        return [
            queue.enqueue([("hook", f"k{n}-{i}", f"body {n}-{i}")], NOW, MAX_AGE) for i in range(10)
        ]

    senders = [in_thread(send, n) for n in range(20)]
    assert all(sender.result(timeout=15) == [[("hook", True)]] * 10 for sender in senders)
    queue.close()

    reopened = Queue(path)
    try:
        expected = {f"k{n}-{i}": f"body {n}-{i}" for n in range(20) for i in range(10)}
        assert stored(reopened) == expected
        # Still queued, so a re-send is a duplicate.
        assert reopened.enqueue([("hook", "k3-4", "again")], NOW, MAX_AGE) == [("hook", False)]
    finally:
        reopened.close()


def test_a_notification_is_answered_only_once_its_group_commit_is_done(tmp_path: Path) -> None:
    receiver = FakeTarget()
    config = {
        "targets": {"hook": {"type": "webhook", "url": receiver.url}},
        "route": {"targets": ["hook"]},
    }
    try:
        with running_relay(tmp_path, config) as relay:
            with write_lock_held(tmp_path / "relay.db"):
                answers = [
                    in_thread(post, relay.url, notification(alert(), group=f"g{n}"))
                    for n in range(5)
                ]
                wait_until(lambda: relay.queue.waiting == 4, what="four behind the first")
                assert not any(answer.done() for answer in answers)
            assert [answer.result(timeout=15).status_code for answer in answers] == [200] * 5
            wait_until(lambda: len(receiver.requests) == 5, what="five deliveries")
    finally:
        receiver.close()
