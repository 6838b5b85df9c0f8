"""The `gpuload` command line, run as a user would run it."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT

from exporter.collectors import REGISTRY


def gpuload(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_sim_exec_runs_a_pynvml_program_against_the_scenario() -> None:
    script = (
        "import pynvml; pynvml.nvmlInit(); "
        "h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h))"
    )
    result = gpuload("sim", "exec", "--scenario", "mixed", "--", sys.executable, "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8 NVIDIA H100 PCIe"


def test_sim_exec_passes_the_exit_code_through() -> None:
    result = gpuload(
        "sim", "exec", "--scenario", "idle", "--", sys.executable, "-c", "raise SystemExit(3)"
    )
    assert result.returncode == 3


def test_sim_exec_rejects_an_unknown_scenario() -> None:
    result = gpuload("sim", "exec", "--scenario", "no-such-node", "--", "true")
    assert result.returncode == 2
    assert "no-such-node" in result.stderr


def test_sim_list_names_the_shipped_scenarios() -> None:
    result = gpuload("sim", "list")
    assert result.returncode == 0
    for name in ("idle", "training", "data-starved", "saturated", "thermal-throttle", "mixed"):
        assert f"\n{name} " in result.stdout


def test_collectors_lists_every_registered_collector() -> None:
    result = gpuload("collectors")
    assert result.returncode == 0
    for name in REGISTRY:
        assert result.stdout.count(f"{name} (enabled by default") == 1


def test_serve_rejects_an_unknown_scenario_before_starting() -> None:
    result = gpuload("serve", "--simulate", "no-such-node")
    assert result.returncode == 2
    assert "--simulate no-such-node" in result.stderr


def test_serve_help_lists_collector_flags() -> None:
    result = gpuload("serve", "--help")
    assert "--collector.utilization" in result.stdout
    assert "--web.listen-address" in result.stdout
