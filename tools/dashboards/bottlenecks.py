"""The bottleneck view: for each in-use GPU, which signal limits it, and the evidence.

It reads ``gpu:gpu_bottleneck:class5m`` (:func:`exporter.alerting.rules.bottleneck_rules`): one
series per in-use GPU and limiting signal, labelled ``bottleneck`` and, where a runbook explains
it, ``runbook_url``. The evidence panels draw the signals with the thresholds that decide.
"""

from __future__ import annotations

import json

from exporter.alerting.thresholds import Thresholds
from tools.dashboards.fleet import NODE_LINK, utilization_steps
from tools.dashboards.grafana import (
    Field,
    Json,
    Layout,
    Query,
    Steps,
    bargauge,
    dashboard,
    link,
    override,
    state_timeline,
    table,
    text,
    timeseries,
)
from tools.dashboards.queries import GPU, NODE, Scope, percent, variables

UID = "gpuload-bottlenecks"

# Each bottleneck's name on screen and colour.
BOTTLENECKS = {
    "input_starved": ("input-starved", "orange"),
    "underutilized": ("underutilized", "yellow"),
    "memory_bandwidth_bound": ("memory-bandwidth-bound", "purple"),
    "hung": ("hung", "semi-dark-red"),
    "compute_bound": ("compute-bound", "blue"),
    "thermal_throttled": ("throttled (thermal)", "red"),
    "power_capped": ("throttled (power cap)", "dark-red"),
    "pcie_bound": ("PCIe-bound", "super-light-purple"),
    "nvlink_bound": ("NVLink-bound", "light-purple"),
    "imbalanced": ("imbalanced", "dark-orange"),
    "none": ("no bottleneck", "green"),
}


def _explanation(thresholds: Thresholds) -> str:
    """Return the markdown that says what each bottleneck means, with the runbook links."""
    alert = thresholds.alert
    starved = alert("GPUDataLoaderStarved")
    bound = alert("GPUMemoryBandwidthBound")
    window = thresholds.window
    rows = [
        (
            "input_starved",
            "GPUDataLoaderStarved",
            f"in use, averaging below {percent(starved.number('average_below'))} utilization"
            f" and fully idle more than {percent(starved.number('idle_above'))} of the time:"
            " it finishes each batch and waits for the next, the data loader does not keep up",
        ),
        (
            "underutilized",
            "GPUUtilizationLow",
            f"average utilization below {percent(alert('GPUUtilizationLow').number('below'))}"
            " without the starved pattern",
        ),
        (
            "memory_bandwidth_bound",
            "GPUMemoryBandwidthBound",
            f"DRAM bandwidth above {percent(bound.number('dram_active_above'))} while the busiest"
            f" compute pipe stays below {percent(bound.number('compute_pipes_below'))} (GPM only)",
        ),
        (
            "hung",
            "GPUJobHung",
            f"utilization above {percent(alert('GPUUtilizationHigh').number('above'))} in every"
            f" {thresholds.short_window} of the last {alert('GPUUtilizationHigh').for_} while"
            f" drawing below {percent(alert('GPUJobHung').number('power_below'))} of its power"
            " limit: kernels wait without computing (a hung collective)",
        ),
        (
            "compute_bound",
            "GPUUtilizationHigh",
            f"utilization above {percent(alert('GPUUtilizationHigh').number('above'))}, not"
            " memory-bound and not hung: more GPUs or less work per step",
        ),
        (
            "thermal_throttled",
            "GPUThermalThrottling",
            f"thermal slowdown active more than"
            f" {percent(alert('GPUThermalThrottling').number('active_above'))} of the window",
        ),
        (
            "power_capped",
            "GPUPowerCapped",
            f"power cap or brake active more than"
            f" {percent(alert('GPUPowerCapped').number('active_above'))} of the window",
        ),
        (
            "pcie_bound",
            "GPUPCIeLinkDegraded",
            f"the PCIe link moves more than {percent(thresholds.bottlenecks.link_busy_above)} of"
            " its bandwidth (at its current generation and width)",
        ),
        (
            "nvlink_bound",
            None,
            f"the NVLinks move more than {percent(thresholds.bottlenecks.link_busy_above)} of"
            f" {thresholds.bottlenecks.nvlink_link_bytes_per_second / 1e9:g} GB/s per link and"
            " direction: the collective communication limits the step",
        ),
        (
            "imbalanced",
            "GPULoadImbalance",
            "trails the node's busiest in-use GPU by more than"
            f" {percent(alert('GPULoadImbalance').number('spread_above'))} points",
        ),
        ("none", None, "in use and none of the above"),
    ]
    lines = [
        f"Each in-use GPU is classified over the last {window} by the recording rule"
        " `gpu:gpu_bottleneck:class5m`, with the alert thresholds of"
        " `alert_rules/thresholds.yaml` (without the alerts' `for:`). A GPU can have more than"
        " one bottleneck. The *signal* is the value that crossed the threshold.",
        "",
        "| bottleneck | when | runbook |",
        "|---|---|---|",
    ]
    for key, alertname, when in rows:
        runbook = f"[{alertname}]({thresholds.runbook_url(alertname)})" if alertname else ""
        lines.append(f"| **{BOTTLENECKS[key][0]}** | {when} | {runbook} |")
    return "\n".join(lines) + "\n"


def build(thresholds: Thresholds) -> Json:
    """Return the bottleneck view."""
    scope = Scope(thresholds, gpu_variable=True)
    names = scope.names
    window = thresholds.window
    alert = thresholds.alert
    starved = alert("GPUDataLoaderStarved")
    bound = alert("GPUMemoryBandwidthBound")
    link_busy = thresholds.bottlenecks.link_busy_above
    classes = scope.gpus(names["bottleneck"])
    mapping = {
        "type": "value",
        "options": {
            key: {"text": shown, "color": color, "index": index}
            for index, (key, (shown, color)) in enumerate(BOTTLENECKS.items())
        },
    }
    layout = Layout()
    layout.add(
        bargauge(
            "In-use GPUs by bottleneck",
            f"How many in-use GPUs each signal limits ({window} window).",
            [
                Query(
                    f"count by (bottleneck) (\n{classes}\n)", legend="{{bottleneck}}", instant=True
                )
            ],
            Field("short", Steps("blue"), decimals=0, min=0),
            width=8,
            height=10,
        ),
        table(
            "What limits each in-use GPU",
            "One row per in-use GPU and limiting signal, with the value that crossed the"
            " threshold and the runbook that says what to do. Click a node for its detail.",
            [Query(f"{classes}\n* on ({GPU}) group_left (name) gpu_info")],
            Field("percentunit", Steps("text"), decimals=1),
            width=16,
            height=10,
            columns={
                "node": "Node",
                "gpu": "GPU",
                "name": "Model",
                "bottleneck": "Bottleneck",
                "Value": "Signal",
                "runbook_url": "Runbook",
            },
            hidden=("Time", "__name__", "job", "instance", "uuid"),
            overrides=[
                override(
                    "byName",
                    "Bottleneck",
                    {
                        "mappings": [mapping],
                        "custom.cellOptions": {"type": "color-background"},
                    },
                ),
                override(
                    "byName",
                    "Runbook",
                    {
                        "links": [link("Open the runbook", "${__value.raw}")],
                        "mappings": [
                            {
                                "type": "regex",
                                "options": {
                                    "pattern": ".*#(.*)",
                                    "result": {"text": "$1", "index": 0},
                                },
                            }
                        ],
                    },
                ),
                override("byName", "Node", {"links": [link("Node detail", NODE_LINK)]}),
            ],
        ),
    )
    layout.add(
        state_timeline(
            "Bottlenecks over time",
            "When each GPU was limited by what (rows appear for the signals that held); the"
            " colour is the signal's value.",
            [
                Query(
                    scope.pods(scope.select(names["bottleneck"], 'bottleneck!="none"')),
                    legend="{{node}} GPU {{gpu}}: {{bottleneck}}",
                )
            ],
            Field("percentunit", Steps("orange"), min=0, max=1),
            width=24,
            height=10,
        ),
    )

    layout.row("Evidence")
    utilization = Field("percentunit", utilization_steps(thresholds), min=0, max=1)

    def runbook(alertname: str) -> list[Json]:
        return [link(f"Runbook: {alertname}", thresholds.runbook_url(alertname))]

    idle_above = starved.number("idle_above")
    layout.add(
        timeseries(
            f"Utilization ({window} average)",
            f"Below {percent(utilization.steps.steps[0][0])}: underutilized; above"
            f" {percent(utilization.steps.steps[1][0])}: compute-bound (dashed lines).",
            [Query(scope.in_use(scope.gpus(names["avg"])), legend="{{node}} GPU {{gpu}}")],
            utilization,
            width=8,
            threshold_lines=True,
            links=runbook("GPUUtilizationLow"),
        ),
        timeseries(
            f"Input: time fully idle ({window})",
            "Fraction of the window in which an in-use GPU ran no kernel at all (NVML samples"
            f" at 0%): above {percent(idle_above)} (dashed), with a low average, it waits for its"
            " input between batches.",
            [
                Query(scope.in_use(scope.gpus(names["idle"])), legend="{{node}} GPU {{gpu}}"),
            ],
            Field("percentunit", Steps("green", ((idle_above, "orange"),)), min=0, max=1),
            width=8,
            threshold_lines=True,
            links=runbook("GPUDataLoaderStarved"),
        ),
        timeseries(
            f"Memory bandwidth vs. busiest compute pipe ({window}, GPM)",
            f"Memory-bandwidth-bound: DRAM above {percent(bound.number('dram_active_above'))}"
            f" while the busiest pipe stays below {percent(bound.number('compute_pipes_below'))}"
            " (dashed). GPM only: no data before Hopper.",
            [
                Query(scope.in_use(scope.gpus(names["dram_active"])), legend="GPU {{gpu}} DRAM"),
                Query(scope.in_use(scope.gpus(names["pipes"])), legend="GPU {{gpu}} pipes"),
            ],
            Field(
                "percentunit",
                Steps(
                    "green",
                    (
                        (bound.number("compute_pipes_below"), "yellow"),
                        (bound.number("dram_active_above"), "purple"),
                    ),
                ),
                min=0,
                max=1,
            ),
            width=8,
            threshold_lines=True,
            links=runbook("GPUMemoryBandwidthBound"),
        ),
    )
    throttle_steps = sorted(
        {
            alert("GPUThermalThrottling").number("active_above"),
            alert("GPUPowerCapped").number("active_above"),
        }
    )

    def share(reasons: str) -> str:
        active = scope.gpus(names["clock_events"], f"reason=~{json.dumps(reasons)}")
        return scope.in_use(f"max without (reason) ({active})")

    layout.add(
        timeseries(
            f"Clock slowdown share ({window})",
            "Fraction of the window the clocks were cut by heat or held by the power cap;"
            " throttled above the dashed line.",
            [
                Query(share("sw_thermal|hw_thermal"), legend="GPU {{gpu}} thermal"),
                Query(share("sw_power_cap|hw_power_brake"), legend="GPU {{gpu}} power"),
            ],
            Field(
                "percentunit",
                Steps("green", tuple((v, "red") for v in throttle_steps)),
                min=0,
                max=1,
            ),
            width=8,
            threshold_lines=True,
            links=runbook("GPUThermalThrottling") + runbook("GPUPowerCapped"),
        ),
        timeseries(
            f"PCIe and NVLink load ({window})",
            "The busier direction of each link as a fraction of its bandwidth; link-bound"
            f" above {percent(link_busy)} (dashed).",
            [
                Query(
                    scope.in_use(f"max without (direction) ({scope.gpus(names['pcie_busy'])})"),
                    legend="GPU {{gpu}} PCIe",
                ),
                Query(
                    scope.in_use(f"max without (direction) ({scope.gpus(names['nvlink_busy'])})"),
                    legend="GPU {{gpu}} NVLink",
                ),
            ],
            Field("percentunit", Steps("green", ((link_busy, "red"),)), min=0, max=1),
            width=8,
            threshold_lines=True,
            links=runbook("GPUPCIeLinkDegraded"),
        ),
        timeseries(
            f"Behind the node's busiest GPU ({window})",
            "How far each in-use GPU's average utilization trails the busiest in-use GPU of its"
            " node; imbalanced above"
            f" {percent(alert('GPULoadImbalance').number('spread_above'))} (dashed).",
            [
                Query(
                    f"max by ({NODE}) ({scope.in_use(scope.gpus(names['avg']))})\n"
                    f"- on ({NODE}) group_right ()\n"
                    f"({scope.in_use(scope.gpus(names['avg']))})",
                    legend="{{node}} GPU {{gpu}}",
                )
            ],
            Field(
                "percentunit",
                Steps("green", ((alert("GPULoadImbalance").number("spread_above"), "red"),)),
                min=0,
                max=1,
            ),
            width=8,
            threshold_lines=True,
            links=runbook("GPULoadImbalance"),
        ),
    )
    layout.add(text("Reading the bottleneck view", _explanation(thresholds), height=12))
    return dashboard(
        UID,
        "GPU bottlenecks",
        "gpuload: what limits each in-use GPU (input, memory bandwidth, compute, heat, power,"
        " PCIe/NVLink, imbalance), with the evidence and the runbooks.",
        variables(one_node=False, gpu=True),
        layout,
        time_from="now-3h",
    )
