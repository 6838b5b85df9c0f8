"""Local alerting inside `gpuload serve`: history, evaluator and delivery, fed after each cycle.

Every cycle's samples go into the history; the rules are evaluated once per evaluation interval
(`alerting.evaluation_interval`, 15 s by default, as Prometheus evaluates its rules): over a full
5-minute window, evaluating is the costliest part of local alerting (`python -m bench.evaluation`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.alerting.evaluator import Alert, Evaluator
from exporter.alerting.history import History, snapshot_samples
from exporter.alerting.thresholds import Thresholds
from exporter.collection import Snapshot

if TYPE_CHECKING:
    # Only for its type: delivery (the relay's targets, jinja2, requests) is imported by the
    # daemon where alerting.delivery has targets, not by every exporter.
    from exporter.alerting.notify import Notifier

log = logging.getLogger(__name__)


def instance_label(listen_address: str, port: int) -> str:
    """What Prometheus would call this exporter: host:port, the host name on every interface.

    ``port`` is the port actually bound (the listen address may ask for port 0).
    """
    host = listen_address.rpartition(":")[0]
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


class LocalAlerting:
    """Evaluates the shipped alerts on each snapshot and hands changes to the notifier, if any."""

    def __init__(
        self,
        thresholds: Thresholds,
        *,
        instance: str,
        job: str = "gpuload",
        notifier: Notifier | None = None,
        also_keep: Iterable[str] = (),
        evaluation_interval: float = 0.0,
    ) -> None:
        self.evaluator = Evaluator(
            thresholds,
            instance=instance,
            job=job,
            also_keep=also_keep,
            interval=evaluation_interval,
        )
        self.notifier = notifier

    @property
    def history(self) -> History:
        """The samples of the last minutes (and of the counters' last hour)."""
        return self.evaluator.history

    def observe(self, snapshot: Snapshot) -> list[Alert]:
        """Evaluate on a new snapshot; queue notifications for what fired or resolved."""
        samples = snapshot_samples(snapshot, self.history.keep)
        changed = self.evaluator.observe(samples, snapshot.completed_at)
        for alert in changed:
            log.info(
                "local alert %s %s: %s",
                alert.name,
                alert.state,
                alert.annotations.get("description", ""),
            )
        if changed and self.notifier is not None:
            self.notifier.send(changed, snapshot.completed_at)
        return changed

    def alerts(self) -> list[Alert]:
        """The pending and firing alerts now."""
        return self.evaluator.alerts()

    def start(self) -> None:
        """Start delivering."""
        if self.notifier is not None:
            self.notifier.start()

    def stop(self) -> None:
        """Stop delivering; what is queued stays queued on disk."""
        if self.notifier is not None:
            self.notifier.stop()
