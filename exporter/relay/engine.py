"""The relay's engine: its durable queue, its metrics and one delivery worker per target.

`gpuload relay` puts its HTTP endpoint in front of it (`exporter.relay.daemon`); the exporter's
built-in alerting feeds it from its evaluator (`exporter.alerting.notify`). Both build it here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from exporter.relay import targets
from exporter.relay.config import RelayConfig
from exporter.relay.delivery import Worker
from exporter.relay.metrics import RelayMetrics
from exporter.relay.recovery import QueueCheck, Recovery, open_queue
from exporter.relay.templates import MessageSettings

# How long `Engine.stop` waits for the workers, all together: a delivery in flight past it is
# abandoned, its row stays queued for the next start.
STOP_SECONDS = 1.0


class Engine:
    """The queue, its metrics and the workers that deliver its rows, started and stopped together.

    Opening the queue may raise `sqlite3.Error`: the caller says what to change. A damaged
    queue file is recovered, at the start and while running (`exporter.relay.recovery`).
    ``quiet``: how a worker waits, before each send, for the commits in progress to finish, so
    that accepting notifications comes before sending them (the relay's HTTP endpoint).
    """

    def __init__(
        self, config: RelayConfig, *, quiet: Callable[[float], bool] | None = None
    ) -> None:
        self.queue, recovery = open_queue(config.queue.path, config.queue.dedup_window)
        settings = MessageSettings(
            grafana_url=config.message.grafana_url,
            grafana_dashboard=config.message.grafana_dashboard,
            timezone=config.message.timezone,
        )
        self.metrics = RelayMetrics(self.queue, list(config.targets))
        self.workers = {
            name: Worker(
                targets.build(target, settings),
                self.queue,
                config.delivery,
                self.metrics,
                quiet=quiet,
            )
            for name, target in config.targets.items()
        }
        if recovery is not None:
            self._recovered(recovery)
        self.check = QueueCheck(
            self.queue,
            config.queue.check_interval,
            damaged=self.metrics.queue_damaged.set,
            recovered=self._recovered,
        )

    def _recovered(self, recovery: Recovery) -> None:
        self.metrics.recoveries.inc()
        self.metrics.recovered_rows.labels("recovered").inc(recovery.recovered)
        self.metrics.recovered_rows.labels("lost").inc(recovery.lost)
        for worker in self.workers.values():
            worker.wake()

    def start(self) -> None:
        """Start the workers: they also deliver what an earlier run left queued."""
        for worker in self.workers.values():
            worker.start()
        self.check.start()

    def wake(self, target: str) -> None:
        """Have ``target``'s worker look at the queue now (a row was just committed for it)."""
        worker = self.workers.get(target)
        if worker is not None:
            worker.wake()

    def stop(self) -> None:
        """Stop the workers within STOP_SECONDS and close the queue; what is queued stays."""
        self.check.stop()
        for worker in self.workers.values():
            worker.stop()
        deadline = time.monotonic() + STOP_SECONDS
        for worker in self.workers.values():
            worker.join(timeout=max(deadline - time.monotonic(), 0.0))
        self.check.join(timeout=max(deadline - time.monotonic(), 0.0))
        self.queue.close()
