"""The local evaluator: gpuload's shipped alerts, evaluated on the exporter's own samples.

For a node without Prometheus. After each collection cycle the samples go into a bounded
:class:`~exporter.alerting.history.History` and every alert's condition is evaluated on it, the
way the PromQL rules would on the same samples: a condition that holds makes the alert *pending*,
one that holds for the rule's ``for:`` makes it *firing*, and one that stops holding makes a firing
alert *resolved*. The conditions are the rules themselves: the recording and alerting rules that
:mod:`exporter.alerting.rules` renders from ``alert_rules/thresholds.yaml``, parsed
(:mod:`exporter.alerting.promql`) and evaluated on the history (:mod:`exporter.alerting.engine`)
with their names, labels, ``for:``, ``keep_firing_for:`` and annotations. Nothing here restates
a condition, so the local alerts, the recorded states and Prometheus's cannot drift.

Labels: every series gets the target labels ``instance`` and ``job`` that Prometheus would add.
``GPULoadExporterDown`` cannot be evaluated locally (see :func:`not_local`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from exporter.alerting import engine, promql, rules, templates
from exporter.alerting.engine import Vector
from exporter.alerting.history import SORTED_LABELS_KEPT, History, Labels, Sample
from exporter.alerting.thresholds import Thresholds, duration_seconds
from exporter.relay.payload import RESOLVED_VALUE

log = logging.getLogger(__name__)


def not_local(thresholds: Thresholds) -> dict[str, str]:
    """The alerts whose condition the exporter cannot see in its own samples, and why."""
    return {alert.name: alert.not_local for alert in rules.alerts(thresholds) if alert.not_local}


def partly_local(thresholds: Thresholds) -> dict[str, str]:
    """The alerts the exporter evaluates only in part, and which part."""
    return {
        alert.name: alert.partly_local for alert in rules.alerts(thresholds) if alert.partly_local
    }


# The roles (rules.recording_names) of the recorded series that say what state each GPU is in
# and the 5-min means it was judged on, which the doctor and the status page read: evaluated
# locally whether or not an alert reads them.
STATE_ROLES = ("state", "bottleneck", "busy", "mig_sm_active")


def state_records(thresholds: Thresholds) -> tuple[str, ...]:
    """The names of the recorded series of :data:`STATE_ROLES`."""
    names = rules.recording_names(thresholds)
    return tuple(names[role] for role in STATE_ROLES)


@dataclass(frozen=True)
class LocalRule:
    """One alert as the rendered rule defines it: its name, condition, `for:`, labels, texts."""

    name: str
    expr: promql.Expr
    for_seconds: float
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    keep_firing_seconds: float = 0.0
    # The quantity the `value` annotation formats, read when the alert resolves.
    reading: promql.Expr | None = None


@dataclass(frozen=True)
class RecordingRule:
    """One recording rule: the name it records, its expression and its extra labels."""

    record: str
    expr: promql.Expr
    labels: Mapping[str, str]


def local_rules(thresholds: Thresholds) -> list[LocalRule]:
    """The alerting rules that can be evaluated locally, in the rule files' order."""
    return [_local(alert) for alert in rules.alerts(thresholds) if not alert.not_local]


def _local(alert: rules.Alert) -> LocalRule:
    """An alert's definition, its condition parsed and its durations in seconds."""
    return LocalRule(
        name=alert.name,
        expr=promql.parse(alert.expr),
        for_seconds=float(duration_seconds(alert.for_)),
        labels=alert.labels,
        annotations=alert.annotations,
        keep_firing_seconds=float(duration_seconds(alert.keep_firing_for)),
        reading=promql.parse(alert.reading) if alert.reading else None,
    )


def _recordings(thresholds: Thresholds) -> list[RecordingRule]:
    """Every recording rule of a local group, parsed, in the order one step settles them."""
    return [
        RecordingRule(rule.record, promql.parse(rule.expr), dict(rule.labels))
        for groups in rules.rule_groups(thresholds).values()
        for group in groups
        if not group.not_local
        for rule in group.recordings()
    ]


@dataclass(frozen=True)
class RuleSet:
    """What the local evaluator evaluates, rendered and parsed once.

    ``recording`` holds the recording rules the local alerts and the states read, directly or
    through another, in the files' order.
    """

    alerts: list[LocalRule]
    recording: list[RecordingRule]

    @classmethod
    def of(cls, thresholds: Thresholds) -> RuleSet:
        """The rules rendered from ``thresholds``."""
        alerts = local_rules(thresholds)
        every = _recordings(thresholds)
        recorded = {rule.record for rule in every}
        read = [rule.expr for rule in alerts] + [r.reading for r in alerts if r.reading]
        needed = set(state_records(thresholds)) | engine.names_read(read, recorded)
        while True:
            more = engine.names_read((r.expr for r in every if r.record in needed), recorded)
            if more <= needed:
                break
            needed |= more
        return cls(alerts, [rule for rule in every if rule.record in needed])

    def _exprs(self) -> list[promql.Expr]:
        readings = [rule.reading for rule in self.alerts if rule.reading is not None]
        return [rule.expr for rule in self.alerts] + readings + [r.expr for r in self.recording]

    def _recorded(self) -> set[str]:
        return {rule.record for rule in self.recording}

    def families(self) -> frozenset[str]:
        """Every metric name the rules read, and the names they record."""
        recorded = self._recorded()
        return frozenset(engine.names_read(self._exprs(), recorded) | recorded)

    def horizon(self, keep: float = 60.0) -> Callable[[str], float]:
        """How long each family's samples are needed: see :func:`history_horizon`."""
        recorded = self._recorded()
        needed: dict[str, float] = {}
        for expr in self._exprs():
            for selector in promql.selectors(expr):
                reach = selector.offset + (
                    selector.range
                    if selector.range is not None
                    else (engine.LOOKBACK_SECONDS if selector.offset else 0.0)
                )
                for name in engine.names_read([selector], recorded):
                    needed[name] = max(needed.get(name, 0.0), reach)

        def horizon(name: str) -> float:
            return needed.get(name, 0.0) + keep

        return horizon


def _with(series: Labels, labels: Mapping[str, str]) -> Labels:
    """A recorded series' labels: the rule's own labels over the result's."""
    if not labels:
        return series
    return tuple(sorted({**dict(series), **labels}.items()))


@dataclass(frozen=True)
class Alert:
    """A pending or firing local alert (resolved ones are reported once, then forgotten)."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    value: float
    active_since: float
    firing_since: float | None = None
    resolved_at: float | None = None
    # When the condition of a firing alert with keep_firing_for stopped holding.
    kept_since: float | None = None

    @property
    def state(self) -> str:
        """``pending``, ``firing`` or ``resolved``."""
        if self.resolved_at is not None:
            return "resolved"
        return "pending" if self.firing_since is None else "firing"


@dataclass(frozen=True)
class Evaluated:
    """One evaluation, whole: what the state rules recorded and the alerts it left active.

    Readers on other threads (the status page) take it in one read, so a verdict never mixes
    the states of one evaluation with the alerts of the next.
    """

    at: float
    # Recorded name -> series -> value, for the names of :func:`state_records`.
    recorded: Mapping[str, Mapping[Labels, float]]
    alerts: tuple[Alert, ...]
    # When the evaluator saw its first samples: the rules' windows fill from then.
    since: float


def _resolved(alert: Alert, rule: LocalRule, series: Labels, readings: Vector, now: float) -> Alert:
    """The alert resolved at ``now``, with its value then where its reading has the series.

    The reading's series is the alert's, or the one whose labels are all the alert's (a reading
    aggregated over fewer labels than the condition keeps).
    """
    value = readings.get(series)
    if value is None:
        have = set(series)
        value = next((v for labels, v in readings.items() if set(labels) <= have), None)
    annotations = dict(alert.annotations)
    template = rule.annotations.get("value")
    if value is not None and template and not math.isnan(value):
        annotations[RESOLVED_VALUE] = templates.render(template, alert.labels, value)
    return replace(alert, resolved_at=now, annotations=annotations)


@dataclass
class _RuleState:
    rule: LocalRule
    active: dict[Labels, Alert] = field(default_factory=dict)


def warm_up_seconds(thresholds: Thresholds) -> float:
    """How long after a start the rules have every window they read whole again.

    The 5-minute means need the window; GPUUtilizationHigh and GPUJobHung need a `for:` of
    1-minute means, the first of which comes a short window after the start.
    """
    high = thresholds.alert("GPUUtilizationHigh").for_
    return float(
        max(
            duration_seconds(thresholds.window),
            duration_seconds(thresholds.short_window) + duration_seconds(high),
        )
    )


def history_horizon(thresholds: Thresholds, keep: float = 60.0) -> Callable[[str], float]:
    """How long the evaluator (and the status page's doctor) needs each family's samples.

    The longest range plus offset any local rule reads the family with (an instant selector
    with an offset looks back Prometheus's 5 minutes more), and ``keep`` for every name.
    """
    return RuleSet.of(thresholds).horizon(keep)


class Evaluator:
    """Evaluates the local rules after each collection and tracks pending/firing alerts."""

    def __init__(
        self,
        thresholds: Thresholds,
        *,
        instance: str,
        job: str = "gpuload",
        history: History | None = None,
        also_keep: Iterable[str] = (),
        interval: float = 0.0,
    ) -> None:
        self.thresholds = thresholds
        self.target_labels = (("instance", instance), ("job", job))
        parsed = RuleSet.of(thresholds)
        # The history keeps what the rules read, and what its other readers declare.
        keep = parsed.families() | frozenset(also_keep)
        self.history = history or History(parsed.horizon(), keep)
        self._recording = parsed.recording
        self._state_records = frozenset(state_records(thresholds))
        # The last evaluation, swapped in whole; None before the first.
        self.evaluated: Evaluated | None = None
        self._recorded: list[set[tuple[str, Labels]]] = [set() for _ in self._recording]
        self._collected: set[tuple[str, Labels]] = set()
        self._states = [_RuleState(rule) for rule in parsed.alerts]
        self._failing: set[str] = set()
        # A series' labels with the target's, as the same series come back every cycle.
        self._targeted: dict[Labels, Labels] = {}
        # Seconds between evaluations, as Prometheus's evaluation_interval (0: every observe).
        self.interval = interval
        self._evaluated_at: float | None = None
        # Alerts restored after a restart are held as they were until the history is whole
        # again: an empty history answers nothing, which is not "resolved".
        self._restored: set[tuple[str, Labels]] = set()
        self._hold_until = 0.0

    def restore(self, alerts: Iterable[tuple[Labels, Alert]], hold_until: float) -> int:
        """Take back the pending and firing alerts of a previous run; how many were known.

        ``alerts`` are (series, alert) pairs as :meth:`active` gave them. Until ``hold_until``
        each is kept as it was while its rule gives nothing for its series, so that a restart
        neither resolves it (the rules need a whole window of samples first) nor fires it anew;
        from then on it resolves when its condition no longer holds.
        """
        states = {state.rule.name: state for state in self._states}
        restored = 0
        for series, alert in alerts:
            state = states.get(alert.name)
            if state is None:
                continue  # a rule that no longer exists
            state.active[series] = alert
            self._restored.add((alert.name, series))
            restored += 1
        self._hold_until = hold_until
        return restored

    def active(self) -> list[tuple[Labels, Alert]]:
        """Every pending and firing alert with its series, as :meth:`restore` takes them."""
        return [(series, alert) for state in self._states for series, alert in state.active.items()]

    def observe(self, samples: Iterable[Sample], at: float) -> list[Alert]:
        """Add one collection's samples; evaluate if due; return what fired or resolved.

        An evaluation is due once the interval has passed since the last one, or when the clock
        has gone back.
        """
        collected = [self._with_target(sample) for sample in samples]
        current = {(sample.name, sample.labels) for sample in collected}
        # A series the exporter no longer gives goes stale, as a scrape without it makes it.
        self.history.add(collected, at, gone=self._collected - current)
        self._collected = current
        last = self._evaluated_at
        if last is not None and last <= at < last + self.interval:
            return []
        self._evaluated_at = at
        return self.evaluate(at)

    def _with_target(self, sample: Sample) -> Sample:
        labels = self._targeted.get(sample.labels)
        if labels is None:
            if len(self._targeted) >= SORTED_LABELS_KEPT:
                self._targeted.clear()
            merged = dict(sample.labels)
            merged.update(self.target_labels)
            labels = self._targeted[sample.labels] = tuple(sorted(merged.items()))
        return Sample(sample.name, labels, sample.value)

    def evaluate(self, now: float) -> list[Alert]:
        """Evaluate every rule at ``now``; return the alerts that changed to firing or resolved."""
        # The recording rules first, in the files' order, as one evaluation step of Prometheus
        # settles them before the alerts; each sees what the rules before it recorded.
        step = engine.Evaluation(self.history, now)
        kept: dict[str, dict[Labels, float]] = {name: {} for name in self._state_records}
        for index, rule in enumerate(self._recording):
            result = self._evaluate(rule.record, rule.expr, step)
            if result is None:
                continue
            samples = {
                _with(series, rule.labels): value
                for series, value in result.items()
                if not math.isnan(value)
            }
            current = {(rule.record, labels) for labels in samples}
            if rule.record in kept:
                kept[rule.record].update(samples)
            self.history.add(
                (Sample(rule.record, labels, value) for labels, value in samples.items()),
                now,
                gone=self._recorded[index] - current,
            )
            self._recorded[index] = current
            step.forget(rule.record)
        changed: list[Alert] = []
        for state in self._states:
            result = self._evaluate(state.rule.name, state.rule.expr, step)
            if result is not None:
                changed.extend(self._advance(state, result, now, step))
        since = self.history.started if self.history.started is not None else now
        self.evaluated = Evaluated(now, kept, tuple(self.alerts()), since)
        return changed

    def _evaluate(self, name: str, expr: promql.Expr, step: engine.Evaluation) -> Vector | None:
        """One rule's result by series (labels without the name); None when it fails."""
        try:
            result = engine.vector(step.value(expr))
        except engine.EvaluationError as error:
            # As in Prometheus, a failed evaluation changes nothing this time.
            if name not in self._failing:
                log.warning("local rule %s: %s", name, error)
                self._failing.add(name)
            return None
        self._failing.discard(name)
        return {engine.without_name(labels): value for labels, value in result.items()}

    def _advance(
        self, state: _RuleState, result: Vector, now: float, step: engine.Evaluation
    ) -> list[Alert]:
        rule = state.rule
        changed = []
        readings: Vector | None = None
        # Changed on a copy and swapped in whole: the status page reads the alerts from request
        # threads while this runs in the collection thread.
        active = dict(state.active)
        for series in list(active):
            if (rule.name, series) in self._restored:
                if series in result or now >= self._hold_until:
                    self._restored.discard((rule.name, series))
                else:
                    continue
            if series not in result:
                alert = active[series]
                if alert.firing_since is not None and rule.keep_firing_seconds:
                    # Prometheus's keep_firing_for: still firing, with its last value, until the
                    # condition has been gone that long.
                    kept_since = alert.kept_since if alert.kept_since is not None else now
                    if now - kept_since < rule.keep_firing_seconds:
                        active[series] = replace(alert, kept_since=kept_since)
                        continue
                del active[series]
                if alert.firing_since is not None:
                    if readings is None:
                        readings = self._readings(rule, step)
                    changed.append(_resolved(alert, rule, series, readings, now))
        for series, value in result.items():
            labels = {**dict(series), "alertname": rule.name, **rule.labels}
            previous = active.get(series)
            since = previous.active_since if previous else now
            firing = previous.firing_since if previous else None
            annotations = {
                name: templates.render(text, labels, value)
                for name, text in rule.annotations.items()
            }
            alert = Alert(rule.name, labels, annotations, value, since, firing)
            if firing is None and now - since >= rule.for_seconds:
                alert = replace(alert, firing_since=now)
                changed.append(alert)
            active[series] = alert
        state.active = active
        return changed

    def _readings(self, rule: LocalRule, step: engine.Evaluation) -> Vector:
        """The rule's reading now, by series; empty without one, or when it fails."""
        if rule.reading is None:
            return {}
        return self._evaluate(f"{rule.name} (its reading)", rule.reading, step) or {}

    def alerts(self) -> list[Alert]:
        """Every pending and firing alert."""
        return [alert for state in self._states for alert in state.active.values()]

    def firing(self) -> list[Alert]:
        """The firing alerts."""
        return [alert for alert in self.alerts() if alert.firing_since is not None]
