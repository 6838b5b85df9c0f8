"""The durable queue: SQLite in WAL mode, one row per (target, notification).

A row is ``queued`` until delivered, then ``delivered`` (kept, without its body,
for the dedup window) or ``dead`` (a dead letter, kept with its body and last
error until it is retried, dropped or older than the retention). The unique
(target, dedup_key) makes Alertmanager's re-sends of a notification collapse
into the row already there.

Each row belongs to an incident: the Alertmanager group (``groupKey``) it
notifies of, on which every target keys its own deduplication (PagerDuty's
dedup_key, a webhook receiver's incident). A target's rows of one incident go
out one at a time and in the order they were queued: only the oldest queued row
of an incident is due, so a resolve waits while its trigger is in backoff
(PagerDuty would take a trigger after the resolve as a new incident) and
incidents stay independent of each other. ``synchronous=FULL`` makes every commit reach the
disk before the relay answers 200: a power cut after the answer loses nothing.

Enqueues are group-committed: those that arrive while a commit is in progress
wait, and the first of them then commits all of them in one transaction (one
fsync). Each returns only after the transaction holding its rows committed; if
that transaction fails, every enqueue in it raises and none of its rows is kept.
An enqueue whose own rows cannot be stored raises alone: the others in its
transaction commit.

Every thread uses its own connection; the ``gpuload relay queue`` command opens
the same file while the relay runs, and SQLite serialises the writers.

A full disk never strands what was accepted: the queue keeps a reserve file of
:data:`RESERVE_BYTES` beside it, gives it back to the file system when recording a
delivery (or a retry, a dead letter) finds the disk full, and refuses new notifications
while it cannot keep the reserve (:meth:`Queue.room`); they are accepted again by
themselves once there is room. The WAL is checkpointed every 32 pages and cut back to
128 KiB, so that it holds no more of the disk than the reserve gives back. A damaged
file (`verify`, or a statement that finds it so) refuses new notifications until it is
replaced by what could be read from it (`replaced`, `exporter.relay.recovery`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

QUEUED, DELIVERED, DEAD = "queued", "delivered", "dead"

log = logging.getLogger(__name__)
T = TypeVar("T")

# What the delivery path may need when the disk is full: a few hundred acks and a checkpoint.
RESERVE_BYTES = 512 * 1024
_WAL_PAGES = 32
# Free space, besides the reserve, below which new notifications are refused.
_ROOM_BYTES = 128 * 1024
_WAL_BYTES = 128 * 1024
# SQLite's primary result codes (sqlite3.h) that say the disk or the file is the problem.
_FULL, _CORRUPT, _NOT_A_DATABASE = 13, 11, 26


class NoRoom(sqlite3.OperationalError):
    """The queue cannot take a notification now: the disk is full (it keeps its reserve)."""


class ReadOnly(sqlite3.OperationalError):
    """The queue file is there, and this user cannot write it."""


class Corrupt(sqlite3.DatabaseError):
    """The queue file is damaged; the message says what to do."""


def _code(error: sqlite3.Error) -> int | None:
    """SQLite's primary result code of an error (Python 3.11+), else from its message."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF
    text = str(error)
    if "disk is full" in text:
        return _FULL
    if "malformed" in text:
        return _CORRUPT
    if "not a database" in text:
        return _NOT_A_DATABASE
    return None


def is_corrupt(error: sqlite3.Error) -> bool:
    """Whether an error says the file itself is damaged (not busy, not full, not read-only)."""
    return _code(error) in (_CORRUPT, _NOT_A_DATABASE)


_READINESS = """
CREATE TABLE IF NOT EXISTS readiness (id INTEGER PRIMARY KEY CHECK (id = 1), checked_at REAL)
"""

_TABLE = """
CREATE TABLE IF NOT EXISTS notifications (
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
    incident TEXT NOT NULL DEFAULT '',
    UNIQUE (target, dedup_key)
)
"""

_INDEXES = """
CREATE INDEX IF NOT EXISTS notifications_due ON notifications (target, state, next_attempt_at);
CREATE INDEX IF NOT EXISTS notifications_incident
    ON notifications (target, incident, state, queued_at, id);
CREATE VIEW IF NOT EXISTS dead_letters AS SELECT * FROM notifications WHERE state = 'dead';
"""

# Queues of the first release have no incident column: rows still to deliver (or to retry from
# the dead letters) take their group key from their body; one without is an incident of its own.
_MIGRATE = (
    "ALTER TABLE notifications ADD COLUMN incident TEXT NOT NULL DEFAULT ''",
    "UPDATE notifications SET incident = CASE "
    "WHEN json_valid(body) AND json_type(body, '$.groupKey') = 'text' "
    "THEN json_extract(body, '$.groupKey') ELSE dedup_key END",
)

# An older queued row of the same target and incident: the row waits behind it.
_BEHIND = """
EXISTS (
    SELECT 1 FROM notifications AS earlier
    WHERE earlier.target = n.target AND earlier.incident = n.incident
    AND earlier.state = 'queued' AND (earlier.queued_at, earlier.id) < (n.queued_at, n.id)
)
"""

# A re-send is a duplicate while the row is queued, or finished within the dedup window.
_ENQUEUE = """
INSERT INTO notifications
    (target, dedup_key, incident, body, state, received_at, queued_at, expires_at,
     next_attempt_at)
VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)
ON CONFLICT (target, dedup_key) DO UPDATE SET
    body = excluded.body, incident = excluded.incident, state = 'queued',
    received_at = excluded.received_at, queued_at = excluded.queued_at,
    expires_at = excluded.expires_at, next_attempt_at = excluded.next_attempt_at, attempts = 0,
    last_error = '', finished_at = NULL
WHERE notifications.state != 'queued' AND notifications.finished_at < ?
"""


@dataclass(frozen=True)
class Entry:
    """A row of the queue."""

    id: int
    target: str
    dedup_key: str
    body: str
    state: str
    received_at: float
    queued_at: float
    next_attempt_at: float
    attempts: int
    last_error: str


@dataclass(frozen=True)
class TargetState:
    """What the metrics show of one target's rows."""

    queued: int = 0
    oldest_queued_at: float | None = None
    dead: int = 0


_COLUMNS = (
    "id, target, dedup_key, body, state, received_at, queued_at, next_attempt_at, "
    "attempts, last_error"
)

# (target, dedup_key, body), or (target, dedup_key, body, incident) from a caller that knows it.
Row = tuple[str, str, str] | tuple[str, str, str, str]


def group_key(body: str) -> str | None:
    """The Alertmanager group key of a notification's JSON body, None if it has none."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    key = document.get("groupKey") if isinstance(document, dict) else None
    return key if isinstance(key, str) else None


@dataclass(frozen=True)
class _Enqueue:
    """One caller's rows, (target, dedup_key, incident, body), waiting for a group commit."""

    rows: Sequence[tuple[str, str, str, str]]
    now: float
    max_age: float


@dataclass
class _Batch:
    """The enqueues that one transaction commits, and how it went: each one's result or error."""

    turn: threading.Condition
    enqueues: list[_Enqueue] = field(default_factory=list)
    done: bool = False
    results: list[list[tuple[str, bool]] | sqlite3.Error] | None = None
    error: sqlite3.Error | None = None


class Queue:
    """The queue file, shared by the HTTP handlers, the workers and the CLI."""

    def __init__(self, path: str, *, dedup_window: float = 3600.0) -> None:
        self.path = path
        self.dedup_window = dedup_window
        # Connections not in use. The HTTP server runs each request on a new thread, so a
        # connection per thread would open (and keep) one per request; a pool reuses them.
        self._idle: list[sqlite3.Connection] = []
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Writers in this process take turns here rather than in SQLite's busy handler, which
        # sleeps in growing steps (up to 100 ms) while another connection holds the lock.
        self._writing = threading.Lock()
        # Held while the file is replaced (`replaced`): a connection opened meanwhile would make
        # a new file at the path, beside the old file's WAL.
        self._replacing = threading.Lock()
        # The group commit: enqueues join `_batch` under `_turn`; while `_committing`, one
        # thread commits an earlier batch and the others wait on their batch's condition, so
        # that a commit wakes only its own waiters and one of the next batch to commit it.
        self._turn = threading.Lock()
        self._batch = _Batch(threading.Condition(self._turn))
        self._committing = False
        # Write transactions this object committed: shows how many enqueues share a commit.
        self.commits = 0
        self._reserve = f"{path}-reserve"
        self._folder = os.path.dirname(os.path.abspath(path))
        # Why the file is damaged, once a check or a statement found it so: it does not heal
        # by itself (see `exporter.relay.recovery`).
        self.corrupt: str | None = None
        # Called on any SQLite error: the integrity check then looks again (it sets this).
        self.on_error: Callable[[], None] | None = None
        try:
            self._create()
            problems = [row[0] for row in self._query("PRAGMA quick_check")]
        except sqlite3.DatabaseError as error:
            if not is_corrupt(error):
                self.close()
                raise
            problems = [str(error)]
        if problems != ["ok"]:
            self.close()
            raise Corrupt(_corrupt_message(path, problems[0]))
        self._keep_reserve(self._free_bytes())

    def _create(self) -> None:
        with self._transaction() as db:
            db.execute(_TABLE)
            db.execute(_READINESS)
            columns = {row[1] for row in db.execute("PRAGMA table_info(notifications)")}
            if "incident" not in columns:
                for statement in _MIGRATE:
                    db.execute(statement)
        with self._borrowed() as db:
            db.executescript(_INDEXES)

    def _read_only(self) -> bool:
        """Whether the file is there, in a writable folder, and this user cannot write it."""
        return (
            os.path.exists(self.path)
            and not os.access(self.path, os.W_OK)
            and os.access(os.path.dirname(self.path) or ".", os.W_OK)
        )

    def _open(self, *, read_only: bool) -> sqlite3.Connection:
        if read_only:
            # Opened for writing, SQLite would create the -wal and -shm files with the file's
            # own mode: read-only to everyone, this relay too once the file is writable again.
            # Immutable, it creates neither, and every write fails (an honest 503).
            uri = f"file:{urllib.parse.quote(self.path)}?mode=ro&immutable=1"
            return sqlite3.connect(
                uri, uri=True, timeout=10, isolation_level=None, check_same_thread=False
            )
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=10000")
        db.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
        db.execute(f"PRAGMA journal_size_limit={_WAL_BYTES}")
        return db

    def _free_bytes(self) -> int:
        """Space free to this user on the queue's file system (0 when it cannot be read)."""
        try:
            room = os.statvfs(self._folder)
        except OSError:
            return 0
        return room.f_bavail * room.f_frsize

    def _keep_reserve(self, free: int) -> bool:
        """Whether the reserve is there, writing it if it is not and there is room for it."""
        try:
            if os.stat(self._reserve).st_size == RESERVE_BYTES:
                return True
        except FileNotFoundError:
            pass
        except OSError:
            return False
        # Taken again only with as much room again beside it: a reserve given back to a
        # delivery is not taken back from the next one.
        if free < 2 * RESERVE_BYTES:
            return False
        try:
            with open(self._reserve, "wb") as reserve:
                for _ in range(RESERVE_BYTES // 65536):
                    reserve.write(bytes(65536))
                reserve.flush()
                os.fsync(reserve.fileno())
        except OSError:
            self._give_back_reserve()
            return False
        return True

    def _give_back_reserve(self) -> bool:
        """Delete the reserve file; False when there was none to give back."""
        try:
            os.unlink(self._reserve)
        except OSError:
            return False
        return True

    def room(self) -> str | None:
        """Why the queue cannot take a notification now, or None when it can.

        Besides its reserve, the disk must have room for notifications: a nearly full disk
        would take a small write (a readiness probe) and refuse the next notification.
        """
        free = self._free_bytes()
        if not self._keep_reserve(free) or free < _ROOM_BYTES:
            return (
                f"the disk of {self._folder} is full ({free // 1024} KiB free): new "
                f"notifications are refused until there is room, and the queue's "
                f"{RESERVE_BYTES // 1024} KiB reserve keeps the deliveries of those accepted going"
            )
        return None

    def _recorded(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` in a transaction of the delivery path; on a full disk, with the reserve."""
        try:
            with self._transaction() as db:
                return work(db)
        except sqlite3.OperationalError as error:
            if _code(error) != _FULL or not self._give_back_reserve():
                raise
        log.warning(
            "the disk of the queue %s is full: its %d KiB reserve was given back so that "
            "deliveries go on; new notifications are refused until there is room",
            self.path,
            RESERVE_BYTES // 1024,
        )
        with self._transaction() as db:
            return work(db)

    @contextmanager
    def _borrowed(self) -> Iterator[sqlite3.Connection]:
        """A connection for this thread alone until the block ends."""
        with self._replacing:  # no connection while the file is moved and made again
            pass
        with self._lock:
            db = self._idle.pop() if self._idle else None
        if db is None:
            # A read-only connection is never pooled: the next one may write, once it can.
            read_only = self._read_only()
            db = self._open(read_only=read_only)
            if not read_only:
                with self._lock:
                    self._connections.append(db)
        try:
            yield db
        except sqlite3.Error as error:
            self._note(error)
            raise
        finally:
            with self._lock:
                if db in self._connections:
                    self._idle.append(db)
                    db = None
            if db is not None:  # read-only, or let go of while borrowed
                db.close()

    def _query(self, sql: str, parameters: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with self._borrowed() as db:
            return db.execute(sql, parameters).fetchall()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._writing, self._borrowed() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                # A failed COMMIT may leave the transaction open; the pooled connection must not.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            self.commits += 1

    @property
    def waiting(self) -> int:
        """How many enqueues wait for the next group commit."""
        with self._turn:
            return len(self._batch.enqueues)

    def _forget(self) -> None:
        """Close the idle connections; those borrowed now are closed when given back."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._connections.clear()
        for db in idle:
            db.close()

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
            self._idle.clear()

    def check(self) -> None:
        """Raise sqlite3.Error unless a notification could be committed now.

        A real write: a read-only or full file system, or a file that cannot be written,
        fails it, as it would fail the next notification.
        """
        self._refuse_if_unable()
        try:
            with self._transaction() as db:
                db.execute(
                    "INSERT INTO readiness VALUES (1, julianday('now')) "
                    "ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at"
                )
        except sqlite3.Error as error:
            self._note(error)
            raise

    def enqueue(self, rows: Sequence[Row], now: float, max_age: float) -> list[tuple[str, bool]]:
        """Commit rows, with other threads' rows, in one transaction.

        A row is (target, dedup_key, body), its incident the body's group key, or
        (target, dedup_key, body, incident). Returns (target, queued) pairs once committed:
        False where the row was a duplicate. Raises sqlite3.Error if the transaction failed or
        these rows could not be stored (sqlite3.DataError for a body that is not valid
        Unicode); then none of them is kept.
        """
        self._refuse_if_unable()
        complete = [
            (row[0], row[1], row[3] if len(row) == 4 else group_key(row[2]) or row[1], row[2])
            for row in rows
        ]
        with self._turn:
            batch = self._batch
            index = len(batch.enqueues)
            batch.enqueues.append(_Enqueue(complete, now, max_age))
            while self._committing and not batch.done:
                batch.turn.wait()
            leading = not batch.done
            if leading:
                # Nobody commits: this thread commits the batch, and later arrivals start the next.
                self._committing = True
                self._batch = _Batch(threading.Condition(self._turn))
        if leading:
            self._commit(batch)
        if batch.error is not None:
            raise copy.copy(batch.error) from batch.error
        assert batch.results is not None
        result = batch.results[index]
        if isinstance(result, sqlite3.Error):
            raise copy.copy(result) from result
        return result

    def _commit(self, batch: _Batch) -> None:
        """Commit a batch, then tell its waiters how it went."""
        try:
            with self._transaction() as db:
                results = [self._insert_alone(db, enqueue) for enqueue in batch.enqueues]
            batch.results = results
        except sqlite3.Error as error:
            self._note(error)
            batch.error = error
        finally:
            if batch.results is None and batch.error is None:
                batch.error = sqlite3.OperationalError("the group commit was interrupted")
            with self._turn:
                batch.done = True
                self._committing = False
                batch.turn.notify_all()
                self._batch.turn.notify()

    def _refuse_if_unable(self) -> None:
        """Raise Corrupt, ReadOnly or NoRoom when a notification cannot be kept now."""
        if self.corrupt is not None:
            raise Corrupt(self.corrupt)
        if self._read_only():
            self._forget()  # its connections are read-only: new ones once the file is writable
            raise ReadOnly(
                f"this user cannot write the queue file {self.path}: give it write permission"
            )
        reason = self.room()
        if reason is not None:
            raise NoRoom(reason)

    def _note(self, error: sqlite3.Error) -> None:
        """Remember a damaged file; after any error, have the file checked again.

        Every later notification would fail on a damaged file the same way.
        """
        if is_corrupt(error):
            self._damaged(str(error))
        if self.on_error is not None:
            self.on_error()

    def _damaged(self, problem: str) -> None:
        if self.corrupt is None:
            self.corrupt = _corrupt_message(self.path, problem)
            log.error("%s", self.corrupt)

    def verify(self) -> str | None:
        """Check the file's integrity (``PRAGMA quick_check``); what is wrong, or None.

        On a connection of its own, opened for the check: a pooled one may hold pages in its
        cache that the file no longer has. A damaged file is remembered, as `corrupt`.
        """
        db = self._open(read_only=self._read_only())
        try:
            problems = [str(row[0]) for row in db.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as error:
            if not is_corrupt(error):
                return None  # busy, locked, read-only: not the file's content
            problems = [str(error)]
        finally:
            db.close()
        if problems == ["ok"]:
            return None
        self._damaged(problems[0])
        return problems[0]

    def replaced(self, rebuild: Callable[[], T]) -> T:
        """Run ``rebuild`` (a new file at `path`) with no write in progress, then use the file.

        The queue is no longer damaged. Connections to the old file are closed (those
        borrowed now, when given back: a read in progress ends on the old file).
        """
        with self._writing, self._replacing:
            self._forget()
            result = rebuild()
            self._forget()
            self.corrupt = None
        return result

    def _insert_alone(
        self, db: sqlite3.Connection, enqueue: _Enqueue
    ) -> list[tuple[str, bool]] | sqlite3.Error:
        """Insert one enqueue's rows, or none of them and its error: the others' go on."""
        db.execute("SAVEPOINT enqueue")
        try:
            results = self._insert(db, enqueue)
        except (sqlite3.Error, ValueError) as error:
            if not db.in_transaction:
                raise  # SQLite ended the transaction (a full disk, an I/O error): nothing is kept
            db.execute("ROLLBACK TO enqueue")
            db.execute("RELEASE enqueue")
            if isinstance(error, sqlite3.Error):
                return error
            # A string SQLite cannot take, such as a lone surrogate, which UTF-8 cannot encode.
            return sqlite3.DataError(f"cannot store the notification: {error}")
        db.execute("RELEASE enqueue")
        return results

    def _insert(self, db: sqlite3.Connection, enqueue: _Enqueue) -> list[tuple[str, bool]]:
        now, expires_at = enqueue.now, enqueue.now + enqueue.max_age
        results = []
        for target, key, incident, body in enqueue.rows:
            cursor = db.execute(
                _ENQUEUE,
                (target, key, incident, body, now, now, expires_at, now, now - self.dedup_window),
            )
            results.append((target, cursor.rowcount > 0))
        return results

    def restore(self, rows: Iterable[tuple[Any, ...]]) -> list[tuple[int, str]]:
        """Insert rows read from a damaged file; (id, state) of each that fit.

        Each row has every column, its id first, in the table's order; an incident of None (a
        file of the first release) is taken from the body.
        """
        columns = (
            "id, target, dedup_key, body, state, received_at, queued_at, expires_at, "
            "next_attempt_at, attempts, last_error, finished_at, incident"
        )
        insert = f"INSERT INTO notifications ({columns}) VALUES ({', '.join('?' * 13)})"
        kept = []
        with self._transaction() as db:
            for row in rows:
                if row[12] is None:
                    row = (*row[:12], group_key(str(row[3])) or str(row[2]))
                try:
                    db.execute(insert, row)
                except sqlite3.Error:
                    continue  # a row SQLite read back garbled (a NULL where none may be)
                kept.append((int(row[0]), str(row[4])))
        return kept

    def due(self, target: str, now: float, limit: int) -> list[Entry]:
        """The oldest queued rows of a target whose next attempt is due, one per incident.

        A row waits while an older row of its incident is queued, due or not.
        """
        rows = self._query(
            f"SELECT {_COLUMNS} FROM notifications AS n WHERE target = ? AND state = 'queued' "
            f"AND next_attempt_at <= ? AND NOT {_BEHIND} ORDER BY queued_at, id LIMIT ?",
            (target, now, limit),
        )
        return [Entry(*row) for row in rows]

    def next_attempt(self, target: str) -> float | None:
        """When the target's next queued row is due, or None with nothing queued."""
        rows = self._query(
            "SELECT MIN(next_attempt_at) FROM notifications AS n "
            f"WHERE target = ? AND state = 'queued' AND NOT {_BEHIND}",
            (target,),
        )
        earliest = rows[0][0] if rows else None
        return None if earliest is None else float(earliest)

    def delivered(self, ids: Sequence[int], now: float) -> None:
        """Mark rows delivered; their bodies are no longer needed."""
        self._recorded(
            lambda db: db.executemany(
                "UPDATE notifications SET state = 'delivered', body = '', finished_at = ?, "
                "attempts = attempts + 1, last_error = '' WHERE id = ? AND state = 'queued'",
                [(now, i) for i in ids],
            )
        )

    def retry(self, ids: Sequence[int], next_attempt_at: float, error: str) -> None:
        """Record a failed attempt; the rows stay queued."""
        self._recorded(
            lambda db: db.executemany(
                "UPDATE notifications SET attempts = attempts + 1, next_attempt_at = ?, "
                "last_error = ? WHERE id = ? AND state = 'queued'",
                [(next_attempt_at, error, i) for i in ids],
            )
        )

    def dead(self, ids: Sequence[int], now: float, error: str) -> None:
        """Move rows to the dead letters."""
        self._recorded(
            lambda db: db.executemany(
                "UPDATE notifications SET state = 'dead', finished_at = ?, "
                "attempts = attempts + 1, last_error = ? WHERE id = ? AND state = 'queued'",
                [(now, error, i) for i in ids],
            )
        )

    def expire(self, target: str, now: float) -> int:
        """Move a target's rows older than their max age to the dead letters; how many moved."""
        return self._recorded(
            lambda db: (
                db.execute(
                    "UPDATE notifications SET state = 'dead', finished_at = ?, "
                    "last_error = 'expired: not delivered within queue.max_age; last error: ' "
                    "|| last_error WHERE target = ? AND state = 'queued' AND expires_at <= ?",
                    (now, target, now),
                ).rowcount
            )
        )

    def prune(self, now: float, dead_letter_retention: float) -> None:
        """Forget delivered rows past the dedup window and dead letters past their retention."""

        def forget(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM notifications WHERE state = 'delivered' AND finished_at < ?",
                (now - self.dedup_window,),
            )
            db.execute(
                "DELETE FROM notifications WHERE state = 'dead' AND finished_at < ?",
                (now - dead_letter_retention,),
            )

        self._recorded(forget)

    def states(self) -> dict[str, TargetState]:
        """Queue depth, oldest queued time and dead letters per target."""
        rows = self._query(
            "SELECT target, state, COUNT(*), MIN(queued_at) FROM notifications "
            "WHERE state IN ('queued', 'dead') GROUP BY target, state"
        )
        found: dict[str, TargetState] = {}
        for target, state, count, oldest in rows:
            current = found.get(target, TargetState())
            if state == QUEUED:
                current = TargetState(count, oldest, current.dead)
            else:
                current = TargetState(current.queued, current.oldest_queued_at, count)
            found[target] = current
        return found

    def entries(self, state: str) -> list[Entry]:
        """Every row in a state, oldest first."""
        rows = self._query(
            f"SELECT {_COLUMNS} FROM notifications WHERE state = ? ORDER BY id", (state,)
        )
        return [Entry(*row) for row in rows]

    def requeue(self, entry_id: int, state: str, now: float) -> bool:
        """Make a queued or dead row due now, with a fresh max age; False if no such row."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE notifications SET state = 'queued', next_attempt_at = ?, queued_at = ?, "
                "expires_at = ? + (expires_at - received_at), received_at = ?, "
                "finished_at = NULL WHERE id = ? AND state = ?",
                (now, now, now, now, entry_id, state),
            )
            return cursor.rowcount > 0

    def drop(self, entry_id: int, state: str) -> bool:
        """Delete a queued or dead row; False if no such row."""
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM notifications WHERE id = ? AND state = ?", (entry_id, state)
            )
            return cursor.rowcount > 0


def _corrupt_message(path: str, problem: str) -> str:
    return (
        f"the queue file {path} is damaged ({problem}): new notifications are refused until "
        "the relay has moved it aside and read what it still can into a fresh file"
    )
