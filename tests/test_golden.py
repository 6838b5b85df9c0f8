"""End-to-end: the real daemon on a pinned scenario, its /metrics diffed against a golden file.

Rewrite the golden file after an intended change with:
    UPDATE_GOLDEN=1 scripts/test tests/test_golden.py
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.collectors import REGISTRY

GOLDEN = Path(__file__).parent / "golden" / "metrics-mixed.txt"
ARGS = ("--simulate", "mixed", "--sim.time", "600", "--sim.seed", "7")

# The only families that differ between two runs of the same pinned scenario:
# wall-clock timestamps, durations and the process's own resource use, and the PCIe byte
# counters, which GPUs without NVML's byte counters integrate over wall-clock time.
NON_DETERMINISTIC = re.compile(
    r"^(# (HELP|TYPE) )?(process_|python_gc_|python_info|gpuload_collector_duration_seconds"
    r"|gpu_pcie_transmit_bytes_total|gpu_pcie_receive_bytes_total"
    r"|gpuload_collector_last_success_timestamp_seconds|gpuload_last_collection_timestamp_seconds"
    r"|gpuload_collection_duration_seconds)"
)


def deterministic(text: str) -> str:
    return "".join(
        line for line in text.splitlines(keepends=True) if not NON_DETERMINISTIC.match(line)
    )


@pytest.fixture
def scrape(daemon_factory) -> str:
    daemon = daemon_factory(*ARGS)
    return daemon.get("/metrics").text


def test_metrics_match_the_golden_file(scrape: str) -> None:
    actual = deterministic(scrape)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(actual)
    expected = GOLDEN.read_text()
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True), "golden", "actual"
        )
    )
    assert not diff, f"/metrics changed; if intended, UPDATE_GOLDEN=1 (see module doc):\n{diff}"


def test_promtool_accepts_the_exposition(scrape: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/test (Debian package prometheus)"
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_every_registered_family_is_in_the_golden_file_and_the_readme() -> None:
    golden = GOLDEN.read_text()
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    names = {family.name for spec in REGISTRY.values() for family in spec.families}
    names |= {
        "gpu_info",
        "gpu_up",
        "gpuload_gpu_stale",
        "gpuload_nvml_up",
        "gpuload_collector_success",
        "gpuload_nvml_errors_total",
        "gpuload_build_info",
    }
    missing_in_golden = sorted(
        n
        for n in names
        if f"# HELP {n.removesuffix('_total')}" not in golden and f"# HELP {n} " not in golden
    )
    assert not missing_in_golden, "families the mixed scenario never shows"
    assert not sorted(n for n in names if f"`{n}" not in readme), "families the README omits"
