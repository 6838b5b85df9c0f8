"""Grafana JSON building blocks: panels, queries, template variables, layout and dashboards.

Only what gpuload's dashboards use, for Grafana 10 and 11 (``schemaVersion`` 39). Every panel
and every query reads the ``datasource`` template variable, so the JSON imports into any Grafana
with a Prometheus data source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

SCHEMA_VERSION = 39
GRID_COLUMNS = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

Json = dict[str, Any]


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel.

    ``instant`` queries return the latest value (stats, tables, bar gauges); the others a range.
    ``table`` asks Grafana for one row per series with the labels as columns.
    """

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass(frozen=True)
class Steps:
    """Threshold colours: ``base`` below the first value, then each (value, colour) upwards."""

    base: str
    steps: tuple[tuple[float, str], ...] = ()

    def json(self) -> Json:
        """Return Grafana's absolute thresholds."""
        values = [value for value, _ in self.steps]
        if values != sorted(set(values)):
            raise ValueError(f"threshold values must rise: {values}")
        return {
            "mode": "absolute",
            "steps": [
                {"color": self.base, "value": None},
                *({"color": color, "value": value} for value, color in self.steps),
            ],
        }


@dataclass
class Panel:
    """A panel before layout: its JSON without ``id`` and ``gridPos``, and its size."""

    json: Json
    width: int
    height: int


def _targets(queries: Sequence[Query]) -> list[Json]:
    targets = []
    for index, query in enumerate(queries):
        targets.append(
            {
                "refId": chr(ord("A") + index),
                "datasource": dict(DATASOURCE),
                "editorMode": "code",
                "expr": query.expr,
                "legendFormat": query.legend or "__auto",
                "range": not query.instant,
                "instant": query.instant,
                "format": "table" if query.table else "time_series",
            }
        )
    return targets


@dataclass
class Field:
    """A panel's field defaults: unit, range, thresholds, value mappings, links."""

    unit: str
    steps: Steps = field(default_factory=lambda: Steps("green"))
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    mappings: Sequence[Json] = ()
    links: Sequence[Json] = ()
    no_value: str | None = None
    color: Json | None = None
    custom: Mapping[str, Any] = field(default_factory=dict)

    def json(self, color: Json) -> Json:
        """Return ``fieldConfig.defaults``."""
        defaults: Json = {
            "unit": self.unit,
            "color": self.color or color,
            "thresholds": self.steps.json(),
            "mappings": list(self.mappings),
            "custom": dict(self.custom),
        }
        for key, value in (
            ("min", self.min),
            ("max", self.max),
            ("decimals", self.decimals),
            ("noValue", self.no_value),
        ):
            if value is not None:
                defaults[key] = value
        if self.links:
            defaults["links"] = list(self.links)
        return defaults


def panel(
    kind: str,
    title: str,
    description: str,
    queries: Sequence[Query],
    fields: Field,
    *,
    width: int,
    height: int,
    options: Mapping[str, Any],
    color: Json,
    overrides: Sequence[Json] = (),
    transformations: Sequence[Json] = (),
    links: Sequence[Json] = (),
) -> Panel:
    """Return a panel of any kind with its queries, field defaults and options."""
    body: Json = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": dict(DATASOURCE),
        "targets": _targets(queries),
        "fieldConfig": {"defaults": fields.json(color), "overrides": list(overrides)},
        "options": dict(options),
    }
    if transformations:
        body["transformations"] = list(transformations)
    if links:
        body["links"] = list(links)
    return Panel(body, width, height)


_LEGEND = {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []}
_REDUCE_LAST = {"calcs": ["lastNotNull"], "fields": "", "values": False}
_PALETTE = {"mode": "palette-classic"}
_BY_THRESHOLD = {"mode": "thresholds"}


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Query],
    fields: Field,
    *,
    width: int = 12,
    height: int = 8,
    threshold_lines: bool = False,
    stacked: bool = False,
    overrides: Sequence[Json] = (),
    links: Sequence[Json] = (),
) -> Panel:
    """Return a time series panel; ``threshold_lines`` draws the thresholds as dashed lines."""
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10 if not stacked else 60,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
        "thresholdsStyle": {"mode": "dashed" if threshold_lines else "off"},
        **fields.custom,
    }
    fields = replace(fields, custom=custom)
    options = {
        "legend": {**_LEGEND, "displayMode": "table", "placement": "right", "calcs": ["mean"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel(
        "timeseries",
        title,
        description,
        queries,
        fields,
        width=width,
        height=height,
        options=options,
        color=_PALETTE,
        overrides=overrides,
        links=links,
    )


def stat(
    title: str,
    description: str,
    query: Query,
    fields: Field,
    *,
    width: int = 4,
    height: int = 4,
    text_field: str | None = None,
    links: Sequence[Json] = (),
) -> Panel:
    """Return a single-value panel, coloured by its thresholds (or one label's text)."""
    reduce = dict(_REDUCE_LAST)
    if text_field:
        reduce["fields"] = f"/^{text_field}$/"
    options = {
        "reduceOptions": reduce,
        "colorMode": "background" if not text_field else "none",
        "graphMode": "none",
        "textMode": "value",
        "justifyMode": "center",
        "orientation": "auto",
        "wideLayout": True,
    }
    return panel(
        "stat",
        title,
        description,
        [query],
        fields,
        width=width,
        height=height,
        options=options,
        color=_BY_THRESHOLD,
        links=links,
    )


def gauge(
    title: str, description: str, query: Query, fields: Field, *, width: int = 4, height: int = 4
) -> Panel:
    """Return a gauge showing one value against its thresholds."""
    options = {
        "reduceOptions": _REDUCE_LAST,
        "showThresholdLabels": False,
        "showThresholdMarkers": True,
        "orientation": "auto",
    }
    return panel(
        "gauge",
        title,
        description,
        [query],
        fields,
        width=width,
        height=height,
        options=options,
        color=_BY_THRESHOLD,
    )


def bargauge(
    title: str,
    description: str,
    queries: Sequence[Query],
    fields: Field,
    *,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """Return horizontal bars, one per series, coloured by the thresholds."""
    options = {
        "reduceOptions": _REDUCE_LAST,
        "orientation": "horizontal",
        "displayMode": "gradient",
        "valueMode": "color",
        "namePlacement": "auto",
        "showUnfilled": True,
        "sizing": "auto",
        "minVizHeight": 16,
        "minVizWidth": 8,
        "maxVizHeight": 300,
    }
    return panel(
        "bargauge",
        title,
        description,
        queries,
        fields,
        width=width,
        height=height,
        options=options,
        color=_BY_THRESHOLD,
    )


def table(
    title: str,
    description: str,
    queries: Sequence[Query],
    fields: Field,
    *,
    width: int = 12,
    height: int = 8,
    columns: Mapping[str, str] | None = None,
    hidden: Iterable[str] = ("Time", "__name__", "job"),
    sort_by: str | None = None,
    overrides: Sequence[Json] = (),
) -> Panel:
    """Return a table of instant queries, one row per series, merged on their labels.

    ``columns`` renames fields (``"Value #A"`` is query A's value) and orders them; ``hidden``
    fields are dropped.
    """
    names = dict(columns or {})
    transformations: list[Json] = []
    if len(queries) > 1:
        transformations.append({"id": "merge", "options": {}})
    transformations.append(
        {
            "id": "organize",
            "options": {
                "excludeByName": dict.fromkeys(hidden, True),
                "indexByName": {name: index for index, name in enumerate(names)},
                "renameByName": names,
            },
        }
    )
    options: Json = {
        "showHeader": True,
        "cellHeight": "sm",
        "footer": {"show": False, "reducer": ["sum"], "fields": "", "countRows": False},
    }
    if sort_by:
        options["sortBy"] = [{"displayName": sort_by, "desc": True}]
    custom = {
        "align": "auto",
        "cellOptions": {"type": "auto"},
        "inspect": False,
        "filterable": True,
        **fields.custom,
    }
    fields = replace(fields, custom=custom)
    return panel(
        "table",
        title,
        description,
        [Query(q.expr, q.legend, instant=True, table=True) for q in queries],
        fields,
        width=width,
        height=height,
        options=options,
        color=_BY_THRESHOLD,
        overrides=overrides,
        transformations=transformations,
    )


def state_timeline(
    title: str,
    description: str,
    queries: Sequence[Query],
    fields: Field,
    *,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """Return a state timeline: one row per series, coloured by value mappings or thresholds."""
    custom = {"lineWidth": 0, "fillOpacity": 80, **fields.custom}
    fields = replace(fields, custom=custom)
    options = {
        "showValue": "never",
        "rowHeight": 0.85,
        "mergeValues": True,
        "alignValue": "left",
        "legend": {**_LEGEND},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    return panel(
        "state-timeline",
        title,
        description,
        queries,
        fields,
        width=width,
        height=height,
        options=options,
        color=_BY_THRESHOLD,
    )


def heatmap(
    title: str,
    description: str,
    query: Query,
    fields: Field,
    *,
    width: int = 24,
    height: int = 10,
) -> Panel:
    """Return a heatmap whose rows are the query's series (already bucketed, not calculated)."""
    options = {
        "calculate": False,
        "cellGap": 1,
        "cellValues": {"unit": fields.unit},
        "color": {
            "mode": "scheme",
            "scheme": "RdYlGn",
            "fill": "dark-orange",
            "scale": "exponential",
            "exponent": 0.5,
            "steps": 64,
            "reverse": False,
            "min": fields.min,
            "max": fields.max,
        },
        # Show every cell, idle (0) ones included.
        "filterValues": {"le": -1},
        "rowsFrame": {"layout": "auto"},
        "yAxis": {"axisPlacement": "left", "reverse": False},
        "legend": {"show": True},
        "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "showValue": "never",
    }
    custom = {
        "hideFrom": {"legend": False, "tooltip": False, "viz": False},
        "scaleDistribution": {"type": "linear"},
    }
    fields = replace(fields, custom=custom)
    return panel(
        "heatmap",
        title,
        description,
        [query],
        fields,
        width=width,
        height=height,
        options=options,
        color=_BY_THRESHOLD,
    )


def text(title: str, markdown: str, *, width: int = 24, height: int = 8) -> Panel:
    """Return a markdown panel (no queries, so no datasource)."""
    body: Json = {
        "type": "text",
        "title": title,
        "options": {"mode": "markdown", "content": markdown, "code": {"language": "plaintext"}},
    }
    return Panel(body, width, height)


def override(matcher: str, name: str, properties: Mapping[str, Any]) -> Json:
    """Return a field override: ``matcher`` is ``byName`` or ``byRegexp``."""
    return {
        "matcher": {"id": matcher, "options": name},
        "properties": [{"id": key, "value": value} for key, value in properties.items()],
    }


def dashed(pattern: str, color: str | None = None) -> Json:
    """Return an override drawing the series whose name matches ``pattern`` as dashed lines."""
    properties: dict[str, Any] = {
        "custom.lineStyle": {"fill": "dash", "dash": [10, 10]},
        "custom.fillOpacity": 0,
    }
    if color:
        properties["color"] = {"mode": "fixed", "fixedColor": color}
    return override("byRegexp", pattern, properties)


def link(title: str, url: str) -> Json:
    """Return a data or panel link opening ``url`` in a new tab."""
    return {"title": title, "url": url, "targetBlank": True}


class Layout:
    """Places panels left to right on Grafana's 24-column grid, under optional rows."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self._x = 0
        self._y = 0
        self._line_height = 0

    def _new_line(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0

    def row(self, title: str) -> None:
        """Start a row: a full-width header that groups the panels below it."""
        if self._x:
            self._new_line()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"x": 0, "y": self._y, "w": GRID_COLUMNS, "h": 1},
            }
        )
        self._y += 1

    def add(self, *panels: Panel) -> None:
        """Place panels after the previous ones, wrapping to a new line when a line is full."""
        for item in panels:
            if not 0 < item.width <= GRID_COLUMNS:
                raise ValueError(f"{item.json['title']}: width {item.width}")
            if self._x + item.width > GRID_COLUMNS:
                self._new_line()
            item.json["gridPos"] = {"x": self._x, "y": self._y, "w": item.width, "h": item.height}
            self.panels.append(item.json)
            self._x += item.width
            self._line_height = max(self._line_height, item.height)

    def numbered(self) -> list[Json]:
        """Return the panels with ids 1, 2, ... in layout order, ``id`` first."""
        return [{"id": index, **body} for index, body in enumerate(self.panels, start=1)]


def datasource_variable() -> Json:
    """Return the ``datasource`` variable: any Prometheus data source of the Grafana."""
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


def query_variable(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    include_all: bool = True,
    all_value: str = ".*",
    regex: str = "",
    sort: int = 3,
    description: str = "",
) -> Json:
    """Return a variable filled by a Prometheus query (``label_values(...)``, ``query_result``).

    "All" is ``all_value``; the default ``.*`` also matches a series without the label, so an
    empty variable (``gpu_pod_info`` absent) filters nothing. ``regex`` takes each value out of
    a ``query_result`` line; ``sort`` is Grafana's order (3 numerical, 5 alphabetical).
    """
    variable: Json = {
        "name": name,
        "label": label,
        "description": description,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "current": {},
        "hide": 0,
        "includeAll": include_all,
        "multi": multi,
        "options": [],
        "refresh": 2,
        "regex": regex,
        "sort": sort,
    }
    if include_all:
        variable["allValue"] = all_value
    return variable


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: Sequence[Json],
    layout: Layout,
    *,
    time_from: str = "now-6h",
) -> Json:
    """Return a whole dashboard, linked to the other gpuload dashboards by their tag."""
    return {
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "type": "dashboards",
                "title": "gpuload",
                "tags": ["gpuload"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "targetBlank": False,
                "icon": "external link",
                "tooltip": "",
                "url": "",
            }
        ],
        "panels": layout.numbered(),
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["gpuload", "gpu", "nvidia"],
        "templating": {"list": list(variables)},
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }
