"""What real drivers do that an idealised simulator would not, and how the collectors cope.

Each behaviour is cited in `exporter/sim` where the simulator shows it (nvml.h, NVML's change
log, a recorded machine); the tests drive it through the real pynvml on the simulated library.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pynvml
import pytest
from helpers import Clock, parse_metrics, value_of
from prometheus_client import generate_latest

from exporter import sim
from exporter.alerting import thresholds
from exporter.alerting.evaluator import Evaluator
from exporter.alerting.history import snapshot_samples
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.server.http import build_registry

# One H100 at 95% for a minute, then idle with its memory still held (in use, for the alerts):
# nothing runs on it from 60 s, so its sample ring stops filling.
BUSY_THEN_IDLE = """
name: busy-then-idle
driver: {version: "550.90.07", cuda_version: 12040}
loop: false
gpus:
  - model: h100-sxm
phases:
  - {duration: 60s, utilization: 0.95, memory_utilization: 0.5, memory_used: 40GiB, power: 600W}
  - {duration: 1h, utilization: 0, memory_utilization: 0, memory_used: 40GiB, power: 70W}
"""


@contextmanager
def _node(tmp_path: Path, scenario: str, at: float) -> Iterator[tuple[Clock, Collection]]:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(scenario))
    clock = Clock(at)
    sim.install(path, clock=clock, epoch=0)
    collection = Collection(dict.fromkeys(REGISTRY, True), timeout=60, clock=clock)
    try:
        yield clock, collection
    finally:
        collection.close()
        sim.uninstall()


def _utilization(collection: Collection) -> float | None:
    snapshot = collection.run_cycle()
    samples = parse_metrics(generate_latest(build_registry(lambda: snapshot)).decode())
    labels = next(dict(k) for (name, k) in samples if name == "gpu_utilization_ratio")
    return value_of(samples, "gpu_utilization_ratio", **labels)


def test_an_idle_gpu_adds_no_utilization_sample(tmp_path: Path) -> None:
    with _node(tmp_path, BUSY_THEN_IDLE, at=120):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        # Power is sampled whether or not the GPU works.
        _, power = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
        assert power
        pynvml.nvmlShutdown()


def test_a_busy_gpu_that_goes_idle_reads_idle_by_the_second_cycle(tmp_path: Path) -> None:
    with _node(tmp_path, BUSY_THEN_IDLE, at=50) as (clock, collection):
        busy = _utilization(collection)
        assert busy is not None and busy > 0.9
        clock.now = 65  # idle since 60 s: samples of 60-65 s are not in the ring
        first = _utilization(collection)
        clock.now = 66
        second = _utilization(collection)
    # The first may still average the last busy samples it had not seen; never the second.
    assert first is not None and second is not None
    assert second <= 0.05, (first, second)


def test_the_idle_alert_fires_for_a_gpu_whose_sample_ring_ran_dry(tmp_path: Path) -> None:
    evaluator = Evaluator(thresholds.load(), instance="n1:19400", interval=15)
    with _node(tmp_path, BUSY_THEN_IDLE, at=0) as (clock, collection):
        # The 5-minute average falls below 30% some minutes after 60 s; then 5 minutes held.
        for t in range(0, 60 + 10 * 60, 15):
            clock.now = t
            evaluator.observe(snapshot_samples(collection.run_cycle()), t)
    assert "GPUUtilizationLow" in {alert.name for alert in evaluator.firing()}


@pytest.mark.parametrize("scenario", sim.scenario_names())
def test_no_scenario_exposes_a_series_twice(scenario: str) -> None:
    # Every MIG instance, link, process and reason is one series: Prometheus rejects a scrape
    # that repeats one (a MIG GPU instance split into compute instances is one way to do it).
    sim.install(scenario, pinned_time=300, seed=7)
    collection = Collection(dict.fromkeys(REGISTRY, True), timeout=60)
    try:
        for _ in range(2):
            snapshot = collection.run_cycle()
    finally:
        collection.close()
        sim.uninstall()
    lines = [
        line.rsplit(" ", 1)[0]
        for line in generate_latest(build_registry(lambda: snapshot)).decode().splitlines()
        if line and not line.startswith("#")
    ]
    repeated = sorted(line for line, count in Counter(lines).items() if count > 1)
    assert repeated == [], repeated


TWO_GPUS = """
name: identity
driver: {version: "550.90.07", cuda_version: 12040}
gpus:
  - {model: h100-sxm, count: 2}
phases:
  - {duration: 1h, utilization: 0.5, power: 300W}
"""


@pytest.mark.parametrize(
    ("call", "error", "label"),
    [
        ("nvmlDeviceGetSerial", "UNKNOWN", "serial"),
        ("nvmlDeviceGetSerial", "NO_PERMISSION", "serial"),
        ("nvmlDeviceGetPciInfo_v3", "UNKNOWN", "pci_bus_id"),
        ("nvmlDeviceGetVbiosVersion", "NO_PERMISSION", "vbios_version"),
    ],
)
def test_an_identity_read_that_fails_leaves_that_label_empty_and_is_counted(
    tmp_path: Path, call: str, error: str, label: str
) -> None:
    faults = f"""
    faults:
      - {{kind: error, gpu: 1, call: {call}, error: {error}}}
    """
    with _node(tmp_path, TWO_GPUS + textwrap.dedent(faults), at=30) as (_, collection):
        snapshot = collection.run_cycle()
    samples = parse_metrics(generate_latest(build_registry(lambda: snapshot)).decode())
    info = {dict(k)["gpu"]: dict(k) for (name, k) in samples if name == "gpu_info"}
    assert info["1"][label] == "" and info["0"][label] != "", info
    assert {dict(k)["gpu"] for (name, k) in samples if name == "gpu_utilization_ratio"} == {
        "0",
        "1",
    }
    counted = value_of(
        samples, "gpuload_nvml_errors_total", collector="identity", error=error.lower()
    )
    assert counted == 1
