"""The fleet benchmark (bench/fleet.py) on a tiny fleet: a real Prometheus, two exporters."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import fleet, fleet_panels, fleet_report, report
from bench.fleet_panels import TimeRange

pytestmark = [
    pytest.mark.skipif(
        not shutil.which("prometheus") or not shutil.which("promtool"),
        reason="needs Debian's prometheus (scripts/test installs it)",
    ),
    pytest.mark.engines,
]


def test_fake_nodes_reach_the_fleet_size_on_distinct_instances() -> None:
    scenarios, nodes = fleet.plan(fleet.Settings(gpus=20, scenarios=("training", "idle")))
    assert scenarios == ["training", "idle"]
    assert len(nodes) == 3  # 8 + 8 + 8 >= 20
    assert len({node.instance for node in nodes}) == 3
    assert [node.exporter for node in nodes] == [0, 1, 0]


def test_grafana_interval_for_the_dashboard_range() -> None:
    assert TimeRange.of(300, 15) == TimeRange(300, 15)
    assert TimeRange.of(6 * 3600, 15) == TimeRange(21600, 20)  # 21.6 s a point, rounded


def test_every_panel_query_expands_without_variables_left() -> None:
    board = fleet_panels.dashboard()
    variables = fleet_panels.all_values(board)
    for panel in fleet_panels.panels(board):
        for target in panel.targets:
            expanded = fleet_panels.expand(target.expr, variables, TimeRange(300, 15))
            # label_replace's "$1" (a node without a node label is known by its instance) stays.
            assert "$" not in expanded.replace('"$1"', "")
            assert variables["$node"] == ".+"


def test_fleet_section_replaces_its_own_and_keeps_the_others(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Exporters\n\nA\n\n## Optimizations: x\n\nB\n")
    report.write_section("## Fleet", "## Fleet\n\nfirst\n", results)
    report.write_section("## Fleet", "## Fleet\n\nsecond\n", results)
    assert results.read_text() == (
        "# Benchmark results\n\n## Exporters\n\nA\n\n## Fleet\n\nsecond\n\n"
        "## Optimizations: x\n\nB\n"
    )


def test_quick_run_reports_every_panel_with_sane_numbers() -> None:
    settings = fleet.Settings(
        gpus=16,
        minutes=0.5,
        scenarios=("training", "idle"),
        scrape_interval=5,
        repeat=2,
        history=600,
    )
    result = fleet.run(settings, progress=False)

    assert result.gpus == 16
    assert result.targets_up == result.nodes == 2
    # The exporter's series, the recorded ones and Prometheus's own add up to the head.
    assert result.scraped_series > 16 * 50
    assert result.recorded_series > 16
    assert result.head_series >= result.scraped_series + result.recorded_series
    assert result.rss_bytes > 10 * 2**20
    assert result.samples_per_second > 0
    assert set(result.rule_groups) >= {"gpuload.recording", "gpuload.utilization"}
    titles = [panel.title for panel in fleet_panels.panels(fleet_panels.dashboard())]
    assert [timings.history for timings in result.timings] == [False, True]
    for timings in result.timings:
        assert [timing.panel.title for timing in timings.panels] == titles
        for timing in timings.panels:
            assert len(timing.seconds) == 2
            assert all(seconds > 0 for seconds in timing.seconds)
    # The history reaches the range queries: they read more samples over it than over the run.
    by_title = {t.panel.title: t for t in result.timings[1].panels}
    run_samples = {t.panel.title: t.samples for t in result.timings[0].panels}
    assert by_title["Fleet power draw"].samples > 2 * run_samples["Fleet power draw"]
    assert by_title["GPUs"].series == 1

    text = fleet_report.section(result, "--quick")
    assert text.startswith("## Fleet\n")
    for title in titles:
        assert f"| {title} " in text
