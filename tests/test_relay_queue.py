"""The queue's group commit: enqueues that wait for a commit in progress share the next one.

To gather a batch without timing, another connection holds SQLite's write lock (as the
``gpuload relay queue`` command may): the first enqueue commits alone and waits for the lock,
and the enqueues that arrive meanwhile join the next batch.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import pytest
from helpers import wait_until
from relay_helpers import (
    FakeTarget,
    alert,
    fill,
    in_thread,
    notification,
    post,
    running_relay,
    small_disk,
    write_lock_held,
)

from exporter.relay.queue import DEAD, QUEUED, Corrupt, NoRoom, Queue

NOW = 1_767_322_800.0
MAX_AGE = 3600.0

Rows = list[tuple[str, str, str]]
Results = list[tuple[str, bool]]
T = TypeVar("T")


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


POISON = (
    "CREATE TRIGGER poison BEFORE INSERT ON notifications WHEN NEW.body = 'poison' "
    "BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
)

# What one bad enqueue carries: a row a trigger refuses, or one that cannot be UTF-8 encoded.
BAD_ROWS = {
    "refused": ("hook", "bad", "poison"),
    "lone surrogate": ("hook", "bad", '{"summary": "\ud800"}'),
}


@pytest.mark.parametrize("bad", sorted(BAD_ROWS))
def test_a_bad_row_fails_only_its_own_enqueue_in_a_group_commit(
    queue: Queue, tmp_path: Path, bad: str
) -> None:
    path = tmp_path / "relay.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute(POISON)
    other.close()
    before = queue.commits
    with write_lock_held(path):
        # Two first: one commits alone once the lock is free, the other waits for the next.
        first = [enqueue_later(queue, [("hook", f"first{n}", "fine")]) for n in range(2)]
        wait_until(lambda: queue.waiting == 1, what="one enqueue behind the first")
        rest = [enqueue_later(queue, [("hook", f"k{n}", "fine")]) for n in range(9)]
        rest.append(enqueue_later(queue, [BAD_ROWS[bad]]))
        wait_until(lambda: queue.waiting == 11, what="eleven enqueues behind the first")
    outcomes = [future.exception(timeout=15) for future in first + rest]

    assert outcomes[:-1] == [None] * 11
    assert isinstance(outcomes[-1], sqlite3.Error)
    assert queue.commits - before == 2
    assert sorted(stored(queue)) == sorted(
        [f"first{n}" for n in range(2)] + [f"k{n}" for n in range(9)]
    )


def test_a_group_commit_on_a_full_disk_fails_every_enqueue_in_it_and_keeps_none(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk") as disk:
        path = disk / "relay.db"
        queue = Queue(str(path))
        try:
            queue.enqueue([("hook", "before", "fine")], NOW, MAX_AGE)
            filler = fill(disk)
            # An enqueue checks for room first (tests/test_relay_readiness.py); here the disk
            # fills after that check, while the enqueues wait for their group commit.
            with pytest.raises(NoRoom):
                queue.enqueue([("hook", "refused", "x")], NOW, MAX_AGE)
            queue.room = lambda: None  # type: ignore[method-assign]
            with write_lock_held(path):
                first = enqueue_later(queue, [("hook", "first", "x" * 100_000)])
                wait_until(lambda: queue.waiting == 0 and not first.done(), what="the first")
                rest = [enqueue_later(queue, [("hook", f"k{n}", "x" * 100_000)]) for n in range(5)]
                wait_until(lambda: queue.waiting == 5, what="five enqueues behind the first")
            outcomes = [future.exception(timeout=15) for future in [first, *rest]]
            assert all(isinstance(error, sqlite3.OperationalError) for error in outcomes)
            assert list(stored(queue)) == ["before"]
            filler.unlink()
            # The failed commits left no transaction open: the next enqueue commits.
            assert queue.enqueue([("hook", "k0", "fine")], NOW, MAX_AGE) == [("hook", True)]
            assert list(stored(queue)) == ["before", "k0"]
        finally:
            queue.close()


# The queue as the relay's first release created it: no incident column.
FIRST_SCHEMA = """
CREATE TABLE notifications (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    target TEXT NOT NULL,
    dedup_key TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    received_at REAL NOT NULL,
    queued_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    finished_at REAL,
    UNIQUE (target, dedup_key)
);
CREATE INDEX notifications_due ON notifications (target, state, next_attempt_at);
CREATE VIEW dead_letters AS SELECT * FROM notifications WHERE state = 'dead';
"""


def test_a_queue_from_the_first_release_keeps_each_groups_order_once_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "relay.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(FIRST_SCHEMA)
    rows = [
        ("delivered-db", "", "delivered"),
        ("trigger-db", json.dumps(notification(alert(), group="db")), "queued"),
        ("resolve-db", json.dumps(notification(alert(status="resolved"), group="db")), "queued"),
        ("trigger-gpu", json.dumps(notification(alert(), group="gpu")), "queued"),
        ("not-json", "not json", "queued"),
        ("dead-gpu", json.dumps(notification(alert(), group="gpu")), "dead"),
    ]
    for key, body, state in rows:
        old.execute(
            "INSERT INTO notifications (target, dedup_key, body, state, received_at, "
            "queued_at, expires_at, next_attempt_at) VALUES ('pager', ?, ?, ?, ?, ?, ?, ?)",
            (key, body, state, NOW, NOW, NOW + MAX_AGE, NOW),
        )
    old.close()
    for _ in range(2):  # opening again finds it migrated
        queue = Queue(str(path))
        try:
            due = [entry.dedup_key for entry in queue.due("pager", NOW, 10)]
            assert due == ["trigger-db", "trigger-gpu", "not-json"]
            assert len(queue.entries(QUEUED)) == 4
            assert [entry.dedup_key for entry in queue.entries(DEAD)] == ["dead-gpu"]
        finally:
            queue.close()


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


def test_a_queue_damaged_while_open_refuses_every_notification_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    queue = Queue(str(path))
    try:
        queue.enqueue([("hook", f"k{n}", "x" * 3000) for n in range(60)], NOW, MAX_AGE)
        with sqlite3.connect(path) as other:
            other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # Every page but the first and the last overwritten, and no connection's cache left.
        pages = path.stat().st_size // 4096
        with open(path, "r+b") as file:
            file.seek(4096)
            file.write(b"\xff" * 4096 * (pages - 2))
        queue.close()
        with pytest.raises(sqlite3.DatabaseError, match="malformed"):
            queue.enqueue([("hook", "new", "y")], NOW, MAX_AGE)
        # From then on, at once and for readiness too: the file will not heal by itself.
        for attempt in (
            lambda: queue.enqueue([("hook", "later", "y")], NOW, MAX_AGE),
            queue.check,
        ):
            with pytest.raises(Corrupt, match=f"the queue file {path} is damaged"):
                attempt()
    finally:
        queue.close()
