"""scripts/gpu-smoke rehearsed against the simulated NVML, as it would run on a GPU machine."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "gpu-smoke"
PROBE = ROOT / "scripts" / "nvml-probe"
# The probe watches the PCIe counters for this long instead of 10 s.
PROBE_SECONDS = "0.5"


def _simulator_importable() -> bool:
    # `install` is what `gpuload serve --simulate` calls; a half-written package lacks it.
    try:
        sim = importlib.import_module("exporter.sim")
    except ImportError:
        return False
    return hasattr(sim, "install")


def _probe(scenario: str | Path) -> str:
    """scripts/nvml-probe run on its own against ``scenario``; its output (it must exit 0)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "GPU_SMOKE_PROBE_SECONDS": PROBE_SECONDS, "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, str(PROBE), "--simulate", str(scenario)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert not re.search(r"probe \S+: raised", output), output
    return output


def _smoke_on_training(**environment: str) -> subprocess.CompletedProcess[str]:
    """scripts/gpu-smoke on the simulated training node, with these environment variables."""
    env = {**os.environ, "GPU_SMOKE_PROBE_SECONDS": PROBE_SECONDS, **environment}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--simulate", "training"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(not _simulator_importable(), reason="exporter.sim cannot be imported")
def test_gpu_smoke_passes_on_simulated_training_gpus(tmp_path: Path) -> None:
    result = _smoke_on_training(GPU_SMOKE_SECONDS="3", GPU_SMOKE_OUTPUT=str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    installed = importlib.metadata.version("nvidia-ml-py")
    assert result.stdout.startswith(f"nvidia-ml-py {installed} (gpuload needs "), output
    assert "reading" in output and "gpuload" in output and "nvidia-smi" in output, output
    assert "utilization.gpu [%]" in output, output
    assert "listening on http://127.0.0.1:" in output, output
    # The driver reality probe ran after the other checks.
    assert "\nDriver reality probe (scripts/nvml-probe" in output, output
    checks, probe = output.split("\nDriver reality probe", 1)
    # The shortcuts were compared on every simulated GPU.
    assert checks.count("the state field agrees") == checks.count("  GPU ") > 0, output
    assert "fields read ahead: agree" in checks and "MISMATCH" not in output, output
    # The probe answered every question and raised nothing.
    assert not re.search(r"probe \S+: raised", probe), probe
    assert all(f"\n  {number}. " in probe for number in range(1, 9)), probe
    _answers_of_the_simulated_driver(probe, "training")
    # Last, the node was recorded as a scenario, and the path printed.
    recording = tmp_path / "recorded-node.yaml"
    assert f"\n  recorded: {recording}\n" in probe, probe
    from exporter.sim import load_scenario

    assert len(load_scenario(recording).gpus) == 8
    assert output.rstrip().splitlines()[-1].startswith("PASS"), output


def _answers_of_the_simulated_driver(probe: str, scenario: str) -> None:
    """What the simulator's table says ``scenario``'s driver answers, in the probe's output."""
    from exporter.sim import branches, load_scenario

    driver = load_scenario(scenario).driver.version
    assert f"    driver version: {driver}\n" in probe, probe
    # Fields 197/198 come with R555: an older branch answers each with INVALID_ARGUMENT.
    counters = "SUCCESS" if branches.knows_field(driver, 197) else "INVALID_ARGUMENT"
    assert f"GPU 0 field 197 PCIE_COUNT_TX_BYTES: {counters}," in probe, probe
    assert f"GPU 0 field 198 PCIE_COUNT_RX_BYTES: {counters}," in probe, probe
    # Busy GPUs keep sampling: the second read, from the newest stamp, finds new samples.
    second_read = r"GPU 0 GPU_UTILIZATION_SAMPLES after 1 s from lastSeen=[1-9]\d*: SUCCESS, "
    assert re.search(second_read + r"valueType 1 \(UNSIGNED_INT\), \d+ samples", probe), probe
    assert "spacing median 166.7 ms" in probe, probe  # the simulator samples 6 times a second
    record = 32 if branches.EARLY_R535_PROCESS_RECORD.include(branches.parse(driver)) else 24
    assert f"{record} bytes per record" in probe, probe
    # Hopper counts each link's CRC errors in field 163 (NVML change log v520->v525).
    assert "GPU 0 link 0 field 163 NVLINK_ERROR_DL_CRC: SUCCESS," in probe, probe
    # The privileged reads ran here and again in the child (as this user: the simulator has none).
    assert probe.count("GPU 0: processes SUCCESS (1); memory v2 SUCCESS") == 2, probe
    assert "SM_UTIL SUCCESS" in probe, probe


@pytest.mark.skipif(not _simulator_importable(), reason="exporter.sim cannot be imported")
def test_nvml_probe_watches_the_pcie_counters_of_a_driver_that_has_them(tmp_path: Path) -> None:
    # R570 answers fields 197/198; at 40 GB/s the default 32-bit counter wraps every ~107 ms, so
    # reads 50 ms apart see it go down.
    scenario = tmp_path / "r570.yaml"
    scenario.write_text(
        'driver: {version: "570.86.15", cuda_version: 12080}\n'
        "gpus: [{model: h100-sxm, count: 1}]\n"
        "phases: [{name: upload, duration: 1h, utilization: 0.9, pcie_rx: 40GB/s}]\n"
    )
    output = _probe(scenario)
    assert (
        "GPU 0 field 197 PCIE_COUNT_TX_BYTES: SUCCESS, valueType 3 (UNSIGNED_LONG_LONG)" in output
    )
    watched = re.search(
        r"GPU 0 field 198: (\d+) reads, min \d+, max \d+ \((\d+) bits\), largest step \d+, "
        r"decreases (\d+)",
        output,
    )
    assert watched is not None, output
    reads, bits, decreases = map(int, watched.groups())
    assert reads >= 5 and bits <= 32 and decreases >= 1, output
    assert re.search(r"SUCCESS: [-\d,]*-198\b", output), output  # the field sweep knows them


@pytest.mark.skipif(not _simulator_importable(), reason="exporter.sim cannot be imported")
def test_nvml_probe_reports_the_dry_sample_ring_of_an_idle_gpu() -> None:
    output = _probe("idle")
    assert "GPU 0 GPU_UTILIZATION_SAMPLES lastSeen=0: NOT_FOUND\n" in output, output
    assert "GPU 0 GPU_UTILIZATION_SAMPLES after 1 s from lastSeen=0: NOT_FOUND\n" in output, output
    assert "GPU 0 _v3: size query SUCCESS, count 0: no process" in output, output


@pytest.mark.skipif(not _simulator_importable(), reason="exporter.sim cannot be imported")
def test_nvml_probe_leaves_out_a_lost_gpu_and_asks_the_others() -> None:
    # The probe's simulated driver started a minute ago: GPU 3 fell off the bus at 60 s.
    output = _probe("fell-off-bus")
    assert "GPU 3 nvmlDeviceGetHandleByIndex: GPU_IS_LOST" in output, output
    assert "GPU 4 nvmlGpmSampleGet x2" in output and "GPU 3 nvmlGpm" not in output, output


@pytest.mark.skipif(not _simulator_importable(), reason="exporter.sim cannot be imported")
def test_gpu_smoke_says_first_that_an_older_nvidia_ml_py_is_unsupported(tmp_path: Path) -> None:
    # An old release's metadata ahead of the installed one: importlib.metadata reports it, while
    # `import pynvml` still loads the installed module, so the rest of the run passes.
    dist_info = tmp_path / "nvidia_ml_py-11.525.150.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvidia-ml-py\nVersion: 11.525.150\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = _smoke_on_training(
        GPU_SMOKE_SECONDS="1", PYTHONPATH=path, GPU_SMOKE_OUTPUT=str(tmp_path / "out")
    )
    output = result.stdout + result.stderr
    declared = re.search(r'"nvidia-ml-py>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert declared is not None
    first, advice = result.stdout.splitlines()[:2]
    assert first.startswith(f"UNSUPPORTED: nvidia-ml-py 11.525.150 is older than {declared[1]},")
    assert advice.endswith(f"{sys.executable} -m pip install 'nvidia-ml-py>={declared[1]}'")
    assert result.returncode == 1, output
    assert "FAIL: 1 problem(s)\n  - nvidia-ml-py 11.525.150 is older than " in output, output


def _script(name: str) -> Any:
    """A module loaded from one of scripts/ (files without a .py suffix)."""
    loader = importlib.machinery.SourceFileLoader(
        name.replace("-", "_"), str(ROOT / "scripts" / name)
    )
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["gpu-smoke", "nvml-probe"])
def test_a_child_that_outlives_its_time_is_left_behind_not_waited_for(script: str) -> None:
    # The shell is killed at its timeout; the process it left running still holds the output,
    # as a child stuck in the driver would. What it writes later must not be waited for.
    command = ["sh", "-c", "echo started; (sleep 20; echo finished) & sleep 60"]
    output, code = _script(script).run_bounded(command, timeout=1, env=dict(os.environ))
    assert code is None
    assert output == "started\n"
