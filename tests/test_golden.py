"""End-to-end: the real daemon on pinned scenarios, its /metrics diffed against golden files.

Rewrite the golden files after an intended change with:
    UPDATE_GOLDEN=1 scripts/test tests/test_golden.py
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import Daemon
from kubelet_helpers import mig_node_kubelet, stop_and_remove

from exporter.collectors import REGISTRY

GOLDEN_DIR = Path(__file__).parent / "golden"
# Scenario -> the pinned scenario time to scrape at (after each scenario's events).
SCENARIOS = {
    "mixed": 600,
    "h100-nvlink": 300,
    "memory-bound": 300,
    "a100-mig": 300,
    "h100-mig": 300,
    "h200-mig": 300,
    "legacy-v100": 300,
    "fell-off-bus": 120,
    "ecc-remap": 120,
}
# Golden files of other metrics profiles (exporter/collectors/profiles.py): name -> (scenario,
# profile). `full` with NVLink link by link shows every family there is.
PROFILES = {
    "h100-nvlink-full": ("h100-nvlink", "full"),
    "h100-mig-full": ("h100-mig", "full"),
    "h100-nvlink-minimal": ("h100-nvlink", "minimal"),
}
# Scenarios whose MIG devices a fake kubelet allocates to pods, so that gpu_pod_info shows.
KUBELET_SCENARIOS = {"a100-mig"}

# The only families that differ between two runs of the same pinned scenario:
# wall-clock timestamps, durations and the process's own resource use, and the PCIe byte
# counters, which GPUs without NVML's byte counters integrate over wall-clock time.
NON_DETERMINISTIC = re.compile(
    r"^(# (HELP|TYPE) )?(process_|python_gc_|python_info"
    r"|gpuload_collector_duration_seconds"
    r"|gpu_pcie_transmit_bytes_total|gpu_pcie_receive_bytes_total"
    r"|gpuload_collector_last_success_timestamp_seconds|gpuload_last_collection_timestamp_seconds"
    r"|gpuload_collection_duration_seconds)"
)


_LAST_COLLECTION = re.compile(r"^gpuload_last_collection_timestamp_seconds (\S+)$", re.M)


def deterministic(text: str) -> str:
    return "".join(
        line for line in text.splitlines(keepends=True) if not NON_DETERMINISTIC.match(line)
    )


def settled_scrape(daemon: Daemon) -> str:
    """Scrape until three cycles in a row give the same output: events and lost GPUs seen.

    With the scenario clock pinned nothing is rescheduled (retries, slow reads follow it), so
    the output settles whatever the machine's speed; scrapes of one cycle count once.
    """
    previous, cycle, agreeing = "", "", 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = daemon.get("/metrics").text
        completed = _LAST_COLLECTION.search(text)
        if completed and completed.group(1) != cycle:
            cycle = completed.group(1)
            agreeing = agreeing + 1 if deterministic(text) == deterministic(previous) else 0
            if agreeing == 2:
                return text
            previous = text
        time.sleep(0.1)
    raise AssertionError("/metrics did not settle")


@pytest.fixture(params=sorted([*SCENARIOS, *PROFILES]))
def scrape(request, daemon_factory) -> tuple[str, str]:
    name = request.param
    scenario, profile = PROFILES.get(name, (name, "default"))
    config: list[str] = []
    if scenario in KUBELET_SCENARIOS:
        kubelet, path = mig_node_kubelet(scenario, seed=7)
        request.addfinalizer(lambda: stop_and_remove(kubelet))
        config = ["--config", str(path)]
    daemon = daemon_factory(
        "--simulate",
        scenario,
        "--sim.time",
        str(SCENARIOS[scenario]),
        "--sim.seed",
        "7",
        "--collect.interval",
        "200ms",
        "--metrics.profile",
        profile,
        *config,
        env={"GPULOAD_COLLECTORS_NVLINK_PER_LINK": str(profile == "full").lower()},
    )
    return name, settled_scrape(daemon)


def test_metrics_match_the_golden_file(scrape: tuple[str, str]) -> None:
    scenario, text = scrape
    golden = GOLDEN_DIR / f"metrics-{scenario}.txt"
    actual = deterministic(text)
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(actual)
    expected = golden.read_text()
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True), "golden", "actual"
        )
    )
    assert not diff, f"/metrics changed; if intended, UPDATE_GOLDEN=1 (see module doc):\n{diff}"


def test_promtool_accepts_the_exposition(scrape: tuple[str, str]) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/test (Debian package prometheus)"
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape[1],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_every_registered_family_is_in_a_golden_file_and_the_readme() -> None:
    golden = "".join(path.read_text() for path in GOLDEN_DIR.glob("metrics-*.txt"))
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
    shown = {
        name
        for name in names
        if NON_DETERMINISTIC.match(name)
        or f"# HELP {name} " in golden
        or f"# HELP {name.removesuffix('_total')}" in golden
    }
    assert sorted(names - shown) == [], "families no golden scenario shows"
    assert sorted(n for n in names if f"`{n}" not in readme) == [], "families the README omits"
