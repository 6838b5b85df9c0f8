"""The GPU fleet overview: how the GPUs of every node are used, what is wasted, what is wrong.

GPU states use the alerts' definitions over the recording rules' window: *idle* (not in use),
*underutilized* (in use, average below GPUUtilizationLow's threshold), *healthy*, *saturated*
(above GPUUtilizationHigh's) and *lost* (``gpu_up == 0``).
"""

from __future__ import annotations

from exporter.alerting.thresholds import Thresholds
from exporter.dashboards.grafana import (
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
from exporter.dashboards.queries import GPU, Scope, number, percent, variables

UID = "gpuload-fleet"
NODE_LINK = (
    "/d/gpuload-node/gpu-node-detail?var-instance=${__data.fields.instance}"
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


def state_queries(thresholds: Thresholds, scope: Scope) -> dict[str, str]:
    """Return the expression selecting the GPUs in each state, by state name."""
    names = scope.names
    low = number(thresholds.alert("GPUUtilizationLow").number("below"))
    high = number(thresholds.alert("GPUUtilizationHigh").number("above"))
    average = scope.select(names["avg"])
    return {
        "idle": scope.pods(f"{scope.select('gpu_up')} == 1\nunless on ({GPU}) {names['in_use']}"),
        "underutilized": scope.pods(scope.in_use(f"{average} < {low}")),
        "healthy": scope.pods(scope.in_use(f"{average} >= {low} <= {high}")),
        "saturated": scope.pods(f"{average} > {high}"),
        "lost": scope.pods(f"{scope.select('gpu_up')} == 0"),
    }


def build(thresholds: Thresholds) -> Json:
    """Return the fleet overview dashboard."""
    scope = Scope(thresholds, gpu_variable=False)
    names = scope.names
    low = thresholds.alert("GPUUtilizationLow").number("below")
    high = thresholds.alert("GPUUtilizationHigh").number("above")
    window = thresholds.window
    states = state_queries(thresholds, scope)
    count = Field("short", Steps("green"), decimals=0)

    def counted(state: str) -> Query:
        return Query(f"count(\n{states[state]}\n) or vector(0)", instant=True)

    layout = Layout()
    layout.add(
        stat(
            "GPUs",
            "GPUs that gpuload reports on the selected nodes (gpu_up, whether reachable or not).",
            Query(f"count({scope.gpus('gpu_up')}) or vector(0)", instant=True),
            Field("short", Steps("blue"), decimals=0),
        ),
        stat(
            "Idle",
            "GPUs with no process and less memory in use than the in-use floor"
            f" ({thresholds.in_use_memory_floor_bytes} bytes): capacity nobody uses.",
            counted("idle"),
            Field("short", Steps("blue"), decimals=0),
        ),
        stat(
            f"In use, underutilized (< {percent(low)})",
            f"In-use GPUs whose {window} average utilization is below {percent(low)}"
            " (the GPUUtilizationLow condition): the money being wasted.",
            counted("underutilized"),
            Field("short", Steps("green", ((1, "orange"),)), decimals=0),
        ),
        stat(
            f"Healthy ({percent(low)}-{percent(high)})",
            f"In-use GPUs whose {window} average utilization is between {percent(low)} and"
            f" {percent(high)}.",
            counted("healthy"),
            count,
        ),
        stat(
            f"Saturated (> {percent(high)})",
            f"GPUs whose {window} average utilization is above {percent(high)} (the"
            " GPUUtilizationHigh condition): no headroom left.",
            counted("saturated"),
            Field("short", Steps("green", ((1, "purple"),)), decimals=0),
        ),
        stat(
            "Lost (fell off the bus)",
            "GPUs that answer NVML with 'GPU is lost' (gpu_up == 0): they need a reset or service.",
            counted("lost"),
            Field("short", Steps("green", ((1, "red"),)), decimals=0),
        ),
    )
    layout.add(
        heatmap(
            "Utilization across nodes and GPUs",
            "One row per GPU (node and NVML index), one column per interval; the colour is the"
            " average utilization in that interval: red idle, green busy.",
            Query(
                scope.pods(f"avg_over_time({scope.select('gpu_utilization_ratio')}[$__interval])"),
                legend="{{instance}} GPU {{gpu}}",
            ),
            Field("percentunit", utilization_steps(thresholds), min=0, max=1),
            width=16,
            height=11,
        ),
        table(
            "Firing GPU alerts",
            'gpuload\'s alerts (ALERTS{alertname=~"GPU.*"}) firing now on the selected nodes;'
            " the runbook of each is linked from the alert's runbook_url.",
            [
                Query(
                    scope.pods(
                        'ALERTS{alertname=~"GPU.*", alertstate="firing", instance=~"$instance"}'
                    )
                )
            ],
            Field("short", no_value="No GPU alert is firing"),
            width=8,
            height=11,
            columns={
                "alertname": "Alert",
                "severity": "Severity",
                "instance": "Node",
                "gpu": "GPU",
            },
            hidden=("Time", "__name__", "job", "alertstate", "uuid", "Value"),
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
    idle_in_use = scope.in_use(f"1 - {scope.select('gpu_utilization_ratio')}")
    layout.add(
        table(
            "Top underutilized GPUs in use (idle GPU-hours over the range)",
            "The in-use GPUs that spent the most time idle over the dashboard's time range:"
            " the sum over the range of (1 - utilization) while in use, in hours. Click a node"
            " to open its detail.",
            [
                Query(
                    "topk(10,\n"
                    f"  sum_over_time((\n{scope.pods(idle_in_use)}\n  )[$__range:$__interval])\n"
                    "  * $__interval_ms / 3600000\n"
                    f"  * on ({GPU}) group_left (name) gpu_info\n)"
                )
            ],
            Field("h", Steps("green", ((1, "orange"), (8, "red"))), decimals=2),
            width=12,
            height=9,
            columns={
                "instance": "Node",
                "gpu": "GPU",
                "name": "Model",
                "Value": "Idle GPU-hours",
            },
            hidden=("Time", "__name__", "job", "uuid"),
            sort_by="Idle GPU-hours",
            overrides=[
                override("byName", "Node", {"links": [link("Node detail", NODE_LINK)]}),
                override(
                    "byName",
                    "Idle GPU-hours",
                    {"custom.cellOptions": {"type": "color-background", "mode": "gradient"}},
                ),
            ],
        ),
        timeseries(
            "Fleet power draw",
            "Power drawn by the selected GPUs together, against the sum of their enforced power"
            " limits (dashed).",
            [
                Query(f"sum({scope.gpus('gpu_power_usage_watts')})", legend="draw"),
                Query(f"sum({scope.gpus('gpu_power_limit_watts')})", legend="limit"),
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
            "How many GPUs were idle, underutilized, healthy, saturated or lost over time"
            f" ({window} averages, as in the counts above).",
            [Query(f"count(\n{states[state]}\n)", legend=state) for state in states],
            Field("short", Steps("green"), min=0, decimals=0),
            stacked=True,
            overrides=[
                override("byName", state, {"color": {"mode": "fixed", "fixedColor": color}})
                for state, color in (
                    ("idle", "blue"),
                    ("underutilized", "orange"),
                    ("healthy", "green"),
                    ("saturated", "purple"),
                    ("lost", "red"),
                )
            ],
        ),
        timeseries(
            f"Average utilization by node ({window})",
            f"Mean of the {window} average utilization of each node's selected GPUs; the dashed"
            f" lines are the {percent(low)} and {percent(high)} thresholds of the alerts.",
            [
                Query(
                    f"avg by (instance) (\n{scope.gpus(names['avg'])}\n)",
                    legend="{{instance}}",
                )
            ],
            Field("percentunit", utilization_steps(thresholds), min=0, max=1),
            threshold_lines=True,
        ),
    )
    return dashboard(
        UID,
        "GPU fleet overview",
        "gpuload: how many GPUs are idle, underutilized, healthy, saturated or lost; where the"
        " idle GPU-hours go; firing GPU alerts; fleet power.",
        variables(one_node=False, gpu=False),
        layout,
    )
