"""Readings over time: determinism, load patterns, energy, memory, processes and samples."""

from __future__ import annotations

import itertools
import statistics
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from exporter.sim import install, install_from_env

if TYPE_CHECKING:
    from conftest import ManualClock

GiB = 2**30


def _handles() -> list[Any]:
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def _snapshot() -> list[tuple[Any, ...]]:
    """Everything that varies per GPU at the current time."""
    rows = []
    for handle in _handles():
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        fields = pynvml.nvmlDeviceGetFieldValues(handle, [82, 186, 197])
        rows.append(
            (
                pynvml.nvmlDeviceGetUUID(handle),
                pynvml.nvmlDeviceGetSerial(handle),
                util.gpu,
                util.memory,
                memory.used,
                pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                pynvml.nvmlDeviceGetPowerUsage(handle),
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
                tuple(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)),
                tuple(f.value.uiVal if f.fieldId != 197 else f.value.ullVal for f in fields),
            )
        )
    return rows


def _run(scenario: str, clock: ManualClock, times: list[float], seed: int | None = None) -> Any:
    install(scenario, clock=clock, epoch=clock.epoch, seed=seed)
    pynvml.nvmlInit()
    readings = []
    for t in times:
        clock.at(t)
        readings.append(_snapshot())
    pynvml.nvmlShutdown()
    return readings


TIMES = [0.0, 0.4, 7.3, 59.9, 123.25, 901.0, 3600.5]


def test_same_scenario_seed_and_epoch_give_identical_readings(clock: ManualClock) -> None:
    assert _run("training", clock, TIMES) == _run("training", clock, TIMES)


def test_another_seed_gives_other_identities_and_noise(clock: ManualClock) -> None:
    first, second = _run("training", clock, TIMES), _run("training", clock, TIMES, seed=7)
    assert first[0][0][0] != second[0][0][0]  # UUID
    assert [row[2:] for row in first[-1]] != [row[2:] for row in second[-1]]


def test_uuid_format_is_nvml_like(clock: ManualClock) -> None:
    uuid = _run("idle", clock, [0.0])[0][0][0]
    assert pynvml.NVML_DEVICE_UUID_V2_BUFFER_SIZE > len(uuid) == 40
    parts = uuid.split("-")
    assert parts[0] == "GPU" and [len(p) for p in parts[1:]] == [8, 4, 4, 4, 12]


def _series(scenario: str, clock: ManualClock, start: float, stop: float, step: float) -> Any:
    install(scenario, clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    values = []
    t = start
    while t < stop:
        clock.at(t)
        values.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        t += step
    return values


def test_data_starved_utilization_saws_below_thirty_percent(clock: ManualClock) -> None:
    # Two full 12 s periods of the sawtooth.
    values = _series("data-starved", clock, 100.0, 124.0, 0.1)
    assert statistics.mean(values) < 30
    assert max(values) >= 45 and min(values) <= 3


def test_training_runs_near_ninety_percent_with_dips(clock: ManualClock) -> None:
    values = _series("training", clock, 60.0, 180.0, 0.25)
    assert 85 <= statistics.mean(values) <= 97
    assert min(values) < 80  # the short dips are there


def test_saturated_stays_above_ninety_five_percent(clock: ManualClock) -> None:
    values = _series("saturated", clock, 0.0, 120.0, 0.25)
    assert min(values) > 95


def test_thermal_throttle_reaches_slowdown_and_drops_clocks(clock: ManualClock) -> None:
    install("thermal-throttle", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    slowdown = pynvml.nvmlDeviceGetTemperatureThreshold(
        handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    )
    max_sm = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
    thermal = (
        pynvml.nvmlClocksEventReasonSwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    clock.at(30.0)  # heating
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) < slowdown - 5
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) & thermal == 0
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == max_sm
    clock.at(200.0)  # throttled
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) >= slowdown - 1
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) & thermal == thermal
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) < 0.75 * max_sm
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu >= 90


def test_idle_gpus_report_gpu_idle_and_no_processes(clock: ManualClock) -> None:
    install("idle", clock=clock)
    pynvml.nvmlInit()
    for handle in _handles():
        assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == (
            pynvml.nvmlClocksEventReasonGpuIdle
        )
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
        assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 0
        assert pynvml.nvmlDeviceGetPerformanceState(handle) == pynvml.NVML_PSTATE_8


def test_energy_is_monotonic_and_matches_integrated_power(clock: ManualClock) -> None:
    install("training", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    energies = []
    for moment in range(0, 2000, 5):
        clock.at(float(moment))
        energies.append(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
    assert energies == sorted(energies)
    # Integrate the reported (1 s average) power across the train -> checkpoint boundary at 900 s.
    start, stop, step = 870.0, 990.0, 0.25
    clock.at(start)
    energy_before = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    power = []
    for k in range(int((stop - start) / step) + 1):
        clock.at(start + k * step)
        power.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000)
    integral = sum((a + b) / 2 * step for a, b in itertools.pairwise(power))
    energy_delta = (pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) - energy_before) / 1000
    assert energy_delta == pytest.approx(integral, rel=0.01)
    assert energy_delta > 120 * 150  # at least 150 W on average: the job was running


def test_memory_v1_counts_reserved_as_used(clock: ManualClock) -> None:
    install("training", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert v1.total == v2.total == 81559 * 2**20
    assert v2.used == 70 * GiB
    assert v1.used == v2.used + v2.reserved
    assert v1.free == v2.free == v2.total - v2.reserved - v2.used


def test_processes_follow_the_two_call_protocol_and_have_names(clock: ManualClock) -> None:
    sim = install("mixed", clock=clock)
    pynvml.nvmlInit()
    pids = set()
    for handle in _handles():
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        assert len(processes) == 1
        pids.add(processes[0].pid)
        assert processes[0].usedGpuMemory > 0
    assert len(pids) == 8  # one process per GPU, all distinct
    a6000 = pynvml.nvmlDeviceGetHandleByIndex(6)
    graphics = pynvml.nvmlDeviceGetGraphicsRunningProcesses(a6000)
    assert [pynvml.nvmlSystemGetProcessName(p.pid) for p in graphics] == ["/usr/lib/xorg/Xorg"]
    # Size query then fill: two C calls per GPU with processes.
    assert sim.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 16
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(1)


def test_samples_arrive_six_per_second_after_the_last_seen(clock: ManualClock) -> None:
    install("data-starved", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.at(60.0)
    value_type, samples = pynvml.nvmlDeviceGetSamples(
        handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0
    )
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert 100 <= len(samples) <= 121
    stamps = [s.timeStamp for s in samples]
    assert stamps == sorted(stamps) and stamps[-1] <= clock.now * 1e6
    assert all(0 <= s.sampleValue.uiVal <= 100 for s in samples)
    last = stamps[-1]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
    clock.advance(1.0)
    _, fresh = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
    assert len(fresh) == 6 and all(s.timeStamp > last for s in fresh)
    _, memory = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, last)
    assert all(s.sampleValue.uiVal <= 36 for s in memory)  # bursts of 35%, noise 0.5%


def test_field_values_report_per_field_status(clock: ManualClock) -> None:
    install("mixed", clock=clock)
    pynvml.nvmlInit()
    h100, p100 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(7)
    ids = [
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        pynvml.NVML_FI_DEV_POWER_INSTANT,
        pynvml.NVML_FI_DEV_POWER_AVERAGE,
    ]
    on_h100 = pynvml.nvmlDeviceGetFieldValues(h100, ids)
    # Driver 525 does not know the PCIe byte counters (R555): a per-field INVALID_ARGUMENT.
    assert [f.nvmlReturn for f in on_h100] == [
        pynvml.NVML_SUCCESS,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_SUCCESS,
        pynvml.NVML_SUCCESS,
    ]
    assert on_h100[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert on_h100[0].timestamp == round(clock.now * 1e6)
    assert 20 < on_h100[0].value.uiVal < 100
    on_p100 = pynvml.nvmlDeviceGetFieldValues(p100, ids)
    assert [f.nvmlReturn for f in on_p100] == [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    ]


def test_pcie_throughput_is_in_kibibytes_per_second(clock: ManualClock) -> None:
    install("data-starved", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.at(0.5)  # inside the 6 GB/s burst of the first second, noise 0.2 GB/s
    rx = pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    assert rx * 1024 == pytest.approx(6e9, rel=0.05)


def test_old_driver_lacks_newer_functions(clock: ManualClock) -> None:
    install("mixed", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) > 0
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) >= 0


def test_calls_need_an_open_session(clock: ManualClock) -> None:
    install("idle", clock=clock)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 8
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_concurrent_callers_are_all_counted(clock: ManualClock) -> None:
    sim = install("training", clock=clock)
    pynvml.nvmlInit()
    handles = _handles()
    failures: list[BaseException] = []

    def poll(handle: Any) -> None:
        try:
            for _ in range(200):
                pynvml.nvmlDeviceGetUtilizationRates(handle)
                pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=poll, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert sim.calls["nvmlDeviceGetUtilizationRates"] == 8 * 200


def test_install_from_env_reads_the_variables() -> None:
    assert install_from_env({}) is None
    sim = install_from_env(
        {
            "GPULOAD_SIM_SCENARIO": "training",
            "GPULOAD_SIM_EPOCH": "1700000000.5",
            "GPULOAD_SIM_SEED": "5",
            "GPULOAD_SIM_TIME": "100",
        }
    )
    assert sim is not None
    assert (sim.epoch, sim.seed, sim.pinned_time) == (1700000000.5, 5, 100.0)
    assert pynvml.nvmlLib is sim
    with pytest.raises(ValueError, match="GPULOAD_SIM_EPOCH"):
        install_from_env({"GPULOAD_SIM_SCENARIO": "training", "GPULOAD_SIM_EPOCH": "soon"})


def test_pinned_time_freezes_readings(clock: ManualClock) -> None:
    install("data-starved", clock=clock, pinned_time=5.0)
    pynvml.nvmlInit()
    first = _snapshot()
    clock.advance(1234.5)
    assert _snapshot() == first


@pytest.mark.parametrize(("loop", "expected"), [(True, 20), (False, 80)])
def test_phases_loop_or_hold_the_last(
    base_scenario: dict[str, Any],
    write_scenario: Callable[[dict[str, Any]], Path],
    clock: ManualClock,
    loop: bool,
    expected: int,
) -> None:
    base_scenario["loop"] = loop
    base_scenario["phases"] = [
        {"duration": 10, "utilization": 0.2},
        {"duration": 10, "utilization": 0.8},
    ]
    install(write_scenario(base_scenario), clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.at(15)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 80
    clock.at(25)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == expected


def test_per_gpu_overrides_make_a_straggler(clock: ManualClock) -> None:
    healthy = _series("mixed", clock, 0.0, 180.0, 0.5)  # GPU 0, session left open
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    straggler = []
    for k in range(360):
        clock.at(k * 0.5)
        straggler.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    assert statistics.mean(straggler) < statistics.mean(healthy) - 25
