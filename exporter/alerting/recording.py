"""gpuload's recording rules: the windowed means, links, bottleneck classes and fleet states.

``gpuload.recording`` turns the exporter's counters of seconds into means over the shared window
(``rate()`` of ``gpu_utilization_seconds_total`` is the exact mean utilization over the window at
any scrape interval, where a gauge of the last second keeps 1 s of every scrape) and classifies
what limits each in-use GPU; ``gpuload.fleet`` gives every GPU one state and sums them per node,
for the fleet dashboard.
"""

from __future__ import annotations

from exporter.alerting.definition import Group, Recording
from exporter.alerting.expressions import (
    BOTTLENECK_ALERTS,
    COMPUTE_PIPES,
    GPM_RATIOS,
    GPU,
    NODE,
    STATES,
    above_for,
    bridged,
    hung_power,
    indented,
    literal,
    recording_names,
    short_rate,
    starved_condition,
    whole_window_rate,
)
from exporter.alerting.thresholds import Thresholds


def recording_group(thresholds: Thresholds) -> Group:
    """The recording rules; the alerts read these instead of repeating the windows."""
    return Group(
        "gpuload.recording",
        (
            *utilization_means(thresholds),
            *usage_rules(thresholds),
            *gpm_means(thresholds),
            *link_rules(thresholds),
            *bottleneck_classes(thresholds),
        ),
    )


def utilization_means(thresholds: Thresholds) -> tuple[Recording, ...]:
    """How busy and how idle each GPU was, over the window and over the short window."""
    names = recording_names(thresholds)
    w, short, gap = thresholds.window, thresholds.short_window, thresholds.gap_tolerance
    return (
        # The sustained utilization alerts hold when every short window's mean does.
        Recording(names["avg_short"], short_rate("gpu_utilization_seconds_total", short, gap)),
        Recording(names["avg"], whole_window_rate("gpu_utilization_seconds_total", w, gap)),
        # The fraction of the window in which the GPU ran no kernel at all.
        Recording(names["idle"], whole_window_rate("gpu_idle_seconds_total", w, gap)),
        # The same over the short window: GPUDataLoaderStarved judges GPUUtilizationLow's.
        Recording(names["idle_short"], short_rate("gpu_idle_seconds_total", short, gap)),
    )


def usage_rules(thresholds: Thresholds) -> tuple[Recording, ...]:
    """Whether each GPU is in use, how full its memory is, and how long its clocks were held."""
    names = recording_names(thresholds)
    floor = thresholds.in_use_memory_floor_bytes
    gap = thresholds.gap_tolerance
    return (
        # 1 for every GPU that has a process or holds memory above the floor, itself or in
        # one of its MIG instances (an unprivileged exporter sees only the instances' memory
        # on a MIG GPU). gpu_processes may be absent (older gpuload, collector off, no host
        # PID namespace): memory alone still decides. The gauges' last readings over the gap
        # tolerance: a failed scrape must not end a job.
        Recording(
            names["in_use"],
            "group without () (\n"
            f"  {bridged('gpu_processes', gap)} > 0\n"
            "  or\n"
            f"  {bridged('gpu_memory_used_bytes', gap)} > {floor}\n"
            "  or\n"
            "  group without (mig_instance, mig_profile) (\n"
            f"    {bridged('gpu_mig_memory_used_bytes', gap)} > {floor}\n"
            "  )\n"
            ")",
        ),
        Recording(names["memory_used"], "gpu_memory_used_bytes / gpu_memory_total_bytes"),
        # The fraction of the window each clock event reason was active (a 0/1 gauge: no
        # counter of it exists).
        Recording(
            names["clock_events"], f"avg_over_time(gpu_clock_event_active[{thresholds.window}])"
        ),
    )


def gpm_means(thresholds: Thresholds) -> tuple[Recording, ...]:
    """The GPM profiling means, MIG instances' SM activity, the power drawn and the busiest pipe."""
    names = recording_names(thresholds)
    w, short, gap = thresholds.window, thresholds.short_window, thresholds.gap_tolerance
    pipes = "|".join(COMPUTE_PIPES)
    return (
        *(
            Recording(names[ratio], whole_window_rate(f"gpu_{ratio}_seconds_total", w, gap))
            for ratio in GPM_RATIOS
        ),
        # A MIG instance's load: NVML has no utilization per instance, GPM has SM activity.
        Recording(
            names["mig_sm_active"], whole_window_rate("gpu_mig_sm_active_seconds_total", w, gap)
        ),
        Recording(
            names["mig_sm_active_short"],
            short_rate("gpu_mig_sm_active_seconds_total", short, gap),
        ),
        # The power drawn as a fraction of the limit (a gauge: no counter of energy is read).
        Recording(
            names["power_short"],
            f"avg_over_time(gpu_power_usage_watts[{short}])\n"
            f"/ {bridged('gpu_power_limit_watts', gap)}",
        ),
        # The busiest arithmetic pipe; whichever of them a GPU reports.
        Recording(
            names["pipes"],
            f'max without () ({{__name__=~"gpu:gpu_({pipes})_active_seconds:rate{w}"}})',
        ),
    )


def link_rules(thresholds: Thresholds) -> tuple[Recording, ...]:
    """How busy each GPU's PCIe link and NVLinks are, as a fraction of their bandwidth."""
    names = recording_names(thresholds)
    w = thresholds.window
    nvlink_rate = literal(thresholds.bottlenecks.nvlink_link_bytes_per_second)
    directions = (("rx", "receive"), ("tx", "transmit"))
    # Bytes/s per lane and direction: 2.5 and 5 GT/s with 8b/10b encoding (gen 1, 2), then
    # 8 GT/s with 128b/130b, doubling with each generation (gen 3 onwards).
    capacity = Recording(
        names["pcie_capacity"],
        "gpu_pcie_link_width * (\n"
        "  984615384 * 2 ^ (gpu_pcie_link_generation - 3)"
        " and gpu_pcie_link_generation >= 3\n"
        "  or\n"
        "  250000000 * 2 ^ (gpu_pcie_link_generation - 1)\n"
        ")",
    )
    pcie = (
        Recording(
            names["pcie_busy"],
            f"rate(gpu_pcie_{counter}_bytes_total[{w}]) / {names['pcie_capacity']}",
            {"direction": direction},
        )
        for direction, counter in directions
    )
    # Traffic spreads over the links that are up; a link that is down carries none. gpuload
    # exports per-GPU totals and the links up; `sum without (link)` and the count of
    # gpu_nvlink_link_up also read an older gpuload's per-link series.
    nvlink = (
        Recording(
            names["nvlink_busy"],
            f"sum without (link) (rate(gpu_nvlink_{counter}_bytes_total[{w}]))\n"
            "/ (\n"
            "  (gpu_nvlink_links_up > 0\n"
            "  or count without (link) (gpu_nvlink_link_up == 1))\n"
            f"  * {nvlink_rate}\n"
            ")",
            {"direction": direction},
        )
        for direction, counter in directions
    )
    return (capacity, *pcie, *nvlink)


def bottleneck_classes(thresholds: Thresholds) -> tuple[Recording, ...]:
    """What limits each in-use GPU: one series per GPU and limiting signal.

    Each series is labelled ``bottleneck`` (and ``runbook_url`` where a runbook explains it);
    its value is the signal that crossed the threshold, a ratio. The conditions are the alerts'
    without their ``for:``, so the bottleneck view and the alerts agree; ``none`` marks an in-use
    GPU that nothing here limits, valued at its average utilization.
    """
    record = recording_names(thresholds)["bottleneck"]
    conditions = {**_load_classes(thresholds), **_limit_classes(thresholds)}
    # In the order of BOTTLENECK_ALERTS: a later class may exclude an earlier one, the rules of
    # a group run in order, at one evaluation time.
    assert list(conditions) == list(BOTTLENECK_ALERTS)
    rules = []
    for bottleneck, expr in conditions.items():
        alert = BOTTLENECK_ALERTS[bottleneck]
        labels = {"bottleneck": bottleneck}
        if alert is not None:
            labels["runbook_url"] = thresholds.runbook_url(alert)
        rules.append(Recording(record, expr, labels))
    return tuple(rules)


def _unless_class(thresholds: Thresholds, bottleneck: str) -> str:
    """Leaves out the GPUs an earlier rule of the group put in class ``bottleneck``."""
    record = recording_names(thresholds)["bottleneck"]
    return f'unless on ({GPU}) {record}{{bottleneck="{bottleneck}"}}'


def _load_classes(thresholds: Thresholds) -> dict[str, str]:
    """The classes judged by how busy a GPU is: starved, underutilized, bound, hung."""
    names = recording_names(thresholds)
    in_use = f"and on ({GPU}) {names['in_use']}"
    low = thresholds.alert("GPUUtilizationLow")
    high = thresholds.alert("GPUUtilizationHigh")
    bound = thresholds.alert("GPUMemoryBandwidthBound")
    return {
        "input_starved": starved_condition(thresholds, names["avg"], names["idle"]),
        "underutilized": (
            f"{names['avg']} < {literal(low.number('below'))}\n{in_use}\n"
            f"{_unless_class(thresholds, 'input_starved')}"
        ),
        "memory_bandwidth_bound": (
            f"{names['dram_active']} > {literal(bound.number('dram_active_above'))}\n"
            f"and on ({GPU}) {names['pipes']} < {literal(bound.number('compute_pipes_below'))}\n"
            f"{in_use}"
        ),
        # GPUJobHung's condition itself: kernels resident, no power drawn.
        "hung": (
            f"{hung_power(thresholds)}\nand on ({GPU}) (\n{indented(above_for(thresholds))}\n)"
        ),
        "compute_bound": (
            f"{names['avg']} > {literal(high.number('above'))}\n{in_use}\n"
            f"{_unless_class(thresholds, 'memory_bandwidth_bound')}\n"
            f"{_unless_class(thresholds, 'hung')}"
        ),
    }


def _limit_classes(thresholds: Thresholds) -> dict[str, str]:
    """The classes judged by what holds a GPU back: heat, power, links, its node's other GPUs."""
    names = recording_names(thresholds)
    record = names["bottleneck"]
    in_use = f"and on ({GPU}) {names['in_use']}"
    in_use_avg = f"{names['avg']} {in_use}"
    thermal = thresholds.alert("GPUThermalThrottling")
    power = thresholds.alert("GPUPowerCapped")
    imbalance = thresholds.alert("GPULoadImbalance")
    link_busy = literal(thresholds.bottlenecks.link_busy_above)
    return {
        "thermal_throttled": (
            f'max without (reason) ({names["clock_events"]}{{reason=~"sw_thermal|hw_thermal"}})\n'
            f"> {literal(thermal.number('active_above'))}\n{in_use}"
        ),
        "power_capped": (
            "max without (reason) ("
            f'{names["clock_events"]}{{reason=~"sw_power_cap|hw_power_brake"}})\n'
            f"> {literal(power.number('active_above'))}\n{in_use}"
        ),
        "pcie_bound": f"max without (direction) ({names['pcie_busy']}) > {link_busy}\n{in_use}",
        "nvlink_bound": (
            f"max without (direction) ({names['nvlink_busy']}) > {link_busy}\n{in_use}"
        ),
        # The in-use GPUs of a node that trail its busiest one by more than the spread.
        "imbalanced": (
            f"max by ({NODE}) ({in_use_avg})\n"
            f"- on ({NODE}) group_right ()\n"
            f"({in_use_avg})\n"
            f"> {literal(imbalance.number('spread_above'))}"
        ),
        "none": f'{in_use_avg}\nunless on ({GPU}) {record}{{bottleneck!="none"}}',
    }


def fleet_group(thresholds: Thresholds) -> Group:
    """The fleet rules: how busy each GPU is, its one state, and per-node sums."""
    names = recording_names(thresholds)
    busy = names["busy"]
    return Group(
        "gpuload.fleet",
        (
            Recording(busy, _busy_ratio(thresholds)),
            *(
                Recording(names["state"], condition, {"state": state})
                for state, condition in state_conditions(thresholds).items()
            ),
            Recording(names["node_states"], f"count by ({NODE}, state) ({names['state']})"),
            Recording(names["node_busy"], f"avg by ({NODE}) ({busy})"),
            Recording(names["node_power"], f"sum by ({NODE}) (gpu_power_usage_watts)"),
            Recording(names["node_power_limit"], f"sum by ({NODE}) (gpu_power_limit_watts)"),
        ),
    )


def _busy_ratio(thresholds: Thresholds) -> str:
    """``gpu:gpu_busy:ratio5m``: the whole-GPU utilization of a GPU, or its MIG instances' SMs.

    In MIG mode, where NVML has no whole-GPU utilization, the mean SM activity of its MIG
    instances weighted by their SMs (GPM, Hopper and newer; absent on an A100 in MIG mode), of
    the instances whose counters have a whole window, like every windowed rate here.
    """
    names = recording_names(thresholds)
    mig_active = names["mig_sm_active"]
    # The SMs of each GPU instance: the sum over its compute instances.
    mig_sms = "sum without (mig_compute_instance, mig_profile) (gpu_mig_multiprocessors)"
    mig = f"{GPU}, mig_instance"
    return (
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
    )


def state_conditions(thresholds: Thresholds) -> dict[str, str]:
    """Each state of :data:`STATES` with its condition, in the order the rules record them.

    ``gpu:gpu_state:5m`` puts every GPU that has ``gpu_up`` in exactly one state, with
    GPUUtilizationLow's and GPUUtilizationHigh's thresholds: one in use without a busy ratio yet
    (a new node) is unmeasured.
    """
    names = recording_names(thresholds)
    low = literal(thresholds.alert("GPUUtilizationLow").number("below"))
    high = literal(thresholds.alert("GPUUtilizationHigh").number("above"))
    busy, in_use, up = names["busy"], names["in_use"], "gpu_up == 1"
    conditions = {
        "lost": "group without () (gpu_up == 0)",
        # Nothing holds it, and it does not run either (if it does, its busy ratio decides).
        "idle": f"{up}\nunless on ({GPU}) {in_use}\nunless on ({GPU}) {busy} >= {low}",
        "unmeasured": f"{up}\nand on ({GPU}) {in_use}\nunless on ({GPU}) {busy}",
        "underutilized": f"{up}\nand on ({GPU}) {in_use}\nand on ({GPU}) {busy} < {low}",
        "healthy": f"{up}\nand on ({GPU}) {busy} >= {low} <= {high}",
        "saturated": f"{up}\nand on ({GPU}) {busy} > {high}",
    }
    assert set(conditions) == set(STATES)
    return conditions


def gpu_count(thresholds: Thresholds) -> Recording:
    """Every GPU an exporter reports, lost ones included, per target (the inventory group's)."""
    return Recording(recording_names(thresholds)["gpu_count"], "count without (gpu, uuid) (gpu_up)")
