"""The shipped rules at Prometheus's scrape interval: counters of seconds do not alias.

gpuload collects every second; Prometheus scrapes every 15 to 60 s. A gauge of the last second
keeps 1 s of every 15, so the minimum, maximum or mean of its scrapes is whatever the scrapes
happened to land on. The rules read ``rate()`` of the counters of seconds instead, the exact mean
over the window whatever the scrape interval.

Here the real collectors run on simulated NVML for 15 minutes, collecting every 5 simulated
seconds (the counters integrate every NVML sample between two collections, so this reads what a
1 s cycle would); every 15 s the exposition is scraped, as a Prometheus would. The series the rule
files read become a ``promtool test rules`` file (``interval: 15s``), and Prometheus's own rule
engine evaluates the shipped rules every 15 s and checks the bottleneck view minute by minute.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import Clock, exposition_text, parse_metrics, simulated_node

from exporter import sim
from exporter.alerting import rules, thresholds
from exporter.snapshot import Snapshot
from tools import RULES_DIR

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")

COLLECT_EVERY_SECONDS = 5
SCRAPE_EVERY_SECONDS = 15
MINUTES = 15
# From the first minute whose 5m window holds only full scrapes, to the end.
CHECKED_MINUTES = range(6, MINUTES + 1)
TARGET = {"instance": "n1:19400", "job": "gpuload"}
BOTTLENECKS = "count by (bottleneck) (gpu:gpu_bottleneck:class5m)"
# How many GPUs have at least one bottleneck class (`none` included): every in-use GPU has one.
CLASSIFIED = "count(count by (instance, gpu) (gpu:gpu_bottleneck:class5m))"
RECORDING = "gpuload-recording.rules.yml"


def rule_inputs(loaded: thresholds.Thresholds) -> set[str]:
    """The exported metric names the rule files read (recorded names have colons)."""
    exprs = [
        rule["expr"]
        for document in rules.rule_files(loaded).values()
        for group in document["groups"]
        for rule in group["rules"]
    ]
    return {name for expr in exprs for name in re.findall(r"\bgpu(?:load)?_[a-z0-9_]+", expr)}


def scrape_run(scenario: str, names: set[str]) -> dict[str, list[str]]:
    """Collect every 5 s, scrape every 15 s: each series the rules read and its values.

    The values are promtool's, one per scrape: a number, or `_` where the series was absent.
    """
    clock = Clock(0.0)
    collection = simulated_node(scenario, clock, wall_clock=clock, profile="default")
    scrapes: list[dict[str, float]] = []
    try:
        for second in range(0, MINUTES * 60 + 1, COLLECT_EVERY_SECONDS):
            clock.now = float(second)
            snapshot = collection.run_cycle()
            if second % SCRAPE_EVERY_SECONDS == 0:
                scrapes.append(scrape(snapshot, names))
    finally:
        collection.close()
        sim.uninstall()
    every = sorted({series for stored in scrapes for series in stored})
    return {
        series: [repr(stored[series]) if series in stored else "_" for stored in scrapes]
        for series in every
    }


def scrape(snapshot: Snapshot, names: set[str]) -> dict[str, float]:
    """What a Prometheus scraping now stores of ``names``: series (with its target) -> value."""
    text = exposition_text(snapshot)
    return {
        _series_text(name, labels): value
        for (name, labels), value in parse_metrics(text).items()
        if name in names
    }


def _series_text(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    pairs = (*labels, *TARGET.items())
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)
    return f"{name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def promtool_file(
    series: dict[str, list[str]], checks: list[dict[str, Any]], loaded: thresholds.Thresholds
) -> dict[str, Any]:
    """A `promtool test rules` document: the scraped series and the checks, shipped rules."""
    interval = f"{SCRAPE_EVERY_SECONDS}s"
    return {
        "rule_files": [str(RULES_DIR / RECORDING)],
        "evaluation_interval": interval,
        # The recording groups, in order: the bottleneck view reads no alert.
        "group_eval_order": [
            group["name"] for group in rules.rule_files(loaded)[RECORDING]["groups"]
        ],
        "tests": [
            {
                "interval": interval,
                "input_series": [
                    {"series": text, "values": " ".join(values)} for text, values in series.items()
                ],
                "promql_expr_test": checks,
            }
        ],
    }


def run_promtool(document: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "scraped.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def each_minute(expr: str, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"expr": expr, "eval_time": f"{minute}m", "exp_samples": samples}
        for minute in CHECKED_MINUTES
    ]


@needs_promtool
def test_a_starved_node_is_input_starved_at_every_minute_with_15s_scrapes(tmp_path: Path) -> None:
    loaded = thresholds.load()
    series = scrape_run("data-starved", rule_inputs(loaded))
    checks = each_minute(BOTTLENECKS, [{"labels": '{bottleneck="input_starved"}', "value": 8}])
    run_promtool(promtool_file(series, checks, loaded), tmp_path)


@needs_promtool
def test_a_training_node_is_never_input_starved_with_15s_scrapes(tmp_path: Path) -> None:
    loaded = thresholds.load()
    series = scrape_run("training", rule_inputs(loaded))
    checks = [
        *each_minute('count(gpu:gpu_bottleneck:class5m{bottleneck="input_starved"})', []),
        # Not for want of a classification: every GPU of the node has one.
        *each_minute(CLASSIFIED, [{"labels": "{}", "value": 8}]),
    ]
    run_promtool(promtool_file(series, checks, loaded), tmp_path)
