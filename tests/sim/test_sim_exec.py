"""``exec_command``: other Python programs see the simulated GPUs through their own pynvml."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from exporter.sim import exec_command, load_scenario
from exporter.sim.exec import PACKAGE_ROOT, SITE_DIR, child_environment

CHILD = """
import json, sys
import pynvml

pynvml.nvmlInit()
rows = []
for i in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
    rows.append([
        pynvml.nvmlDeviceGetName(handle),
        pynvml.nvmlDeviceGetUUID(handle),
        pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
    ])
print("ROWS " + json.dumps(rows))
"""


def _rows(output: str) -> list[list[Any]]:
    line = next(line for line in output.splitlines() if line.startswith("ROWS "))
    return json.loads(line.removeprefix("ROWS "))


@pytest.fixture
def child_script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD, encoding="utf-8")
    return path


def test_child_python_sees_the_scenario_gpus(
    child_script: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = exec_command(
        "mixed", [sys.executable, str(child_script)], epoch=None, seed=None, pinned_time=None
    )
    assert code == 0
    rows = _rows(capfd.readouterr().out)
    expected = [gpu.model.name for gpu in load_scenario("mixed").gpus]
    assert [row[0] for row in rows] == expected
    assert all(0 <= row[2] <= 100 for row in rows)


def test_children_with_the_same_epoch_see_identical_values(
    child_script: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    outputs = []
    for _ in range(2):
        argv = [sys.executable, str(child_script)]
        assert exec_command("training", argv, epoch=1.7e9, seed=3, pinned_time=42.0) == 0
        outputs.append(_rows(capfd.readouterr().out))
    assert outputs[0] == outputs[1]
    exec_command(
        "training", [sys.executable, str(child_script)], epoch=1.7e9, seed=4, pinned_time=42.0
    )
    assert _rows(capfd.readouterr().out)[0][1] != outputs[0][0][1]  # another seed, other UUIDs


def test_scenario_file_and_existing_sitecustomize_are_honoured(
    tmp_path: Path,
    child_script: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('CHAINED')\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(site))
    scenario = tmp_path / "one.yaml"
    scenario.write_text(
        "driver: {version: '535.1', cuda_version: 12020}\n"
        "gpus: [{model: t4}]\n"
        "phases: [{duration: 10, utilization: 0.25}]\n",
        encoding="utf-8",
    )
    argv = [sys.executable, str(child_script)]
    monkeypatch.chdir(tmp_path / "site")  # the child runs elsewhere: the path must be absolute
    assert exec_command(str(scenario), argv, epoch=None, seed=None, pinned_time=1.0) == 0
    out = capfd.readouterr().out
    assert "CHAINED" in out
    assert _rows(out) == [["Tesla T4", _rows(out)[0][1], 25, 43]]


def test_exit_code_is_returned(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; sys.exit(3)"]
    assert exec_command("idle", argv, epoch=None, seed=None, pinned_time=None) == 3


def test_sigterm_is_forwarded_to_the_child() -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(10)"]
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = exec_command("idle", argv, epoch=None, seed=None, pinned_time=None)
    finally:
        timer.cancel()
    assert code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # restored


def test_child_environment_puts_the_simulator_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine.yaml").write_text("", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    env = child_environment(
        "mine.yaml", {"PYTHONPATH": "/opt/lib"}, epoch=12.5, seed=None, pinned_time=3.0
    )
    assert env["GPULOAD_SIM_SCENARIO"] == str(tmp_path / "mine.yaml")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), str(PACKAGE_ROOT), "/opt/lib"]
    assert (env["GPULOAD_SIM_EPOCH"], env["GPULOAD_SIM_TIME"]) == ("12.5", "3.0")
    assert "GPULOAD_SIM_SEED" not in env
    shipped = child_environment("idle", {}, epoch=1.0, seed=2, pinned_time=None)
    assert (shipped["GPULOAD_SIM_SCENARIO"], shipped["GPULOAD_SIM_SEED"]) == ("idle", "2")
