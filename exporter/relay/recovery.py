"""A damaged queue file: found while the relay runs, and recovered rather than refused.

The integrity of the file is checked every ``queue.check_interval`` (at most a minute; 30 s by
default) and again soon after any SQLite error (`QueueCheck`). ``PRAGMA quick_check`` reads
every page: about 0.1 s of CPU for a 100 MB queue, so 0.3% of a core at 30 s; a check that an
error asks for waits a hundred times as long as the last one took, which keeps the checks within
1% of a core. Damage found (or met by a statement) makes the queue refuse new notifications
(503, so Alertmanager retries) and raises ``gpuload_relay_queue_damaged``; the file is then
recovered in place, at once, and the relay goes on. A file found damaged at start is recovered
the same way before anything else (`open_queue`).

Recovering (`recover`): the file is moved aside with its ``-wal`` and ``-shm`` (kept, as
``relay.db.damaged-<UTC time>``), and every row SQLite can still read from it is copied, with
its id, state and times, into a fresh queue at the same path; what was queued is then delivered
as before, in order per incident (the ids and queue times are kept), at least once. Python's
``sqlite3`` has no binding of SQLite's recovery extension (``sqlite3_recover_*``,
https://www.sqlite.org/recovery.html, ext/recover/sqlite3recover.h) and the image has no
``sqlite3`` command for its ``.recover``, so the rows are read with SQL alone, around the
damage: the table is read in id order; where a page cannot be read, the read starts again
at the next id whose page can. The indexes name every row's id without reading the table:
an id they name whose row could not be read is a row lost. Both counts are logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from exporter.relay.queue import Corrupt, Queue, is_corrupt

log = logging.getLogger(__name__)

# A check asked for by an error waits this many times as long as the last check took: 1%.
_COST_RATIO = 100.0
# Ids tried one by one past an unreadable page before the rest of the table is given up on,
# when neither the indexes nor the sequence say how far the ids go.
_SKIP_LIMIT = 100_000

_COLUMNS = (
    "id",
    "target",
    "dedup_key",
    "body",
    "state",
    "received_at",
    "queued_at",
    "expires_at",
    "next_attempt_at",
    "attempts",
    "last_error",
    "finished_at",
    "incident",
)
_INDEXES = ("sqlite_autoindex_notifications_1", "notifications_due", "notifications_incident")


@dataclass(frozen=True)
class Recovery:
    """What a recovery kept: rows copied (and of them, still to deliver), rows lost.

    ``aside``: where the damaged file is kept.
    """

    recovered: int
    queued: int
    lost: int
    aside: str

    def describe(self, path: str) -> str:
        """One line for the log."""
        return (
            f"recovered the damaged queue file {path}: {self.recovered} row(s) read back "
            f"({self.queued} still to deliver), {self.lost} lost; the damaged file is kept as "
            f"{self.aside}"
        )


def open_queue(path: str, dedup_window: float) -> tuple[Queue, Recovery | None]:
    """The queue at ``path``; a damaged one is recovered first (and how is returned).

    Raises Corrupt for a file that was never a queue: not SQLite's, and without the reserve
    that a queue keeps beside it (a queue.path naming some other file by mistake).
    """
    try:
        return Queue(path, dedup_window=dedup_window), None
    except Corrupt as error:
        if not _was_a_queue(path):
            raise Corrupt(
                f"the queue file {path} is not an SQLite database, and no queue was kept "
                f"there (no {path}-reserve beside it): give queue.path a file of its own"
            ) from error
        log.error("%s", error)
    recovery = recover(path, dedup_window)
    log.warning("%s", recovery.describe(path))
    return Queue(path, dedup_window=dedup_window), recovery


def _was_a_queue(path: str) -> bool:
    with contextlib.suppress(OSError), open(path, "rb") as file:
        if file.read(16) == b"SQLite format 3\0":
            return True
    return os.path.exists(f"{path}-reserve")


def recover(path: str, dedup_window: float, now: float | None = None) -> Recovery:
    """Move the file aside with its -wal and -shm, and copy what it still holds to ``path``.

    Row by row: a queue of 100 MB is never held in memory.
    """
    aside = _aside(path, time.time() if now is None else now)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, aside + suffix)
    read: set[int] = set()
    known: set[int] = set()

    def rows() -> Iterator[tuple[Any, ...]]:
        with _reading(aside) as db:
            try:
                columns = _columns(db)
                known.update(_indexed_ids(db))
                last = max(max(known, default=0), _last_id(db))
            except sqlite3.DatabaseError as error:
                # The schema itself cannot be read: nothing can be.
                log.error("nothing can be read from the damaged queue file %s: %s", aside, error)
                return
            for row in _rows(db, columns, last):
                read.add(int(row[0]))
                yield row

    fresh = Queue(path, dedup_window=dedup_window)
    try:
        kept = fresh.restore(rows())
    finally:
        fresh.close()
    lost = len((known | read) - {row_id for row_id, _ in kept})
    queued = sum(1 for _, state in kept if state == "queued")
    return Recovery(len(kept), queued, lost, aside)


def _aside(path: str, now: float) -> str:
    """A name for the damaged file that no earlier one has."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    aside, number = f"{path}.damaged-{stamp}", 1
    while os.path.exists(aside):
        number += 1
        aside = f"{path}.damaged-{stamp}-{number}"
    return aside


@contextlib.contextmanager
def _reading(path: str) -> Iterator[sqlite3.Connection]:
    # Read-only, so that the damaged file and its WAL are kept as they were found.
    uri = f"file:{urllib.parse.quote(path)}?mode=ro"
    db = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        # A schema naming a page past the end of a truncated file is refused whole, unless it
        # is "writable" (https://www.sqlite.org/pragma.html#pragma_writable_schema): then the
        # tables whose pages are there can still be read.
        db.execute("PRAGMA writable_schema=ON")
        yield db
    finally:
        db.close()


def _columns(db: sqlite3.Connection) -> str:
    """The select list: an old file without an incident column gets it from each body."""
    present = {row[1] for row in db.execute("PRAGMA table_info(notifications)")}
    if not present:
        raise sqlite3.DatabaseError("no notifications table")
    return ", ".join(name if name in present else "NULL" for name in _COLUMNS)


def _indexed_ids(db: sqlite3.Connection) -> set[int]:
    known: set[int] = set()
    for index in _INDEXES:
        # A covering scan of the index: the ids come without a read of the table.
        with contextlib.suppress(sqlite3.Error):
            for (rowid,) in db.execute(f"SELECT id FROM notifications INDEXED BY {index}"):
                known.add(int(rowid))
    return known


def _last_id(db: sqlite3.Connection) -> int:
    with contextlib.suppress(sqlite3.Error):
        found = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'notifications'")
        for (seq,) in found:
            return int(seq)
    return 0


def _rows(db: sqlite3.Connection, columns: str, last: int) -> Iterator[tuple[Any, ...]]:
    """Every row readable, in id order, reading on past each unreadable page."""
    start: int | None = -(2**63)
    # "id >= ?": SQLite seeks to that id; "id > ?" would seek to the one before, and fail
    # on its page.
    select = f"SELECT {columns} FROM notifications WHERE id >= ? ORDER BY id"
    while start is not None:
        try:
            for row in db.execute(select, (start,)):
                start = int(row[0]) + 1
                yield row
            return
        except sqlite3.DatabaseError as error:
            if not is_corrupt(error):
                raise
        # Python's cursor reads the next row before it hands over the last one: a row read
        # just before the damage was dropped with the error. Alone, it comes.
        try:
            alone = db.execute(f"{select} LIMIT 1", (start,)).fetchall()
        except sqlite3.DatabaseError:
            alone = []
        if alone:
            start = int(alone[0][0]) + 1
            yield alone[0]
            continue
        start = _next_readable(db, start, last)


def _next_readable(db: sqlite3.Connection, start: int, last: int) -> int | None:
    """The next id after ``start`` from which the table can be read (the rows between are lost).

    None when there is none up to ``last``, or, with no last id known, within _SKIP_LIMIT.
    """
    first = max(start + 1, 1)
    end = last if last else first + _SKIP_LIMIT
    for candidate in range(first, end + 1):
        try:
            db.execute(
                "SELECT id FROM notifications WHERE id >= ? LIMIT 1", (candidate,)
            ).fetchall()
        except sqlite3.DatabaseError:
            continue
        return candidate
    return None


class QueueCheck:
    """Checks the queue file on a thread of its own, and recovers it in place when damaged."""

    def __init__(
        self,
        queue: Queue,
        interval: float,
        *,
        damaged: Callable[[bool], None],
        recovered: Callable[[Recovery], None],
    ) -> None:
        self._queue = queue
        self._interval = interval
        self._damaged = damaged
        self._recovered = recovered
        self._asked = threading.Event()
        self._stop = threading.Event()
        self._last_cost = 0.0
        self._thread = threading.Thread(target=self._run, name="queue-check", daemon=True)
        queue.on_error = self._asked.set

    def start(self) -> None:
        """Check in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop checking (a recovery in progress finishes)."""
        self._stop.set()
        self._asked.set()

    def join(self, timeout: float) -> None:
        """Wait for the thread."""
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            # Within 1% of a core: after a check, no other for a hundred times its cost.
            pause = min(self._interval, _COST_RATIO * self._last_cost)
            if self._stop.wait(pause):
                return
            self._asked.wait(self._interval - pause)
            self._asked.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception:  # the thread's boundary: log, go on at the next period
                log.exception("checking the queue file %s failed", self._queue.path)

    def step(self) -> Recovery | None:
        """One check; a damaged file is recovered in place (and how is returned)."""
        started = time.monotonic()
        problem = self._queue.verify() if self._queue.corrupt is None else self._queue.corrupt
        self._last_cost = time.monotonic() - started
        if problem is None:
            return None
        self._damaged(True)
        path = self._queue.path
        recovery = self._queue.replaced(lambda: recover(path, self._queue.dedup_window))
        log.warning("%s", recovery.describe(path))
        self._damaged(False)
        self._recovered(recovery)
        return recovery
