"""scripts/gpu-smoke rehearsed against the simulated NVML, as it would run on a GPU machine."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "gpu-smoke"


def _simulator_importable() -> bool:
    # `install` is what `gpuload serve --simulate` calls; a half-written package lacks it.
    try:
        sim = importlib.import_module("exporter.sim")
    except ImportError:
        return False
    return hasattr(sim, "install")


@pytest.mark.skipif(not _simulator_importable(), reason="exporter.sim cannot be imported")
def test_gpu_smoke_passes_on_simulated_training_gpus() -> None:
    env = {**os.environ, "GPU_SMOKE_SECONDS": "3"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--simulate", "training"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "reading" in output and "gpuload" in output and "nvidia-smi" in output, output
    assert "utilization.gpu [%]" in output, output
    assert "listening on http://127.0.0.1:" in output, output
    # The shortcuts were compared on every simulated GPU.
    assert output.count("the state field agrees") == output.count("  GPU ") > 0, output
    assert "fields read ahead: agree" in output and "MISMATCH" not in output, output
    assert output.rstrip().splitlines()[-1].startswith("PASS"), output
