"""Each GPU's verdict as the rules recorded it: what the doctor prints and the status page shows.

Nothing here judges a GPU. A verdict is read from one evaluation of the local evaluator
(:class:`~exporter.alerting.evaluator.Evaluated`), the same series Prometheus records from the
same rule files:

- its state, ``gpu:gpu_state:5m`` (one of :data:`~exporter.alerting.rules.STATES`);
- the 5-minute mean that state was judged on, ``gpu:gpu_busy:ratio5m``;
- its bottleneck classes, ``gpu:gpu_bottleneck:class5m``, each with the mean it was judged on;
- the alerts pending or firing on the GPU or one of its MIG instances, with their values.

How much a GPU needs a person follows from those alone (:func:`attention`): a lost GPU or a
firing critical alert is a ``fault``; a pending or firing alert above ``info``, a bottleneck class
whose alert is above ``info`` (or that has none, as ``nvlink_bound``), or the state
``underutilized`` (the fleet's "look at me"), a ``warning``; a GPU
in use whose load the rules cannot measure (``unmeasured``) is ``unknown``; anything else ``ok``.
Until the evaluator has seen a whole warm-up (:func:`~exporter.alerting.evaluator.warm_up_seconds`)
the means cover less than their window and the verdict says it is warming up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.alerting import precedence, rules
from exporter.alerting.evaluator import Alert, Evaluated, warm_up_seconds
from exporter.alerting.thresholds import Thresholds, duration_seconds

# Attention levels, the most urgent first.
LEVELS = ("fault", "warning", "unknown", "ok")
# The series each verdict names its GPU by, besides the recorded ones.
FAMILIES = frozenset({"gpu_info", "gpu_up", "gpu_xid_errors_total"})

# The state of a GPU the rules recorded none for yet: a verdict's one state besides the rules'.
UNRECORDED = "unknown"
# What each state and bottleneck class means, in a few words for a person.
STATE_WORDS = {
    "idle": "nothing running on it",
    "underutilized": "in use, but busy less than GPUUtilizationLow's threshold",
    "healthy": "busy, within the utilization thresholds",
    "saturated": "busy above GPUUtilizationHigh's threshold",
    "lost": "lost: NVML answers GPU_IS_LOST",
    "unmeasured": "in use; its load cannot be measured (no utilization, no GPM)",
    UNRECORDED: "no state recorded yet",
}
BOTTLENECK_WORDS = {
    "input_starved": "input-starved: busy in bursts, fully idle in between",
    "underutilized": "underutilized: in use but mostly idle",
    "memory_bandwidth_bound": "memory-bandwidth-bound: busy moving data, not computing",
    "hung": "hung: looks busy but draws no power (a stuck collective?)",
    "compute_bound": "compute-bound: busy computing",
    "thermal_throttled": "thermal throttling: clocks held down by heat",
    "power_capped": "power-capped: clocks held down by the power limit",
    "pcie_bound": "PCIe-bound: host transfers fill the link",
    "nvlink_bound": "NVLink-bound: GPU-to-GPU transfers fill the links",
    "imbalanced": "imbalanced: well behind the busiest GPU of the node",
    "none": "nothing holds it back",
}

# What each class's value is, ``{window}`` and ``{short}`` the rules' windows in words.
BOTTLENECK_VALUES = {
    "input_starved": "utilization, {window} mean",
    "underutilized": "utilization, {window} mean",
    "memory_bandwidth_bound": "DRAM active, {window} mean",
    "hung": "power of its limit, the highest {short} mean in {window}",
    "compute_bound": "utilization, {window} mean",
    "thermal_throttled": "share of time throttled by heat, over {window}",
    "power_capped": "share of time capped by power, over {window}",
    "pcie_bound": "PCIe link busy, {window} mean",
    "nvlink_bound": "NVLink busy, {window} mean",
    "imbalanced": "behind the busiest GPU, in {window} means of utilization",
    "none": "utilization, {window} mean",
}


def window_words(window: str) -> str:
    """A rules' window in words: ``5m`` -> ``5-min``, ``90s`` -> ``90-s``."""
    seconds = int(duration_seconds(window))
    return f"{seconds // 60}-min" if seconds % 60 == 0 else f"{seconds}-s"


def span_words(seconds: float) -> str:
    """A duration in words: ``6 min``, ``30 s``, ``1 min 30 s``."""
    minutes, rest = divmod(max(0, round(seconds)), 60)
    if not minutes:
        return f"{rest} s"
    return f"{minutes} min" + (f" {rest} s" if rest else "")


def value_words(bottleneck: str, thresholds: Thresholds) -> str:
    """What a bottleneck class's value is, with the rules' windows: ``utilization, 5-min mean``."""
    text = BOTTLENECK_VALUES.get(bottleneck, "{window} value")
    return text.format(
        window=window_words(thresholds.window), short=window_words(thresholds.short_window)
    )


def needs_a_look(attention: str) -> bool:
    """Whether a GPU of this attention needs a person: ``fault`` or ``warning``."""
    return attention in ("fault", "warning")


def needs_a_person(alert: Alert) -> bool:
    """Whether an alert is above info: a pending or firing one makes its GPU a warning or fault."""
    return _alert_rank(alert)[0] < 2


@dataclass(frozen=True)
class Bottleneck:
    """One class of ``gpu:gpu_bottleneck:class5m`` a GPU is in, with the mean it was judged on."""

    name: str
    value: float
    runbook_url: str
    # Whether it needs a person: its alert's severity is above info (or it has no alert).
    finding: bool
    # What the value is: ``utilization, 5-min mean``.
    measure: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "bottleneck": self.name,
            "value": self.value,
            "measure": self.measure,
            "finding": self.finding,
            "text": BOTTLENECK_WORDS.get(self.name, self.name),
            "runbook_url": self.runbook_url,
        }


@dataclass(frozen=True)
class Instance:
    """One MIG GPU instance: its SM activity's 5-minute mean and its alerts."""

    instance: str
    profile: str
    sm_active: float | None
    alerts: tuple[Alert, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "mig_instance": int(self.instance),
            "mig_profile": self.profile,
            "sm_active_5m": self.sm_active,
            "alerts": [alert_json(alert) for alert in self.alerts],
        }


@dataclass(frozen=True)
class Verdict:
    """One GPU as the rules recorded it at one evaluation."""

    gpu: str
    uuid: str
    name: str
    state: str
    # gpu:gpu_busy:ratio5m: the 5-minute mean the state was judged on (None: not measured).
    busy: float | None
    bottlenecks: tuple[Bottleneck, ...]
    # The alerts on the whole GPU, then those on its MIG instances (also in ``instances``).
    alerts: tuple[Alert, ...]
    instances: tuple[Instance, ...]
    attention: str
    # Whether the rules' means still cover less than their window.
    warming_up: bool = False

    @property
    def healthy(self) -> bool:
        """Whether the GPU is known to need nothing done: its attention is ``ok``."""
        return self.attention == "ok"

    def worst(self) -> Alert | Bottleneck | None:
        """The worst real problem: an alert above info or a finding, by :mod:`precedence`."""
        ranked: list[tuple[tuple[int, int, int], Alert | Bottleneck]] = [
            ((1, precedence.rank(rules.BOTTLENECK_ALERTS.get(b.name)), 0), b)
            for b in self.bottlenecks
            if b.finding
        ]
        for alert in self.alerts:
            if needs_a_person(alert):
                severity, place, _pending, _name = _alert_rank(alert)
                ranked.append(((severity, place, 1), alert))
        return min(ranked, key=lambda pair: pair[0])[1] if ranked else None

    def headline(self) -> str:
        """The word a GPU goes by: its worst problem (``hung``, an alert's name), else its state."""
        if not needs_a_look(self.attention) or self.state == "lost":
            return self.state
        worst = self.worst()
        if isinstance(worst, Bottleneck):
            return worst.name.replace("_", "-")
        return worst.name if worst is not None else self.state

    def summary(self) -> str:
        """The one line that says what is wrong (its worst problem), or what it does."""
        worst = self.worst()
        if isinstance(worst, Bottleneck):
            return BOTTLENECK_WORDS.get(worst.name, worst.name)
        if worst is not None:
            return worst.annotations.get("summary") or worst.name
        healthy = [b for b in self.bottlenecks if b.name != "none"]
        if healthy and self.state not in ("lost", "unknown"):
            return BOTTLENECK_WORDS.get(healthy[0].name, healthy[0].name)
        if self.warming_up and self.state in ("unmeasured", "unknown"):
            return "warming up: the 5-min means need a whole window of samples"
        return STATE_WORDS.get(self.state, self.state)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "gpu": int(self.gpu),
            "uuid": self.uuid,
            "name": self.name,
            "state": self.state,
            "busy_5m": self.busy,
            "attention": self.attention,
            "healthy": self.healthy,
            "headline": self.headline(),
            "warming_up": self.warming_up,
            "summary": self.summary(),
            "bottlenecks": [b.to_json() for b in self.bottlenecks],
            "alerts": [alert_json(alert) for alert in self.alerts],
            "mig_instances": [instance.to_json() for instance in self.instances],
        }


@dataclass(frozen=True)
class Verdicts:
    """Every GPU's verdict at one evaluation, and how far the rules' windows have filled."""

    at: float
    gpus: dict[str, Verdict]
    # Alerts on no GPU (NVML down, the exporter's own).
    node_alerts: tuple[Alert, ...]
    seen_seconds: float
    warm_up_seconds: float
    # The rules' window (``5m``): what every mean of a verdict is taken over.
    window: str

    @property
    def mean_words(self) -> str:
        """How a figure over the window is labelled: ``5-min mean``."""
        return f"{window_words(self.window)} mean"

    @property
    def warming_up(self) -> bool:
        """Whether the 5-minute means still cover less than their window."""
        return self.seen_seconds < self.warm_up_seconds

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view (without the GPUs, which their readers place themselves)."""
        return {
            "evaluated_at": self.at,
            "warming_up": self.warming_up,
            "seen_seconds": round(self.seen_seconds, 3),
            "warm_up_seconds": self.warm_up_seconds,
            "window": self.window,
        }


def alert_json(alert: Alert) -> dict[str, Any]:
    """One pending or firing alert as the doctor and the status page give it."""
    return {
        "alertname": alert.name,
        "severity": alert.labels.get("severity", ""),
        "state": alert.state,
        "value": alert.value,
        "summary": alert.annotations.get("summary", ""),
        "description": alert.annotations.get("description", ""),
        "runbook_url": alert.annotations.get("runbook_url", ""),
        "since": alert.firing_since if alert.firing_since is not None else alert.active_since,
        **(
            {"mig_instance": int(alert.labels["mig_instance"])}
            if "mig_instance" in alert.labels
            else {}
        ),
    }


def _alert_rank(alert: Alert) -> tuple[int, int, int, str]:
    """(severity rank, precedence, firing before pending, name): critical 0, warning 1, else 2."""
    severity = alert.labels.get("severity", "")
    rank = {"critical": 0, "warning": 1}.get(severity, 2)
    return (rank, precedence.rank(alert.name), alert.firing_since is None, alert.name)


def attention(state: str, bottlenecks: tuple[Bottleneck, ...], alerts: tuple[Alert, ...]) -> str:
    """How much a GPU needs a person: fault, warning, unknown or ok (see the module's text)."""
    ranks = [_alert_rank(alert) for alert in alerts]
    if state == "lost" or any(rank == 0 and not pending for rank, _p, pending, _n in ranks):
        return "fault"
    if any(rank < 2 for rank, _p, _pending, _n in ranks) or any(b.finding for b in bottlenecks):
        return "warning"
    if state == "underutilized":
        return "warning"
    if state in ("unmeasured", "unknown"):
        return "unknown"
    return "ok"


# Why no sample names a GPU: NVML answered GPU_IS_LOST before the exporter could read its name
# and UUID (its gpu_up 0 has no uuid label, and it has no gpu_info).
LOST_BEFORE_READ = "lost before it was read"


def unidentified(what: str, lost: bool) -> str:
    """What stands for a GPU's ``what`` (name, UUID) where no sample carries it, and why."""
    return f"{what} unknown: {LOST_BEFORE_READ if lost else 'in no sample yet'}"


def read(
    evaluated: Evaluated | None,
    thresholds: Thresholds,
    identities: Mapping[str, tuple[str, str]],
) -> Verdicts | None:
    """The verdicts of one evaluation (None before the first).

    ``identities`` are the GPUs to give a verdict for, index -> (name, UUID) as the exporter
    read them ("" where it could not); a GPU the evaluation recorded nothing for is ``unknown``.
    """
    if evaluated is None:
        return None
    names = rules.recording_names(thresholds)
    recorded = evaluated.recorded
    states = _by_gpu(recorded.get(names["state"], {}))
    busy = _by_gpu(recorded.get(names["busy"], {}))
    classes = _bottlenecks(recorded.get(names["bottleneck"], {}), thresholds)
    sm_active = _sm_active(recorded.get(names["mig_sm_active"], {}))
    on_gpu: dict[str, list[Alert]] = {}
    node_alerts: list[Alert] = []
    for alert in evaluated.alerts:
        if "gpu" in alert.labels:
            on_gpu.setdefault(alert.labels["gpu"], []).append(alert)
        else:
            node_alerts.append(alert)
    warm_up = warm_up_seconds(thresholds)
    gpus: dict[str, Verdict] = {}
    for gpu in sorted({*identities, *states, *on_gpu, *classes} - {""}, key=int):
        label = dict(states[gpu][0]) if gpu in states else {}
        model, uuid = identities.get(gpu, ("", ""))
        lost = label.get("state") == "lost"
        found = tuple(classes.get(gpu, []))
        alerts = tuple(sorted(on_gpu.get(gpu, []), key=_alert_rank))
        name = label.get("state", UNRECORDED)
        gpus[gpu] = Verdict(
            gpu,
            uuid or label.get("uuid") or unidentified("UUID", lost),
            model or unidentified("name", lost),
            name,
            busy[gpu][1] if gpu in busy else None,
            found,
            alerts,
            _instances(gpu, sm_active, alerts),
            attention(name, found, alerts),
            evaluated.at - evaluated.since < warm_up,
        )
    return Verdicts(
        evaluated.at,
        gpus,
        tuple(sorted(node_alerts, key=_alert_rank)),
        evaluated.at - evaluated.since,
        warm_up,
        thresholds.window,
    )


def _bottlenecks(
    series: Mapping[Any, float], thresholds: Thresholds
) -> dict[str, list[Bottleneck]]:
    """GPU index -> its bottleneck classes, in the order the rules record them."""
    order = list(rules.BOTTLENECK_ALERTS)
    classes: dict[str, list[Bottleneck]] = {}
    for labels, value in series.items():
        label = dict(labels)
        name = label.get("bottleneck", "")
        paired = rules.BOTTLENECK_ALERTS.get(name)
        finding = name != "none" and (
            paired is None or thresholds.alert(paired).severity not in ("info", "none")
        )
        bottleneck = Bottleneck(
            name, value, label.get("runbook_url", ""), finding, value_words(name, thresholds)
        )
        classes.setdefault(label.get("gpu", ""), []).append(bottleneck)
    return {gpu: sorted(found, key=lambda b: order.index(b.name)) for gpu, found in classes.items()}


def _sm_active(series: Mapping[Any, float]) -> dict[tuple[str, str], tuple[str, float]]:
    """(GPU index, MIG instance) -> (its profile, its SM activity's mean)."""
    found = {}
    for labels, value in series.items():
        label = dict(labels)
        key = (label.get("gpu", ""), label.get("mig_instance", ""))
        found[key] = (label.get("mig_profile", ""), value)
    return found


def _instances(
    gpu: str,
    sm_active: Mapping[tuple[str, str], tuple[str, float]],
    alerts: tuple[Alert, ...],
) -> tuple[Instance, ...]:
    """The MIG instances of a GPU that have an SM activity's mean or an alert."""
    instance_ids = {i for g, i in sm_active if g == gpu}
    instance_ids |= {a.labels["mig_instance"] for a in alerts if "mig_instance" in a.labels}
    instances = []
    for instance in sorted(instance_ids, key=int):
        on_instance = tuple(a for a in alerts if a.labels.get("mig_instance") == instance)
        profile, mean = sm_active.get((gpu, instance), ("", None))
        # An instance with alerts but no SM activity yet is named by its alerts' profile.
        profile = profile or next((a.labels.get("mig_profile", "") for a in on_instance), "")
        instances.append(Instance(instance, profile, mean, on_instance))
    return tuple(instances)


def _by_gpu(series: Mapping[Any, float]) -> dict[str, tuple[Any, float]]:
    """GPU index -> (labels, value) of a recorded family with one series per GPU."""
    found = {}
    for labels, value in series.items():
        gpu = dict(labels).get("gpu")
        if gpu is not None:
            found[gpu] = (labels, value)
    return found
