"""The alert thresholds: one YAML definition, read and validated into typed objects.

``alert_rules/thresholds.yaml`` is the only place the numbers live. The committed rule files are
rendered from it (:mod:`tools.render_rules`); the Helm chart and the local evaluator read it
through :func:`load`, so no second copy can drift. Its ``inhibit_rules`` are Alertmanager's, in
Alertmanager's syntax: local alerting applies them (:mod:`exporter.alerting.inhibition`), and
docs/runbooks.md shows the same block for an Alertmanager's configuration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from exporter.alerting.inhibition import InhibitRule
from exporter.matchers import EXAMPLE, Matcher, parse_matchers
from exporter.settings import ConfigError, load_yaml, one_line, read_input

# alert_rules/thresholds.yaml through the package's data folder (a link in the repository, the
# file itself in an installed wheel), so that an installed gpuload finds it too.
DEFAULT_PATH = Path(__file__).parent / "data" / "thresholds.yaml"
# docs/runbooks.md, likewise: the doctor quotes its advice.
RUNBOOKS_PATH = Path(__file__).parent / "data" / "runbooks.md"

SEVERITIES = ("info", "warning", "critical")

# Each alert and the parameters it takes besides `severity`, `for` and `keep_firing_for`, with
# their kinds:
# "ratio" (0..1), "number", "duration" (a Prometheus duration) or "xids" (a list of XID codes).
# The order is the order of the alerts in the rendered files.
PARAMETERS: Mapping[str, Mapping[str, str]] = {
    "GPUUtilizationLow": {"below": "ratio"},
    "GPUUtilizationHigh": {"above": "ratio"},
    "GPUJobHung": {"power_below": "ratio"},
    "GPUDataLoaderStarved": {"average_below": "ratio", "idle_above": "ratio"},
    "GPUMemoryBandwidthBound": {"dram_active_above": "ratio", "compute_pipes_below": "ratio"},
    "GPUMemoryNearlyFull": {"used_above": "ratio"},
    "GPULoadImbalance": {"spread_above": "ratio"},
    "GPUIdleAllocated": {"below": "ratio"},
    "GPUMIGUtilizationLow": {},
    "GPUThermalThrottling": {"active_above": "ratio"},
    "GPUPowerCapped": {"active_above": "ratio"},
    "GPUHardwareSlowdown": {"active_above": "ratio"},
    "GPUTemperatureHigh": {"margin_celsius": "number", "fallback_celsius": "number"},
    "GPUMemoryTemperatureHigh": {"above_celsius": "number"},
    "GPUPCIeLinkDegraded": {"busy_above": "ratio"},
    "GPUNVLinkDown": {},
    "GPUXidError": {"window": "duration", "xids": "xids"},
    "GPURecoveryActionRequired": {"window": "duration"},
    "GPUFellOffBus": {},
    "GPUECCUncorrectable": {"window": "duration"},
    "GPURowRemapPending": {},
    "GPURowRemapFailed": {},
    "GPUCountDropped": {"lookback": "duration"},
    "GPUVanished": {"lookback": "duration"},
    "GPULoadExporterDown": {},
    "GPULoadExporterAbsent": {},
    "GPULoadCollectorFailing": {},
    "GPULoadPodResourcesDown": {},
    "GPULoadNVMLDown": {},
    "GPULoadStale": {"max_age": "duration"},
}

# Alerts that judge another alert's window and so have no `for:` of their own: GPUJobHung and
# GPUUtilizationHigh split one condition by power, over one window (expressions.above_for).
SHARED_FOR: Mapping[str, str] = {"GPUJobHung": "GPUUtilizationHigh"}

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNIT_SECONDS = (86400, 3600, 60, 1)
# A label name in an inhibit rule's `equal`, as Alertmanager validates it.
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_INHIBIT_RULE_KEYS = ("source_matchers", "target_matchers", "equal")
# What follows `label_` in a kube-state-metrics label name: it writes a pod label's key with every
# character but letters, digits and `_` made `_` (app.kubernetes.io/team: app_kubernetes_io_team).
TEAM_LABEL = re.compile(r"^[a-zA-Z0-9_]+$")
DEFAULT_TEAM_LABEL = "team"


class ThresholdsError(ValueError):
    """The thresholds file is missing, unreadable or has a bad value; the message names the key."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def duration_seconds(text: str) -> int:
    """Return the seconds in a Prometheus duration made of d/h/m/s parts (``"1h30m"`` -> 5400).

    Raises:
        ValueError: ``text`` is not such a duration.
    """
    match = _DURATION.match(text)
    if not text or not match:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m or 1h")
    return sum(
        int(part or 0) * unit for part, unit in zip(match.groups(), _UNIT_SECONDS, strict=True)
    )


@dataclass(frozen=True)
class AlertThresholds:
    """One alert's severity, `for` duration and parameters, as the thresholds file sets them."""

    name: str
    severity: str
    for_: str
    parameters: Mapping[str, Any]
    # How long a firing alert keeps firing after its condition stops holding ("0s": not at all).
    keep_firing_for: str = "0s"

    def number(self, key: str) -> float:
        """Return a ratio or number parameter."""
        return float(self.parameters[key])

    def duration(self, key: str) -> str:
        """Return a duration parameter as written (``"1h"``)."""
        return str(self.parameters[key])

    def xids(self) -> tuple[int, ...]:
        """Return the XID codes this alert fires on."""
        return tuple(self.parameters["xids"])


@dataclass(frozen=True)
class BottleneckThresholds:
    """The settings only the bottleneck recording rules use (the rest reuse the alerts')."""

    link_busy_above: float
    nvlink_link_bytes_per_second: float


@dataclass(frozen=True)
class Thresholds:
    """All alert thresholds and the settings shared by the rules."""

    runbook_base_url: str
    exporter_job_regex: str
    in_use_memory_floor_bytes: int
    window: str
    short_window: str
    gap_tolerance: str
    # The pod label naming a pod's team, as kube-state-metrics' kube_pod_labels writes it after
    # `label_` (exporter.alerting.owners).
    team_label: str
    alerts: Mapping[str, AlertThresholds]
    bottlenecks: BottleneckThresholds
    # Alertmanager's inhibit rules, which local alerting applies to its notifications too.
    inhibit_rules: tuple[InhibitRule, ...] = ()

    def alert(self, name: str) -> AlertThresholds:
        """Return the thresholds of the alert called ``name``."""
        return self.alerts[name]

    def runbook_url(self, name: str) -> str:
        """Return the runbook section of alert ``name``: the base URL and its lowercase anchor."""
        return f"{self.runbook_base_url}#{name.lower()}"


def load(path: Path | str | None = None) -> Thresholds:
    """Read and validate the thresholds file (default: ``alert_rules/thresholds.yaml``).

    Raises:
        ThresholdsError: the file cannot be read or a value is missing, unknown or invalid.
    """
    source = Path(path) if path is not None else DEFAULT_PATH
    try:
        text = read_input(source)
    except ConfigError as error:
        raise ThresholdsError(f"thresholds file {source}: {error}") from None
    try:
        document = load_yaml(text, f"thresholds file {source}")
    except ConfigError as error:
        raise ThresholdsError(str(error)) from None
    return parse(document, origin=str(source))


def parse(document: object, origin: str = "thresholds") -> Thresholds:
    """Validate an already-parsed thresholds document.

    Raises:
        ThresholdsError: a value is missing, unknown or invalid; the message names its key path.
    """
    top = _mapping(document, origin, "")
    _no_unknown_keys(
        top,
        {
            "runbook_base_url",
            "exporter_job_regex",
            "in_use_memory_floor_bytes",
            "window",
            "short_window",
            "gap_tolerance",
            "team_label",
            "bottlenecks",
            "alerts",
            "inhibit_rules",
        },
        origin,
        "",
    )
    base_url = _string(top, "runbook_base_url", origin)
    job_regex = _job_regex(top, origin)
    floor = _memory_floor(top, origin)
    window, short_window, gap_tolerance = _windows(top, origin)
    team_label = _team_label(top, origin)
    alerts = _alerts(_mapping(top.get("alerts"), origin, "alerts"), origin)
    bottlenecks = _bottlenecks(top.get("bottlenecks"), origin)
    inhibit_rules = _inhibit_rules(top.get("inhibit_rules"), origin)
    return Thresholds(
        base_url.rstrip("/"),
        job_regex,
        floor,
        window,
        short_window,
        gap_tolerance,
        team_label,
        alerts,
        bottlenecks,
        inhibit_rules,
    )


def _job_regex(top: Mapping[str, Any], origin: str) -> str:
    """``exporter_job_regex``, which must compile: the rules match ``job`` with it."""
    job_regex = _string(top, "exporter_job_regex", origin)
    try:
        re.compile(job_regex)
    except re.error as error:
        raise ThresholdsError(
            f"{origin}: exporter_job_regex: {job_regex!r} is not a regex: {error}"
        ) from error
    return job_regex


def _team_label(top: Mapping[str, Any], origin: str) -> str:
    """``team_label``: a pod label's key as kube-state-metrics writes it, after ``label_``.

    Optional, ``team`` when left out: a thresholds file written before it keeps working.
    """
    label = top.get("team_label", DEFAULT_TEAM_LABEL)
    if not isinstance(label, str) or not TEAM_LABEL.match(label):
        raise ThresholdsError(
            f"{origin}: team_label: expected a pod label's key as kube-state-metrics writes it"
            " after label_ (letters, digits and _; app.kubernetes.io/team is"
            f" app_kubernetes_io_team), got {label!r}"
        )
    return label


def _memory_floor(top: Mapping[str, Any], origin: str) -> int:
    """``in_use_memory_floor_bytes``: a whole number of bytes."""
    floor = top.get("in_use_memory_floor_bytes")
    if not isinstance(floor, int) or isinstance(floor, bool) or floor < 0:
        raise ThresholdsError(
            f"{origin}: in_use_memory_floor_bytes: expected a whole number of bytes, got {floor!r}"
        )
    return floor


def _windows(top: Mapping[str, Any], origin: str) -> tuple[str, str, str]:
    """``window``, ``short_window`` and ``gap_tolerance``, the last longer than the short one."""
    window = _duration(top.get("window"), origin, "window")
    short_window = _duration(top.get("short_window"), origin, "short_window")
    gap_tolerance = _duration(top.get("gap_tolerance"), origin, "gap_tolerance")
    if duration_seconds(gap_tolerance) <= duration_seconds(short_window):
        raise ThresholdsError(
            f"{origin}: gap_tolerance: {gap_tolerance} is not longer than short_window"
            f" ({short_window}): the first sample after a gap is measured over gap_tolerance, a"
            " window that must hold the short one and the gap"
        )
    return window, short_window, gap_tolerance


def _alerts(entries: Mapping[str, Any], origin: str) -> dict[str, AlertThresholds]:
    """Every alert's thresholds; an alert that shares another's `for:` takes it from there."""
    _no_unknown_keys(entries, set(PARAMETERS), origin, "alerts")
    alerts = {}
    for name, kinds in PARAMETERS.items():
        if name not in entries:
            raise ThresholdsError(f"{origin}: alerts.{name}: missing")
        alerts[name] = _alert(name, kinds, entries[name], origin)
    for name, owner in SHARED_FOR.items():
        alerts[name] = replace(alerts[name], for_=alerts[owner].for_)
    return alerts


def _inhibit_rules(value: object, origin: str) -> tuple[InhibitRule, ...]:
    if not isinstance(value, list):
        raise ThresholdsError(
            f"{origin}: inhibit_rules: expected a list of Alertmanager inhibit rules ([] for"
            f" none), got {value!r}"
        )
    return tuple(
        _inhibit_rule(entry, origin, f"inhibit_rules[{index}]") for index, entry in enumerate(value)
    )


def _inhibit_rule(entry: object, origin: str, path: str) -> InhibitRule:
    fields = _mapping(entry, origin, path)
    unknown = sorted(set(fields) - set(_INHIBIT_RULE_KEYS))
    if unknown:
        # Alertmanager's older source_match / target_match forms included.
        raise ThresholdsError(
            f"{origin}: {path}.{unknown[0]}: unknown key, expected {', '.join(_INHIBIT_RULE_KEYS)}"
        )
    source = _matchers(fields.get("source_matchers"), origin, f"{path}.source_matchers")
    target = _matchers(fields.get("target_matchers"), origin, f"{path}.target_matchers")
    equal = fields.get("equal", [])
    if not isinstance(equal, list) or not all(
        isinstance(name, str) and _LABEL_NAME.match(name) for name in equal
    ):
        raise ThresholdsError(
            f"{origin}: {path}.equal: expected a list of label names like [instance, gpu],"
            f" got {equal!r}"
        )
    return InhibitRule(source, target, tuple(equal))


def _matchers(value: object, origin: str, path: str) -> tuple[Matcher, ...]:
    # Required, unlike in Alertmanager: an empty side would match every alert.
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ThresholdsError(
            f"{origin}: {path}: expected a non-empty list of matchers like [{EXAMPLE}],"
            f" got {value!r}"
        )
    matchers: list[Matcher] = []
    for index, text in enumerate(value):
        try:
            matchers.extend(parse_matchers(text))
        except ValueError as error:
            raise ThresholdsError(f"{origin}: {path}[{index}]: {error}") from error
    return tuple(matchers)


def _bottlenecks(entry: object, origin: str) -> BottleneckThresholds:
    fields = _mapping(entry, origin, "bottlenecks")
    kinds = {"link_busy_above": "ratio", "nvlink_link_bytes_per_second": "number"}
    _no_unknown_keys(fields, set(kinds), origin, "bottlenecks")
    values = {
        # _parameter has checked that a "ratio" or "number" is an int or a float.
        key: float(cast(float, _parameter(fields.get(key), kind, origin, f"bottlenecks.{key}")))
        for key, kind in kinds.items()
    }
    if values["nvlink_link_bytes_per_second"] <= 0:
        raise ThresholdsError(
            f"{origin}: bottlenecks.nvlink_link_bytes_per_second: expected a positive number"
        )
    return BottleneckThresholds(**values)


def _alert(name: str, kinds: Mapping[str, str], entry: object, origin: str) -> AlertThresholds:
    path = f"alerts.{name}"
    fields = _mapping(entry, origin, path)
    _no_unknown_keys(fields, {"severity", "for", "keep_firing_for", *kinds}, origin, path)
    severity = fields.get("severity")
    if severity not in SEVERITIES:
        raise ThresholdsError(
            f"{origin}: {path}.severity: expected one of {', '.join(SEVERITIES)}, got {severity!r}"
        )
    if name in SHARED_FOR:
        if "for" in fields:
            raise ThresholdsError(
                f"{origin}: {path}.for: {name} has no `for:` of its own: it judges"
                f" {SHARED_FOR[name]}'s, set it there"
            )
        for_ = "0s"  # replaced by the other alert's in parse()
    else:
        for_ = _duration(fields.get("for"), origin, f"{path}.for")
    keep = _duration(fields.get("keep_firing_for", "0s"), origin, f"{path}.keep_firing_for")
    parameters: dict[str, Any] = {}
    for key, kind in kinds.items():
        parameters[key] = _parameter(fields.get(key), kind, origin, f"{path}.{key}")
    return AlertThresholds(name, str(severity), for_, parameters, keep)


def _parameter(value: object, kind: str, origin: str, path: str) -> object:
    if kind == "duration":
        return _duration(value, origin, path)
    if kind == "xids":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value)
        ):
            raise ThresholdsError(f"{origin}: {path}: expected a list of XID codes, got {value!r}")
        return tuple(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ThresholdsError(f"{origin}: {path}: expected a number, got {value!r}")
    if kind == "ratio" and not 0 <= value <= 1:
        raise ThresholdsError(f"{origin}: {path}: expected a ratio between 0 and 1, got {value!r}")
    return value


def _duration(value: object, origin: str, path: str) -> str:
    text = str(value) if value is not None else ""
    try:
        duration_seconds(text)
    except ValueError as error:
        raise ThresholdsError(f"{origin}: {path}: {error}") from error
    return text


def _mapping(value: object, origin: str, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        where = f"{path}: " if path else ""
        raise ThresholdsError(f"{origin}: {where}expected a mapping, got {type(value).__name__}")
    return value


def _string(fields: Mapping[str, Any], key: str, origin: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value:
        raise ThresholdsError(f"{origin}: {key}: expected a non-empty string, got {value!r}")
    return value


def _no_unknown_keys(fields: Mapping[str, Any], known: set[str], origin: str, path: str) -> None:
    unknown = sorted(set(fields) - known)
    if unknown:
        prefix = f"{path}." if path else ""
        raise ThresholdsError(f"{origin}: {prefix}{unknown[0]}: unknown key")
