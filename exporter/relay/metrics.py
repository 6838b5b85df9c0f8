"""The relay's own metrics, on a dedicated registry.

Counters and the latency histogram are instrumented directly; queue depth,
oldest queued age and dead letters are read from the queue file at scrape time,
so they are right after a restart and after `gpuload relay queue` changes.
Target names are labels; URLs and keys never are.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.relay.queue import Queue, TargetState

log = logging.getLogger(__name__)


class QueueCollector(Collector):
    """Queue depth, oldest queued age and dead letters per target, from the queue file."""

    def __init__(self, queue: Queue, targets: Sequence[str], clock: Callable[[], float]) -> None:
        self._queue = queue
        self._targets = targets
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        """Yield the three gauge families; nothing if the file cannot be read."""
        try:
            states = self._queue.states()
        except sqlite3.Error as error:
            log.warning("cannot read the queue for /metrics: %s", error)
            return
        depth = GaugeMetricFamily(
            "gpuload_relay_queue_depth",
            "Notifications waiting for delivery (or a retry) to the target.",
            labels=["target"],
        )
        oldest = GaugeMetricFamily(
            "gpuload_relay_oldest_queued_age_seconds",
            "Seconds the target's oldest waiting notification has been queued; 0 when none waits.",
            labels=["target"],
        )
        dead = GaugeMetricFamily(
            "gpuload_relay_dead_letters",
            "Notifications the relay gave up delivering to the target (too old or rejected), "
            "kept for `gpuload relay queue`.",
            labels=["target"],
        )
        now = self._clock()
        for target in sorted({*self._targets, *states}):
            state = states.get(target, TargetState())
            depth.add_metric([target], state.queued)
            age = 0.0 if state.oldest_queued_at is None else max(now - state.oldest_queued_at, 0)
            oldest.add_metric([target], age)
            dead.add_metric([target], state.dead)
        yield depth
        yield oldest
        yield dead


class RelayMetrics:
    """The relay's registry and its directly instrumented families."""

    def __init__(
        self, queue: Queue, targets: Sequence[str], clock: Callable[[], float] = time.time
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.received = Counter(
            "gpuload_relay_notifications_received",
            "Alertmanager notifications accepted (answered 200 after they were committed).",
            registry=self.registry,
        )
        self.rejected = Counter(
            "gpuload_relay_requests_rejected",
            "Inbound requests refused, by reason: unauthorized, too_large, no_length, "
            "malformed, method, storage (the queue could not commit; answered 503).",
            ["reason"],
            registry=self.registry,
        )
        self.duplicates = Counter(
            "gpuload_relay_duplicates",
            "Notifications for a target that were already queued or delivered (Alertmanager "
            "re-sends), not delivered again.",
            ["target"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "gpuload_relay_deliveries",
            "Notifications by delivery outcome: delivered, failed (will be retried), "
            "rejected (the target refused it for good) or expired (older than queue.max_age).",
            ["target", "outcome"],
            registry=self.registry,
        )
        self.digests = Counter(
            "gpuload_relay_digests",
            "Digest messages sent, each coalescing several waiting notifications.",
            ["target"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpuload_relay_delivery_duration_seconds",
            "Seconds one HTTP request to the target took, answered or not.",
            ["target"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.queue_damaged = Gauge(
            "gpuload_relay_queue_damaged",
            "1 while the queue file is found damaged (new notifications refused, answered 503) "
            "until it is recovered, else 0.",
            registry=self.registry,
        )
        self.recoveries = Counter(
            "gpuload_relay_queue_recoveries",
            "Damaged queue files moved aside and read back into a fresh one, at start or "
            "while running.",
            registry=self.registry,
        )
        self.recovered_rows = Counter(
            "gpuload_relay_queue_recovered_rows",
            "Rows of damaged queue files by outcome: recovered (read back), or lost (an index "
            "names them and their page cannot be read).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("recovered", "lost"):
            self.recovered_rows.labels(outcome)
        for target in targets:
            for outcome in ("delivered", "failed", "rejected", "expired"):
                self.deliveries.labels(target, outcome)
            self.duplicates.labels(target)
            self.digests.labels(target)
            self.duration.labels(target)
        self.registry.register(QueueCollector(queue, targets, clock))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
