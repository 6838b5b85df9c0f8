"""The typed document of `/api/v1/status`: every object and key the status page is rendered from.

docs/status.md describes each field; ``tests/test_status_document.py`` checks that every document
served on every shipped scenario has exactly these keys, that the docs list the same ones, and the
invariants the docs state. Each key means one thing:

- a GPU's ``collection`` is whether the exporter reads it (up, stale, lost);
- a verdict's ``activity`` is the state the rules recorded (idle, healthy, saturated, ...);
- an alert's ``phase`` is pending or firing.

The key ``state``, which meant each of the three, is kept beside them with the same values for one
release, deprecated (:data:`DEPRECATED`).

Colours derive from a level: a bar's, a chip's or an alert's ``level`` is one of :data:`LEVELS`, and
where the level comes from an alert's threshold it is that alert's severity
(:func:`severity_level`); a card's colour is its GPU's ``severity`` (an attention level).
"""

from __future__ import annotations

from typing import Literal, TypedDict

# A reading's or an alert's level, the most urgent last: ``info`` is worth showing and needs no
# person, as an info alert.
Level = Literal["ok", "info", "warn", "crit"]
LEVELS: tuple[Level, ...] = ("ok", "info", "warn", "crit")
# The keys that meant more than one thing, kept for one release: (object, key) -> its new key.
DEPRECATED = {
    ("gpu", "state"): "collection",
    ("verdict", "state"): "activity",
    ("alert", "state"): "phase",
}
# An alert's severity -> the level it colours with; an unknown or missing severity is info.
_SEVERITY_LEVELS: dict[str, Level] = {"critical": "crit", "warning": "warn", "info": "info"}


def severity_level(severity: str) -> Level:
    """The level an alert of ``severity`` gives what crosses its threshold."""
    return _SEVERITY_LEVELS.get(severity, "info")


def worst(levels: list[Level]) -> Level:
    """The most urgent of ``levels`` (``ok`` for none)."""
    return max(levels, key=LEVELS.index, default="ok")


class Rules(TypedDict):
    """How far the rules' windows have filled at their last evaluation."""

    evaluated_at: float
    warming_up: bool
    seen_seconds: float
    warm_up_seconds: float
    window: str


class _Alert(TypedDict):
    """One pending or firing alert, without the keys only some have."""

    alertname: str
    severity: str
    state: str  # deprecated: phase
    phase: Literal["pending", "firing"]
    level: Level
    value: float
    summary: str
    description: str
    runbook_url: str
    since: float | None


class Alert(_Alert, total=False):
    """One pending or firing alert: on a MIG instance, with its ``mig_instance``."""

    mig_instance: int


class Bar(TypedDict):
    """One reading now, against the threshold of its alert."""

    name: str
    ratio: float | None
    text: str
    level: Level
    note: str
    mark: float | None


class Bottleneck(TypedDict):
    """One bottleneck class a GPU is in, with the mean it was judged on."""

    bottleneck: str
    value: float
    measure: str
    finding: bool
    text: str
    runbook_url: str


class Verdict(TypedDict):
    """A GPU as the rules recorded it at their last evaluation."""

    state: str  # deprecated: activity
    activity: str
    label: str
    summary: str
    busy_5m: float | None
    busy_text: str
    bottlenecks: list[Bottleneck]
    attention: Literal["fault", "warning", "unknown", "ok"]
    healthy: bool
    provisional: bool
    runbook_url: str
    evidence: list[str]


class ClockEvent(TypedDict):
    """One active clock event reason."""

    reason: str
    text: str
    level: Level


class MigInstance(TypedDict):
    """One MIG GPU instance: its bars now and its SM activity's mean."""

    instance: int
    profile: str
    gpm: bool
    bars: list[Bar]
    sm_active_5m: float | None
    sm_active_text: str


class Gpu(TypedDict):
    """One GPU's card."""

    index: int
    name: str
    uuid: str
    state: str  # deprecated: collection
    collection: Literal["up", "stale", "lost"]
    bars: list[Bar]
    clock_events: list[ClockEvent]
    throttled: bool
    last_xid: int
    xids: dict[str, int]
    critical_xids: list[str]
    xid_level: Level
    mig_mode: bool
    verdict: Verdict
    alerts: list[Alert]
    mig: list[MigInstance]
    severity: Literal["fault", "warning", "unknown", "ok"]


class AlertCounts(TypedDict):
    """How many alerts of one severity are pending and firing."""

    firing: int
    pending: int


class Summary(TypedDict):
    """The node's counts, each of the items it names."""

    gpus: int
    lost: int
    stale: int
    faults: int
    warnings: int
    firing: int
    pending: int
    info: int
    by_severity: dict[str, AlertCounts]


class Document(TypedDict):
    """The whole document of `/api/v1/status`."""

    version: str
    hostname: str
    simulated: str | None
    refresh_seconds: float
    nvml: Literal["starting", "up", "down"]
    updated_at: float | None
    rules: Rules | None
    gpus: list[Gpu]
    alerts: list[Alert]
    summary: Summary
