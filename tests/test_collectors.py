"""Collectors against the simulated NVML: exact values, absent features, faults, isolation."""

from __future__ import annotations

import contextlib
import logging
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest
from helpers import Clock, exposition_text, parse_metrics, series, value_of

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.collectors.base import Family, Sample, register
from exporter.snapshot import Snapshot

ALL_ON = {name: True for name in REGISTRY}

# One H100 SXM and one RTX A6000 with constant load: every expected value below follows
# from this file and the documented unit conversions.
CONSTANT = """
name: constant
driver: {version: "550.90.07", cuda_version: 12040}
loop: false
gpus:
  - model: h100-sxm
  - model: rtx-a6000
phases:
  - duration: 1h
    utilization: 0.42
    memory_utilization: 0.17
    memory_used: 10GiB
    temperature: 61
    memory_temperature: 70
    power: 250W
    sm_clock: 1755
    graphics_clock: 1755
    memory_clock: 2619
    encoder_utilization: 0.05
    decoder_utilization: 0.03
    fan: 0.4
    clock_event_reasons: [sw_power_cap, sw_thermal_slowdown]
"""


def write_scenario(tmp_path: Path, text: str, faults: str = "") -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(faults))
    return path


@pytest.fixture
def collect() -> Iterator[Callable[..., dict]]:
    """Install a scenario, run collection cycles, return the scraped samples."""
    collections: list[Collection] = []

    def run(
        scenario: str | Path,
        *,
        at: float = 30.0,
        cycles: int = 1,
        enabled: dict[str, bool] | None = None,
    ) -> dict:
        if not collections:
            sim.install(scenario, pinned_time=at)
            collections.append(Collection(enabled or ALL_ON, timeout=5))
        collection = collections[0]
        snapshot: Snapshot | None = None
        for _ in range(cycles):
            snapshot = collection.run_cycle()
        assert snapshot is not None
        return _scrape(snapshot)

    yield run
    for collection in collections:
        collection.close()
    sim.uninstall()


def gpu_labels(samples: dict, gpu: str) -> dict[str, str]:
    (uuid,) = [
        dict(labels)["uuid"] for labels in series(samples, "gpu_up") if dict(labels)["gpu"] == gpu
    ]
    return {"gpu": gpu, "uuid": uuid}


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


def _cycle_until(collection: Collection, condition: Callable[[dict], bool]) -> dict:
    """Run cycles until the scraped samples meet `condition`, for what a worker thread finishes.

    The deadline only stops a broken run from waiting forever: it normally takes one cycle.
    """
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        samples = _scrape(collection.run_cycle())
        if condition(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError("condition not reached")


@contextlib.contextmanager
def moving_clock(
    scenario: Path,
    *,
    at: float = 5,
    timeout: float = 5,
    hang: Callable[[float], object] = time.sleep,
) -> Iterator[tuple[Clock, Collection]]:
    """A collection over a scenario whose clock the test moves by hand.

    The collection schedules its retries on the same clock, so a backoff passes when the test
    moves the clock past it, not after real seconds.
    """
    clock = Clock(at)
    sim.install(scenario, clock=clock, epoch=0, hang=hang)
    collection = Collection(ALL_ON, timeout=timeout, clock=clock)
    try:
        yield clock, collection
    finally:
        collection.close()
        sim.uninstall()


@pytest.mark.parametrize(
    ("family", "labels", "expected"),
    [
        ("gpu_utilization_ratio", {}, 0.42),
        ("gpu_memory_utilization_ratio", {}, 0.17),
        ("gpu_memory_used_bytes", {}, 10 * 2**30),
        ("gpu_temperature_celsius", {"sensor": "gpu"}, 61.0),
        ("gpu_temperature_celsius", {"sensor": "memory"}, 70.0),
        ("gpu_power_usage_watts", {}, 250.0),
        ("gpu_power_limit_watts", {}, 700.0),
        ("gpu_clock_hertz", {"clock": "sm"}, 1755e6),
        ("gpu_clock_hertz", {"clock": "memory"}, 2619e6),
        ("gpu_clock_event_active", {"reason": "sw_power_cap"}, 1.0),
        ("gpu_clock_event_active", {"reason": "sw_thermal"}, 1.0),
        ("gpu_clock_event_active", {"reason": "hw_thermal"}, 0.0),
        ("gpu_clock_event_active", {"reason": "gpu_idle"}, 0.0),
        ("gpu_decoder_utilization_ratio", {}, 0.03),
        ("gpu_pcie_link_max_generation", {}, 5.0),
        ("gpu_pcie_link_max_width", {}, 16.0),
        ("gpu_up", {}, 1.0),
    ],
)
def test_values_follow_the_scenario_in_base_units(
    collect, tmp_path: Path, family: str, labels: dict[str, str], expected: float
) -> None:
    samples = collect(write_scenario(tmp_path, CONSTANT))
    value = value_of(samples, family, **gpu_labels(samples, "0"), **labels)
    assert value == pytest.approx(expected, rel=1e-6)


NVML_READINGS = [
    ("gpu_memory_total_bytes", {}, lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).total),
    (
        "gpu_memory_free_bytes",
        {},
        lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).free,
    ),
    (
        "gpu_memory_reserved_bytes",
        {},
        lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).reserved,
    ),
    ("gpu_bar1_memory_total_bytes", {}, lambda h: pynvml.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total),
    ("gpu_bar1_memory_used_bytes", {}, lambda h: pynvml.nvmlDeviceGetBAR1MemoryInfo(h).bar1Used),
    ("gpu_pcie_link_generation", {}, pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
    ("gpu_pcie_link_width", {}, pynvml.nvmlDeviceGetCurrPcieLinkWidth),
    ("gpu_pcie_replay_errors_total", {}, pynvml.nvmlDeviceGetPcieReplayCounter),
    (
        "gpu_energy_consumption_joules_total",
        {},
        lambda h: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000,
    ),
    (
        "gpu_temperature_slowdown_threshold_celsius",
        {},
        lambda h: pynvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        ),
    ),
    (
        "gpu_temperature_shutdown_threshold_celsius",
        {},
        lambda h: pynvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        ),
    ),
    (
        "gpu_clock_max_hertz",
        {"clock": "sm"},
        lambda h: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) * 1e6,
    ),
    (
        "gpu_clock_hertz",
        {"clock": "graphics"},
        lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) * 1e6,
    ),
    ("gpu_fan_speed_ratio", {}, lambda h: pynvml.nvmlDeviceGetFanSpeed(h) / 100),
]


@pytest.mark.parametrize(("family", "labels", "read"), NVML_READINGS)
def test_values_match_what_pynvml_reads_on_every_gpu(
    collect, family: str, labels: dict[str, str], read: Callable
) -> None:
    # The scenario clock is pinned, so pynvml read afterwards sees the same GPU state.
    samples = collect("mixed", at=1234.0)
    checked = 0
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        expected_labels = {**gpu_labels(samples, str(index)), **labels}
        try:
            expected = float(read(handle))
        except pynvml.NVMLError_NotSupported:
            assert value_of(samples, family, **expected_labels) is None
            continue
        assert value_of(samples, family, **expected_labels) == pytest.approx(expected)
        checked += 1
    assert checked >= 1


def test_unsupported_features_are_absent_not_zero_and_not_errors(collect, tmp_path: Path) -> None:
    samples = collect(write_scenario(tmp_path, CONSTANT))
    h100, a6000 = gpu_labels(samples, "0"), gpu_labels(samples, "1")
    # An SXM board has no fan; the A6000's GDDR6 has no memory temperature sensor.
    assert value_of(samples, "gpu_fan_speed_ratio", **h100) is None
    assert value_of(samples, "gpu_temperature_celsius", **a6000, sensor="memory") is None
    assert value_of(samples, "gpu_temperature_celsius", **a6000, sensor="gpu") == 61
    assert value_of(samples, "gpu_fan_speed_ratio", **a6000) == pytest.approx(0.4)
    # GH100 has no video encoder; the A6000 has one.
    assert value_of(samples, "gpu_encoder_utilization_ratio", **h100) is None
    assert value_of(samples, "gpu_encoder_utilization_ratio", **a6000) == pytest.approx(0.05)
    assert all(value == 1 for value in series(samples, "gpuload_collector_success").values())
    assert series(samples, "gpuload_nvml_errors_total") == {}


def test_gpu_info_and_driver_info_describe_the_node(collect, tmp_path: Path) -> None:
    samples = collect(write_scenario(tmp_path, CONSTANT))
    infos = [dict(labels) for labels in series(samples, "gpu_info")]
    assert [(info["gpu"], info["name"]) for info in sorted(infos, key=lambda i: i["gpu"])] == [
        ("0", "NVIDIA H100 80GB HBM3"),
        ("1", "NVIDIA RTX A6000"),
    ]
    assert all(info["uuid"].startswith("GPU-") and info["pci_bus_id"] for info in infos)
    driver = series(samples, "gpuload_driver_info")
    assert list(driver) == [
        (
            ("cuda_driver_version", "12.4"),
            ("driver_version", "550.90.07"),
            ("nvml_version", "12.550.90.07"),
        ),
    ]


def test_lost_gpu_keeps_other_gpus_reporting_and_comes_back(collect, tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path,
        CONSTANT,
        """
        faults:
          - {kind: gpu_lost, gpu: 1, at: 10, until: 20}
        """,
    )
    with moving_clock(scenario, at=5, timeout=5) as (clock, collection):
        before = _scrape(collection.run_cycle())
        a6000 = gpu_labels(before, "1")
        assert value_of(before, "gpu_up", **a6000) == 1

        clock.now = 15  # inside the fault window
        during = _scrape(collection.run_cycle())
        assert value_of(during, "gpu_up", **a6000) == 0
        assert value_of(during, "gpu_utilization_ratio", **a6000) is None
        assert value_of(during, "gpu_utilization_ratio", **gpu_labels(during, "0")) == 0.42
        # The lost GPU keeps its identity labels.
        assert any(dict(labels)["uuid"] == a6000["uuid"] for labels in series(during, "gpu_info"))
        # Losing a GPU is gpu_up's news, not a collector failure.
        assert all(v == 1 for v in series(during, "gpuload_collector_success").values())

        clock.now = 25  # the fault is over and the first retry (1 s after the loss) is due
        after = _scrape(collection.run_cycle())
        assert value_of(after, "gpu_up", **a6000) == 1
        assert value_of(after, "gpu_utilization_ratio", **a6000) == 0.42


def test_unexpected_error_is_counted_and_other_series_stay(collect, tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path,
        CONSTANT,
        """
        faults:
          - {kind: error, gpu: 0, call: nvmlDeviceGetPowerUsage, error: UNKNOWN}
        """,
    )
    samples = collect(scenario, cycles=3)
    h100 = gpu_labels(samples, "0")
    assert value_of(samples, "gpu_power_usage_watts", **h100) is None
    assert value_of(samples, "gpu_power_limit_watts", **h100) == 700
    assert value_of(samples, "gpu_power_usage_watts", **gpu_labels(samples, "1")) == 250
    assert value_of(samples, "gpuload_collector_success", collector="power") == 0
    assert value_of(samples, "gpuload_collector_success", collector="memory") == 1
    assert value_of(samples, "gpuload_nvml_errors_total", collector="power", error="unknown") == 3


@pytest.mark.parametrize(
    ("call", "family", "labels"),
    [
        # Whichever of the two the driver has (GetTemperatureV is R565 and later).
        (
            "nvmlDeviceGetTemperatureV, nvmlDeviceGetTemperature",
            "gpu_temperature_celsius",
            {"sensor": "gpu"},
        ),
        ("nvmlDeviceGetPowerUsage", "gpu_power_usage_watts", {}),
        ("nvmlDeviceGetSamples, nvmlDeviceGetUtilizationRates", "gpu_utilization_ratio", {}),
        # Energy is a field value (83), read in the call with the other fields.
        ("nvmlDeviceGetFieldValues", "gpu_energy_consumption_joules_total", {}),
        ("nvmlDeviceGetClockInfo", "gpu_clock_hertz", {"clock": "sm"}),
    ],
)
def test_sentinel_values_never_become_samples(
    collect, tmp_path: Path, call: str, family: str, labels: dict[str, str]
) -> None:
    scenario = write_scenario(
        tmp_path,
        CONSTANT,
        "faults:\n"
        + "".join(f"  - {{kind: sentinel, gpu: 0, call: {name}}}\n" for name in call.split(", ")),
    )
    samples = collect(scenario)
    assert value_of(samples, family, **gpu_labels(samples, "0"), **labels) is None
    assert value_of(samples, family, **gpu_labels(samples, "1"), **labels) is not None


def test_not_supported_fault_drops_only_that_series(collect, tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path,
        CONSTANT,
        """
        faults:
          - {kind: not_supported, gpu: 0, calls: [nvmlDeviceGetEnforcedPowerLimit]}
        """,
    )
    samples = collect(scenario)
    h100 = gpu_labels(samples, "0")
    assert value_of(samples, "gpu_power_limit_watts", **h100) is None
    assert value_of(samples, "gpu_power_usage_watts", **h100) == 250
    assert value_of(samples, "gpuload_collector_success", collector="power") == 1


def test_disabled_collector_exports_nothing(collect, tmp_path: Path) -> None:
    samples = collect(write_scenario(tmp_path, CONSTANT), enabled={**ALL_ON, "clocks": False})
    assert series(samples, "gpu_clock_hertz") == {}
    assert value_of(samples, "gpuload_collector_success", collector="clocks") is None
    assert series(samples, "gpu_power_usage_watts")


@pytest.fixture
def broken_collector() -> Iterator[str]:
    family = Family("gpu_broken_ratio", "gauge", "A collector that always raises.")

    @register("broken", [family])
    class Broken:
        """Raises on every GPU."""

        def collect(self, device: object, read: object) -> Iterator[Sample]:
            yield Sample("gpu_broken_ratio", 1.0)
            raise RuntimeError("broken on purpose")

    yield "broken"
    del REGISTRY["broken"]


def test_raising_collector_leaves_others_intact(
    collect, tmp_path: Path, broken_collector: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    samples = collect(
        write_scenario(tmp_path, CONSTANT), enabled={**ALL_ON, broken_collector: True}, cycles=3
    )
    assert value_of(samples, "gpuload_collector_success", collector="broken") == 0
    assert series(samples, "gpu_broken_ratio") == {}
    assert value_of(samples, "gpuload_collector_exceptions_total", collector="broken") == 6
    assert value_of(samples, "gpuload_collector_success", collector="power") == 1
    assert value_of(samples, "gpu_utilization_ratio", **gpu_labels(samples, "0")) == 0.42
    # Logged once per GPU when it started, not once per cycle.
    messages = [r.getMessage() for r in caplog.records if "collector broken" in r.getMessage()]
    assert len(messages) == 2
    assert "RuntimeError: broken on purpose" in messages[0]


def test_driver_not_loaded_then_loaded_brings_metrics(tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path,
        CONSTANT,
        """
        faults:
          - {kind: driver_not_loaded, at: 0, until: 10}
        """,
    )
    with moving_clock(scenario, at=5, timeout=5) as (clock, collection):
        down = _scrape(collection.run_cycle())
        assert value_of(down, "gpuload_nvml_up") == 0
        assert (
            value_of(down, "gpuload_nvml_errors_total", collector="nvml", error="driver_not_loaded")
            == 1
        )
        assert series(down, "gpu_up") == {}
        clock.now = 12  # the driver is loaded and the retry (1 s after the failure) is due
        up = _scrape(collection.run_cycle())
        assert value_of(up, "gpuload_nvml_up") == 1
        assert len(series(up, "gpu_up")) == 2


def test_hung_call_marks_one_gpu_stale_without_piling_up_threads(tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path,
        CONSTANT,
        """
        faults:
          - {kind: hang, gpu: 1, call: nvmlDeviceGetPowerUsage, seconds: 1.5, at: 0, until: 10}
        """,
    )
    released = threading.Event()

    def hang(_seconds: float) -> bool:
        """The hung call returns when the test releases it, however many cycles that takes."""
        return released.wait(60)

    threads = threading.active_count()
    with moving_clock(scenario, at=5, timeout=0.2, hang=hang) as (clock, collection):
        try:
            first = _scrape(collection.run_cycle())
            h100, a6000 = gpu_labels(first, "0"), gpu_labels(first, "1")
            for _ in range(5):
                samples = _scrape(collection.run_cycle())
                # The healthy GPU is collected every cycle; the stuck one is stale, not resubmitted.
                assert value_of(samples, "gpu_utilization_ratio", **h100) == 0.42
                assert value_of(samples, "gpuload_gpu_stale", **a6000) == 1
                assert value_of(samples, "gpuload_gpu_stale", **h100) == 0
                assert value_of(samples, "gpu_utilization_ratio", **a6000) is None
                assert value_of(samples, "gpuload_collector_success", collector="power") == 0
                # At most one worker per GPU (and the XID event thread), however long it is stuck.
                assert threading.active_count() <= threads + 2 + 1
        finally:
            clock.now = 20  # the stuck call returns into a scenario without the fault
            released.set()
        # Its worker finishes on its own thread: the next cycles pick up what it returned.
        recovered = _cycle_until(
            collection,
            lambda s: (
                value_of(s, "gpuload_gpu_stale", **a6000) == 0
                and value_of(s, "gpu_power_usage_watts", **a6000) is not None
            ),
        )
        assert value_of(recovered, "gpuload_collector_success", collector="power") == 1


def test_driver_unloaded_mid_run_is_initialised_again(tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path,
        CONSTANT,
        """
        faults:
          - {kind: driver_not_loaded, at: 10, until: 20}
          - {kind: error, call: nvmlDeviceGetUtilizationRates, error: UNINITIALIZED, at: 10,
             until: 20}
        """,
    )
    with moving_clock(scenario, at=5, timeout=5) as (clock, collection):
        assert value_of(_scrape(collection.run_cycle()), "gpuload_nvml_up") == 1
        clock.now = 12
        down = _scrape(collection.run_cycle())
        assert value_of(down, "gpuload_nvml_up") == 0
        assert series(down, "gpu_utilization_ratio") == {}
        clock.now = 22  # the driver is back: initialised again on the next cycle
        back = _scrape(collection.run_cycle())
        assert value_of(back, "gpuload_nvml_up") == 1
        assert len(series(back, "gpu_utilization_ratio")) == 2
        assert all(v == 1 for v in series(back, "gpu_up").values())


SAWTOOTH = """
name: sawtooth
driver: {version: "550.90.07", cuda_version: 12040}
gpus:
  - model: h100-sxm
phases:
  - duration: 1h
    utilization: {pattern: sawtooth, min: 0.0, max: 1.0, period: 3}
    memory_utilization: {pattern: square, min: 0.1, max: 0.5, period: 3}
"""


def test_utilization_is_the_mean_of_the_samples_since_the_last_collection(tmp_path: Path) -> None:
    with moving_clock(write_scenario(tmp_path, SAWTOOTH), at=30) as (clock, collection):
        collection.run_cycle()
        # Three seconds later: a whole sawtooth period (0 -> 100%) and a whole square period.
        clock.now = 33
        samples = _scrape(collection.run_cycle())
        h100 = gpu_labels(samples, "0")
        instant = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert value_of(samples, "gpu_utilization_ratio", **h100) == pytest.approx(0.5, abs=0.05)
    assert value_of(samples, "gpu_memory_utilization_ratio", **h100) == pytest.approx(0.3, abs=0.05)
    # The instant reading at the same moment is far from the mean: that is the point.
    assert abs(instant.gpu / 100 - 0.5) > 0.3
