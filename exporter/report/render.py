"""A report as a table for people, CSV for spreadsheets or JSON for programs."""

from __future__ import annotations

import csv
import io
import json

from exporter.alerting.accounting import ACCOUNTED_STATES
from exporter.report.ledger import UNALLOCATED, Line, Report

FORMATS = ("table", "csv", "json")


def name(line: Line) -> str:
    """How a line is named: ``ml Deployment/train``, ``team vision``, ``(unallocated)``."""
    if line.key.get("line") == UNALLOCATED:
        return "(no pod: unallocated)"
    namespace = line.key.get("namespace")
    owner = line.key.get("owner_name")
    if "team" in line.key:
        return f"team {line.key['team'] or '(none)'}"
    if owner is None:
        return namespace or "(none)"
    kind = line.key.get("owner_kind") or ""
    return f"{namespace} {kind}/{owner}" if kind else f"{namespace} (owner unknown)"


def _hours(value: float) -> str:
    return f"{value:,.1f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def header(report: Report) -> str:
    """The period, the coverage and what the numbers are, in one line."""
    return (
        f"GPU-hours {report.period.words()}, coverage {report.coverage:.1%}"
        f", ranked by idle GPU-hours"
    )


def table(report: Report, limit: int | None = None) -> str:
    """Aligned columns, one line each, ``limit`` lines at most (then "and N more")."""
    cost = report.prices.given
    head = ["line", "allocated", "used", "idle", "efficiency", "hung", "unmeasured"]
    if cost:
        head.append(f"cost ({report.prices.currency})")
    rows = [head]
    shown = report.lines if limit is None else report.lines[:limit]
    for line in shown:
        row = [
            name(line),
            _hours(line.allocated),
            _hours(line.used),
            _hours(line.idle),
            _percent(line.efficiency),
            _hours(line.states.get("hung", 0.0)),
            _hours(line.unmeasured),
        ]
        if cost:
            row.append(f"{line.cost or 0.0:,.2f}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    text = [header(report)]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        text.append("  ".join(cells).rstrip())
    if limit is not None and len(report.lines) > limit:
        text.append(f"and {len(report.lines) - limit} more")
    return "\n".join(text) + "\n"


def as_csv(report: Report) -> str:
    """One row per line, every state's hours in its own column."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    keys = ["namespace", "owner_kind", "owner_name"] if report.by == "owner" else [report.by]
    writer.writerow(
        [
            *keys,
            "allocated_gpu_hours",
            "used_gpu_hours",
            "idle_gpu_hours",
            "efficiency",
            "hung_used_gpu_hours",
            "unmeasured_gpu_hours",
            *(f"{state}_hours" for state in ACCOUNTED_STATES),
            "cost",
            "coverage",
        ]
    )
    for line in report.lines:
        ids = (
            [UNALLOCATED] + [""] * (len(keys) - 1)
            if line.key.get("line") == UNALLOCATED
            else [line.key.get(k, "") for k in keys]
        )
        writer.writerow(
            [
                *ids,
                f"{line.allocated:.4f}",
                f"{line.used:.4f}",
                f"{line.idle:.4f}",
                "" if line.efficiency is None else f"{line.efficiency:.4f}",
                f"{line.hung_used:.4f}",
                f"{line.unmeasured:.4f}",
                *(f"{line.states.get(state, 0.0):.4f}" for state in ACCOUNTED_STATES),
                "" if line.cost is None else f"{line.cost:.2f}",
                f"{report.coverage:.4f}",
            ]
        )
    return out.getvalue()


def as_json(report: Report) -> str:
    """The whole report."""
    return json.dumps(report.to_json(), indent=2) + "\n"


def render(report: Report, output: str) -> str:
    """The report in one of :data:`FORMATS`."""
    if output == "csv":
        return as_csv(report)
    if output == "json":
        return as_json(report)
    return table(report)
