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
from helpers import ROOT, Clock, exposition_text, parse_metrics, value_of

from exporter import sim
from exporter.alerting import thresholds
from exporter.alerting.evaluator import Evaluator
from exporter.alerting.history import snapshot_samples
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.sim import FUNCTION_NAMES, branches
from exporter.sim.scenario import SCENARIO_DIR
from exporter.snapshot import Snapshot

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


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


def _utilization(collection: Collection) -> float | None:
    snapshot = collection.run_cycle()
    samples = _scrape(snapshot)
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
        for line in exposition_text(snapshot).splitlines()
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
    samples = _scrape(snapshot)
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


def _processes_scenario(driver: str, gpus: int = 1) -> str:
    return f"""
    name: processes
    driver: {{version: "{driver}", cuda_version: 12020}}
    gpus:
      - {{model: h100-sxm, count: {gpus}}}
    phases:
      - duration: 1h
        utilization: 0.9
        processes:
          - {{name: python train.py, memory: 30GiB}}
          - {{name: python eval.py, memory: 10GiB}}
          - {{name: tritonserver, memory: 5GiB}}
    """


def _process_memory(collection: Collection) -> dict[str, float]:
    snapshot = collection.run_cycle()
    samples = _scrape(snapshot)
    return {
        dict(k)["process"]: v
        for (name, k), v in samples.items()
        if name == "gpu_process_memory_used_bytes"
    }


@pytest.mark.parametrize(
    "driver",
    [
        "470.223.02",  # no _v3: _v2
        "535.54.03",  # _v3 writes the early-R535 32-byte record
        "535.98",  # no _v3 in this one release: _v2
        "535.104.05",  # _v3, 24 bytes again
        "550.90.07",
    ],
)
def test_process_lists_are_read_with_the_record_each_driver_writes(
    tmp_path: Path, driver: str
) -> None:
    with _node(tmp_path, _processes_scenario(driver), at=30) as (_, collection):
        memory = _process_memory(collection)
    assert memory == {
        "python train.py": 30 * 2**30,
        "python eval.py": 10 * 2**30,
        "tritonserver": 5 * 2**30,
    }


def test_a_process_struct_of_the_wrong_size_reads_garbage_as_on_hardware(tmp_path: Path) -> None:
    # pynvml's own _v3 wrapper declares the 24-byte record; an early R535 driver writes 32.
    with _node(tmp_path, _processes_scenario("535.54.03"), at=30):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        read = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
        pynvml.nvmlShutdown()
    truth = {30 * 2**30, 10 * 2**30, 5 * 2**30}
    assert read[0].usedGpuMemory in truth  # the first record is where both agree
    assert {process.usedGpuMemory for process in read} != truth, read


def _pcie_scenario(driver: str, bits: int = 32) -> str:
    return f"""
    name: pcie
    driver: {{version: "{driver}", cuda_version: 12040, pcie_counter_bits: {bits}}}
    gpus:
      - model: h100-sxm
    phases:
      - {{duration: 1h, utilization: 0.9, pcie_tx: 2GB/s, pcie_rx: 1GB/s}}
    """


def _transmitted(collection: Collection, clock: Clock, times: range) -> tuple[list[float], dict]:
    sent = []
    for t in times:
        clock.now = t
        samples = _scrape(collection.run_cycle())
        sent += [v for (name, _), v in samples.items() if name == "gpu_pcie_transmit_bytes_total"]
    return sent, samples


@pytest.mark.parametrize(
    ("driver", "bits", "fields"),
    [
        ("550.90.07", 64, False),  # no fields 197/198 before R555
        ("555.42.02", 32, False),  # wrapping faster than any collection: not a counter
        ("555.42.02", 64, True),
    ],
)
def test_pcie_byte_fields_are_used_where_the_driver_has_them_wider_than_32_bits(
    tmp_path: Path, driver: str, bits: int, fields: bool
) -> None:
    with _node(tmp_path, _pcie_scenario(driver, bits), at=30) as (clock, collection):
        library = pynvml.nvmlLib
        sent, samples = _transmitted(collection, clock, range(30, 33))
        throughput_calls = library.calls["nvmlDeviceGetPcieThroughput"]
    assert value_of(samples, "gpuload_collector_success", collector="pcie") == 1
    assert not [k for (name, k) in samples if name == "gpuload_nvml_errors_total"], samples
    assert len(sent) == 3 and sent[-1] > 0
    assert (throughput_calls == 0) == fields


def test_a_32_bit_byte_counter_that_wraps_never_makes_the_traffic_counter_go_back(
    tmp_path: Path,
) -> None:
    # 2 GB/s wraps a 32-bit counter about every 2 s: seconds 30-45 see several wraps.
    with _node(tmp_path, _pcie_scenario("555.42.02", 32), at=30) as (clock, collection):
        sent, _ = _transmitted(collection, clock, range(30, 46))
    assert sent == sorted(sent) and sent[-1] > sent[0], sent


def test_a_read_refused_for_lack_of_privilege_is_reported_not_counted_as_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    faults = """
    faults:
      - {kind: error, gpu: 1, call: nvmlDeviceGetMemoryInfo_v2, error: NO_PERMISSION}
      - {kind: error, gpu: 1, call: nvmlDeviceGetComputeRunningProcesses_v3, error: NO_PERMISSION}
    """
    scenario = textwrap.dedent(_processes_scenario("550.90.07", gpus=2)) + textwrap.dedent(faults)
    with _node(tmp_path, scenario, at=30) as (clock, collection):
        for t in (30, 31, 32):
            clock.now = t
            samples = _scrape(collection.run_cycle())
    memory = {dict(k)["gpu"] for (name, k) in samples if name == "gpu_memory_used_bytes"}
    assert memory == {"0"}
    assert value_of(samples, "gpuload_collector_success", collector="memory") == 1
    assert value_of(samples, "gpuload_collector_success", collector="processes") == 1
    assert not [k for (name, k) in samples if name == "gpuload_nvml_errors_total"]
    refused = {
        (dict(k)["collector"], dict(k)["read"]): v
        for (name, k), v in samples.items()
        if name == "gpuload_nvml_permission_denied"
    }
    assert refused == {("memory", "memory"): 1, ("processes", "compute_processes"): 1}
    logged = [r.getMessage() for r in caplog.records if "NO_PERMISSION" in r.getMessage()]
    assert len(logged) == 2 and all("run gpuload as root" in line for line in logged), logged


@pytest.mark.parametrize("scenario", ["h100-mig", "a100-mig", "training"])
@pytest.mark.parametrize("caller", ["root", "unprivileged", "unprivileged-no-host-pid"])
def test_every_collector_succeeds_or_reports_a_refusal_whoever_calls(
    tmp_path: Path, scenario: str, caller: str
) -> None:
    text = (SCENARIO_DIR / f"{scenario}.yaml").read_text()
    with _node(tmp_path, f"caller: {caller}\n{text}", at=30) as (clock, collection):
        for t in (30, 31, 32):
            clock.now = t
            samples = _scrape(collection.run_cycle())
    failed = {
        dict(k)["collector"]
        for (n, k), v in samples.items()
        if n == "gpuload_collector_success" and v != 1
    }
    assert failed == set()
    assert not [k for (name, k) in samples if name == "gpuload_nvml_errors_total"], samples
    refused = {
        (dict(k)["collector"], dict(k)["read"])
        for (name, k) in samples
        if name == "gpuload_nvml_permission_denied"
    }
    mig = scenario != "training"
    if caller == "root":
        assert refused == set()
    else:
        # Whole-GPU memory and processes on MIG GPUs (nvml.h), GPM samples (DCGM issue 214).
        assert (("memory", "memory") in refused) == mig, refused
        assert (("processes", "compute_processes") in refused) == mig, refused
        assert (("gpm", "gpm_sample") in refused) == (scenario != "a100-mig"), refused  # Hopper
    counted = {dict(k)["gpu"]: v for (name, k), v in samples.items() if name == "gpu_processes"}
    if caller == "unprivileged-no-host-pid":
        assert set(counted.values()) <= {0}, counted  # the driver hides them: none visible


CAPTURES = ROOT.parent / "shared" / "reality" / "captures"


def _exported_symbols(capture: Path) -> frozenset[str]:
    """The `nvml*` functions a recorded machine's libnvidia-ml.so.1 exports."""
    lines = capture.read_text().splitlines()
    start = lines.index("# capabilities :: nvml-symbols")
    symbols = set()
    for line in lines[start + 1 :]:
        if line.startswith("# ") and "::" in line:
            break  # the next section
        if line.startswith("nvml"):
            symbols.add(line.strip())
    return frozenset(symbols)


@pytest.mark.skipif(not CAPTURES.is_dir(), reason="needs ../shared/reality (recorded machines)")
def test_the_branch_table_agrees_with_the_recorded_drivers_symbols() -> None:
    recorded = [
        path
        for path in sorted(CAPTURES.glob("*.txt"))
        if "# capabilities :: nvml-symbols" in path.read_text()
    ]
    assert len(recorded) >= 2, recorded
    for capture in recorded:
        version = capture.stem.rsplit("__", 1)[1]
        symbols = _exported_symbols(capture)
        lacks = branches.lacks_functions(version)
        # What the simulated driver of that release exports, the real one exports too.
        assert sorted(FUNCTION_NAMES - lacks - symbols) == [], capture.name
        assert sorted(lacks & symbols) == [], capture.name
