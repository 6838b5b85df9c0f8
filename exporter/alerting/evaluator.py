"""The local evaluator: gpuload's shipped alerts, evaluated on the exporter's own samples.

For a node without Prometheus. After each collection cycle the samples go into a bounded
:class:`~exporter.alerting.history.History` and every alert's condition is evaluated on it, the
way the PromQL rules would on the same samples: a condition that holds makes the alert *pending*,
one that holds for the rule's ``for:`` makes it *firing*, and one that stops holding makes a firing
alert *resolved*. Names, labels, ``for:`` durations and annotations (rendered from the same
templates, with the same functions) come from the rules that :mod:`exporter.alerting.rules`
renders from ``alert_rules/thresholds.yaml``, so the local and the Prometheus alerts cannot drift;
the conditions are written here once more, in Python, next to the PromQL they mirror, and the
shared test vectors in ``alert_rules/vectors/`` run through both and must agree.

Labels: every series gets the target labels ``instance`` and ``job`` that Prometheus would add.
``GPULoadExporterDown`` cannot be evaluated locally (see :data:`NOT_LOCAL`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from operator import itemgetter
from typing import TypeVar

from exporter.alerting import rules, templates
from exporter.alerting.history import SORTED_LABELS_KEPT, History, Labels, Point, Sample
from exporter.alerting.thresholds import Thresholds, duration_seconds

log = logging.getLogger(__name__)

# Alerts whose condition the exporter cannot see in its own samples, and why.
NOT_LOCAL: Mapping[str, str] = {
    "GPULoadExporterDown": "it is Prometheus's `up`: an exporter cannot observe that it cannot be "
    "scraped (a process that is down evaluates nothing)",
    "GPULoadExporterAbsent": "it is Prometheus's `up` and kube-state-metrics: an exporter that is "
    "not running evaluates nothing",
    "GPUCountDropped": "it compares with the GPUs reported before a restart, which a restarted "
    "exporter no longer has (while it runs, gpuload drops no GPU: a lost one reads gpu_up 0, "
    "and while NVML is down every GPU is absent, which GPULoadNVMLDown reports)",
    "GPUVanished": "the same: a GPU goes missing only across a restart of the exporter",
}
# Parts of alerts that cannot be evaluated locally, though the alert is.
_HELD = (
    "only its condition: the branch that keeps it firing while Prometheus cannot scrape the "
    "exporter reads `up` and `ALERTS`, which a running exporter never sees"
)
PARTLY_LOCAL: Mapping[str, str] = {
    "GPUUtilizationLow": _HELD,
    "GPUDataLoaderStarved": _HELD,
    "GPUMIGUtilizationLow": _HELD,
    "GPULoadStale": "only its `gpuload_gpu_stale` branch: the evaluator runs right after each "
    "collection cycle, so the age of the last collection is always fresh when it looks",
}

GPU_KEYS = ("instance", "job", "gpu", "uuid")
# The short means the rules record (rules.recording_names: avg_short, idle_short,
# mig_sm_active_short, power_short), under names of the evaluator's own history.
RECORDED_UTILIZATION = "local:gpu_utilization:mean_short"
RECORDED_IDLE = "local:gpu_idle:mean_short"
RECORDED_MIG_SM_ACTIVE = "local:gpu_mig_sm_active:mean_short"
RECORDED_POWER = "local:gpu_power_usage:ratio_short"
RECORDED = (RECORDED_UTILIZATION, RECORDED_IDLE, RECORDED_MIG_SM_ACTIVE, RECORDED_POWER)
NODE_KEYS = ("job", "instance", "node")
# Prometheus's lookback for an instant selector (`x offset 1h` finds a sample up to 5m older).
LOOKBACK_SECONDS = 300.0
# Every metric name the conditions below read: an evaluator's history keeps these and no others.
FAMILIES = frozenset(
    {
        "gpu_up",
        "gpu_processes",
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
        "gpu_mig_memory_used_bytes",
        "gpu_mig_memory_total_bytes",
        "gpu_mig_sm_active_seconds_total",
        "gpu_power_usage_watts",
        "gpu_power_limit_watts",
        "gpu_nvlink_link_down",
        "gpu_utilization_seconds_total",
        "gpu_idle_seconds_total",
        "gpu_dram_active_seconds_total",
        *(f"gpu_{pipe}_active_seconds_total" for pipe in rules.COMPUTE_PIPES),
        "gpu_pod_info",
        "gpu_clock_event_active",
        "gpu_temperature_celsius",
        "gpu_temperature_slowdown_threshold_celsius",
        "gpu_pcie_link_generation",
        "gpu_pcie_link_max_generation",
        "gpu_pcie_link_width",
        "gpu_pcie_link_max_width",
        "gpu_xid_errors_total",
        "gpu_ecc_errors_total",
        "gpu_row_remap_pending",
        "gpu_row_remap_failed",
        "gpu_retired_pages_pending",
        "gpuload_collector_success",
        "gpuload_nvml_up",
        "gpuload_kubernetes_pod_resources_up",
        "gpuload_last_collection_timestamp_seconds",
        "gpuload_gpu_stale",
        # The recorded short means, which the evaluator records into its history as Prometheus
        # does (the alerts read their last value, and their lowest and highest over a window).
        *RECORDED,
    }
)

Vector = dict[Labels, float]
T = TypeVar("T")


def _project(labels: Labels, keys: Iterable[str]) -> Labels:
    wanted = set(keys)
    return tuple(pair for pair in labels if pair[0] in wanted)


def _without(labels: Labels, *names: str) -> Labels:
    return tuple(pair for pair in labels if pair[0] not in names)


def _label(labels: Labels, name: str) -> str:
    return dict(labels).get(name, "")


def where(vector: Vector, keep: Callable[[float], bool]) -> Vector:
    """A comparison with a scalar as a filter (``x > 0.5``): the elements that pass."""
    return {labels: value for labels, value in vector.items() if keep(value)}


def and_on(left: Vector, right: Vector | Iterable[Labels], keys: Iterable[str] | None) -> Vector:
    """``left and on (keys) right``; ``keys`` None matches on every label."""
    key_list = None if keys is None else tuple(keys)
    present = {labels if key_list is None else _project(labels, key_list) for labels in right}
    return {
        labels: value
        for labels, value in left.items()
        if (labels if key_list is None else _project(labels, key_list)) in present
    }


def unless_on(left: Vector, right: Vector, keys: Iterable[str] | None) -> Vector:
    """``left unless on (keys) right``; ``keys`` None matches on every label."""
    key_list = None if keys is None else tuple(keys)
    present = {labels if key_list is None else _project(labels, key_list) for labels in right}
    return {
        labels: value
        for labels, value in left.items()
        if (labels if key_list is None else _project(labels, key_list)) not in present
    }


def or_(left: Vector, right: Vector) -> Vector:
    """``left or right``: all of left, and the elements of right whose labels left lacks."""
    return {**right, **left}


def aggregate_without(vector: Vector, drop: Iterable[str], pick: Callable[..., float]) -> Vector:
    """``max/min without (drop) (vector)`` with ``pick`` = max or min."""
    names = tuple(drop)
    groups: dict[Labels, list[float]] = {}
    for labels, value in vector.items():
        groups.setdefault(_without(labels, *names), []).append(value)
    return {labels: pick(values) for labels, values in groups.items()}


def aggregate_by(vector: Vector, keys: Iterable[str], pick: Callable[..., float]) -> Vector:
    """``max/min by (keys) (vector)``."""
    key_list = tuple(keys)
    groups: dict[Labels, list[float]] = {}
    for labels, value in vector.items():
        groups.setdefault(_project(labels, key_list), []).append(value)
    return {labels: pick(values) for labels, values in groups.items()}


def binary(
    left: Vector,
    right: Vector,
    op: Callable[[float, float], float],
    ignoring: tuple[str, ...] = (),
) -> Vector:
    """One-to-one ``left op ignoring (...) right``: like PromQL, the ignored labels are dropped."""
    by_key = {_without(labels, *ignoring): value for labels, value in right.items()}
    result = {}
    for labels, value in left.items():
        key = _without(labels, *ignoring)
        other = by_key.get(key)
        if other is not None:
            result[key] = op(value, other)
    return result


def compare(
    left: Vector,
    right: Vector,
    keep: Callable[[float, float], bool],
    ignoring: tuple[str, ...] = (),
) -> Vector:
    """A filtering comparison of two vectors (``left > ignoring (...) right``): left's values."""
    return {
        labels: value
        for labels, value in binary(
            left, right, lambda a, b: a if keep(a, b) else math.nan, ignoring
        ).items()
        if not math.isnan(value)
    }


def increase(points: list[Point], start: float, end: float) -> float | None:
    """Prometheus's ``increase()`` of a counter's samples in [start, end], extrapolated alike."""
    return _extrapolated(points, start, end, per_second=False)


def rate(points: list[Point], start: float, end: float) -> float | None:
    """Prometheus's ``rate()`` of a counter's samples in [start, end]: increase per second."""
    return _extrapolated(points, start, end, per_second=True)


def _extrapolated(points: list[Point], start: float, end: float, per_second: bool) -> float | None:
    """Prometheus 2.x's ``extrapolatedRate``, step for step, so that it rounds alike.

    A value below the previous one is a counter reset (the previous value is added back). The
    increase from the first to the last sample is extrapolated to each end of the range where a
    sample is within 1.1 average intervals of it, else by half an interval, and never to before
    the counter would have been zero. Prometheus scales by one factor (``rate()`` divides it by
    the range first): 285 * (1 / 300) is 0.9500000000000001, not 285 / 300.
    """
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    result = last_v - first_v
    previous = 0.0
    for _t, value in points:
        if value < previous:
            result += previous
        previous = value
    to_start, to_end = first_t - start, end - last_t
    sampled = last_t - first_t
    average = sampled / (len(points) - 1)
    if result > 0 and first_v >= 0:
        to_start = min(to_start, sampled * (first_v / result))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = interval / sampled
    if per_second:
        factor /= end - start
    return result * factor


class Context:
    """What one evaluation sees: the history at ``now``, with PromQL's selectors over it."""

    def __init__(self, history: History, now: float, window: float, gap: float = 0.0) -> None:
        self.history = history
        self.now = now
        self.window = window
        # thresholds.gap_tolerance in seconds: how long a missing reading is bridged.
        self.gap = gap
        # Several rules read the same window of the same family: selected once per evaluation.
        self._windows: dict[tuple[str, float], dict[Labels, list[Point]]] = {}

    def latest(self, name: str, **matchers: str) -> Vector:
        """An instant selector ``name{label=~"regex"}`` (values anchored like PromQL's)."""
        return _match(self.history.latest(name), matchers)

    def _in_window(self, name: str, seconds: float) -> dict[Labels, list[Point]]:
        """``name[seconds]``, selected once per evaluation: several rules read the same."""
        found = self._windows.get((name, seconds))
        if found is None:
            found = self._windows[(name, seconds)] = self.history.points(
                name, self.now - seconds, self.now
            )
        return found

    def over_time(
        self, name: str, pick: Callable[[list[float]], float], seconds: float | None = None
    ) -> Vector:
        """``pick_over_time(name[window])``; the result drops the metric name like PromQL."""
        value = itemgetter(1)
        return {
            labels: pick(list(map(value, points)))
            for labels, points in self._in_window(name, seconds or self.window).items()
        }

    def rate(self, name: str, seconds: float | None = None) -> Vector:
        """``rate(name[window])``: a counter's per-second increase over the window."""
        seconds = seconds or self.window
        result = {}
        for labels, points in self._in_window(name, seconds).items():
            value = rate(points, self.now - seconds, self.now)
            if value is not None:
                result[labels] = value
        return result

    def whole_window_rate(self, name: str, seconds: float | None = None) -> Vector:
        """``rate(name[window]) and last_over_time(name[gap] offset window)``."""
        seconds = seconds or self.window
        start = self.now - seconds
        scraped = self.history.points(name, start - self.gap, start)
        return {labels: v for labels, v in self.rate(name, seconds).items() if labels in scraped}

    def short_rate(self, name: str, seconds: float) -> Vector:
        """rules.short_rate: the mean over the short window per second of collection time.

        Over ``seconds``, else over the gap tolerance: where the counter was scraped up to a
        short window before the window starts and not reset over the gap tolerance; only at a
        fresh sample.
        """
        collected = {
            _project(labels, ("instance", "job")): points
            for labels, points in self.history.points(
                rules.COLLECTED_AT, self.now - self.gap, self.now
            ).items()
        }
        fresh = self.history.latest(name)
        before = self.history.points(name, self.now - self.gap - seconds, self.now)
        result: Vector = {}
        for length in (seconds, self.gap):
            start = self.now - length
            for labels, points in self._in_window(name, length).items():
                if labels in result or labels not in fresh:
                    continue
                earlier = before.get(labels, [])
                if not any(start - seconds <= t <= start for t, _ in earlier):
                    continue  # not scraped a window before the window starts
                recent = [v for t, v in earlier if t >= self.now - self.gap]
                if any(b < a for a, b in pairwise(recent)):
                    continue  # reset: the exporter restarted
                clock = [
                    point
                    for point in collected.get(_project(labels, ("instance", "job")), [])
                    if point[0] >= start
                ]
                busy, elapsed = rate(points, start, self.now), rate(clock, start, self.now)
                if busy is not None and elapsed:
                    result[labels] = busy / elapsed
        return result

    def last(self, name: str, seconds: float, **matchers: str) -> Vector:
        """``last_over_time(name{...}[seconds])``."""
        found = _match(self.history.points(name, self.now - seconds, self.now), matchers)
        return {labels: points[-1][1] for labels, points in found.items()}

    def increase(self, name: str, seconds: float, **matchers: str) -> Vector:
        """``increase(name{...}[seconds])``."""
        found = _match(self.history.points(name, self.now - seconds, self.now), matchers)
        result = {}
        for labels, points in found.items():
            value = increase(points, self.now - seconds, self.now)
            if value is not None:
                result[labels] = value
        return result

    def offset(self, name: str, seconds: float, **matchers: str) -> Vector:
        """``name{...} offset seconds``: the last sample within the lookback before then."""
        at = self.now - seconds
        found = _match(self.history.points(name, at - LOOKBACK_SECONDS, at), matchers)
        return {labels: points[-1][1] for labels, points in found.items()}


def _match(series: Mapping[Labels, T], matchers: Mapping[str, str]) -> dict[Labels, T]:
    if not matchers:
        return dict(series)
    patterns = {name: re.compile(pattern) for name, pattern in matchers.items()}
    return {
        labels: value
        for labels, value in series.items()
        if all(p.fullmatch(_label(labels, name)) for name, p in patterns.items())
    }


# The conditions, one function per alert, each beside the PromQL it mirrors.


def _in_use(ctx: Context, t: Thresholds) -> set[Labels]:
    """gpu:gpu_in_use:group: a process, or memory above the floor (of the GPU or a MIG instance).

    group without () (last_over_time(gpu_processes[gap]) > 0
    or last_over_time(gpu_memory_used_bytes[gap]) > floor
    or group without (mig_instance, mig_profile) (last_over_time(gpu_mig_memory_used_bytes[gap])
    > floor))
    """
    floor = t.in_use_memory_floor_bytes
    processes = where(ctx.last("gpu_processes", ctx.gap), lambda v: v > 0)
    memory = where(ctx.last("gpu_memory_used_bytes", ctx.gap), lambda v: v > floor)
    mig = where(ctx.last("gpu_mig_memory_used_bytes", ctx.gap), lambda v: v > floor)
    instances = {_without(labels, "mig_instance", "mig_profile"): 1.0 for labels in mig}
    return set(or_(or_(processes, memory), instances))


def _avg(ctx: Context) -> Vector:
    """gpu:gpu_utilization_seconds:rate5m, the mean utilization over the window."""
    return ctx.whole_window_rate("gpu_utilization_seconds_total")


def _short(t: Thresholds) -> float:
    return float(duration_seconds(t.short_window))


def record(ctx: Context, t: Thresholds) -> list[Sample]:
    """The short means the recording rules record, to add to the history at ``ctx.now``.

    rules.short_rate of the utilization, fully idle and MIG SM activity counters, and
    avg_over_time(gpu_power_usage_watts[short]) / last_over_time(gpu_power_limit_watts[gap]).
    """
    short = _short(t)
    power = binary(
        ctx.over_time("gpu_power_usage_watts", lambda v: sum(v) / len(v), short),
        ctx.last("gpu_power_limit_watts", ctx.gap),
        lambda usage, limit: usage / limit if limit else float("nan"),
    )
    recorded = (
        (RECORDED_UTILIZATION, ctx.short_rate("gpu_utilization_seconds_total", short)),
        (RECORDED_IDLE, ctx.short_rate("gpu_idle_seconds_total", short)),
        (RECORDED_MIG_SM_ACTIVE, ctx.short_rate("gpu_mig_sm_active_seconds_total", short)),
        (RECORDED_POWER, power),
    )
    return [
        Sample(name, labels, value)
        for name, vector in recorded
        for labels, value in vector.items()
        if not math.isnan(value)
    ]


def utilization_low(ctx: Context, t: Thresholds) -> Vector:
    """last_over_time(rate1m[gap]) < below and on (GPU) in_use."""
    below = t.alert("GPUUtilizationLow").number("below")
    low = where(ctx.last(RECORDED_UTILIZATION, ctx.gap), lambda v: v < below)
    return and_on(low, _in_use(ctx, t), GPU_KEYS)


def _above_for(ctx: Context, t: Thresholds) -> Vector:
    """rules.above_for: min_over_time(rate1m[for]) > above, recorded a `for:` ago."""
    high = t.alert("GPUUtilizationHigh")
    window = float(duration_seconds(high.for_))
    lowest = where(
        ctx.over_time(RECORDED_UTILIZATION, min, window), lambda v: v > high.number("above")
    )
    start = ctx.now - window
    covered = ctx.history.points(RECORDED_UTILIZATION, start - ctx.gap, start)
    return {labels: value for labels, value in lowest.items() if labels in covered}


def _hung_power(ctx: Context, t: Thresholds) -> Vector:
    """rules.hung_power: max_over_time(power ratio[for]) < power_below and on (GPU) in_use."""
    window = float(duration_seconds(t.alert("GPUUtilizationHigh").for_))
    below = t.alert("GPUJobHung").number("power_below")
    highest = where(ctx.over_time(RECORDED_POWER, max, window), lambda v: v < below)
    return and_on(highest, _in_use(ctx, t), GPU_KEYS)


def job_hung(ctx: Context, t: Thresholds) -> Vector:
    """hung_power and on (GPU) above_for."""
    return and_on(_hung_power(ctx, t), _above_for(ctx, t), GPU_KEYS)


def utilization_high(ctx: Context, t: Thresholds) -> Vector:
    """above_for unless on (GPU) hung_power."""
    return unless_on(_above_for(ctx, t), _hung_power(ctx, t), GPU_KEYS)


def data_loader_starved(ctx: Context, t: Thresholds) -> Vector:
    """rules.starved_condition on the bridged short means."""
    a = t.alert("GPUDataLoaderStarved")
    result = where(
        ctx.last(RECORDED_UTILIZATION, ctx.gap), lambda v: 0 < v < a.number("average_below")
    )
    idle = where(ctx.last(RECORDED_IDLE, ctx.gap), lambda v: v > a.number("idle_above"))
    result = and_on(result, idle, GPU_KEYS)
    return and_on(result, _in_use(ctx, t), GPU_KEYS)


def memory_bandwidth_bound(ctx: Context, t: Thresholds) -> Vector:
    """GPM: dram rate5m > dram_active_above and on (GPU) max(pipe rate5m) < compute_pipes_below."""
    a = t.alert("GPUMemoryBandwidthBound")
    dram = where(
        ctx.whole_window_rate("gpu_dram_active_seconds_total"),
        lambda v: v > a.number("dram_active_above"),
    )
    pipes: Vector = {}
    for pipe in rules.COMPUTE_PIPES:
        for labels, value in ctx.whole_window_rate(f"gpu_{pipe}_active_seconds_total").items():
            pipes[labels] = max(value, pipes.get(labels, value))
    busiest = where(pipes, lambda v: v < a.number("compute_pipes_below"))
    return and_on(dram, busiest, GPU_KEYS)


def memory_nearly_full(ctx: Context, t: Thresholds) -> Vector:
    """The memory used over total above used_above, of each GPU or each MIG instance."""
    above = t.alert("GPUMemoryNearlyFull").number("used_above")

    def ratio(used: float, total: float) -> float:
        return used / total if total else float("nan")

    whole = binary(ctx.latest("gpu_memory_used_bytes"), ctx.latest("gpu_memory_total_bytes"), ratio)
    mig = binary(
        ctx.latest("gpu_mig_memory_used_bytes"), ctx.latest("gpu_mig_memory_total_bytes"), ratio
    )
    return or_(where(whole, lambda v: v > above), where(mig, lambda v: v > above))


def load_imbalance(ctx: Context, t: Thresholds) -> Vector:
    """Spread: max by (node) (rate5m and in_use) - min by (node) (...) > spread_above."""
    spread = t.alert("GPULoadImbalance").number("spread_above")
    in_use = and_on(_avg(ctx), _in_use(ctx, t), GPU_KEYS)
    highest = aggregate_by(in_use, NODE_KEYS, max)
    lowest = aggregate_by(in_use, NODE_KEYS, min)
    return where(binary(highest, lowest, lambda a, b: a - b), lambda v: v > spread)


def idle_allocated(ctx: Context, t: Thresholds) -> Vector:
    """A whole GPU's rate5m, or a MIG instance's SM activity rate5m, below ``below``, per pod.

    pod_info{mig_instance=""} * on (GPU) group_left () (rate5m < below) or
    pod_info{mig_instance!=""} * on (GPU, mig_instance) group_left () (mig sm rate5m < below)
    """
    below = t.alert("GPUIdleAllocated").number("below")
    mig_keys = (*GPU_KEYS, "mig_instance")

    def joined(pods: Vector, busy: Vector, keys: tuple[str, ...]) -> Vector:
        idle = {
            _project(labels, keys): value
            for labels, value in where(busy, lambda v: v < below).items()
        }
        return {
            labels: value * idle[_project(labels, keys)]
            for labels, value in pods.items()
            if _project(labels, keys) in idle
        }

    whole = joined(ctx.last("gpu_pod_info", ctx.gap, mig_instance=""), _avg(ctx), GPU_KEYS)
    mig = joined(
        ctx.last("gpu_pod_info", ctx.gap, mig_instance=".+"),
        ctx.whole_window_rate("gpu_mig_sm_active_seconds_total"),
        mig_keys,
    )
    return or_(whole, mig)


def mig_utilization_low(ctx: Context, t: Thresholds) -> Vector:
    """The MIG SM activity rate1m < GPUUtilizationLow's below, where the instance is in use."""
    below = t.alert("GPUUtilizationLow").number("below")
    active = ctx.last(RECORDED_MIG_SM_ACTIVE, ctx.gap)
    floor = t.in_use_memory_floor_bytes
    used = where(ctx.last("gpu_mig_memory_used_bytes", ctx.gap), lambda v: v > floor)
    return and_on(where(active, lambda v: v < below), used, (*GPU_KEYS, "mig_instance"))


def _clock_events(ctx: Context, reasons: str, above: float) -> Vector:
    events = _match(
        ctx.over_time("gpu_clock_event_active", lambda v: sum(v) / len(v)), {"reason": reasons}
    )
    return where(aggregate_without(events, ("reason",), max), lambda v: v > above)


def thermal_throttling(ctx: Context, t: Thresholds) -> Vector:
    """Clock events avg5m{reason=~"sw_thermal|hw_thermal"}, max without (reason), > active_above."""
    return _clock_events(
        ctx, "sw_thermal|hw_thermal", t.alert("GPUThermalThrottling").number("active_above")
    )


def power_capped(ctx: Context, t: Thresholds) -> Vector:
    """The same with reason=~"sw_power_cap|hw_power_brake"."""
    return _clock_events(
        ctx, "sw_power_cap|hw_power_brake", t.alert("GPUPowerCapped").number("active_above")
    )


def hardware_slowdown(ctx: Context, t: Thresholds) -> Vector:
    """The same with reason="hw_slowdown"."""
    return _clock_events(ctx, "hw_slowdown", t.alert("GPUHardwareSlowdown").number("active_above"))


def temperature_high(ctx: Context, t: Thresholds) -> Vector:
    """temp{sensor="gpu"} > ignoring(sensor) (slowdown - margin) or the fallback."""
    a = t.alert("GPUTemperatureHigh")
    temperature = ctx.latest("gpu_temperature_celsius", sensor="gpu")
    slowdown = ctx.latest("gpu_temperature_slowdown_threshold_celsius")
    limit = {labels: value - a.number("margin_celsius") for labels, value in slowdown.items()}
    above = compare(temperature, limit, lambda v, lim: v > lim, ("sensor",))
    fallback = aggregate_without(
        where(temperature, lambda v: v > a.number("fallback_celsius")), ("sensor",), max
    )
    return or_(above, unless_on(fallback, slowdown, GPU_KEYS))


def memory_temperature_high(ctx: Context, t: Thresholds) -> Vector:
    """temp{sensor="memory"} > above_celsius."""
    above = t.alert("GPUMemoryTemperatureHigh").number("above_celsius")
    return where(ctx.latest("gpu_temperature_celsius", sensor="memory"), lambda v: v > above)


def pcie_link_degraded(ctx: Context, t: Thresholds) -> Vector:
    """2^(gen - max gen) * width / max width < 1 and on (GPU) rate5m > busy_above."""
    busy = t.alert("GPUPCIeLinkDegraded").number("busy_above")
    generations = binary(
        ctx.latest("gpu_pcie_link_generation"),
        ctx.latest("gpu_pcie_link_max_generation"),
        lambda g, m: 2 ** (g - m),
    )
    widths = binary(
        ctx.latest("gpu_pcie_link_width"),
        ctx.latest("gpu_pcie_link_max_width"),
        lambda w, m: w / m if m else float("nan"),
    )
    fraction = where(binary(generations, widths, lambda g, w: g * w), lambda v: v < 1)
    return and_on(fraction, where(_avg(ctx), lambda v: v > busy), GPU_KEYS)


def nvlink_down(ctx: Context, t: Thresholds) -> Vector:
    """gpu_nvlink_link_down == 1."""
    return where(ctx.latest("gpu_nvlink_link_down"), lambda v: v == 1)


def _xid_increase(ctx: Context, codes: str, seconds: float) -> Vector:
    """increase(xid{codes}[window]) > 0 or (xid{codes} > 0 unless xid{codes} offset window)."""
    grown = where(ctx.increase("gpu_xid_errors_total", seconds, xid=codes), lambda v: v > 0)
    current = where(ctx.latest("gpu_xid_errors_total", xid=codes), lambda v: v > 0)
    new = unless_on(current, ctx.offset("gpu_xid_errors_total", seconds, xid=codes), None)
    return or_(grown, new)


def xid_error(ctx: Context, t: Thresholds) -> Vector:
    """The critical XIDs counted in the window."""
    a = t.alert("GPUXidError")
    critical = "|".join(str(code) for code in a.xids())
    return _xid_increase(ctx, critical, duration_seconds(a.duration("window")))


def recovery_action(ctx: Context, t: Thresholds) -> Vector:
    """XID 154 counted in the window."""
    window = t.alert("GPURecoveryActionRequired").duration("window")
    return _xid_increase(ctx, "154", duration_seconds(window))


def fell_off_bus(ctx: Context, t: Thresholds) -> Vector:
    """The lost GPUs, without their UUID: max without (uuid) (gpu_up == 0)."""
    return aggregate_without(where(ctx.latest("gpu_up"), lambda v: v == 0), ("uuid",), max)


def ecc_uncorrectable(ctx: Context, t: Thresholds) -> Vector:
    """ECC: volatile uncorrected > 0 or increase(aggregate[window]) > 0 unless on (GPU) volatile."""
    seconds = duration_seconds(t.alert("GPUECCUncorrectable").duration("window"))
    volatile = ctx.latest("gpu_ecc_errors_total", type="uncorrected", counter="volatile")
    aggregate = where(
        ctx.increase("gpu_ecc_errors_total", seconds, type="uncorrected", counter="aggregate"),
        lambda v: v > 0,
    )
    return or_(where(volatile, lambda v: v > 0), unless_on(aggregate, volatile, GPU_KEYS))


def row_remap_pending(ctx: Context, t: Thresholds) -> Vector:
    """gpu_row_remap_pending == 1 or gpu_retired_pages_pending == 1."""
    return or_(
        where(ctx.latest("gpu_row_remap_pending"), lambda v: v == 1),
        where(ctx.latest("gpu_retired_pages_pending"), lambda v: v == 1),
    )


def row_remap_failed(ctx: Context, t: Thresholds) -> Vector:
    """gpu_row_remap_failed == 1."""
    return where(ctx.latest("gpu_row_remap_failed"), lambda v: v == 1)


def collector_failing(ctx: Context, t: Thresholds) -> Vector:
    """gpuload_collector_success == 0 unless on (instance, job) gpuload_nvml_up == 0."""
    failing = where(ctx.latest("gpuload_collector_success"), lambda v: v == 0)
    nvml_down = where(ctx.latest("gpuload_nvml_up"), lambda v: v == 0)
    return unless_on(failing, nvml_down, ("instance", "job"))


def pod_resources_down(ctx: Context, t: Thresholds) -> Vector:
    """gpuload_kubernetes_pod_resources_up == 0."""
    return where(ctx.latest("gpuload_kubernetes_pod_resources_up"), lambda v: v == 0)


def nvml_down(ctx: Context, t: Thresholds) -> Vector:
    """gpuload_nvml_up == 0."""
    return where(ctx.latest("gpuload_nvml_up"), lambda v: v == 0)


def stale(ctx: Context, t: Thresholds) -> Vector:
    """gpuload_gpu_stale == 1 or time() - gpuload_last_collection_timestamp_seconds > max_age."""
    max_age = duration_seconds(t.alert("GPULoadStale").duration("max_age"))
    age = {
        labels: ctx.now - value
        for labels, value in ctx.latest("gpuload_last_collection_timestamp_seconds").items()
    }
    return or_(
        where(ctx.latest("gpuload_gpu_stale"), lambda v: v == 1),
        where(age, lambda v: v > max_age),
    )


CONDITIONS: Mapping[str, Callable[[Context, Thresholds], Vector]] = {
    "GPUUtilizationLow": utilization_low,
    "GPUUtilizationHigh": utilization_high,
    "GPUJobHung": job_hung,
    "GPUDataLoaderStarved": data_loader_starved,
    "GPUMemoryBandwidthBound": memory_bandwidth_bound,
    "GPUMemoryNearlyFull": memory_nearly_full,
    "GPULoadImbalance": load_imbalance,
    "GPUIdleAllocated": idle_allocated,
    "GPUMIGUtilizationLow": mig_utilization_low,
    "GPUThermalThrottling": thermal_throttling,
    "GPUPowerCapped": power_capped,
    "GPUHardwareSlowdown": hardware_slowdown,
    "GPUTemperatureHigh": temperature_high,
    "GPUMemoryTemperatureHigh": memory_temperature_high,
    "GPUPCIeLinkDegraded": pcie_link_degraded,
    "GPUNVLinkDown": nvlink_down,
    "GPUXidError": xid_error,
    "GPURecoveryActionRequired": recovery_action,
    "GPUFellOffBus": fell_off_bus,
    "GPUECCUncorrectable": ecc_uncorrectable,
    "GPURowRemapPending": row_remap_pending,
    "GPURowRemapFailed": row_remap_failed,
    "GPULoadCollectorFailing": collector_failing,
    "GPULoadPodResourcesDown": pod_resources_down,
    "GPULoadNVMLDown": nvml_down,
    "GPULoadStale": stale,
}


@dataclass(frozen=True)
class LocalRule:
    """One alert as the rendered rule defines it: its name, `for:`, labels and annotations."""

    name: str
    for_seconds: float
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    keep_firing_seconds: float = 0.0


def local_rules(thresholds: Thresholds) -> list[LocalRule]:
    """The rendered alerting rules that can be evaluated locally, in the rule files' order."""
    document = rules.rule_files(thresholds)["gpuload-alerts.rules.yml"]
    found = []
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue  # a recording rule of an alert group
            if rule["alert"] in NOT_LOCAL or rule["alert"] not in CONDITIONS:
                # An alert without a local condition yet: tests/test_local_alerting.py says so.
                continue
            found.append(
                LocalRule(
                    name=rule["alert"],
                    for_seconds=float(duration_seconds(rule.get("for", "0s"))),
                    labels=dict(rule.get("labels", {})),
                    annotations=dict(rule.get("annotations", {})),
                    keep_firing_seconds=float(duration_seconds(rule.get("keep_firing_for", "0s"))),
                )
            )
    return found


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
    """How long the evaluator (and the status page's doctor) needs each family's samples."""
    short = duration_seconds(thresholds.short_window)
    gap = duration_seconds(thresholds.gap_tolerance)
    # A window and the gap tolerance before it: rates need a sample from before the window,
    # and the short means may reach back over a gap and a window more.
    window = float(max(duration_seconds(thresholds.window), 2 * short) + gap)
    above = duration_seconds(thresholds.alert("GPUUtilizationHigh").for_)
    xid = duration_seconds(thresholds.alert("GPUXidError").duration("window")) + LOOKBACK_SECONDS
    ecc = float(duration_seconds(thresholds.alert("GPUECCUncorrectable").duration("window")))
    windowed = {
        "gpu_utilization_seconds_total",
        "gpu_idle_seconds_total",
        "gpu_clock_event_active",
        "gpu_power_usage_watts",
        "gpu_mig_sm_active_seconds_total",
        rules.COLLECTED_AT,
        *(f"gpu_{ratio}_seconds_total" for ratio in rules.GPM_RATIOS),
    }

    def horizon(name: str) -> float:
        if name == "gpu_xid_errors_total":
            return max(xid, keep)
        if name == "gpu_ecc_errors_total":
            return max(ecc, keep)
        if name in windowed:
            return window + keep
        if name in RECORDED:
            # GPUUtilizationHigh's window, and a recorded mean from before it.
            return above + gap + keep
        # A gauge's last value bridges a gap.
        return max(keep, float(gap))

    return horizon


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
        # The history keeps what the rules read, and what its other readers declare.
        keep = FAMILIES | frozenset(also_keep)
        self.history = history or History(history_horizon(thresholds), keep)
        self._window = float(duration_seconds(thresholds.window))
        self._gap = float(duration_seconds(thresholds.gap_tolerance))
        self._states = [_RuleState(rule) for rule in local_rules(thresholds)]
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
        self.history.add((self._with_target(sample) for sample in samples), at)
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
        ctx = Context(self.history, now, self._window, self._gap)
        # The recording rules first, as Prometheus settles them before the alerts.
        self.history.add(record(ctx, self.thresholds), now)
        ctx = Context(self.history, now, self._window, self._gap)
        changed: list[Alert] = []
        for state in self._states:
            try:
                result = CONDITIONS[state.rule.name](ctx, self.thresholds)
            except Exception:  # one rule's bug must not stop the others
                if state.rule.name not in self._failing:
                    log.exception("local alert %s: evaluation failed", state.rule.name)
                    self._failing.add(state.rule.name)
                continue
            self._failing.discard(state.rule.name)
            changed.extend(self._advance(state, result, now))
        return changed

    def _advance(self, state: _RuleState, result: Vector, now: float) -> list[Alert]:
        rule = state.rule
        changed = []
        for series in list(state.active):
            if (rule.name, series) in self._restored:
                if series in result or now >= self._hold_until:
                    self._restored.discard((rule.name, series))
                else:
                    continue
            if series not in result:
                alert = state.active[series]
                if alert.firing_since is not None and rule.keep_firing_seconds:
                    # Prometheus's keep_firing_for: still firing, with its last value, until the
                    # condition has been gone that long.
                    kept_since = alert.kept_since if alert.kept_since is not None else now
                    if now - kept_since < rule.keep_firing_seconds:
                        state.active[series] = replace(alert, kept_since=kept_since)
                        continue
                del state.active[series]
                if alert.firing_since is not None:
                    changed.append(replace(alert, resolved_at=now))
        for series, value in result.items():
            labels = {**dict(series), "alertname": rule.name, **rule.labels}
            previous = state.active.get(series)
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
            state.active[series] = alert
        return changed

    def alerts(self) -> list[Alert]:
        """Every pending and firing alert."""
        return [alert for state in self._states for alert in state.active.values()]

    def firing(self) -> list[Alert]:
        """The firing alerts."""
        return [alert for alert in self.alerts() if alert.firing_since is not None]
