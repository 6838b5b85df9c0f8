"""The "GPU efficiency" dashboard: who holds idle GPU-hours, allocated against used, idle pods.

Every number is `gpuload report`'s for the dashboard's time range: the tables run the report's
own queries (:func:`exporter.report.ledger.panel_queries`) over ``$__range``, on the accounting
rules' series (docs/accounting.md).
"""

from __future__ import annotations

from exporter.alerting import accounting
from exporter.alerting.thresholds import Thresholds
from exporter.report.ledger import BY, idle_pods_query, panel_queries
from tools.dashboards.grafana import (
    Field,
    Json,
    Layout,
    Panel,
    Query,
    Steps,
    dashboard,
    datasource_variable,
    table,
    text,
    timeseries,
)

UID = "gpuload-efficiency"
RANGE = "$__range"


def _hours_table(title: str, description: str, keys: tuple[str, ...]) -> Panel:
    queries = panel_queries(keys, RANGE)
    names = {key: key.replace("_", " ").capitalize() for key in keys}
    return table(
        title,
        description,
        [
            Query(f"sort_desc({queries['idle']})"),
            Query(queries["allocated"]),
            Query(queries["used"]),
        ],
        Field("short", Steps("text"), decimals=1),
        width=24,
        height=10,
        columns={
            **names,
            "Value #A": "Idle GPU-hours",
            "Value #B": "Allocated GPU-hours",
            "Value #C": "Used GPU-hours",
        },
        sort_by="Idle GPU-hours",
    )


def build(thresholds: Thresholds) -> Json:
    """Return the GPU efficiency dashboard."""
    del thresholds  # the accounting rules' states already carry the thresholds
    layout = Layout()
    layout.add(
        text(
            "How to read this",
            "GPU-hours over the dashboard's time range, from the accounting rules"
            " (`gpuload.accounting`): **allocated** is what pods held, **used** what they used"
            " (a hung GPU's use left out), **idle** allocated less used, leaving out the hours"
            " whose use cannot be measured (A100 MIG instances). `gpuload report` over the same"
            " period prints the same numbers, with cost and coverage. See docs/accounting.md.",
            height=4,
        )
    )
    layout.add(
        _hours_table(
            "Namespaces and owners by idle GPU-hours",
            "GPU-hours each workload held and did not use over the time range, the most first.",
            BY["owner"],
        )
    )
    layout.add(
        timeseries(
            "Allocated against used",
            "GPU-equivalents held by pods and used by them at each evaluation.",
            [
                Query(f"sum({accounting.level_names('namespace')[0]})", legend="allocated"),
                Query(
                    f'sum({accounting.level_names("namespace")[1]}{{state!="{accounting.HUNG}"}})',
                    legend="used",
                ),
                Query(f"sum({accounting.UNALLOCATED})", legend="no pod"),
            ],
            Field("short", Steps("green"), min=0, decimals=1),
            width=12,
        ),
        table(
            "Pods that held idle GPUs longest",
            "Hours each pod held a GPU the rules called idle or underutilized, the most first.",
            [Query(f"sort_desc({idle_pods_query(RANGE)})")],
            Field("h", Steps("text"), decimals=1),
            width=12,
            columns={"namespace": "Namespace", "pod": "Pod", "Value": "Hours idle"},
            sort_by="Hours idle",
        ),
    )
    return dashboard(
        UID,
        "GPU efficiency",
        "gpuload: which namespaces and owners hold idle GPU-hours, allocated against used, and"
        " the pods that held idle GPUs longest; the numbers of `gpuload report`.",
        [datasource_variable()],
        layout,
        time_from="now-7d",
    )
