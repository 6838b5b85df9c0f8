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
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.utils import get_netrc_auth

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


def backoff(attempts: int, initial: float, ceiling: float) -> float:
    """Seconds before the next attempt: doubling from `initial` up to `ceiling`, half jittered."""
    base = min(ceiling, initial * 2 ** max(attempts - 1, 0))
    return base / 2 + random.uniform(0, base / 2)


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
        self._session = requests.Session()
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
            self._queue.dead(ids, self._clock(), f"cannot build the message: {error}"[:300])
            self._metrics.deliveries.labels(name, "rejected").inc(len(ids))
            return
        started = time.monotonic()
        outcome = self._send(request.url, request.body, dict(request.headers))
        self._metrics.duration.labels(name).observe(time.monotonic() - started)
        finished = self._clock()
        if outcome.delivered:
            self._queue.delivered(ids, finished)
            self._metrics.deliveries.labels(name, "delivered").inc(len(ids))
            if len(batch) > 1:
                self._metrics.digests.labels(name).inc()
            self._problems.resolve("send", "target %s: delivering again", name)
            return
        if not outcome.retry:
            self._queue.dead(ids, finished, outcome.reason)
            self._metrics.deliveries.labels(name, "rejected").inc(len(ids))
            log.error(
                "target %s: rejected %d notification(s) for good (%s); they are dead letters, "
                "see gpuload relay queue list --dead",
                name,
                len(ids),
                outcome.reason,
            )
            return
        attempts = max(entry.attempts for entry in batch) + 1
        delay = backoff(attempts, self._settings.backoff_initial, self._settings.backoff_max)
        if outcome.retry_after is not None:
            delay = max(delay, outcome.retry_after)
            self._not_before = max(self._not_before, finished + outcome.retry_after)
        self._queue.retry(ids, finished + delay, outcome.reason)
        self._metrics.deliveries.labels(name, "failed").inc(len(ids))
        self._problems.report(
            "send", "target %s: delivery failing (%s); retrying with backoff", name, outcome.reason
        )

    def _send(self, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        try:
            response = self._session.post(
                url,
                data=body,
                headers=headers,
                timeout=(CONNECT_TIMEOUT, self._timeout),
                allow_redirects=False,
                **self._environment_settings(url),
            )
        except requests.RequestException as error:
            # The exception's text holds the URL, which is a secret for most targets.
            return Outcome(False, True, f"{type(error).__name__} (no answer)")
        with response:
            return self.target.outcome(response.status_code, response.headers, response.content)

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
