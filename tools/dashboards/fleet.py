"""The GPU fleet overview: how the GPUs of every node are used, what is wasted, what is wrong.

GPU states are the fleet recording rules' (``gpu:gpu_state:5m``, exporter/alerting/rules.py):
*idle* (not in use), *underutilized* (average below GPUUtilizationLow's threshold), *healthy*,
*saturated* (above GPUUtilizationHigh's), *unmeasured* (in use, no utilization: an A100 in MIG
mode, or a node scraped for less than a window) and *lost* (``gpu_up == 0``). A GPU in MIG mode
is as busy as its instances' SMs. Every panel reads recorded series, the state counts and power
per node (``node:*``), so that a fleet of 10,000 GPUs answers from a few series per node; no
panel reads a GPU's series as scraped, which is also why the fleet has no namespace or pod
filter (``gpu_pod_info`` is one scraped series per GPU: the bottleneck view has them).
"""

from __future__ import annotations

from exporter.alerting.thresholds import Thresholds
from tools.dashboards.grafana import (
    Field,
    Json,
    Layout,
    Query,
    Steps,
    dashboard,
    dashed,
    heatmap,
    link,
    override,
    stat,
    table,
    timeseries,
)
from tools.dashboards.queries import Scope, percent, variables

UID = "gpuload-fleet"
# Every series of the dashboards has a `node` label (queries.keyed), so a table's Node column
# always has the node detail's key.
NODE_LINK = (
    "/d/gpuload-node/gpu-node-detail?var-node=${__data.fields.node}"
    "&${datasource:queryparam}&${__url_time_range}"
)


def utilization_steps(thresholds: Thresholds) -> Steps:
    """Colours of a utilization: orange below the low threshold, green, red above the high one."""
    return Steps(
        "orange",
        (
            (thresholds.alert("GPUUtilizationLow").number("below"), "green"),
            (thresholds.alert("GPUUtilizationHigh").number("above"), "red"),
        ),
    )


# State -> its colour, in the order the panels show them.
STATE_COLOURS = {
    "idle": "blue",
    "underutilized": "orange",
    "healthy": "green",
    "saturated": "purple",
    "unmeasured": "text",
    "lost": "red",
}


def build(thresholds: Thresholds) -> Json:
    """Return the fleet overview dashboard."""
    scope = Scope(thresholds, gpu_variable=False)
    names = scope.names
    low = thresholds.alert("GPUUtilizationLow").number("below")
    high = thresholds.alert("GPUUtilizationHigh").number("above")
    window = thresholds.window
    count = Field("short", Steps("green"), decimals=0)
    states = scope.node(names["node_states"])

    def counted(state: str) -> Query:
        selected = scope.node(names["node_states"], f'state="{state}"')
        return Query(f"sum({selected}) or vector(0)", instant=True)

    layout = Layout()
    layout.add(
        stat(
            "GPUs",
            "GPUs that gpuload reports on the selected nodes (gpu_up, whether reachable or not).",
            Query(f"sum({states}) or vector(0)", instant=True),
            Field("short", Steps("blue"), decimals=0),
            width=3,
        ),
        stat(
            "Idle",
            "GPUs with no process and less memory in use than the in-use floor"
            f" ({thresholds.in_use_memory_floor_bytes} bytes): capacity nobody uses.",
            counted("idle"),
            Field("short", Steps("blue"), decimals=0),
            width=3,
        ),
        stat(
            f"In use, underutilized (< {percent(low)})",
            f"In-use GPUs whose {window} average utilization is below {percent(low)}"
            " (the GPUUtilizationLow condition): the money being wasted.",
            counted("underutilized"),
            Field("short", Steps("green", ((1, "orange"),)), decimals=0),
            width=4,
        ),
        stat(
            f"Healthy ({percent(low)}-{percent(high)})",
            f"In-use GPUs whose {window} average utilization is between {percent(low)} and"
            f" {percent(high)}.",
            counted("healthy"),
            count,
            width=4,
        ),
        stat(
            f"Saturated (> {percent(high)})",
            f"GPUs whose {window} average utilization is above {percent(high)} (the"
            " GPUUtilizationHigh condition): no headroom left.",
            counted("saturated"),
            Field("short", Steps("green", ((1, "purple"),)), decimals=0),
            width=4,
        ),
        stat(
            "In use, unmeasured",
            "In-use GPUs with no utilization to judge: in MIG mode without GPM (A100), or on a"
            f" node scraped for less than {window}.",
            counted("unmeasured"),
            Field("short", Steps("green", ((1, "text"),)), decimals=0),
            width=3,
        ),
        stat(
            "Lost (fell off the bus)",
            "GPUs that answer NVML with 'GPU is lost' (gpu_up == 0): they need a reset or service.",
            counted("lost"),
            Field("short", Steps("green", ((1, "red"),)), decimals=0),
            width=3,
        ),
    )
    layout.add(
        heatmap(
            "Utilization across nodes",
            "One row per node, one column per interval; the colour is the mean of its GPUs'"
            f" {window} average utilization (a GPU in MIG mode: its instances' SM activity): red"
            " idle, green busy. The node detail has a row per GPU.",
            # One row per node, not per GPU: 10,000 rows over 6 hours is neither readable nor
            # answered in a second (1.3 s at 1,024 GPUs, bench/RESULTS.md).
            Query(f"max by (node) {scope.node(names['node_busy'])}", legend="{{node}}"),
            Field("percentunit", utilization_steps(thresholds), min=0, max=1),
            width=16,
            height=11,
        ),
        table(
            "Firing GPU alerts",
            'gpuload\'s alerts (ALERTS{alertname=~"GPU.*"}) firing now on the selected nodes;'
            " the runbook of each is linked from the alert's runbook_url.",
            [Query(scope.node("ALERTS", 'alertname=~"GPU.*"', 'alertstate="firing"'))],
            Field("short", no_value="No GPU alert is firing"),
            width=8,
            height=11,
            columns={
                "alertname": "Alert",
                "severity": "Severity",
                "node": "Node",
                "gpu": "GPU",
            },
            hidden=("Time", "__name__", "job", "instance", "alertstate", "uuid", "Value"),
            overrides=[
                override(
                    "byName",
                    "Severity",
                    {
                        "mappings": [
                            {
                                "type": "value",
                                "options": {
                                    "critical": {"color": "red", "index": 0},
                                    "warning": {"color": "orange", "index": 1},
                                    "info": {"color": "blue", "index": 2},
                                },
                            }
                        ],
                        "custom.cellOptions": {"type": "color-background"},
                    },
                ),
            ],
        ),
    )
    underutilized = scope.select(names["state"], 'state="underutilized"')
    layout.add(
        table(
            "Top underutilized GPUs (hours in use below the threshold, over the range)",
            f"The GPUs that spent the most hours in use below {percent(low)} utilization over"
            " the dashboard's time range (state underutilized of the fleet rules; only those"
            " GPUs' series are read). Click a node to open its detail.",
            [
                Query(
                    "topk(10,\n"
                    "  sum by (node, gpu, uuid) (\n"
                    f"    sum_over_time(\n{underutilized}[$__range:$__interval])\n"
                    "  )\n"
                    "  * $__interval_ms / 3600000\n)"
                )
            ],
            Field("h", Steps("green", ((1, "orange"), (8, "red"))), decimals=2),
            width=12,
            height=9,
            columns={"node": "Node", "gpu": "GPU", "Value": "Underutilized hours"},
            hidden=("Time", "__name__", "job", "instance", "uuid", "state"),
            sort_by="Underutilized hours",
            overrides=[
                override("byName", "Node", {"links": [link("Node detail", NODE_LINK)]}),
                override(
                    "byName",
                    "Underutilized hours",
                    {"custom.cellOptions": {"type": "color-background", "mode": "gradient"}},
                ),
            ],
        ),
        timeseries(
            "Fleet power draw",
            "Power drawn by the GPUs of the selected nodes together, against the sum of their"
            " enforced power limits (dashed).",
            [
                Query(f"sum({scope.node(names['node_power'])})", legend="draw"),
                Query(f"sum({scope.node(names['node_power_limit'])})", legend="limit"),
            ],
            Field("watt", Steps("green"), min=0),
            width=12,
            height=9,
            overrides=[dashed("limit", "red")],
        ),
    )
    layout.add(
        timeseries(
            "GPUs by state",
            "How many GPUs were idle, underutilized, healthy, saturated, unmeasured or lost over"
            f" time ({window} averages, as in the counts above).",
            [Query(f"sum by (state) ({states})", legend="{{state}}")],
            Field("short", Steps("green"), min=0, decimals=0),
            stacked=True,
            overrides=[
                override("byName", state, {"color": {"mode": "fixed", "fixedColor": color}})
                for state, color in STATE_COLOURS.items()
            ],
        ),
        timeseries(
            f"Average utilization by node ({window})",
            f"Mean of the {window} average utilization of each node's GPUs (MIG instances"
            f" included); the dashed lines are the {percent(low)} and {percent(high)} thresholds"
            " of the alerts.",
            [Query(f"avg by (node) {scope.node(names['node_busy'])}", legend="{{node}}")],
            Field("percentunit", utilization_steps(thresholds), min=0, max=1),
            threshold_lines=True,
        ),
    )
    return dashboard(
        UID,
        "GPU fleet overview",
        "gpuload: how many GPUs are idle, underutilized, healthy, saturated, unmeasured or lost;"
        " where the underutilized hours go; firing GPU alerts; fleet power.",
        variables(one_node=False, gpu=False, pods=False),
        layout,
    )
