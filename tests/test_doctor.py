"""`gpuload doctor`: each simulated scenario gets its verdict, locally and from Prometheus."""

from __future__ import annotations

import io
import json
import os
import pty
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import ROOT, wait_until

from exporter.alerting import thresholds
from exporter.doctor.command import Options, run
from exporter.doctor.verdicts import Window, diagnose, figures

# Short windows keep the suite fast: 3 s at 200 ms is 15 samples per GPU.
SHORT = ["--duration", "3s", "--collect.interval", "200ms"]


def doctor(*args: str) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    return subprocess.Popen(
        [sys.executable, "-m", "exporter", "doctor", *args],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# scenario -> (extra arguments, exit code, expected state of each GPU or of GPU index -> state)
SCENARIOS: dict[str, tuple[list[str], int, dict[int, str] | str]] = {
    "idle": ([], 0, "idle"),
    "saturated": ([], 0, "compute-bound"),
    "memory-bound": ([], 1, "memory-bandwidth-bound"),
    # The throttled phase runs from 2m to 5m after the epoch.
    "thermal-throttle": (["--sim.epoch", "-150"], 1, "throttled-thermal"),
    # GPU 3 falls off the bus 60 s after the epoch; the others keep training at ~90%.
    "fell-off-bus": (["--sim.epoch", "-62"], 1, {3: "hardware-fault", 0: "compute-bound"}),
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple[int, dict[str, Any], str]]:
    """Every scenario's doctor run, all at once (each takes its 3 s window)."""
    running = {}
    for scenario, (extra, _code, _state) in SCENARIOS.items():
        # A negative epoch here is relative to now: the scenario started that long ago.
        args = [
            str(time.time() + float(a)) if a[:1] == "-" and a[1:2].isdigit() else a for a in extra
        ]
        running[scenario] = doctor("--simulate", scenario, *args, *SHORT, "--json")
    results = {}
    for scenario, process in running.items():
        out, err = process.communicate(timeout=60)
        results[scenario] = (process.returncode, json.loads(out), err)
    return results


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_scenario_gets_its_verdict(scenario: str, verdicts) -> None:
    _extra, code, expected = SCENARIOS[scenario]
    returncode, report, err = verdicts[scenario]
    states = {gpu["gpu"]: gpu["state"] for gpu in report["gpus"]}
    assert len(states) == 8, err
    if isinstance(expected, str):
        assert set(states.values()) == {expected}, states
    else:
        for gpu, state in expected.items():
            assert states[gpu] == state, states
    assert returncode == code
    assert report["exit_code"] == code
    # Nothing on stderr but the collection's own log lines: no progress bar when piped.
    assert "sampling the GPUs" not in err


def test_findings_carry_evidence_and_next_steps_from_the_runbooks(verdicts) -> None:
    gpu = verdicts["thermal-throttle"][1]["gpus"][0]
    finding = gpu["findings"][0]
    assert finding["state"] == "throttled-thermal"
    assert any("thermal slowdown active 100% of the window" in e for e in finding["evidence"])
    assert any(e.startswith("temperature 89 °C (slowdown at") for e in finding["evidence"])
    assert finding["next_steps"][0].startswith("Check the cooling")
    assert finding["runbook_url"].endswith("runbooks.md#gputhermalthrottling")
    lost = verdicts["fell-off-bus"][1]["gpus"][3]["findings"][0]
    assert lost["summary"] == "NVML answers GPU is lost: it has fallen off the bus"
    assert lost["next_steps"][0].startswith("Drain the node")
    bound = verdicts["memory-bound"][1]["gpus"][0]["findings"][0]
    assert "DRAM bandwidth 90% of peak" in bound["evidence"]


def test_a_starved_input_pipeline_is_input_starved() -> None:
    # data-starved computes for 1 s at 90% and sits fully idle for 3 s: an 8 s window holds two
    # of its steps, whenever the sampling starts.
    out = io.StringIO()
    code = run(
        Options(duration=8.0, interval=0.2, simulate="data-starved", json=True),
        out=out,
        err=io.StringIO(),
    )
    report = json.loads(out.getvalue())
    assert code == 1
    assert {gpu["state"] for gpu in report["gpus"]} == {"input-starved"}
    finding = report["gpus"][0]["findings"][0]
    assert finding["summary"] == "busy in bursts, fully idle in between: waits for its input"
    figures = report["gpus"][0]["figures"]
    assert 0.15 < figures["utilization_mean"] < 0.35
    assert 0.55 < figures["idle_fraction"] < 0.85
    steps = finding["next_steps"]
    assert any("num_workers" in step for step in steps)
    assert any("pin_memory=True" in step for step in steps)


GPU0 = (("gpu", "0"), ("uuid", "GPU-0"))


def window(counters: dict[str, list[tuple[float, float]]]) -> Window:
    """10 s of one GPU that is up and runs a process, with its counters' (time, value) readings."""
    series = {name: {GPU0: points} for name, points in counters.items()}
    for name in ("gpu_up", "gpu_processes"):
        series[name] = {GPU0: [(0.0, 1.0), (10.0, 1.0)]}
    return Window(series, 0.0, 10.0)


def test_window_means_are_the_counters_increase_over_the_window() -> None:
    # Busy 0.9 s of every 4 s, read once at each second: gauge readings of the last second would
    # say 90% or 0% by where they land; the counter says 22.5%, and resets (an exporter restart
    # at 6 s) cost nothing of it.
    busy = [(0.0, 100.0), (2.0, 100.45), (4.0, 100.9), (6.0, 0.45), (8.0, 0.9), (10.0, 1.35)]
    idle = [(float(t), 0.7 * t) for t in range(0, 11, 2)]
    found = figures(
        window({"gpu_utilization_seconds_total": busy, "gpu_idle_seconds_total": idle}), "0"
    )
    assert found["utilization_mean"] == pytest.approx(0.225)
    assert found["idle_fraction"] == pytest.approx(0.7)
    assert found["samples"] == 6


@pytest.mark.parametrize(
    ("idle_per_second", "state"),
    [
        (0.7, "input-starved"),  # waits for each batch: GPUDataLoaderStarved
        (0.0, "busy"),  # a steady small workload runs something in every sample period
    ],
)
def test_starved_needs_fully_idle_time_not_just_a_low_mean(
    idle_per_second: float, state: str
) -> None:
    loaded = thresholds.load()
    starved = loaded.alert("GPUDataLoaderStarved")
    mean = (starved.number("average_below") + loaded.alert("GPUUtilizationLow").number("below")) / 2
    counters = {
        "gpu_utilization_seconds_total": [(0.0, 0.0), (10.0, 10 * mean)],
        "gpu_idle_seconds_total": [(0.0, 0.0), (10.0, 10 * idle_per_second)],
    }
    (report,) = diagnose(window(counters), loaded)
    assert report.state == state


def test_text_report_and_progress_on_a_terminal() -> None:
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "doctor", "--simulate", "idle", "--duration", "1s"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    out, _ = process.communicate(timeout=30)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert process.returncode == 0
    assert b"\rsampling the GPUs [" in shown
    assert "GPU 0  NVIDIA H100 80GB HBM3" in out
    assert "  state: idle" in out
    assert out.rstrip().endswith("result: healthy: nothing to do (exit 0)")


def test_no_nvml_or_no_prometheus_is_exit_code_2() -> None:
    unreachable = doctor("--prometheus", "http://127.0.0.1:1", "--instance", "n1:19400")
    out, err = unreachable.communicate(timeout=30)
    assert unreachable.returncode == 2
    assert "cannot query Prometheus at http://127.0.0.1:1" in err
    # This machine has no NVIDIA driver: NVML cannot be initialised.
    no_driver = doctor("--duration", "1s")
    out, err = no_driver.communicate(timeout=30)
    if no_driver.returncode != 2 and "NVIDIA" in out:
        pytest.skip("this machine has a GPU")
    assert no_driver.returncode == 2
    assert "NVML is not available" in err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus(tmp_path: Path, daemon_factory) -> Iterator[tuple[str, str]]:
    """A real Prometheus scraping a simulated memory-bound exporter every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("needs Debian's prometheus (scripts/test installs it)")
    daemon = daemon_factory("--simulate", "memory-bound", "--collect.interval", "500ms")
    target = daemon.url.removeprefix("http://").rstrip("/")
    port = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{"job_name": "gpuload", "static_configs": [{"targets": [target]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with (tmp_path / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, target
    finally:
        process.kill()
        process.wait(timeout=10)


def _samples(url: str, target: str) -> int:
    try:
        answer = requests.get(
            url + "/api/v1/query",
            params={"query": f'count_over_time(gpu_up{{instance="{target}",gpu="0"}}[1m])'},
            timeout=2,
        ).json()
    except (requests.RequestException, ValueError):
        return 0
    result = answer.get("data", {}).get("result", [])
    return int(float(result[0]["value"][1])) if result else 0


def test_a_remote_node_is_diagnosed_from_prometheus(prometheus) -> None:
    url, target = prometheus
    wait_until(lambda: _samples(url, target) >= 4, timeout=30, what="four scrapes")
    process = doctor("--prometheus", url, "--instance", target, "--duration", "10s", "--json")
    out, err = process.communicate(timeout=30)
    report = json.loads(out)
    assert process.returncode == 1, err
    assert len(report["gpus"]) == 8
    assert {gpu["state"] for gpu in report["gpus"]} == {"memory-bandwidth-bound"}
    assert report["source"] == f"Prometheus {url}, instance {target}"
