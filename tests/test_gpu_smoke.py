"""scripts/gpu-smoke rehearsed against the simulated NVML, as it would run on a GPU machine."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

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
    installed = importlib.metadata.version("nvidia-ml-py")
    assert result.stdout.startswith(f"nvidia-ml-py {installed} (gpuload needs "), output
    assert "reading" in output and "gpuload" in output and "nvidia-smi" in output, output
    assert "utilization.gpu [%]" in output, output
    assert "listening on http://127.0.0.1:" in output, output
    # The shortcuts were compared on every simulated GPU.
    assert output.count("the state field agrees") == output.count("  GPU ") > 0, output
    assert "fields read ahead: agree" in output and "MISMATCH" not in output, output
    assert output.rstrip().splitlines()[-1].startswith("PASS"), output


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
    env = {**os.environ, "GPU_SMOKE_SECONDS": "1", "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--simulate", "training"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    declared = re.search(r'"nvidia-ml-py>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert declared is not None
    first, advice = result.stdout.splitlines()[:2]
    assert first.startswith(f"UNSUPPORTED: nvidia-ml-py 11.525.150 is older than {declared[1]},")
    assert advice.endswith(f"{sys.executable} -m pip install 'nvidia-ml-py>={declared[1]}'")
    assert result.returncode == 1, output
    assert "FAIL: 1 problem(s)\n  - nvidia-ml-py 11.525.150 is older than " in output, output
