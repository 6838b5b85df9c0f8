"""Delivery workers: one thread per target, so a slow or broken target delays only itself.

A worker sends the target's oldest due notification, waits the target's
minimum interval, and goes on. While notifications are being committed it holds
its next message back (``YIELD_SECONDS`` at most): accepting comes first, as
Alertmanager waits for the answer and both need the same GIL. Failures are
retried with exponential backoff and jitter; a 429's Retry-After pauses the
whole target. Rows older than ``queue.max_age`` become dead letters, as do
those a target rejects for good (a 4xx other than 408/425/429). When at least
``delivery.storm_threshold`` notifications wait, the target's next message is a
digest of up to ``delivery.digest_max`` of them: one message within the
target's limits instead of a flood the rate limit would stretch over minutes.
The queue hands out one notification per incident at a time, so a digest holds
at most one of each group and a group's notifications go out in order.

The target's timeout bounds the whole request: connecting, sending and the
answer, which is read up to ``ANSWER_LIMIT`` bytes and no further. An attempt's
outcome is recorded in the queue before anything else is sent: if the queue
cannot record it (a full disk), the worker retries the record with backoff, not
the send. A notification sent but not yet recorded when the relay stops is sent
again at the next start: delivery is at least once.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import sqlite3
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.utils import get_netrc_auth
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from exporter.problems import ProblemLog
from exporter.relay import payload
from exporter.relay.config import DeliveryConfig
from exporter.relay.metrics import RelayMetrics
from exporter.relay.queue import Entry, Queue
from exporter.relay.targets import Outcome, Target

log = logging.getLogger(__name__)

# Longest sleep between looks at the queue: rows retried by `gpuload relay queue` are seen soon.
POLL_SECONDS = 1.0
CONNECT_TIMEOUT = 5.0
# Rows expire after queue.max_age (hours by default): looking once a second is soon enough, and
# spares a write transaction per message, which the commits of accepted notifications wait for.
EXPIRE_SECONDS = 1.0
# Longest a worker holds back its next message while notifications are being committed.
YIELD_SECONDS = 0.02
# Bytes of a target's answer read: enough for any verdict; a larger answer is cut off there.
ANSWER_LIMIT = 64 << 10
# Longest pause between tries to record an outcome while the queue cannot write.
STORAGE_BACKOFF_MAX = 30.0
# How often a request past its deadline is shut down again: one connecting at the deadline.
_SHUT_AGAIN_SECONDS = 0.05


def backoff(attempts: int, initial: float, ceiling: float) -> float:
    """Seconds before the next attempt: doubling from `initial` up to `ceiling`, half jittered."""
    base = min(ceiling, initial * 2 ** max(attempts - 1, 0))
    return base / 2 + random.uniform(0, base / 2)


class _Watchdog:
    """Shuts down the sockets of a worker's request still in progress at its deadline.

    requests' timeouts bound each read, not the exchange: a target trickling its answer a byte
    at a time would hold the worker for ever. Shutting the socket down ends the read at once.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._changed = threading.Condition()
        self._deadline: float | None = None
        self._connections: list[HTTPConnection] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.expired = False

    def arm(self, seconds: float) -> None:
        """Start timing a request: its connections are shut down `seconds` from now."""
        with self._changed:
            self._deadline = time.monotonic() + seconds
            self._connections = []
            self.expired = False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"deadline-{self._name}", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def disarm(self) -> None:
        """The request is over, in time or not."""
        with self._changed:
            self._deadline = None
            self._connections = []

    def watch(self, connection: HTTPConnection) -> None:
        """A connection the timed request uses."""
        with self._changed:
            if self._deadline is None:
                return
            self._connections.append(connection)
            if self.expired:
                _shut(connection)

    def close(self) -> None:
        """End the watchdog's thread."""
        with self._changed:
            self._closed = True
            self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                if self._deadline is None:
                    self._changed.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self.expired = True
                for connection in self._connections:
                    _shut(connection)
                self._changed.wait(_SHUT_AGAIN_SECONDS)


def _shut(connection: HTTPConnection) -> None:
    """End every read and write on the connection's socket; closing is left to its owner."""
    sock = connection.sock
    if sock is None:
        return
    # socket.socket's own shutdown, not SSLSocket's, which would first drop the TLS state that
    # the worker's thread is reading with. An error means it is already closed or shut down.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


# The watchdog of the delivery this thread has in progress, for the pools below.
_attempt = threading.local()


def _watched(connection: Any) -> Any:
    watchdog = getattr(_attempt, "watchdog", None)
    if watchdog is not None and isinstance(connection, HTTPConnection):
        watchdog.watch(connection)
    return connection


class _HTTPPool(HTTPConnectionPool):
    """A pool that shows each connection it lends to the thread's watchdog."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        return _watched(super()._get_conn(timeout))


class _HTTPSPool(HTTPSConnectionPool):
    """A pool that shows each connection it lends to the thread's watchdog."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        return _watched(super()._get_conn(timeout))


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter, with the pools above directly and through an HTTP proxy."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Make the pool manager, lending watched connections."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """Make a proxy's pool manager; a SOCKS proxy's keeps its own pools (per-read timeouts)."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = _POOLS
        return manager


def _read_answer(response: requests.Response) -> bytes:
    """The answer's body, up to ANSWER_LIMIT bytes; past that the connection is dropped."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(16 << 10):
        chunks.append(chunk)
        size += len(chunk)
        if size >= ANSWER_LIMIT:
            break
    return b"".join(chunks)[:ANSWER_LIMIT]


class Worker:
    """Delivers one target's queue on a thread of its own."""

    def __init__(
        self,
        target: Target,
        queue: Queue,
        settings: DeliveryConfig,
        metrics: RelayMetrics,
        *,
        clock: Callable[[], float] = time.time,
        quiet: Callable[[float], bool] | None = None,
    ) -> None:
        self.target = target
        self._queue = queue
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._quiet = quiet
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._not_before = 0.0
        self._next_expiry = 0.0
        self._problems = ProblemLog(log)
        # An attempt's outcome not recorded yet, and when to try again after a storage error.
        self._unrecorded: Callable[[], object] | None = None
        self._storage_failures = 0
        self._storage_retry_at = 0.0
        self._watchdog = _Watchdog(target.name)
        self._session = requests.Session()
        self._session.mount("http://", _WatchedAdapter())
        self._session.mount("https://", _WatchedAdapter())
        # A compressed answer would hold far more than ANSWER_LIMIT bytes of text.
        self._session.headers["Accept-Encoding"] = "identity"
        # requests reads the proxy, CA bundle and netrc settings from the environment on every
        # request: half a millisecond of Python, a third of a local delivery, taken from the
        # HTTP threads accepting notifications (one GIL). They are read once per origin.
        self._session.trust_env = False
        self._environment: dict[tuple[str, str], dict[str, Any]] = {}
        self._timeout = target.config.timeout or settings.timeout
        self._thread = threading.Thread(
            target=self._run, name=f"deliver-{target.name}", daemon=True
        )

    def start(self) -> None:
        """Start delivering in the background."""
        self._thread.start()

    def wake(self) -> None:
        """Look at the queue now: something was added."""
        self._wake.set()

    def stop(self) -> None:
        """Ask the worker to stop after its current attempt."""
        self._stop.set()
        self._wake.set()
        self._watchdog.close()

    def join(self, timeout: float) -> None:
        """Wait for the worker; an attempt still hanging is abandoned and its rows stay queued."""
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.step()
            except Exception:  # the worker's boundary: log, pause, go on
                log.exception("target %s: delivery failed unexpectedly", self.target.name)
                delay = POLL_SECONDS
            if delay > 0:
                self._wake.wait(min(delay, POLL_SECONDS))
                self._wake.clear()
            elif self._quiet is not None:
                # Accepting comes first: Alertmanager waits for the answer, and sending holds
                # the GIL that the HTTP threads need. Held back for a bounded time, a worker
                # still sends at least one message per YIELD_SECONDS under a flood.
                self._quiet(YIELD_SECONDS)

    def step(self) -> float:
        """One look at the queue: send at most one message; seconds until the next look."""
        now = self._clock()
        if now < self._storage_retry_at:
            return self._storage_retry_at - now
        try:
            if self._unrecorded is not None:
                # Recorded before anything else is sent: the outcome of a send is never lost
                # while the relay runs, and the send is never repeated for want of a record.
                self._unrecorded()
                self._unrecorded = None
            delay = self._look(now)
        except sqlite3.Error as error:
            return self._storage_failed(now, error)
        if self._storage_failures:
            self._storage_failures = 0
            name = self.target.name
            self._problems.resolve("storage", "target %s: the queue records again", name)
        return delay

    def _storage_failed(self, now: float, error: sqlite3.Error) -> float:
        self._storage_failures += 1
        ceiling = min(self._settings.backoff_max, STORAGE_BACKOFF_MAX)
        delay = backoff(self._storage_failures, self._settings.backoff_initial, ceiling)
        self._storage_retry_at = now + delay
        # The next look writes first (the expiry): a read that succeeds says nothing of the
        # write that failed, and "records again" after it would be false.
        self._next_expiry = 0.0
        if self._unrecorded is not None:
            self._problems.report(
                "storage",
                "target %s: cannot record a delivery attempt in the queue (%s); retrying the "
                "record with backoff, sending nothing meanwhile (free space for the queue file)",
                self.target.name,
                error,
            )
        else:
            self._problems.report(
                "storage",
                "target %s: cannot use the queue (%s); retrying with backoff",
                self.target.name,
                error,
            )
        return delay

    def _record(self, record: Callable[[], object]) -> None:
        """Record an attempt's outcome now, or, if the queue fails, before anything else."""
        self._unrecorded = record
        record()
        self._unrecorded = None

    def _look(self, now: float) -> float:
        if now >= self._next_expiry:
            self._next_expiry = now + EXPIRE_SECONDS
            self._expire(now)
        if now < self._not_before:
            return self._not_before - now
        limit = self._settings.digest_max if self.target.digests else 1
        due = self._queue.due(self.target.name, now, limit)
        if not due:
            upcoming = self._queue.next_attempt(self.target.name)
            return POLL_SECONDS if upcoming is None else max(upcoming - now, 0.01)
        batch = due if len(due) >= self._settings.storm_threshold else due[:1]
        self._deliver(batch, now)
        self._not_before = max(self._not_before, self._clock() + self.target.interval)
        return 0.0

    def _expire(self, now: float) -> None:
        expired = self._queue.expire(self.target.name, now)
        if expired:
            self._metrics.deliveries.labels(self.target.name, "expired").inc(expired)
            log.warning(
                "target %s: %d notification(s) not delivered within queue.max_age moved to "
                "the dead letters (see gpuload relay queue list --dead)",
                self.target.name,
                expired,
            )

    def _deliver(self, batch: Sequence[Entry], now: float) -> None:
        name = self.target.name
        ids = [entry.id for entry in batch]
        try:
            notifications = [payload.parse(entry.body) for entry in batch]
            request = self.target.request(notifications, now)
        except Exception as error:  # a row we cannot render becomes a dead letter, kept
            log.exception("target %s: cannot build the message", name)
            self._metrics.deliveries.labels(name, "rejected").inc(len(ids))
            reason = f"cannot build the message: {error}"[:300]
            self._record(partial(self._queue.dead, ids, self._clock(), reason))
            return
        started = time.monotonic()
        outcome = self._send(request.url, request.body, dict(request.headers))
        self._metrics.duration.labels(name).observe(time.monotonic() - started)
        finished = self._clock()
        if outcome.delivered:
            self._metrics.deliveries.labels(name, "delivered").inc(len(ids))
            if len(batch) > 1:
                self._metrics.digests.labels(name).inc()
            self._problems.resolve("send", "target %s: delivering again", name)
            self._record(partial(self._queue.delivered, ids, finished))
            return
        if not outcome.retry:
            self._metrics.deliveries.labels(name, "rejected").inc(len(ids))
            log.error(
                "target %s: rejected %d notification(s) for good (%s); they are dead letters, "
                "see gpuload relay queue list --dead",
                name,
                len(ids),
                outcome.reason,
            )
            self._record(partial(self._queue.dead, ids, finished, outcome.reason))
            return
        attempts = max(entry.attempts for entry in batch) + 1
        delay = backoff(attempts, self._settings.backoff_initial, self._settings.backoff_max)
        if outcome.retry_after is not None:
            delay = max(delay, outcome.retry_after)
            self._not_before = max(self._not_before, finished + outcome.retry_after)
        self._metrics.deliveries.labels(name, "failed").inc(len(ids))
        self._problems.report(
            "send", "target %s: delivery failing (%s); retrying with backoff", name, outcome.reason
        )
        self._record(partial(self._queue.retry, ids, finished + delay, outcome.reason))

    def _send(self, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        """POST within the target's timeout, all told: connecting, sending and the answer."""
        settings = self._environment_settings(url)
        self._watchdog.arm(self._timeout)
        _attempt.watchdog = self._watchdog
        try:
            with self._session.post(
                url,
                data=body,
                headers=headers,
                timeout=(min(CONNECT_TIMEOUT, self._timeout), self._timeout),
                allow_redirects=False,
                stream=True,
                **settings,
            ) as response:
                answer = _read_answer(response)
        except requests.RequestException as error:
            if self._watchdog.expired:
                return self._timed_out()
            # The exception's text holds the URL, which is a secret for most targets: only the
            # cause, in words, from the socket error underneath.
            return Outcome(False, True, f"no answer: {_cause(error)}")
        finally:
            _attempt.watchdog = None
            self._watchdog.disarm()
        if self._watchdog.expired:
            # Cut off mid-answer, whatever the part read seemed to say.
            return self._timed_out()
        return self.target.outcome(response.status_code, response.headers, answer)

    def _timed_out(self) -> Outcome:
        return Outcome(False, True, f"timed out after {self._timeout:g} s (no complete answer)")

    def _environment_settings(self, url: str) -> dict[str, Any]:
        """What requests would take from the environment for `url`: proxies, verify, cert, auth."""
        parts = urlsplit(url)
        origin = (parts.scheme, parts.netloc)
        settings = self._environment.get(origin)
        if settings is None:
            with requests.Session() as reader:
                found = reader.merge_environment_settings(url, {}, None, None, None)
            settings = {
                "proxies": found["proxies"],
                "verify": found["verify"],
                "cert": found["cert"],
                "auth": get_netrc_auth(url),
            }
            self._environment[origin] = settings
        return settings


def _cause(error: BaseException) -> str:
    """Why a request got no answer, in words (``connection refused``), never the URL."""
    causes = (
        (ConnectionRefusedError, "connection refused"),
        (ConnectionResetError, "connection reset"),
        (TimeoutError, "timed out"),
        (socket.gaierror, "unknown host name"),
        (ssl.SSLError, "TLS handshake failed"),
    )
    # requests wraps urllib3, which keeps the socket's error as `reason` or as the cause.
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for kind, words in causes:
            if isinstance(current, kind):
                return words
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked += [arg for arg in current.args if isinstance(arg, BaseException)]
        pending += [item for item in linked if isinstance(item, BaseException)]
    return type(error).__name__
