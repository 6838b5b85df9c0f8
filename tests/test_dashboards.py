"""The committed Grafana dashboards: rendered from their definitions, well formed, one threshold.

Structure only; tests/test_dashboards_prometheus.py runs every query against real Prometheus.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.alerting import rules, thresholds
from tools import RULES_DIR
from tools.dashboards import render

FILES = sorted(render.DASHBOARDS_DIR.glob("*.json"))
PROVISIONING = render.DASHBOARDS_DIR.parent / "provisioning"

# Grafana's unit ids that the dashboards may use (Grafana's valueFormats categories).
GRAFANA_UNITS = {
    "none", "short", "percent", "percentunit", "bytes", "decbytes", "bits", "Bps", "binBps",
    "bps", "watt", "kwatt", "watth", "joule", "celsius", "fahrenheit", "hertz", "rotrpm",
    "s", "ms", "µs", "ns", "m", "h", "d", "dtdurations", "dateTimeAsIso", "string",
}  # fmt: skip
MODERN_PANELS = {
    "timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "state-timeline", "text",
    "row",
}  # fmt: skip
DEPRECATED_PANELS = {"graph", "singlestat", "table-old", "grafana-piechart-panel"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The dashboard of `gpuload report`'s numbers: sums over the cluster, no node scope.
CLUSTER_WIDE = "gpuload-efficiency"


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def panels() -> list[tuple[str, dict[str, Any]]]:
    return [(path.stem, panel) for path in FILES for panel in load(path)["panels"]]


def ratio_values(loaded: thresholds.Thresholds) -> set[float]:
    """Every number the thresholds file defines."""
    values = {loaded.bottlenecks.link_busy_above}
    for alert in loaded.alerts.values():
        values |= {v for v in alert.parameters.values() if isinstance(v, (int, float))}
    return {float(value) for value in values}


def test_committed_dashboards_are_what_the_definitions_render() -> None:
    rendered = render.render(thresholds.load())
    assert sorted(rendered) == [path.name for path in FILES]
    assert sorted(rendered) == [
        "gpuload-bottlenecks.json",
        "gpuload-efficiency.json",
        "gpuload-fleet.json",
        "gpuload-node.json",
    ]
    for path in FILES:
        assert path.read_text(encoding="utf-8") == rendered[path.name], (
            f"{path} differs from its definition: run"
            " `.venv/bin/python -m tools.dashboards.render` and commit the result"
        )


def test_render_check_reports_a_stale_file(tmp_path: Path) -> None:
    for path in FILES:
        shutil.copy(path, tmp_path / path.name)
    assert render.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "gpuload-node.json").write_text("{}\n", encoding="utf-8")
    assert render.main(["--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_dashboard_is_modern_grafana_json(path: Path) -> None:
    board = load(path)
    assert board["schemaVersion"] >= 39
    assert board["uid"] == path.stem
    assert board["title"]
    assert "gpuload" in board["tags"]
    names = [variable["name"] for variable in board["templating"]["list"]]
    assert names[0] == "datasource"
    if board["uid"] == CLUSTER_WIDE:
        # The report's numbers, for the whole cluster: no node or pod scope.
        assert names == ["datasource"]
        return
    assert names[1] == "node"
    # The fleet reads no per-GPU series as scraped, gpu_pod_info included: no pod scope.
    assert {"namespace", "pod"} <= set(names) or board["uid"] == "gpuload-fleet"
    datasource = board["templating"]["list"][0]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    for variable in board["templating"]["list"][1:]:
        assert variable["datasource"] == DATASOURCE
        assert variable["definition"].startswith("query_result(group by (")
        assert variable["regex"] == f'/{variable["name"]}="([^"]+)"/'
        if variable["includeAll"]:
            # Every node key; the others also match a series without the label.
            assert variable["allValue"] == (".+" if variable["name"] == "node" else ".*")
    # The pod variables must filter nothing while gpu_pod_info does not exist.
    for name in ("namespace", "pod"):
        variable = next((v for v in board["templating"]["list"] if v["name"] == name), None)
        assert variable is None or (
            variable["includeAll"] and "gpu_pod_info" in variable["definition"]
        )


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_every_query_finds_a_node_by_its_node_label_or_else_its_instance(path: Path) -> None:
    """A node keeps its `node` key across exporter rollouts; a bare install has its instance."""
    board = load(path)
    if board["uid"] == CLUSTER_WIDE:
        return
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    if board["uid"] == "gpuload-node":
        assert not variables["node"]["multi"] and not variables["node"]["includeAll"]
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            assert "$instance" not in expr, panel["title"]
            labelled = len(re.findall(r'\{node=~"\$node"', expr))
            bare = len(re.findall(r'\{node="", instance=~"\$node"', expr))
            keyed = len(re.findall(r'"node", "\$1", "instance", "\(\.\*\)"\)', expr))
            assert labelled == bare == keyed >= 1, (panel["title"], expr)


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_panel_ids_are_unique_and_the_grid_has_no_overlaps(path: Path) -> None:
    board = load(path)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize(("dashboard", "panel"), panels(), ids=lambda item: str(item)[:60])
def test_panel_uses_the_datasource_variable_a_modern_type_and_grafana_units(
    dashboard: str, panel: dict[str, Any]
) -> None:
    assert panel["type"] in MODERN_PANELS
    assert panel["type"] not in DEPRECATED_PANELS
    if panel["type"] in {"row", "text"}:
        assert "targets" not in panel
        return
    assert panel["datasource"] == DATASOURCE
    assert panel["targets"]
    for target in panel["targets"]:
        assert target["datasource"] == DATASOURCE
        assert target["expr"].strip()
    assert panel["description"]
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"] in GRAFANA_UNITS
    assert defaults["thresholds"]["mode"] == "absolute"
    assert defaults["thresholds"]["steps"][0]["value"] is None
    for override in panel["fieldConfig"]["overrides"]:
        for prop in override["properties"]:
            if prop["id"] == "unit":
                assert prop["value"] in GRAFANA_UNITS


def test_utilization_panels_draw_the_alert_thresholds() -> None:
    loaded = thresholds.load()
    low = loaded.alert("GPUUtilizationLow").number("below")
    high = loaded.alert("GPUUtilizationHigh").number("above")
    checked = 0
    for _, panel in panels():
        exprs = " ".join(target["expr"] for target in panel.get("targets", []))
        utilization = r"gpu_utilization_seconds(_total|:rate5m)\{|gpu_busy:(ratio5m|avg5m)\{"
        if not re.search(utilization, exprs) or "count(" in exprs:
            continue
        if panel["fieldConfig"]["defaults"]["unit"] != "percentunit":
            continue
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        if "fully idle" in panel["title"] or "Behind" in panel["title"]:
            continue  # the starved and imbalance evidence use their own thresholds
        assert [step["value"] for step in steps] == [None, low, high], panel["title"]
        checked += 1
    assert checked >= 5


def test_every_threshold_in_a_dashboard_comes_from_the_thresholds_file() -> None:
    """A number edited into a dashboard, not into alert_rules/thresholds.yaml, fails here."""
    defined = ratio_values(thresholds.load()) | {1.0}  # 1: "at least one" for counts and flags
    for dashboard, panel in panels():
        if "fieldConfig" not in panel:
            continue
        for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]:
            if panel["fieldConfig"]["defaults"]["unit"] == "h":
                continue  # underutilized hours: colour only, not an alert threshold
            assert float(step["value"]) in defined, (dashboard, panel["title"], step)


def test_changed_thresholds_reach_the_dashboards() -> None:
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    document["alerts"]["GPUUtilizationLow"]["below"] = 0.25
    document["alerts"]["GPUUtilizationHigh"]["above"] = 0.9
    document["runbook_base_url"] = "https://example.org/runbooks.md"
    changed = render.render(thresholds.parse(document))
    fleet = json.loads(changed["gpuload-fleet.json"])
    titles = [panel["title"] for panel in fleet["panels"]]
    assert "In use, underutilized (< 25%)" in titles
    assert "Saturated (> 90%)" in titles
    # The fleet's states come from the fleet rules, which read the same thresholds; its
    # utilization panels draw them.
    by_node = next(p for p in fleet["panels"] if p["title"].startswith("Average utilization"))
    assert [s["value"] for s in by_node["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [
        None,
        0.25,
        0.9,
    ]
    node = json.loads(changed["gpuload-node.json"])
    utilization = next(panel for panel in node["panels"] if panel["title"] == "GPU utilization")
    steps = utilization["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [step["value"] for step in steps] == [None, 0.25, 0.9]
    assert (
        "https://example.org/runbooks.md#gpudataloaderstarved"
        in (changed["gpuload-bottlenecks.json"])
    )


def test_dashboards_only_use_metric_names_that_exist() -> None:
    """Every name in a query is a family in a golden file or a shipped recording rule."""
    golden = Path(__file__).parent / "golden"
    exposed = {
        line.split("{")[0].split(" ")[0]
        for path in golden.glob("metrics-*.txt")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    }
    recorded = {
        rule.record
        for groups in rules.rule_groups(thresholds.load()).values()
        for group in groups
        for rule in group.recordings()
    }
    # ALERTS is Prometheus's; gpu_pod_info comes with the Kubernetes pod labels (optional); the
    # PCIe byte counters are in the golden scrapes but dropped as non-deterministic.
    known = exposed | recorded | {"ALERTS", "gpu_pod_info"}
    known |= {"gpu_pcie_receive_bytes_total", "gpu_pcie_transmit_bytes_total"}
    for dashboard, panel in panels():
        for target in panel.get("targets", []):
            expr = re.sub(r'"[^"]*"', '""', target["expr"])  # label values are not names
            expr = re.sub(r"\{[^}]*\}", "", expr)  # neither are label names
            expr = re.sub(r"\[[^\]]*\]", "", expr)  # nor durations
            # nor the label lists of by/without/on/group_left
            expr = re.sub(
                r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr
            )
            for name in re.findall(r"[a-zA-Z_:][\w:]*", expr):
                if not re.match(r"gpu|node:|ALERTS", name):
                    continue
                assert name in known, (dashboard, panel["title"], name)


# The last interval's ratios a panel must not read (rate() of their counters of seconds is the
# mean over any window), and the families being removed.
LAST_INTERVAL = re.compile(
    r"gpu_(mig_)?(utilization|memory_utilization|sm_active|sm_occupancy|tensor_active"
    r"|dram_active|fp16_active|fp32_active|fp64_active|integer_active)_ratio"
    r"|gpu_bar1_|gpu_memory_free_bytes|clock=\"graphics\""
)


def test_activity_is_read_from_counters_of_seconds_not_the_last_interval() -> None:
    read = 0
    for dashboard, panel in panels():
        for target in panel.get("targets", []):
            assert not LAST_INTERVAL.search(target["expr"]), (dashboard, panel["title"])
            read += "_seconds_total" in target["expr"] or "_seconds:rate" in target["expr"]
    assert read >= 10


def test_fleet_reads_recorded_series_only() -> None:
    """At 10,000 GPUs no fleet panel reads every GPU's series as scraped."""
    board = load(render.DASHBOARDS_DIR / "gpuload-fleet.json")
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\{[^}]*\}", "", target["expr"])
            scraped = re.findall(r"(?<![\w:])gpu(?:load)?_\w+", expr)
            assert not scraped, (panel["title"], scraped)
            assert re.search(r"(?<![\w:])(gpu|node):\w+:\w+|ALERTS", expr), panel["title"]


def test_node_links_open_the_node_detail_by_its_node_key() -> None:
    for dashboard, panel in panels():
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] != "links" or "gpuload-node" not in json.dumps(prop["value"]):
                    continue
                assert override["matcher"]["options"] == "Node"
                assert "var-node=${__data.fields.node}" in prop["value"][0]["url"]
                columns = next(
                    t["options"]["renameByName"]
                    for t in panel["transformations"]
                    if t["id"] == "organize"
                )
                assert columns["node"] == "Node", (dashboard, panel["title"])


def test_bottleneck_table_links_the_runbooks_and_names_every_class() -> None:
    board = load(render.DASHBOARDS_DIR / "gpuload-bottlenecks.json")
    table = next(p for p in board["panels"] if p["title"] == "What limits each in-use GPU")
    overrides = {
        o["matcher"]["options"]: o["properties"] for o in table["fieldConfig"]["overrides"]
    }
    links = next(p["value"] for p in overrides["Runbook"] if p["id"] == "links")
    assert links[0]["url"] == "${__value.raw}"
    mapping = next(p["value"] for p in overrides["Bottleneck"] if p["id"] == "mappings")
    recorded = {rule["labels"]["bottleneck"] for rule in rules.bottleneck_rules(thresholds.load())}
    assert set(mapping[0]["options"]) == recorded
    loaded = thresholds.load()
    for rule in rules.bottleneck_rules(loaded):
        url = rule["labels"].get("runbook_url")
        if url:
            anchor = url.split("#")[1]
            runbooks = (RULES_DIR.parent / "docs" / "runbooks.md").read_text()
            assert any(line.lower() == f"## {anchor}" for line in runbooks.splitlines()), anchor


def test_provisioning_files_point_grafana_at_the_dashboards_and_prometheus() -> None:
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpuload.yaml").read_text())
    assert providers["apiVersion"] == 1
    assert providers["providers"][0]["type"] == "file"
    assert providers["providers"][0]["options"]["path"]
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"
