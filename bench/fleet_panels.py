"""The fleet dashboard's panels as Grafana sends their queries to Prometheus.

The panels come from the dashboard's definition (``tools.dashboards.fleet.build``), not from a
copy, so a changed query is measured as it now is. Each template variable takes its "All" value
(the dashboard's ``allValue``); Grafana's built-in ``$__interval``, ``$__interval_ms`` and
``$__range`` are filled in as Grafana computes them for the time range asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from exporter.alerting import thresholds
from exporter.alerting.thresholds import duration_seconds
from tools.dashboards import fleet

# Grafana's maxDataPoints defaults to the panel's width in pixels: about 1,000 on a wide screen.
MAX_DATA_POINTS = 1000
# The exporter's own families (gpu_*, gpuload_*), and the recorded ones (`gpu:...`, `node:...`).
_RAW_FAMILY = re.compile(r"(?<![\w:])gpu(?:load)?_\w+(?![\w:])")
_RECORDED = re.compile(r"(?<![\w:])(?:gpu|node):[\w:]+")


@dataclass(frozen=True)
class Target:
    """One query of a panel: instant (``/api/v1/query``) or over a range (``query_range``)."""

    ref: str
    expr: str
    instant: bool


@dataclass(frozen=True)
class Panel:
    """A dashboard panel and the queries Grafana sends to draw it."""

    title: str
    kind: str
    targets: tuple[Target, ...]

    def raw_families(self) -> list[str]:
        """The exporter's families the panel reads as scraped: every selected GPU's series."""
        names: set[str] = set()
        for target in self.targets:
            names |= raw_families(target.expr)
        return sorted(names)


# Grafana's interval rounding (its `roundInterval`): below each bound in seconds, this interval.
_ROUNDED = (
    (1.5, 1),
    (3.5, 2),
    (7.5, 5),
    (12.5, 10),
    (17.5, 15),
    (25, 20),
    (45, 30),
    (90, 60),
    (210, 120),
    (450, 300),
    (750, 600),
    (1050, 900),
    (1500, 1200),
    (2700, 1800),
    (5400, 3600),
)


@dataclass(frozen=True)
class TimeRange:
    """The range a dashboard shows and the interval Grafana derives from it."""

    seconds: int
    interval: int  # seconds: $__interval, and the step of range queries

    @classmethod
    def of(cls, seconds: float, scrape_interval: int) -> TimeRange:
        """Grafana's interval: the range over the panel's points, rounded, at least a scrape."""
        whole = max(int(seconds), scrape_interval)
        per_point = whole / MAX_DATA_POINTS
        rounded = next((value for bound, value in _ROUNDED if per_point < bound), 7200)
        return cls(whole, max(scrape_interval, rounded))

    def describe(self) -> str:
        """E.g. "6 h at a 20 s step"."""
        span = (
            f"{self.seconds / 3600:g} h" if self.seconds >= 3600 else f"{self.seconds / 60:.1f} min"
        )
        return f"{span} at a {self.interval} s step"


def dashboard() -> dict[str, Any]:
    """The fleet dashboard as the committed thresholds build it."""
    return fleet.build(thresholds.load())


def default_range_seconds(board: dict[str, Any]) -> int:
    """The dashboard's default time range (``now-6h`` -> 21600)."""
    return duration_seconds(str(board["time"]["from"]).removeprefix("now-"))


def panels(board: dict[str, Any]) -> list[Panel]:
    """Every panel of the dashboard that queries Prometheus, in the dashboard's order."""
    found = []
    for panel in board["panels"]:
        targets = tuple(
            Target(target["refId"], target["expr"], bool(target.get("instant")))
            for target in panel.get("targets", [])
        )
        if targets:
            found.append(Panel(panel["title"], panel["type"], targets))
    return found


def all_values(board: dict[str, Any]) -> dict[str, str]:
    """Each template variable's "All" value, by ``$name``: the whole fleet selected."""
    return {
        f"${variable['name']}": variable["allValue"]
        for variable in board["templating"]["list"]
        if variable.get("includeAll")
    }


def variable_queries(board: dict[str, Any]) -> dict[str, str]:
    """The PromQL of each ``query_result(...)`` variable, by name."""
    found = {}
    for variable in board["templating"]["list"]:
        match = re.fullmatch(r"query_result\((.+)\)", variable.get("definition", ""), re.DOTALL)
        if variable["type"] == "query" and match:
            found[variable["name"]] = match.group(1)
    return found


def expand(expr: str, variables: dict[str, str], time_range: TimeRange) -> str:
    """The query as Grafana sends it: variables and built-ins replaced, longest names first."""
    builtins = {
        "$__interval_ms": str(time_range.interval * 1000),
        "$__interval": f"{time_range.interval}s",
        "$__range": f"{time_range.seconds}s",
    }
    for name, value in sorted({**builtins, **variables}.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(name, value)
    # `$1` is label_replace's first group (the node key of a series without a node label).
    if "$" in expr.replace('"$1"', ""):
        raise ValueError(f"a variable is left in {expr!r}")
    return expr


def raw_families(expr: str) -> set[str]:
    """The exporter's families a query reads as scraped, not through a recording rule."""
    return set(_RAW_FAMILY.findall(re.sub(r"\{[^{}]*\}", "{}", expr)))


def families(board_panels: list[Panel]) -> list[str]:
    """Every family the panels read: the exporter's and the recorded ones."""
    names: set[str] = set()
    for panel in board_panels:
        for target in panel.targets:
            expr = re.sub(r"\{[^{}]*\}", "{}", target.expr)
            names |= set(_RAW_FAMILY.findall(expr)) | set(_RECORDED.findall(expr))
    return sorted(names)
