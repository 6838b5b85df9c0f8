"""Scenario faults, as pynvml callers see them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from exporter.sim import install

if TYPE_CHECKING:
    from conftest import ManualClock

Writer = Callable[[dict[str, Any]], Path]


def _start(
    base: dict[str, Any], write: Writer, clock: ManualClock, *faults: dict[str, Any]
) -> tuple[Any, Any]:
    """Install the base scenario with ``faults``, initialise, return the two GPU handles."""
    install(write({**base, "faults": list(faults)}), clock=clock)
    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)


def test_lost_gpu_fails_every_call_then_recovers(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    gpu0, gpu1 = _start(
        base_scenario, write_scenario, clock, {"kind": "gpu_lost", "gpu": 1, "at": 10, "until": 20}
    )
    clock.at(15)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUtilizationRates(gpu1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(gpu1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu0).gpu > 0
    assert pynvml.nvmlDeviceGetCount() == 2
    clock.at(20)
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu1).gpu > 0
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByIndex(1)) == 1


def test_not_supported_fault_hides_calls_for_its_window(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    calls = ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"]
    gpu0, gpu1 = _start(
        base_scenario,
        write_scenario,
        clock,
        {"kind": "not_supported", "gpu": 0, "calls": calls, "until": 10},
    )
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(gpu0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu0)
    assert pynvml.nvmlDeviceGetPowerUsage(gpu1) > 0
    clock.at(10)
    assert pynvml.nvmlDeviceGetPowerUsage(gpu0) > 0


@pytest.mark.parametrize(
    ("error", "exception"),
    [
        ("TIMEOUT", pynvml.NVMLError_Timeout),
        ("UNKNOWN", pynvml.NVMLError_Unknown),
        ("NVML_ERROR_NO_PERMISSION", pynvml.NVMLError_NoPermission),
    ],
)
def test_error_fault_returns_the_named_error(
    base_scenario: dict[str, Any],
    write_scenario: Writer,
    clock: ManualClock,
    error: str,
    exception: type[Exception],
) -> None:
    fault = {"kind": "error", "gpu": 0, "call": "nvmlDeviceGetUtilizationRates", "error": error}
    gpu0, gpu1 = _start(base_scenario, write_scenario, clock, {**fault, "at": 5, "until": 6})
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu0).gpu > 0
    clock.at(5.5)
    with pytest.raises(exception):
        pynvml.nvmlDeviceGetUtilizationRates(gpu0)
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu1).gpu > 0
    clock.at(6)
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu0).gpu > 0


def test_error_fault_on_init_without_gpu(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    fault = {"kind": "error", "call": "nvmlInitWithFlags", "error": "LIB_RM_VERSION_MISMATCH"}
    install(write_scenario({**base_scenario, "faults": [{**fault, "until": 30}]}), clock=clock)
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        pynvml.nvmlInit()
    clock.at(30)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 2


SENTINEL_CALLS = [
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetFieldValues",
]


def test_sentinel_fault_returns_unavailable_values(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    faults = [{"kind": "sentinel", "gpu": 0, "call": name, "until": 10} for name in SENTINEL_CALLS]
    gpu0, gpu1 = _start(base_scenario, write_scenario, clock, *faults)
    assert pynvml.nvmlDeviceGetTemperature(gpu0, pynvml.NVML_TEMPERATURE_GPU) == 4000
    assert pynvml.nvmlDeviceGetTemperatureV(gpu0, pynvml.NVML_TEMPERATURE_GPU) == 4000
    util = pynvml.nvmlDeviceGetUtilizationRates(gpu0)
    assert (util.gpu, util.memory) == (0xFFFFFFFF, 0xFFFFFFFF)
    memory = pynvml.nvmlDeviceGetMemoryInfo(gpu0, version=pynvml.nvmlMemory_v2)
    assert memory.used == 2**64 - 1
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu0) == 2**64 - 1
    assert pynvml.nvmlDeviceGetPowerUsage(gpu0) == 0xFFFFFFFF
    assert [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0)] == [None]
    (field,) = pynvml.nvmlDeviceGetFieldValues(gpu0, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert field.nvmlReturn == pynvml.NVML_SUCCESS and field.value.uiVal == 0xFFFFFFFF
    assert pynvml.nvmlDeviceGetTemperature(gpu1, pynvml.NVML_TEMPERATURE_GPU) < 100
    clock.at(10)
    assert pynvml.nvmlDeviceGetTemperature(gpu0, pynvml.NVML_TEMPERATURE_GPU) < 100


def test_driver_reload_fails_init_then_succeeds_and_restarts_energy(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    gpu0, _ = _start(
        base_scenario, write_scenario, clock, {"kind": "driver_not_loaded", "at": 10, "until": 20}
    )
    clock.at(9)
    energy_before = pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu0)
    clock.at(15)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlDeviceGetUtilizationRates(gpu0)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    clock.at(25)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    energy_after = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert 0 < energy_after < energy_before
    assert energy_after == pytest.approx(5 * pynvml.nvmlDeviceGetPowerUsage(handle), rel=0.1)


def test_hang_blocks_only_that_gpus_call(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    hang = {"kind": "hang", "gpu": 0, "call": "nvmlDeviceGetPowerUsage", "seconds": 0.5}
    gpu0, gpu1 = _start(base_scenario, write_scenario, clock, hang)
    sim = pynvml.nvmlLib
    hanging, release, hung_for = threading.Event(), threading.Event(), []

    def hang_until_released(seconds: float) -> None:  # the fault's seconds, ended by the test
        hung_for.append(seconds)
        hanging.set()
        release.wait(60)

    sim.hang = hang_until_released
    thread = threading.Thread(target=pynvml.nvmlDeviceGetPowerUsage, args=(gpu0,))
    thread.start()
    assert hanging.wait(60)
    for _ in range(20):  # every other call completes while that one hangs
        pynvml.nvmlDeviceGetPowerUsage(gpu1)
        pynvml.nvmlDeviceGetUtilizationRates(gpu0)
    assert thread.is_alive()
    release.set()
    thread.join(timeout=60)
    assert not thread.is_alive() and hung_for == [0.5]


def test_driver_without_a_function_raises_function_not_found(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    base_scenario["driver"]["lacks"] = ["nvmlDeviceGetMemoryInfo_v2", "nvmlSystemGetNVMLVersion"]
    gpu0, _ = _start(base_scenario, write_scenario, clock)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(gpu0, version=pynvml.nvmlMemory_v2)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlSystemGetNVMLVersion()
    assert pynvml.nvmlDeviceGetMemoryInfo(gpu0).total > 0


def test_faulty_scenario_timeline(clock: ManualClock) -> None:
    install("faulty", clock=clock)
    pynvml.nvmlInit()
    gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    clock.at(35)
    assert pynvml.nvmlDeviceGetTemperature(gpus[2], pynvml.NVML_TEMPERATURE_GPU) == 4000
    clock.at(61)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(gpus[1])
    clock.at(155)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlDeviceGetUtilizationRates(gpus[0])
    clock.at(205)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlDeviceGetCount()
    clock.at(215)
    assert [pynvml.nvmlDeviceGetUtilizationRates(h).gpu > 50 for h in gpus] == [True] * 4
