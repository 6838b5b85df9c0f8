"""Local alerting inside `gpuload serve`: history, evaluator and delivery, fed after each cycle.

Every cycle's samples go into the history; the rules are evaluated once per evaluation interval
(`alerting.evaluation_interval`, 15 s by default, as Prometheus evaluates its rules): over a full
5-minute window, evaluating is the costliest part of local alerting (`python -m bench.evaluation`).

With delivery targets, the pending and firing alerts are kept in the relay's queue database (table
``local_alerts``), so that a restart neither loses a resolve nor fires an alert anew, and a firing
alert is notified again every `alerting.repeat_interval`, as Alertmanager's repeat_interval.
The inhibit rules of the thresholds file mute notifications as an Alertmanager loading them would
(:mod:`exporter.alerting.inhibition`); an inhibited alert stays pending or firing all the same.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.alerting import history_file, provisional
from exporter.alerting.evaluator import Alert, Evaluator, warm_up_seconds
from exporter.alerting.from_prometheus import SamplingError, replay, sample_prometheus
from exporter.alerting.history import History, Labels, Sample, snapshot_samples
from exporter.alerting.inhibition import find_inhibitor
from exporter.alerting.thresholds import Thresholds, duration_seconds
from exporter.snapshot import Snapshot

if TYPE_CHECKING:
    # Only for its type: delivery (the relay's targets, jinja2, requests) is imported by the
    # daemon where alerting.delivery has targets, not by every exporter.
    from exporter.alerting.notify import AlertStore, Key, Notifier

log = logging.getLogger(__name__)

# Seconds between saves of the history to its file: what a crash may lose.
HISTORY_SAVE_INTERVAL = 60.0


def instance_label(listen_address: str, port: int) -> str:
    """What Prometheus would call this exporter: host:port, the host name on every interface.

    ``port`` is the port actually bound (the listen address may ask for port 0).
    """
    host = listen_address.rpartition(":")[0]
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


def _keeper(
    thresholds: Thresholds, path: str | Path | None, interval: float
) -> history_file.Keeper | None:
    """What keeps the history in ``path``: taken back when saved within the gap tolerance."""
    if path is None:
        return None
    return history_file.Keeper(Path(path), duration_seconds(thresholds.gap_tolerance), interval)


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
        repeat_interval: float = 0.0,
        now: float | None = None,
        history_path: str | Path | None = None,
        history_save_interval: float = HISTORY_SAVE_INTERVAL,
        history_prometheus: tuple[str, str] | None = None,
    ) -> None:
        """``history_prometheus``: (URL, instance label) to take the history from at start."""
        self.evaluator = Evaluator(
            thresholds,
            instance=instance,
            job=job,
            also_keep=also_keep,
            interval=evaluation_interval,
        )
        self.notifier = notifier
        # The same rules with shorter windows, fed until this evaluator's windows are whole;
        # then dropped with their history (see exporter.alerting.provisional).
        self.provisional: Evaluator | None = Evaluator(
            provisional.thresholds(thresholds),
            instance=instance,
            job=job,
            also_keep=also_keep,
            interval=evaluation_interval,
        )
        self._warm_up = warm_up_seconds(thresholds)
        # Where the history is kept across restarts (None: nowhere, every start is cold).
        self.keeper = _keeper(thresholds, history_path, history_save_interval)
        self._history_prometheus = history_prometheus
        self._first = True
        self.inhibit_rules = thresholds.inhibit_rules
        # Seconds between notifications of a firing alert (0: only when it fires and resolves).
        self.repeat_interval = repeat_interval
        self._notified: dict[Key, float] = {}
        self._store: AlertStore | None = None
        self._saved: object = None
        if notifier is not None:
            from exporter.alerting.notify import AlertStore

            self._store = AlertStore(notifier.queue.path)
            alerts, self._notified = self._store.load()
            # The rules need their whole windows again before a restored alert may resolve.
            started = time.time() if now is None else now
            hold = warm_up_seconds(thresholds) + evaluation_interval
            restored = self.evaluator.restore(alerts, hold_until=started + hold)
            if restored:
                log.info(
                    "local alerting: %d pending or firing alerts taken back from %s",
                    restored,
                    self._store.path,
                )

    def _take_history(self, samples: list[Sample], now: float) -> None:
        """Replay the last minutes Prometheus holds of this exporter, before the first samples.

        Prometheus adds its target's labels (instance, job, the chart's node...): each family
        keeps only the labels this exporter gives it, so that the replayed series are the live
        ones. A Prometheus that cannot answer means a cold start and one log line.
        """
        assert self._history_prometheus is not None
        url, instance = self._history_prometheus
        keys: dict[str, set[str]] = {}
        for sample in samples:
            keys.setdefault(sample.name, set()).update(key for key, _ in sample.labels)
        try:
            found = sample_prometheus(url, instance, warm_up_seconds(self.evaluator.thresholds))
        except SamplingError as error:
            log.warning("history not taken from Prometheus, a cold start: %s", error)
            return
        series: dict[str, dict[Labels, list[tuple[float, float]]]] = {}
        for name, family in found.items():
            if name not in keys:
                continue
            for labels, points in family.items():
                own = tuple((k, v) for k, v in labels if k in keys[name])
                merged = series.setdefault(name, {}).setdefault(own, [])
                merged.extend(point for point in points if point[0] < now)
        for family in series.values():
            for points in family.values():
                points.sort()
        replay(self.evaluator, series)
        log.info(
            "history taken from Prometheus at %s (instance %s): %d series",
            url,
            instance,
            sum(len(family) for family in series.values()),
        )

    @property
    def history(self) -> History:
        """The samples of the last minutes (and of the counters' last hour)."""
        return self.evaluator.history

    def observe(self, snapshot: Snapshot) -> list[Alert]:
        """Evaluate on a new snapshot; queue notifications for what fired, resolved or repeats.

        With a history file, the first snapshot's GPUs decide whether the saved history is taken
        back; the history is saved every ``history_save_interval`` after evaluating.
        """
        now = snapshot.completed_at
        if self.keeper is not None and self.keeper.uuids is None:
            self.keeper.start(self.history, [gpu.uuid for gpu in snapshot.gpus if gpu.uuid], now)
        samples = list(snapshot_samples(snapshot, self.history.keep))
        if self._first:
            self._first = False
            if self._history_prometheus is not None and self.history.now is None:
                self._take_history(samples, now)
        changed = self.observe_samples(samples, now)
        if self.keeper is not None:
            self.keeper.tick(self.history, now)
        return changed

    def observe_samples(self, samples: Iterable[Sample], now: float) -> list[Alert]:
        """:meth:`observe` on one cycle's samples, taken at ``now``."""
        # The alerts before this evaluation: the series of those that resolve in it.
        previous = self.evaluator.active() if self.notifier is not None else []
        samples = list(samples)
        changed = self.evaluator.observe(samples, now)
        self._observe_provisional(samples, now)
        for alert in changed:
            log.info(
                "local alert %s %s: %s",
                alert.name,
                alert.state,
                alert.annotations.get("description", ""),
            )
        if self.notifier is None:
            return changed
        active = self.evaluator.active()
        outgoing = self._resolves(changed, previous) + self._firing(changed, active, now)
        keys = {(alert.name, series) for series, alert in active}
        self._notified = {k: at for k, at in self._notified.items() if k in keys}
        if outgoing:
            self.notifier.send(outgoing, now)
        self._save(active)
        return changed

    def _observe_provisional(self, samples: list[Sample], now: float) -> None:
        """Feed the provisional rules while the rules' windows fill; drop them once whole."""
        if self.provisional is None:
            return
        started = self.history.started
        if started is not None and now - started >= self._warm_up:
            self.provisional = None
            return
        self.provisional.observe(samples, now)

    def _resolves(self, changed: list[Alert], previous: list[tuple[Labels, Alert]]) -> list[Alert]:
        """The resolved alerts whose firing was notified.

        An alert inhibited all the while it fired sends no resolve: its receivers never heard of
        it. One notified before its inhibition began (an XID 79 paged before GPUFellOffBus's
        `for:` had passed) does, even while its source still fires, where Alertmanager mutes
        it: a resolve pages nobody, and without it the incident its firing opened (a PagerDuty
        page) would stay open.
        """
        resolves = []
        for alert in changed:
            if alert.resolved_at is None:
                continue
            series = next((s for s, a in previous if a.labels == alert.labels), None)
            if (alert.name, series) in self._notified:
                resolves.append(alert)
        return resolves

    def _firing(
        self, changed: list[Alert], active: list[tuple[Labels, Alert]], now: float
    ) -> list[Alert]:
        """The firing alerts to notify now: those that fired, or repeat, and are not inhibited.

        An alert inhibited when it fired is notified once its inhibition ends (its source
        resolved) if it still fires, as Alertmanager would; while inhibited it neither fires
        nor repeats.
        """
        firing = [alert.labels for _series, alert in active if alert.firing_since is not None]
        outgoing = []
        for series, alert in active:
            if alert.firing_since is None:
                continue
            source = find_inhibitor(alert.labels, firing, self.inhibit_rules)
            if source is not None:
                if alert in changed:
                    log.info(
                        "local alert %s not notified: inhibited by %s",
                        alert.name,
                        source.get("alertname", ""),
                    )
                continue
            key = (alert.name, series)
            last = self._notified.get(key)
            if last is None or (self.repeat_interval and now - last >= self.repeat_interval):
                outgoing.append(alert)
                self._notified[key] = now
        return outgoing

    def _save(self, active: list[tuple[Labels, Alert]]) -> None:
        """Keep the alerts in the queue database when they changed (not every evaluation)."""
        assert self._store is not None
        state = [
            (
                alert.name,
                series,
                alert.firing_since,
                alert.kept_since,
                self._notified.get((alert.name, series)),
            )
            for series, alert in active
        ]
        if state == self._saved:
            return
        if self._store.save(active, self._notified):
            self._saved = state

    def alerts(self) -> list[Alert]:
        """The pending and firing alerts now."""
        return self.evaluator.alerts()

    def start(self) -> None:
        """Start delivering."""
        if self.notifier is not None:
            self.notifier.start()

    def stop(self) -> None:
        """Stop delivering and save the history; what is queued stays queued on disk."""
        if self.keeper is not None and self.history.now is not None:
            self.keeper.save(self.history, self.history.now)
        if self.notifier is not None:
            self.notifier.stop()
        if self._store is not None:
            self._store.close()
