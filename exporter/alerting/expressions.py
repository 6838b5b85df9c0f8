"""The vocabulary of gpuload's rules: label sets, text templates, recorded names and conditions.

What more than one rule reads lives here once: the labels that identify a GPU and a node, the
templates that say where an alert happened and format its value, the names of the recorded
series (:func:`recording_names`), the rates every windowed mean is measured with, and the
conditions an alert shares with a bottleneck class (:func:`starved_condition`,
:func:`above_for`, :func:`hung_power`).
"""

from __future__ import annotations

from exporter.alerting.thresholds import Thresholds
from exporter.names import GPM_METRICS

# The labels that identify one GPU in Prometheus. The chart's `node` label, when present, is the
# same for every series of an instance, so matching on these never splits or merges GPUs.
GPU = "instance, job, gpu, uuid"
# Node-level grouping that works with or without the relabelled `node` label.
NODE = "job, instance, node"

# Where an alert happened, for descriptions: "GPU 3 (GPU-uuid) on host:port (node n1)".
WHERE = (
    "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
    "{{ with $labels.node }} (node {{ . }}){{ end }}"
)
INSTANCE = "{{ $labels.instance }}{{ with $labels.node }} (node {{ . }}){{ end }}"
MIG_INSTANCE = (
    "{{ with $labels.mig_instance }}, MIG instance {{ . }} ({{ $labels.mig_profile }}){{ end }}"
)

# The `value` annotation of each alert, which notifications show: the measured value, formatted.
PERCENT = "{{ $value | humanizePercentage }}"
CELSIUS = "{{ $value | humanize }} °C"
COUNT = '{{ $value | printf "%.0f" }}'

# The GPM profiling metrics whose counters of seconds get a windowed rate; the pipes are the
# arithmetic units whose busiest one tells compute-bound from memory-bound work.
GPM_RATIOS = tuple(GPM_METRICS)
COMPUTE_PIPES = ("tensor", "fp16", "fp32", "fp64")
# The states of gpu:gpu_state:5m, the fleet dashboard's partition of the GPUs.
STATES = ("idle", "underutilized", "healthy", "saturated", "lost", "unmeasured")
# The classes of gpu:gpu_bottleneck:class5m, each with the alert whose runbook explains it (and
# whose severity says whether it needs a person), in the order the rules record them.
BOTTLENECK_ALERTS: dict[str, str | None] = {
    "input_starved": "GPUDataLoaderStarved",
    "underutilized": "GPUUtilizationLow",
    "memory_bandwidth_bound": "GPUMemoryBandwidthBound",
    "hung": "GPUJobHung",
    "compute_bound": "GPUUtilizationHigh",
    "thermal_throttled": "GPUThermalThrottling",
    "power_capped": "GPUPowerCapped",
    "pcie_bound": "GPUPCIeLinkDegraded",
    "nvlink_bound": None,
    "imbalanced": "GPULoadImbalance",
    "none": None,
}


def recording_names(thresholds: Thresholds) -> dict[str, str]:
    """Return the recorded series' names by role (they carry the window, e.g. ``rate5m``).

    ``avg`` is the mean utilization over the window, ``idle`` the fraction of it the GPU sat
    fully idle; each GPM metric's role is its own name (``dram_active``).
    """
    w, short = thresholds.window, thresholds.short_window
    return {
        "avg": f"gpu:gpu_utilization_seconds:rate{w}",
        "avg_short": f"gpu:gpu_utilization_seconds:rate{short}",
        "idle": f"gpu:gpu_idle_seconds:rate{w}",
        "idle_short": f"gpu:gpu_idle_seconds:rate{short}",
        "in_use": "gpu:gpu_in_use:group",
        "memory_used": "gpu:gpu_memory_used:ratio",
        "clock_events": f"gpu:gpu_clock_event_active:avg{w}",
        "pipes": f"gpu:gpu_compute_pipe_active_seconds:max_rate{w}",
        **{ratio: f"gpu:gpu_{ratio}_seconds:rate{w}" for ratio in GPM_RATIOS},
        "mig_sm_active": f"gpu:gpu_mig_sm_active_seconds:rate{w}",
        "mig_sm_active_short": f"gpu:gpu_mig_sm_active_seconds:rate{short}",
        "power_short": f"gpu:gpu_power_usage:ratio_avg{short}",
        "gpu_count": "instance:gpu_up:count",
        "pcie_capacity": "gpu:gpu_pcie_link_capacity_bytes:per_second",
        "pcie_busy": f"gpu:gpu_pcie_link_busy:ratio_rate{w}",
        "nvlink_busy": f"gpu:gpu_nvlink_busy:ratio_rate{w}",
        "bottleneck": f"gpu:gpu_bottleneck:class{w}",
        "busy": f"gpu:gpu_busy:ratio{w}",
        "state": f"gpu:gpu_state:{w}",
        "node_states": "node:gpu_state:count",
        "node_busy": f"node:gpu_busy:avg{w}",
        "node_power": "node:gpu_power_usage_watts:sum",
        "node_power_limit": "node:gpu_power_limit_watts:sum",
    }


def whole_window_rate(counter: str, window: str, gap: str) -> str:
    """``rate(counter[window])`` where the counter was scraped a whole window ago, else nothing.

    A counter first scraped less than a window ago (a new node) covers only part of the window,
    and ``rate()`` divides its increase by the whole window: a busy GPU would read 20% one minute
    into a 5m window and raise GPUUtilizationLow on every new node. "Scraped a window ago" looks
    for a sample within ``gap`` before then (``last_over_time``), not at that instant: an instant
    lookup lands on the staleness marker of a failed scrape, a window after it.
    """
    return f"rate({counter}[{window}])\nand\nlast_over_time({counter}[{gap}] offset {window})"


# The Unix time of the collection each scrape's samples come from, one series per exporter.
COLLECTED_AT = "gpuload_last_collection_timestamp_seconds"


def short_rate(counter: str, window: str, gap: str) -> str:
    """The mean of a counter of seconds over the short window, measured across gaps and restarts.

    - The counter's increase is divided by the increase of the collection time between the same
      samples, not by the window: ``rate()`` of both is extrapolated alike, so the ratio is the
      exact mean between the first and the last sample, however late a collection was, however
      many scrapes failed inside the window (where ``rate()`` alone extrapolates a window with
      a missing sample at an edge by half a scrape interval and reads 20% low).
    - A window counts only where the counter covers all of it: it had a sample within a window
      before the window starts, and no reset over the gap tolerance. A restarted exporter's
      counters start again at 0 and lose the seconds it was down, so a window holding the
      reset, or starting before the new counter did, would divide what was counted by more time
      than it covers (a 97% GPU read 22%).
    - Where the short window has no such measurement because scrapes failed, the first sample
      after the gap is measured against the samples before it, over the gap tolerance: the gap's
      seconds are counted, so a gap the GPU spent busy breaks a low stretch.
    - Only at a fresh sample (``and {counter}``: a failed scrape leaves a staleness marker, which
      an instant selector does not look past): a gap has no reading, not the last one again.
    """

    def mean(length: str) -> str:
        return (
            f"rate({counter}[{length}]) / on (instance, job) group_left ()"
            f" rate({COLLECTED_AT}[{length}])\n"
            f"  unless resets({counter}[{gap}]) > 0\n"
            f"  and last_over_time({counter}[{window}] offset {length})"
        )

    return f"(\n  {mean(window)}\n  or\n  {mean(gap)}\n)\nand {counter}"


def bridged(series: str, gap: str) -> str:
    """A recorded series or gauge, its last value over the gap tolerance.

    An alert's `for:` restarts whenever its expression returns nothing for one evaluation: after
    a failed scrape (the gauges are stale), while a counter reset keeps the short rate from
    being measured, during a gap. The last reading carries the condition across, for at most
    ``gap``; a real reading that breaks the condition (a job that ended reads 0 processes)
    breaks it at once.

    A GPU that the exporter no longer lists, in a scrape that succeeded, is not bridged: it is
    gone, not unread (:func:`vanished`). Only a missing exporter (a failed scrape, a restart) is.
    """
    return f"(last_over_time({series}[{gap}]) {unless_vanished(gap)})"


# The labels a GPU's series and its vanished reading share: the UUID names a GPU across
# renumbering, and every series of a listed GPU carries it.
VANISHED_KEYS = "instance, job, uuid"


def unless_vanished(window: str) -> str:
    """``unless`` the GPU vanished (:func:`vanished`) within ``window``.

    Appended to a condition that reads the GPU's samples over ``window``: they linger there
    that long after the GPU is gone, so the GPU counts as vanished that long too.
    """
    return f"unless on ({VANISHED_KEYS}) (\n{indented(vanished(window))}\n)"


def vanished(window: str) -> str:
    """GPUs read within ``window`` that the last scrape, which succeeded, no longer lists.

    A failed scrape leaves every series of the exporter stale, its collection time included; a
    scrape that succeeded carries the collection time, and staleness markers for each series it
    no longer has: so a GPU gone from a scrape that answered is its own ``gpu_up`` stale while
    its exporter's collection time is fresh.
    """
    return (
        f"last_over_time(gpu_up[{window}])\n"
        f"unless on ({VANISHED_KEYS}) gpu_up\n"
        f"and on (instance, job) {COLLECTED_AT}"
    )


def starved_condition(thresholds: Thresholds, utilization: str, idle: str) -> str:
    """GPUDataLoaderStarved's condition on the given means: the alert's and the bottleneck class's.

    In use, a mean utilization below ``average_below`` but above zero (a GPU that ran nothing
    waits for no batch), and fully idle more than ``idle_above`` of the window: it finishes each
    batch and waits for the next one, where a steady small workload is never fully idle.
    """
    names = recording_names(thresholds)
    starved = thresholds.alert("GPUDataLoaderStarved")
    return (
        f"{utilization} < {literal(starved.number('average_below'))} > 0\n"
        f"and on ({GPU}) {idle} > {literal(starved.number('idle_above'))}\n"
        f"and on ({GPU}) {names['in_use']}"
    )


def above_for(thresholds: Thresholds) -> str:
    """Utilization above GPUUtilizationHigh's threshold in every short window for its `for:`.

    GPUUtilizationHigh and GPUJobHung split this one condition by power, so exactly one of them
    fires for a GPU above the threshold, whatever its power does. Each judges the last `for:` as
    one window, with no pending state: two `for:` clocks would restart each other whenever the
    power crossed the line between them. The lowest short-window mean of the window is above the
    threshold, and the short mean was already recorded a `for:` ago (within the gap tolerance):
    the window is whole. A short mean missing inside the window (a restart, a gap) is skipped.
    """
    names = recording_names(thresholds)
    high = thresholds.alert("GPUUtilizationHigh")
    window = high.for_
    return (
        f"min_over_time({names['avg_short']}[{window}]) > {literal(high.number('above'))}\n"
        f"and on ({GPU}) last_over_time({names['avg_short']}[{thresholds.gap_tolerance}]"
        f" offset {window})\n"
        f"{unless_vanished(window)}"
    )


def hung_power(thresholds: Thresholds) -> str:
    """GPUJobHung's power condition, which GPUUtilizationHigh excludes; its value is the power.

    Every short-window mean of the power drawn over GPUUtilizationHigh's `for:` stayed below
    ``power_below`` of the limit, on a GPU in use: kernels are resident (a hung NCCL collective
    spins in one) but do no arithmetic and move no memory, which is what draws power. One short
    window of real power makes the GPU busy, not hung: that is the hysteresis.
    """
    names = recording_names(thresholds)
    hung = thresholds.alert("GPUJobHung")
    window = thresholds.alert("GPUUtilizationHigh").for_
    return (
        f"max_over_time({names['power_short']}[{window}]) < {literal(hung.number('power_below'))}\n"
        f"and on ({GPU}) {names['in_use']}"
    )


def held_while_down(thresholds: Thresholds, name: str, value: str, keys: str) -> str:
    """A firing alert of a GPU whose exporter cannot be scraped, until GPULoadExporterDown fires.

    A dead exporter's series go stale and its alerts would resolve at once, minutes before
    GPULoadExporterDown (`up == 0` for its `for:`) says the node is unmonitored: nothing would
    cover the GPU meanwhile, and the on-call would read "resolved". While Prometheus fails to
    scrape the target, an alert that was firing stays firing with its last value, until
    GPULoadExporterDown fires. (A target that is gone altogether is GPULoadExporterAbsent's.)
    """
    down, gap = thresholds.alert("GPULoadExporterDown").for_, thresholds.gap_tolerance
    # Its last value: within the gap tolerance, or before it by as long as the wait for
    # GPULoadExporterDown (the window of last_over_time cannot be a sum of settings).
    return (
        f"(\n  last_over_time({value}[{gap}])\n"
        f"  or\n  last_over_time({value}[{down}] offset {gap})\n)\n"
        f'and on ({keys}) ALERTS{{alertname="{name}",alertstate="firing"}}\n'
        f'and on (instance, job) up{{job=~"{thresholds.exporter_job_regex}"}} == 0\n'
        'unless on (instance, job) ALERTS{alertname="GPULoadExporterDown",alertstate="firing"}'
    )


def xid_increase(matcher: str, window: str) -> str:
    """XIDs of the codes ``matcher`` selects counted in the last ``window``."""
    selector = f"gpu_xid_errors_total{{{matcher}}}"
    return (
        f"increase({selector}[{window}]) > 0\n"
        "or\n"
        # A counter whose first sample is already non-zero: increase() cannot see it.
        f"({selector} > 0 unless {selector} offset {window})"
    )


def indented(expr: str) -> str:
    """A sub-expression indented by two spaces, to sit inside parentheses."""
    return "\n".join(f"  {line}" for line in expr.split("\n"))


def literal(value: float) -> str:
    """Format a threshold for PromQL: 0.3 -> "0.3", 5.0 -> "5"."""
    return f"{value:g}"


def percent(ratio: float) -> str:
    """Format a ratio as text: 0.3 -> "30%"."""
    return f"{ratio * 100:g}%"


def points(ratio: float) -> str:
    """Format a spread of ratios as percentage points: 0.4 -> "40"."""
    return f"{ratio * 100:g}"
