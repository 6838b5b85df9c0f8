"""gpuload's Prometheus rules, built from the thresholds.

Two rule files: recording rules (``level:metric:operations``), then the alerts, in three groups
(utilization, health, the exporter). The recording rules come in two groups: ``gpuload.recording``
turns the exporter's counters of seconds into means over the shared window (``rate()`` of
``gpu_utilization_seconds_total`` is the exact mean utilization over the window at any scrape
interval, where a gauge of the last second keeps 1 s of every scrape) and classifies what limits
each in-use GPU; ``gpuload.fleet`` gives every GPU one state and sums them per node, for the fleet
dashboard. Every alert carries ``severity`` and the annotations ``summary``, ``description`` (the
GPU, the instance, the node when the chart's relabelling adds one, and the measured value) and
``runbook_url``.

Optional families are handled where a fallback exists: "in use" is a process *or* memory above
the floor (of the GPU or of one of its MIG instances); the slowdown threshold falls back to a fixed
temperature; a pending page retirement stands in for a pending row remap on pre-Ampere GPUs; the
NVLink rules read the per-GPU totals and also an older gpuload's per-link series.
``GPUMemoryBandwidthBound`` needs the GPM profiling families (Hopper and newer) and has no
fallback.
"""

from __future__ import annotations

from typing import Any

from exporter.alerting.thresholds import Thresholds, duration_seconds

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
GPM_RATIOS = (
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp16_active",
    "fp32_active",
    "fp64_active",
    "integer_active",
)
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

Rule = dict[str, Any]


def rule_files(thresholds: Thresholds) -> dict[str, dict[str, Any]]:
    """Return the rule files' contents by file name, ready to dump as YAML."""
    return {
        "gpuload-recording.rules.yml": {
            "groups": [recording_group(thresholds), fleet_group(thresholds)]
        },
        "gpuload-alerts.rules.yml": {
            "groups": [
                {"name": "gpuload.utilization", "rules": utilization_alerts(thresholds)},
                {"name": "gpuload.health", "rules": health_alerts(thresholds)},
                inventory_group(thresholds),
                {"name": "gpuload.exporter", "rules": exporter_alerts(thresholds)},
            ]
        },
    }


def group_names(thresholds: Thresholds) -> list[str]:
    """Every rule group, recording groups first: the order one evaluation step settles them in."""
    documents = rule_files(thresholds).values()
    return [group["name"] for document in documents for group in document["groups"]]


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
    """
    return f"last_over_time({series}[{gap}])"


def recording_group(thresholds: Thresholds) -> dict[str, Any]:
    """Return the recording rules; the alerts read these instead of repeating the windows."""
    names = recording_names(thresholds)
    w = thresholds.window
    floor = thresholds.in_use_memory_floor_bytes
    pipes = "|".join(COMPUTE_PIPES)
    short, gap = thresholds.short_window, thresholds.gap_tolerance
    rules: list[Rule] = [
        {
            # The sustained utilization alerts hold when every short window's mean does.
            "record": names["avg_short"],
            "expr": short_rate("gpu_utilization_seconds_total", short, gap),
        },
        {
            "record": names["avg"],
            "expr": whole_window_rate("gpu_utilization_seconds_total", w, gap),
        },
        {
            # The fraction of the window in which the GPU ran no kernel at all.
            "record": names["idle"],
            "expr": whole_window_rate("gpu_idle_seconds_total", w, gap),
        },
        {
            # The same over the short window: GPUDataLoaderStarved judges GPUUtilizationLow's.
            "record": names["idle_short"],
            "expr": short_rate("gpu_idle_seconds_total", short, gap),
        },
        {
            # 1 for every GPU that has a process or holds memory above the floor, itself or in
            # one of its MIG instances (an unprivileged exporter sees only the instances' memory
            # on a MIG GPU). gpu_processes may be absent (older gpuload, collector off, no host
            # PID namespace): memory alone still decides. The gauges' last readings over the gap
            # tolerance: a failed scrape must not end a job.
            "record": names["in_use"],
            "expr": (
                "group without () (\n"
                f"  {bridged('gpu_processes', gap)} > 0\n"
                "  or\n"
                f"  {bridged('gpu_memory_used_bytes', gap)} > {floor}\n"
                "  or\n"
                "  group without (mig_instance, mig_profile) (\n"
                f"    {bridged('gpu_mig_memory_used_bytes', gap)} > {floor}\n"
                "  )\n"
                ")"
            ),
        },
        {
            "record": names["memory_used"],
            "expr": "gpu_memory_used_bytes / gpu_memory_total_bytes",
        },
        {
            # The fraction of the window each clock event reason was active (a 0/1 gauge: no
            # counter of it exists).
            "record": names["clock_events"],
            "expr": f"avg_over_time(gpu_clock_event_active[{w}])",
        },
    ]
    rules += [
        {
            "record": names[ratio],
            "expr": whole_window_rate(f"gpu_{ratio}_seconds_total", w, gap),
        }
        for ratio in GPM_RATIOS
    ]
    rules += [
        {
            # A MIG instance's load: NVML has no utilization per instance, GPM has SM activity.
            "record": names["mig_sm_active"],
            "expr": whole_window_rate("gpu_mig_sm_active_seconds_total", w, gap),
        },
        {
            "record": names["mig_sm_active_short"],
            "expr": short_rate("gpu_mig_sm_active_seconds_total", short, gap),
        },
        {
            # The power drawn as a fraction of the limit (a gauge: no counter of energy is read).
            "record": names["power_short"],
            "expr": (
                f"avg_over_time(gpu_power_usage_watts[{short}])\n"
                f"/ {bridged('gpu_power_limit_watts', gap)}"
            ),
        },
    ]
    rules.append(
        {
            # The busiest arithmetic pipe; whichever of them a GPU reports.
            "record": names["pipes"],
            "expr": (f'max without () ({{__name__=~"gpu:gpu_({pipes})_active_seconds:rate{w}"}})'),
        }
    )
    rules += link_rules(thresholds)
    rules += bottleneck_rules(thresholds)
    return {"name": "gpuload.recording", "rules": rules}


def fleet_group(thresholds: Thresholds) -> dict[str, Any]:
    """Return the fleet rules: how busy each GPU is, its one state, and per-node sums.

    ``gpu:gpu_busy:ratio5m`` is the whole-GPU utilization of a GPU; in MIG mode, where NVML has
    no whole-GPU utilization, the mean SM activity of its MIG instances weighted by their SMs
    (GPM, Hopper and newer; absent on an A100 in MIG mode), of the instances whose counters have a
    whole window, like every windowed rate here. ``gpu:gpu_state:5m`` puts every GPU that has
    ``gpu_up`` in exactly one of :data:`STATES`, with GPUUtilizationLow's and GPUUtilizationHigh's
    thresholds: one in use without a busy ratio yet (a new node) is unmeasured.
    """
    names = recording_names(thresholds)
    low = _num(thresholds.alert("GPUUtilizationLow").number("below"))
    high = _num(thresholds.alert("GPUUtilizationHigh").number("above"))
    mig_active = names["mig_sm_active"]
    # The SMs of each GPU instance: the sum over its compute instances.
    mig_sms = "sum without (mig_compute_instance, mig_profile) (gpu_mig_multiprocessors)"
    mig = f"{GPU}, mig_instance"
    busy, in_use, up = names["busy"], names["in_use"], "gpu_up == 1"
    states = {
        "lost": "group without () (gpu_up == 0)",
        # Nothing holds it, and it does not run either (if it does, its busy ratio decides).
        "idle": f"{up}\nunless on ({GPU}) {in_use}\nunless on ({GPU}) {busy} >= {low}",
        "unmeasured": f"{up}\nand on ({GPU}) {in_use}\nunless on ({GPU}) {busy}",
        "underutilized": f"{up}\nand on ({GPU}) {in_use}\nand on ({GPU}) {busy} < {low}",
        "healthy": f"{up}\nand on ({GPU}) {busy} >= {low} <= {high}",
        "saturated": f"{up}\nand on ({GPU}) {busy} > {high}",
    }
    rules: list[Rule] = [
        {
            "record": busy,
            "expr": (
                f"sum without (mig_instance, mig_profile) (\n"
                f"  {mig_active}\n"
                f"  * on ({mig}) group_left ()\n"
                f"  {mig_sms}\n"
                ")\n"
                "/\n"
                "sum without (mig_instance, mig_profile) (\n"
                f"  {mig_sms}\n"
                f"  and on ({mig}) {mig_active}\n"
                ")\n"
                "or\n"
                f"{names['avg']}\n"
                f"unless on ({GPU}) gpu_mig_mode_enabled == 1"
            ),
        },
    ]
    rules += [
        {"record": names["state"], "expr": states[state], "labels": {"state": state}}
        for state in ("lost", "idle", "unmeasured", "underutilized", "healthy", "saturated")
    ]
    rules += [
        {
            "record": names["node_states"],
            "expr": f"count by ({NODE}, state) ({names['state']})",
        },
        {"record": names["node_busy"], "expr": f"avg by ({NODE}) ({busy})"},
        {"record": names["node_power"], "expr": f"sum by ({NODE}) (gpu_power_usage_watts)"},
        {"record": names["node_power_limit"], "expr": f"sum by ({NODE}) (gpu_power_limit_watts)"},
    ]
    return {"name": "gpuload.fleet", "rules": rules}


def link_rules(thresholds: Thresholds) -> list[Rule]:
    """Return how busy each GPU's PCIe link and NVLinks are, as a fraction of their bandwidth."""
    names = recording_names(thresholds)
    w = thresholds.window
    nvlink_rate = _num(thresholds.bottlenecks.nvlink_link_bytes_per_second)
    rules: list[Rule] = [
        {
            # Bytes/s per lane and direction: 2.5 and 5 GT/s with 8b/10b encoding (gen 1, 2),
            # then 8 GT/s with 128b/130b, doubling with each generation (gen 3 onwards).
            "record": names["pcie_capacity"],
            "expr": (
                "gpu_pcie_link_width * (\n"
                "  984615384 * 2 ^ (gpu_pcie_link_generation - 3)"
                " and gpu_pcie_link_generation >= 3\n"
                "  or\n"
                "  250000000 * 2 ^ (gpu_pcie_link_generation - 1)\n"
                ")"
            ),
        },
    ]
    for direction, counter in (("rx", "receive"), ("tx", "transmit")):
        rules.append(
            {
                "record": names["pcie_busy"],
                "expr": f"rate(gpu_pcie_{counter}_bytes_total[{w}]) / {names['pcie_capacity']}",
                "labels": {"direction": direction},
            }
        )
    for direction, counter in (("rx", "receive"), ("tx", "transmit")):
        rules.append(
            {
                # Traffic spreads over the links that are up; a link that is down carries none.
                # gpuload exports per-GPU totals and the links up; `sum without (link)` and the
                # count of gpu_nvlink_link_up also read an older gpuload's per-link series.
                "record": names["nvlink_busy"],
                "expr": (
                    f"sum without (link) (rate(gpu_nvlink_{counter}_bytes_total[{w}]))\n"
                    "/ (\n"
                    "  (gpu_nvlink_links_up > 0\n"
                    "  or count without (link) (gpu_nvlink_link_up == 1))\n"
                    f"  * {nvlink_rate}\n"
                    ")"
                ),
                "labels": {"direction": direction},
            }
        )
    return rules


def bottleneck_rules(thresholds: Thresholds) -> list[Rule]:
    """Return what limits each in-use GPU: one series per GPU and limiting signal.

    Each series is labelled ``bottleneck`` (and ``runbook_url`` where a runbook explains it);
    its value is the signal that crossed the threshold, a ratio. The conditions are the alerts'
    without their ``for:``, so the bottleneck view and the alerts agree; ``none`` marks an in-use
    GPU that nothing here limits, valued at its average utilization.
    """
    names = recording_names(thresholds)
    record = names["bottleneck"]
    in_use = f"and on ({GPU}) {names['in_use']}"
    in_use_avg = f"{names['avg']} {in_use}"
    low = thresholds.alert("GPUUtilizationLow")
    high = thresholds.alert("GPUUtilizationHigh")
    bound = thresholds.alert("GPUMemoryBandwidthBound")
    imbalance = thresholds.alert("GPULoadImbalance")
    thermal = thresholds.alert("GPUThermalThrottling")
    power = thresholds.alert("GPUPowerCapped")
    link_busy = _num(thresholds.bottlenecks.link_busy_above)

    def unless(bottleneck: str) -> str:
        return f'unless on ({GPU}) {record}{{bottleneck="{bottleneck}"}}'

    # (bottleneck, expression), in the order of BOTTLENECK_ALERTS. A later class may exclude an
    # earlier one: the rules of a group run in order, at one evaluation time.
    classes: list[tuple[str, str]] = [
        (
            "input_starved",
            starved_condition(thresholds, names["avg"], names["idle"]),
        ),
        (
            "underutilized",
            f"{names['avg']} < {_num(low.number('below'))}\n{in_use}\n{unless('input_starved')}",
        ),
        (
            "memory_bandwidth_bound",
            f"{names['dram_active']} > {_num(bound.number('dram_active_above'))}\n"
            f"and on ({GPU}) {names['pipes']} < {_num(bound.number('compute_pipes_below'))}\n"
            f"{in_use}",
        ),
        (
            # GPUJobHung's condition itself: kernels resident, no power drawn.
            "hung",
            f"{hung_power(thresholds)}\nand on ({GPU}) (\n{_indented(above_for(thresholds))}\n)",
        ),
        (
            "compute_bound",
            f"{names['avg']} > {_num(high.number('above'))}\n{in_use}\n"
            f"{unless('memory_bandwidth_bound')}\n{unless('hung')}",
        ),
        (
            "thermal_throttled",
            f'max without (reason) ({names["clock_events"]}{{reason=~"sw_thermal|hw_thermal"}})\n'
            f"> {_num(thermal.number('active_above'))}\n{in_use}",
        ),
        (
            "power_capped",
            "max without (reason) ("
            f'{names["clock_events"]}{{reason=~"sw_power_cap|hw_power_brake"}})\n'
            f"> {_num(power.number('active_above'))}\n{in_use}",
        ),
        (
            "pcie_bound",
            f"max without (direction) ({names['pcie_busy']}) > {link_busy}\n{in_use}",
        ),
        (
            "nvlink_bound",
            f"max without (direction) ({names['nvlink_busy']}) > {link_busy}\n{in_use}",
        ),
        (
            # The in-use GPUs of a node that trail its busiest one by more than the spread.
            "imbalanced",
            f"max by ({NODE}) ({in_use_avg})\n"
            f"- on ({NODE}) group_right ()\n"
            f"({in_use_avg})\n"
            f"> {_num(imbalance.number('spread_above'))}",
        ),
        (
            "none",
            f'{in_use_avg}\nunless on ({GPU}) {record}{{bottleneck!="none"}}',
        ),
    ]
    assert [name for name, _expr in classes] == list(BOTTLENECK_ALERTS)
    rules = []
    for bottleneck, expr in classes:
        alert = BOTTLENECK_ALERTS[bottleneck]
        labels = {"bottleneck": bottleneck}
        if alert is not None:
            labels["runbook_url"] = thresholds.runbook_url(alert)
        rules.append({"record": record, "expr": expr, "labels": labels})
    return rules


def starved_condition(thresholds: Thresholds, utilization: str, idle: str) -> str:
    """GPUDataLoaderStarved's condition on the given means: the alert's and the bottleneck class's.

    In use, a mean utilization below ``average_below`` but above zero (a GPU that ran nothing
    waits for no batch), and fully idle more than ``idle_above`` of the window: it finishes each
    batch and waits for the next one, where a steady small workload is never fully idle.
    """
    names = recording_names(thresholds)
    starved = thresholds.alert("GPUDataLoaderStarved")
    return (
        f"{utilization} < {_num(starved.number('average_below'))} > 0\n"
        f"and on ({GPU}) {idle} > {_num(starved.number('idle_above'))}\n"
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
        f"min_over_time({names['avg_short']}[{window}]) > {_num(high.number('above'))}\n"
        f"and on ({GPU}) last_over_time({names['avg_short']}[{thresholds.gap_tolerance}]"
        f" offset {window})"
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
        f"max_over_time({names['power_short']}[{window}]) < {_num(hung.number('power_below'))}\n"
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


def utilization_alerts(thresholds: Thresholds) -> list[Rule]:
    """Return the alerts about how well the GPUs are used: idle, saturated, hung, starved, bound."""
    names = recording_names(thresholds)
    w, short = thresholds.window, thresholds.short_window
    floor = thresholds.in_use_memory_floor_bytes
    in_use = f"and on ({GPU}) {names['in_use']}"
    low = thresholds.alert("GPUUtilizationLow")
    high = thresholds.alert("GPUUtilizationHigh")
    hung = thresholds.alert("GPUJobHung")
    starved = thresholds.alert("GPUDataLoaderStarved")
    bound = thresholds.alert("GPUMemoryBandwidthBound")
    full = thresholds.alert("GPUMemoryNearlyFull")
    imbalance = thresholds.alert("GPULoadImbalance")
    idle = thresholds.alert("GPUIdleAllocated")
    in_use_avg = f"{names['avg']} {in_use}"
    mig = f"{GPU}, mig_instance"

    gap = thresholds.gap_tolerance

    def held(name: str) -> str:
        """'Held for 5 minutes': the alert's `for:`, over the mean of every short window."""
        return f"for {thresholds.alert(name).for_} (the mean of every {short} window)"

    def or_held(name: str, condition: str, value: str, keys: str = GPU) -> str:
        return f"{condition}\nor\n{held_while_down(thresholds, name, value, keys)}"

    above = above_for(thresholds)
    # The pods holding a whole GPU and a MIG instance; a failed scrape must not restart the wait.
    whole_pods = bridged('gpu_pod_info{mig_instance=""}', gap)
    mig_pods = bridged('gpu_pod_info{mig_instance!=""}', gap)
    return [
        _alert(
            thresholds,
            "GPUUtilizationLow",
            or_held(
                "GPUUtilizationLow",
                f"{bridged(names['avg_short'], gap)} < {_num(low.number('below'))}\n{in_use}",
                names["avg_short"],
            ),
            "A GPU in use is mostly idle",
            f"{WHERE} has work on it but its utilization stayed below"
            f" {_pct(low.number('below'))} {held('GPUUtilizationLow')};"
            f" {PERCENT} over the last one: it waits on something other than its own compute.",
            value=PERCENT,
        ),
        _alert(
            thresholds,
            "GPUUtilizationHigh",
            f"{above}\nunless on ({GPU}) (\n{_indented(hung_power(thresholds))}\n)",
            "A GPU is saturated",
            f"{WHERE} kept its utilization above {_pct(high.number('above'))}"
            f" {held('GPUUtilizationHigh')} and drew the power of real work; {PERCENT} in its"
            " least busy window: it has no headroom left.",
            value=PERCENT,
            windowed=True,
        ),
        _alert(
            thresholds,
            "GPUJobHung",
            f"{hung_power(thresholds)}\nand on ({GPU}) (\n{_indented(above)}\n)",
            "A GPU looks busy but does no work",
            f"{WHERE} has run kernels all the time {held('GPUJobHung')} while drawing at most"
            f" {{{{ $value | humanizePercentage }}}} of its power limit (below"
            f" {_pct(hung.number('power_below'))}): kernels wait without computing, the sign of"
            " a hung collective (NCCL) or a deadlock.",
            value=PERCENT + " of the power limit",
            windowed=True,
        ),
        _alert(
            thresholds,
            "GPUDataLoaderStarved",
            or_held(
                "GPUDataLoaderStarved",
                starved_condition(
                    thresholds, bridged(names["avg_short"], gap), bridged(names["idle_short"], gap)
                ),
                names["avg_short"],
            ),
            "A GPU keeps waiting for its input",
            f"{WHERE} stayed below {_pct(starved.number('average_below'))} utilization and sat"
            f" fully idle, no kernel running, more than {_pct(starved.number('idle_above'))} of"
            f" the time {held('GPUDataLoaderStarved')}; {PERCENT} utilization over the last one:"
            " it finishes each batch and waits for the next one, the input pipeline does not"
            " keep up.",
            value=PERCENT,
        ),
        _alert(
            thresholds,
            "GPUMemoryBandwidthBound",
            (
                f"{names['dram_active']} > {_num(bound.number('dram_active_above'))}\n"
                f"and on ({GPU}) {names['pipes']} < {_num(bound.number('compute_pipes_below'))}"
            ),
            "A GPU is limited by memory bandwidth",
            f"{WHERE} kept its memory interface active {{{{ $value | humanizePercentage }}}}"
            f" of the time over the last {w} while its busiest compute pipe stayed below"
            f" {_pct(bound.number('compute_pipes_below'))}: the work is bound by memory bandwidth.",
            value=PERCENT + " DRAM active",
        ),
        _alert(
            thresholds,
            "GPUMemoryNearlyFull",
            (
                f"{names['memory_used']} > {_num(full.number('used_above'))}\n"
                "or\n"
                "gpu_mig_memory_used_bytes / gpu_mig_memory_total_bytes"
                f" > {_num(full.number('used_above'))}"
            ),
            "A GPU's memory is nearly full",
            f"{WHERE}{MIG_INSTANCE} has {{{{ $value | humanizePercentage }}}} of its memory in use"
            f" (above {_pct(full.number('used_above'))}): the next allocation peak may run out"
            " of memory.",
            value=PERCENT + " used",
        ),
        _alert(
            thresholds,
            "GPULoadImbalance",
            (
                f"max by ({NODE}) ({in_use_avg})\n"
                f"- min by ({NODE}) ({in_use_avg})\n"
                f"> {_num(imbalance.number('spread_above'))}"
            ),
            "GPUs of one node are unevenly loaded",
            f"The in-use GPUs on {INSTANCE} differ by {{{{ $value | humanizePercentage }}}}"
            f" in {w} average utilization (more than"
            f" {_points(imbalance.number('spread_above'))} points between the busiest and the"
            " idlest): uneven batches or a straggler.",
            value=PERCENT + " spread",
        ),
        _alert(
            thresholds,
            "GPUIdleAllocated",
            # gpu_pod_info on the left: a time-sliced GPU has several pods, one alert each. A
            # whole GPU is judged by its utilization, a MIG instance by its SM activity.
            (
                f"{whole_pods}\n"
                f"* on ({GPU}) group_left ()\n"
                f"({names['avg']} < {_num(idle.number('below'))})\n"
                "or\n"
                f"{mig_pods}\n"
                f"* on ({mig}) group_left ()\n"
                f"({names['mig_sm_active']} < {_num(idle.number('below'))})"
            ),
            "A GPU allocated to a pod sits idle",
            f"{WHERE}{MIG_INSTANCE} is allocated to pod"
            " {{ $labels.namespace }}/{{ $labels.pod }} (container {{ $labels.container }}) but"
            f" was busy {{{{ $value | humanizePercentage }}}} of the last {w}, below"
            f" {_pct(idle.number('below'))}: the pod holds a GPU it does not use.",
            value=PERCENT,
        ),
        _alert(
            thresholds,
            "GPUMIGUtilizationLow",
            or_held(
                "GPUMIGUtilizationLow",
                f"{bridged(names['mig_sm_active_short'], gap)}"
                f" < {_num(low.number('below'))}\n"
                f"and on ({mig}) {bridged('gpu_mig_memory_used_bytes', gap)} > {floor}",
                names["mig_sm_active_short"],
                mig,
            ),
            "A MIG instance in use is mostly idle",
            f"{WHERE}{MIG_INSTANCE} holds memory but its SMs stayed busy less than"
            f" {_pct(low.number('below'))} of the time"
            f" {held('GPUMIGUtilizationLow')}; {PERCENT} over the last one.",
            value=PERCENT + " SM active",
        ),
    ]


def health_alerts(thresholds: Thresholds) -> list[Rule]:
    """Return the alerts about the hardware: heat, power, links, XIDs, memory errors, lost GPUs."""
    names = recording_names(thresholds)
    w = thresholds.window
    thermal = thresholds.alert("GPUThermalThrottling")
    power = thresholds.alert("GPUPowerCapped")
    slowdown = thresholds.alert("GPUHardwareSlowdown")
    temperature = thresholds.alert("GPUTemperatureHigh")
    memory_temperature = thresholds.alert("GPUMemoryTemperatureHigh")
    pcie = thresholds.alert("GPUPCIeLinkDegraded")
    xid = thresholds.alert("GPUXidError")
    recovery = thresholds.alert("GPURecoveryActionRequired")
    ecc = thresholds.alert("GPUECCUncorrectable")
    margin = _num(temperature.number("margin_celsius"))
    fallback = _num(temperature.number("fallback_celsius"))
    memory_above = _num(memory_temperature.number("above_celsius"))
    xids = "|".join(str(code) for code in xid.xids())
    ecc_window = ecc.duration("window")
    uncorrected = 'gpu_ecc_errors_total{type="uncorrected",counter="volatile"}'
    events = names["clock_events"]
    return [
        _alert(
            thresholds,
            "GPUThermalThrottling",
            (
                f'max without (reason) ({events}{{reason=~"sw_thermal|hw_thermal"}})'
                f"\n> {_num(thermal.number('active_above'))}"
            ),
            "A GPU is slowed down by heat",
            f"{WHERE} had its clocks cut by thermal slowdown {{{{ $value | humanizePercentage }}}}"
            f" of the last {w}.",
            value=PERCENT + " of the time",
        ),
        _alert(
            thresholds,
            "GPUPowerCapped",
            (
                f'max without (reason) ({events}{{reason=~"sw_power_cap|hw_power_brake"}})'
                f"\n> {_num(power.number('active_above'))}"
            ),
            "A GPU is held down by its power limit",
            f"{WHERE} had its clocks held down by its power limit or an external power brake"
            f" {{{{ $value | humanizePercentage }}}} of the last {w}.",
            value=PERCENT + " of the time",
        ),
        _alert(
            thresholds,
            "GPUHardwareSlowdown",
            (
                f'max without (reason) ({events}{{reason="hw_slowdown"}})'
                f"\n> {_num(slowdown.number('active_above'))}"
            ),
            "A GPU's hardware cut its clocks",
            f"{WHERE} had hardware slowdown engaged (clocks cut by half or more: heat, a power"
            f" brake or the power supply) {{{{ $value | humanizePercentage }}}} of the last {w}.",
            value=PERCENT + " of the time",
        ),
        _alert(
            thresholds,
            "GPUTemperatureHigh",
            (
                'gpu_temperature_celsius{sensor="gpu"}\n'
                f"  > ignoring (sensor) (gpu_temperature_slowdown_threshold_celsius - {margin})\n"
                "or\n"
                f'max without (sensor) (gpu_temperature_celsius{{sensor="gpu"}} > {fallback})\n'
                f"  unless on ({GPU}) gpu_temperature_slowdown_threshold_celsius"
            ),
            "A GPU is close to its slowdown temperature",
            f"{WHERE} is at {{{{ $value | humanize }}}} °C, less than {margin} °C below its"
            f" slowdown threshold (or above {fallback} °C where it reports none).",
            value=CELSIUS,
        ),
        _alert(
            thresholds,
            "GPUMemoryTemperatureHigh",
            f'gpu_temperature_celsius{{sensor="memory"}} > {memory_above}',
            "A GPU's memory is close to its temperature limit",
            f"{WHERE} has its memory (HBM) at {{{{ $value | humanize }}}} °C, above"
            f" {memory_above} °C: near its maximum operating temperature, where it is throttled.",
            value=CELSIUS,
        ),
        _alert(
            thresholds,
            "GPUPCIeLinkDegraded",
            (
                # Each generation doubles the per-lane rate (gen 3 onwards after encoding), so
                # this is the link's bandwidth as a fraction of what it supports.
                "2 ^ (gpu_pcie_link_generation - gpu_pcie_link_max_generation)\n"
                "  * gpu_pcie_link_width / gpu_pcie_link_max_width\n"
                "< 1\n"
                f"and on ({GPU}) {names['avg']} > {_num(pcie.number('busy_above'))}"
            ),
            "A busy GPU's PCIe link runs below its capability",
            f"{WHERE} is busy but its PCIe link gives {{{{ $value | humanizePercentage }}}} of"
            " its maximum bandwidth: it trained at a lower generation or fewer lanes than"
            " it supports.",
            value=PERCENT + " of its bandwidth",
        ),
        _alert(
            thresholds,
            "GPUNVLinkDown",
            "gpu_nvlink_link_down == 1",
            "An NVLink link of a GPU is down",
            f"{WHERE} has NVLink link {{{{ $labels.link }}}} inactive while its other links are"
            " up: traffic over it falls back to other paths, or collectives stall.",
            value="link {{ $labels.link }} down",
        ),
        _alert(
            thresholds,
            "GPUXidError",
            _xid_increase(f'xid=~"{xids}"', xid.duration("window")),
            "A GPU reported a critical XID error",
            f"{WHERE} reported XID {{{{ $labels.xid }}}}"
            f' ({{{{ $value | printf "%.0f" }}}} in the last {xid.duration("window")}):'
            " see the runbook for what this code needs (reset, drain or service).",
            value=f"{COUNT} of XID {{{{ $labels.xid }}}}",
        ),
        _alert(
            thresholds,
            "GPURecoveryActionRequired",
            _xid_increase('xid="154"', recovery.duration("window")),
            "A GPU needs a recovery action",
            f'{WHERE} reported XID 154 ({{{{ $value | printf "%.0f" }}}} in the last'
            f" {recovery.duration('window')}): the driver asks for a recovery action (a GPU"
            " reset, a node reboot or a drain); the kernel log names which.",
            value=f"{COUNT} of XID 154",
        ),
        _alert(
            thresholds,
            "GPUFellOffBus",
            # Without the UUID: after an exporter restart NVML cannot read a lost GPU's UUID
            # (GPU_IS_LOST), and the alert must stay the same alert across the restart.
            "max without (uuid) (gpu_up == 0)",
            "A GPU has fallen off the bus",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }}"
            "{{ with $labels.node }} (node {{ . }}){{ end }}"
            " no longer answers NVML (GPU is lost): it has fallen off the bus.",
            value="lost (gpu_up 0)",
        ),
        _alert(
            thresholds,
            "GPUECCUncorrectable",
            (
                f"{uncorrected} > 0\n"
                "or\n"
                # Where the volatile counter is missing, new errors in the aggregate one.
                'increase(gpu_ecc_errors_total{type="uncorrected",counter="aggregate"}'
                f"[{ecc_window}]) > 0\n"
                f"  unless on ({GPU}) {uncorrected}"
            ),
            "A GPU had uncorrectable memory errors",
            f'{WHERE} counted {{{{ $value | printf "%.0f" }}}} uncorrectable ECC errors since'
            f" its driver was loaded (or in the last {ecc_window}).",
            value=f"{COUNT} errors",
        ),
        _alert(
            thresholds,
            "GPURowRemapPending",
            # Pre-Ampere GPUs retire pages instead of remapping rows: same action.
            "gpu_row_remap_pending == 1\nor\ngpu_retired_pages_pending == 1",
            "A GPU needs a reset to repair its memory",
            f"{WHERE} has a memory row remapping (or page retirement) pending: it takes effect at"
            " the next GPU reset.",
            value="remap pending",
        ),
        _alert(
            thresholds,
            "GPURowRemapFailed",
            "gpu_row_remap_failed == 1",
            "A GPU failed to repair its memory",
            f"{WHERE} failed to remap a memory row: it needs service.",
            value="remap failed",
        ),
    ]


def _xid_increase(matcher: str, window: str) -> str:
    """XIDs of the codes ``matcher`` selects counted in the last ``window``."""
    selector = f"gpu_xid_errors_total{{{matcher}}}"
    return (
        f"increase({selector}[{window}]) > 0\n"
        "or\n"
        # A counter whose first sample is already non-zero: increase() cannot see it.
        f"({selector} > 0 unless {selector} offset {window})"
    )


def inventory_group(thresholds: Thresholds) -> dict[str, Any]:
    """Return the GPUs that went missing: fewer than a node had, or one no longer reported.

    A group of its own, evaluated once a minute: its ranges span hours, and a GPU that has gone
    stays gone, so a minute's delay costs nothing. Not evaluated locally: a restarted exporter no
    longer has the GPUs it reported before, and cannot see whether it is scraped.
    """
    names = recording_names(thresholds)
    dropped = thresholds.alert("GPUCountDropped").duration("lookback")
    vanished = thresholds.alert("GPUVanished").duration("lookback")
    count = names["gpu_count"]
    exporter_up = f'up{{job=~"{thresholds.exporter_job_regex}"}} == 1'
    return {
        "name": "gpuload.inventory",
        "interval": "1m",
        "rules": [
            {
                # Every GPU an exporter reports, lost ones included, per target.
                "record": count,
                "expr": "count without (gpu, uuid) (gpu_up)",
            },
            _alert(
                thresholds,
                "GPUCountDropped",
                f"max_over_time({count}[{dropped}]) - {count} > 0",
                "A node reports fewer GPUs than it had",
                f'gpuload on {INSTANCE} reports {{{{ $value | printf "%.0f" }}}} GPU(s) fewer'
                f" than at its most in the last {dropped}: the driver no longer sees them.",
                value=f"{COUNT} missing",
            ),
            _alert(
                thresholds,
                "GPUVanished",
                (
                    f"last_over_time(gpu_up[{vanished}])\n"
                    "unless on (instance, job, uuid) gpu_up\n"
                    # A lost GPU read after a restart has no UUID: GPUFellOffBus names it.
                    "unless on (instance, job, gpu) gpu_up == 0\n"
                    # While NVML is down every GPU's series are absent: GPULoadNVMLDown says so.
                    "unless on (instance, job) gpuload_nvml_up == 0\n"
                    f"and on (instance, job) {exporter_up}"
                ),
                "A GPU is no longer reported",
                f"{WHERE} was reported in the last {vanished} and is no longer, while gpuload"
                " there is up: the driver no longer enumerates it.",
                value="no longer reported",
            ),
        ],
    }


def exporter_alerts(thresholds: Thresholds) -> list[Rule]:
    """Return the alerts about gpuload itself: down or absent, failing, without NVML, stale."""
    stale = thresholds.alert("GPULoadStale")
    max_age = duration_seconds(stale.duration("max_age"))
    job = f'job=~"{thresholds.exporter_job_regex}"'
    return [
        _alert(
            thresholds,
            "GPULoadExporterDown",
            f"up{{{job}}} == 0",
            "gpuload cannot be scraped",
            f"Prometheus cannot scrape gpuload on {INSTANCE} (job {{{{ $labels.job }}}}):"
            " the GPUs there are not monitored.",
            value="up 0",
        ),
        _alert(
            thresholds,
            "GPULoadExporterAbsent",
            (
                f"absent(up{{{job}}})\n"
                "or\n"
                # kube-state-metrics: a node that advertises GPUs, with no gpuload target on it.
                'group by (node) (kube_node_status_capacity{resource="nvidia_com_gpu"} > 0)\n'
                f"unless on (node) group by (node) (up{{{job}}})"
            ),
            "gpuload is not running where GPUs are",
            "{{ if $labels.node }}Node {{ $labels.node }} has GPUs but no gpuload target:"
            "{{ else }}Prometheus has no gpuload target at all:{{ end }}"
            " its GPUs are not monitored (no pod of the DaemonSet, or no scrape config finds it).",
            value="no target",
        ),
        _alert(
            thresholds,
            "GPULoadCollectorFailing",
            # With NVML down every collector fails; GPULoadNVMLDown says so once.
            "gpuload_collector_success == 0\nunless on (instance, job) gpuload_nvml_up == 0",
            "A gpuload collector keeps failing",
            "The {{ $labels.collector }} collector of gpuload on"
            f" {INSTANCE} fails: its metrics are missing or stale.",
            value="{{ $labels.collector }} failing",
        ),
        _alert(
            thresholds,
            "GPULoadPodResourcesDown",
            "gpuload_kubernetes_pod_resources_up == 0",
            "gpuload cannot tell which pod holds which GPU",
            f"gpuload on {INSTANCE} cannot use the kubelet's pod-resources socket (missing, not"
            " permitted, or the kubelet does not answer): gpu_pod_info is gone; the log names"
            " the path and the cause.",
            value="pod_resources_up 0",
        ),
        _alert(
            thresholds,
            "GPULoadNVMLDown",
            "gpuload_nvml_up == 0",
            "gpuload cannot use the NVIDIA driver",
            f"gpuload on {INSTANCE} cannot initialise NVML: the NVIDIA driver or its library is"
            " missing or broken, so no GPU there is monitored.",
            value="nvml_up 0",
        ),
        _alert(
            thresholds,
            "GPULoadStale",
            (
                "gpuload_gpu_stale == 1\n"
                "or\n"
                f"time() - gpuload_last_collection_timestamp_seconds > {max_age}"
            ),
            "gpuload serves stale data",
            "{{ if $labels.gpu }}"
            f"{WHERE} has NVML calls that do not return: its readings are stale."
            "{{ else }}"
            f"gpuload on {INSTANCE} last finished a collection"
            " {{ $value | humanizeDuration }} ago."
            "{{ end }}",
            value="{{ if $labels.gpu }}stale{{ else }}{{ $value | humanizeDuration }} old{{ end }}",
        ),
    ]


def _alert(
    thresholds: Thresholds,
    name: str,
    expr: str,
    summary: str,
    description: str,
    *,
    value: str,
    windowed: bool = False,
) -> Rule:
    """One alerting rule; ``windowed``: its expression judges the `for:` itself (no `for:`)."""
    settings = thresholds.alert(name)
    rule: Rule = {"alert": name, "expr": expr}
    if duration_seconds(settings.for_) and not windowed:
        rule["for"] = settings.for_
    if duration_seconds(settings.keep_firing_for):
        rule["keep_firing_for"] = settings.keep_firing_for
    rule["labels"] = {"severity": settings.severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "value": value,
        "runbook_url": thresholds.runbook_url(name),
    }
    return rule


def _indented(expr: str) -> str:
    """A sub-expression indented by two spaces, to sit inside parentheses."""
    return "\n".join(f"  {line}" for line in expr.split("\n"))


def _num(value: float) -> str:
    """Format a threshold for PromQL: 0.3 -> "0.3", 5.0 -> "5"."""
    return f"{value:g}"


def _pct(ratio: float) -> str:
    """Format a ratio as text: 0.3 -> "30%"."""
    return f"{ratio * 100:g}%"


def _points(ratio: float) -> str:
    """Format a spread of ratios as percentage points: 0.4 -> "40"."""
    return f"{ratio * 100:g}"
