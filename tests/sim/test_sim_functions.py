"""Every simulated C function, through pynvml's public API, on every GPU of every scenario."""

from __future__ import annotations

import contextlib
import ctypes
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.sim import FUNCTION_NAMES, install, load_scenario, scenario_names
from exporter.sim.features import READINGS
from exporter.sim.scenario import SCENARIO_DIR, GpuSpec

Call = Callable[[Any], Any]
Unsupported = Callable[[GpuSpec], bool]


def _lacks(feature: str) -> Unsupported:
    return lambda gpu: feature in gpu.lacks


def _never(gpu: GpuSpec) -> bool:
    return False


def _always(gpu: GpuSpec) -> bool:
    return True


def _in_mig_mode(gpu: GpuSpec) -> bool:
    return bool(gpu.mig)


def _lacks_or_in_mig_mode(feature: str) -> Unsupported:
    # In MIG mode the whole GPU has no codec utilization (the recorded H200 prints N/A).
    return lambda gpu: feature in gpu.lacks or bool(gpu.mig)


def _lacks_samples_or_mig(gpu: GpuSpec) -> bool:
    return "samples" in gpu.lacks or bool(gpu.mig)


def _utilization_samples(handle: Any, sample_type: int) -> Any:
    # An idle GPU adds no utilization sample: NOT_FOUND (tests/test_driver_reality.py).
    try:
        return pynvml.nvmlDeviceGetSamples(handle, sample_type, 0)
    except pynvml.NVMLError_NotFound:
        return None


def _gpm_sample(handle: Any) -> None:
    sample = pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(handle, sample)
    finally:
        pynvml.nvmlGpmSampleFree(sample)


# (C function pynvml calls, the public pynvml call, when the GPU answers NOT_SUPPORTED)
DEVICE_CALLS: list[tuple[str, Call, Unsupported]] = [
    ("nvmlDeviceGetIndex", pynvml.nvmlDeviceGetIndex, _never),
    ("nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, _never),
    ("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, _never),
    ("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, _never),
    ("nvmlDeviceGetSerial", pynvml.nvmlDeviceGetSerial, _lacks("serial")),
    ("nvmlDeviceGetVbiosVersion", pynvml.nvmlDeviceGetVbiosVersion, _never),
    ("nvmlDeviceGetBrand", pynvml.nvmlDeviceGetBrand, _never),
    ("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, _never),
    ("nvmlDeviceGetCudaComputeCapability", pynvml.nvmlDeviceGetCudaComputeCapability, _never),
    ("nvmlDeviceGetPciInfo_v3", pynvml.nvmlDeviceGetPciInfo, _never),
    ("nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, _in_mig_mode),
    ("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, _never),
    (
        "nvmlDeviceGetMemoryInfo_v2",
        lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
        _never,
    ),
    ("nvmlDeviceGetBAR1MemoryInfo", pynvml.nvmlDeviceGetBAR1MemoryInfo, _never),
    ("nvmlDeviceGetMemoryBusWidth", pynvml.nvmlDeviceGetMemoryBusWidth, _never),
    ("nvmlDeviceGetCurrPcieLinkGeneration", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, _never),
    ("nvmlDeviceGetMaxPcieLinkGeneration", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, _never),
    (
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration,
        _never,
    ),
    ("nvmlDeviceGetCurrPcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth, _never),
    ("nvmlDeviceGetMaxPcieLinkWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth, _never),
    (
        "nvmlDeviceGetPcieReplayCounter",
        pynvml.nvmlDeviceGetPcieReplayCounter,
        _lacks("pcie_replay"),
    ),
    (
        "nvmlDeviceGetPcieThroughput",
        lambda h: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        _lacks("pcie_throughput"),
    ),
    (
        "nvmlDeviceGetTemperature",
        lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        _never,
    ),
    (
        "nvmlDeviceGetTemperatureV",
        lambda h: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
        _never,
    ),
    (
        "nvmlDeviceGetTemperatureThreshold",
        lambda h: pynvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        ),
        _never,
    ),
    (
        "nvmlDeviceGetTemperatureThreshold",
        lambda h: pynvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
        ),
        _lacks("memory_temperature"),
    ),
    ("nvmlDeviceGetFieldValues", lambda h: pynvml.nvmlDeviceGetFieldValues(h, [82, 185]), _never),
    ("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, _never),
    ("nvmlDeviceGetEnforcedPowerLimit", pynvml.nvmlDeviceGetEnforcedPowerLimit, _never),
    ("nvmlDeviceGetPowerManagementLimit", pynvml.nvmlDeviceGetPowerManagementLimit, _never),
    (
        "nvmlDeviceGetPowerManagementDefaultLimit",
        pynvml.nvmlDeviceGetPowerManagementDefaultLimit,
        _never,
    ),
    (
        "nvmlDeviceGetPowerManagementLimitConstraints",
        pynvml.nvmlDeviceGetPowerManagementLimitConstraints,
        _never,
    ),
    (
        "nvmlDeviceGetTotalEnergyConsumption",
        pynvml.nvmlDeviceGetTotalEnergyConsumption,
        _lacks("energy"),
    ),
    (
        "nvmlDeviceGetClockInfo",
        lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        _never,
    ),
    (
        "nvmlDeviceGetMaxClockInfo",
        lambda h: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
        _never,
    ),
    (
        "nvmlDeviceGetCurrentClocksEventReasons",
        pynvml.nvmlDeviceGetCurrentClocksEventReasons,
        _lacks("clock_event_reasons"),
    ),
    (
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons,
        _lacks("clock_event_reasons"),
    ),
    (
        "nvmlDeviceGetSupportedClocksEventReasons",
        pynvml.nvmlDeviceGetSupportedClocksEventReasons,
        _lacks("clock_event_reasons"),
    ),
    (
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        pynvml.nvmlDeviceGetSupportedClocksThrottleReasons,
        _lacks("clock_event_reasons"),
    ),
    ("nvmlDeviceGetNumFans", pynvml.nvmlDeviceGetNumFans, _never),
    ("nvmlDeviceGetFanSpeed", pynvml.nvmlDeviceGetFanSpeed, lambda g: g.model.fans == 0),
    (
        "nvmlDeviceGetFanSpeed_v2",
        lambda h: pynvml.nvmlDeviceGetFanSpeed_v2(h, 0),
        lambda g: g.model.fans == 0,
    ),
    # The table-driven readings: pynvml names its wrapper after the C function.
    *(
        (
            reading.function,
            getattr(pynvml, reading.function),
            _lacks_or_in_mig_mode(reading.feature)
            if reading.whole_gpu
            else _lacks(reading.feature),
        )
        for reading in READINGS
    ),
    ("nvmlDeviceGetPerformanceState", pynvml.nvmlDeviceGetPerformanceState, _never),
    ("nvmlDeviceGetPowerState", pynvml.nvmlDeviceGetPowerState, _never),
    ("nvmlDeviceGetPersistenceMode", pynvml.nvmlDeviceGetPersistenceMode, _never),
    ("nvmlDeviceGetComputeMode", pynvml.nvmlDeviceGetComputeMode, _never),
    ("nvmlDeviceGetDisplayActive", pynvml.nvmlDeviceGetDisplayActive, _never),
    ("nvmlDeviceGetDisplayMode", pynvml.nvmlDeviceGetDisplayMode, _never),
    ("nvmlDeviceGetEccMode", pynvml.nvmlDeviceGetEccMode, _lacks("ecc")),
    (
        "nvmlDeviceGetTotalEccErrors",
        lambda h: pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
        ),
        _lacks("ecc"),
    ),
    # Driver models (WDDM/TCC) are Windows-only: a Linux driver answers NOT_SUPPORTED.
    ("nvmlDeviceGetDriverModel_v2", pynvml.nvmlDeviceGetDriverModel_v2, lambda g: True),
    ("nvmlDeviceGetDriverModel", pynvml.nvmlDeviceGetDriverModel_v1, lambda g: True),
    ("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, lambda g: not g.model.mig_capable),
    ("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, _never),
    ("nvmlDeviceIsMigDeviceHandle", pynvml.nvmlDeviceIsMigDeviceHandle, _never),
    (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
        _never,
    ),
    (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3,
        _never,
    ),
    (
        "nvmlDeviceGetComputeRunningProcesses_v2",
        pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
        _never,
    ),
    (
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2,
        _never,
    ),
    (
        "nvmlDeviceGetSamples",
        lambda h: _utilization_samples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES),
        _lacks_samples_or_mig,
    ),
    (
        "nvmlDeviceGetSamples",
        lambda h: _utilization_samples(h, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES),
        _lacks_samples_or_mig,
    ),
    ("nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport, _never),
    ("nvmlGpmSampleGet", _gpm_sample, _lacks("gpm")),
    ("nvmlDeviceGetNvLinkState", lambda h: pynvml.nvmlDeviceGetNvLinkState(h, 0), _lacks("nvlink")),
    (
        "nvmlDeviceGetNvLinkVersion",
        lambda h: pynvml.nvmlDeviceGetNvLinkVersion(h, 0),
        _lacks("nvlink"),
    ),
    (
        "nvmlDeviceGetNvLinkErrorCounter",
        lambda h: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
        _lacks("nvlink"),
    ),
    ("nvmlDeviceGetSupportedEventTypes", pynvml.nvmlDeviceGetSupportedEventTypes, _lacks("events")),
    ("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, _lacks("row_remapping")),
    (
        "nvmlDeviceGetRetiredPages",
        lambda h: pynvml.nvmlDeviceGetRetiredPages(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        ),
        _lacks("retired_pages"),
    ),
    (
        "nvmlDeviceGetRetiredPages_v2",
        lambda h: pynvml.nvmlDeviceGetRetiredPages_v2(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        ),
        _lacks("retired_pages"),
    ),
    (
        "nvmlDeviceGetRetiredPagesPendingStatus",
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus,
        _lacks("retired_pages"),
    ),
    # On a whole GPU (not a MIG device handle) these answer NOT_SUPPORTED.
    ("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, _always),
    ("nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, _always),
    ("nvmlDeviceGetAttributes_v2", pynvml.nvmlDeviceGetAttributes_v2, _always),
    (
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
        _always,
    ),
]

# Calls that MIG device handles answer.
MIG_CALLS: list[tuple[str, Call]] = [
    ("nvmlDeviceGetName", pynvml.nvmlDeviceGetName),
    ("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID),
    ("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo),
    (
        "nvmlDeviceGetMemoryInfo_v2",
        lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
    ),
    ("nvmlDeviceIsMigDeviceHandle", pynvml.nvmlDeviceIsMigDeviceHandle),
    ("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId),
    ("nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId),
    ("nvmlDeviceGetAttributes_v2", pynvml.nvmlDeviceGetAttributes_v2),
    (
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
    ),
    ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.nvmlDeviceGetComputeRunningProcesses),
    ("nvmlDeviceGetGraphicsRunningProcesses_v3", pynvml.nvmlDeviceGetGraphicsRunningProcesses),
]

SYSTEM_CALLS: list[tuple[str, Callable[[], Any]]] = [
    ("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion),
    ("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion),
    ("nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2),
    ("nvmlSystemGetNVMLVersion", pynvml.nvmlSystemGetNVMLVersion),
    ("nvmlDeviceGetCount_v2", pynvml.nvmlDeviceGetCount),
]

# Real NVML exports that this pynvml release no longer asks for (older nvidia-ml-py releases
# and C clients do), reached below through pynvml's own function lookup.
OLDER_BINDING_NAMES = {
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
}


def _expect(
    name: str,
    call: Callable[..., Any],
    args: tuple[Any, ...],
    unsupported: bool,
    lacks: frozenset[str],
) -> Any:
    if name in lacks:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            call(*args)
        return None
    if unsupported:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(*args)
        return None
    return call(*args)


@pytest.mark.parametrize("scenario_name", scenario_names())
def test_every_function_answers_on_every_gpu(scenario_name: str) -> None:
    scenario = load_scenario(scenario_name)
    sim = install(scenario, pinned_time=20.0)  # before the faulty scenario's faults
    pynvml.nvmlInit()
    lacks = sim.lacks  # the scenario's and its driver branch's
    for name, call in SYSTEM_CALLS:
        assert _expect(name, call, (), False, lacks) is not None
    assert pynvml.nvmlDeviceGetCount() == len(scenario.gpus)
    for gpu in scenario.gpus:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        for name, device_call, unsupported in DEVICE_CALLS:
            _expect(name, device_call, (handle,), unsupported(gpu), lacks)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle):
            assert pynvml.nvmlSystemGetProcessName(process.pid)
        for slot in range(len(gpu.mig)):
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            for name, mig_call in MIG_CALLS:
                _expect(name, mig_call, (mig,), False, lacks)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == gpu.index
        by_bus = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        assert pynvml.nvmlDeviceGetIndex(by_bus) == gpu.index
    pynvml.nvmlShutdown()
    assert sim.calls["nvmlShutdown"] == 1


def test_process_utilization_and_older_entry_points() -> None:
    sim = install("training", pinned_time=100.0)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert len(samples) == 1
    assert 70 <= samples[0].smUtil <= 100
    for name in ("nvmlInit", "nvmlInit_v2"):
        assert pynvml._nvmlGetFunctionPointer(name)() == pynvml.NVML_SUCCESS
    info = pynvml.nvmlPciInfo_v2_t()
    get_pci_v2 = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetPciInfo_v2")
    assert get_pci_v2(handle, pynvml.byref(info)) == pynvml.NVML_SUCCESS
    assert info.busId == "0000:1B:00.0"
    assert sim.calls["nvmlDeviceGetPciInfo_v2"] == 1
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        count = ctypes.c_uint(0)
        pynvml._nvmlGetFunctionPointer(name)(handle, ctypes.byref(count), None)
        assert sim.calls[name] == 1


def _call_ignoring_errors(call: Callable[..., Any], *args: Any) -> None:
    # Only reaching the C function matters here; the answers are checked elsewhere.
    with contextlib.suppress(pynvml.NVMLError):
        call(*args)


def _gpm_metrics(handle: Any) -> None:
    samples = [pynvml.nvmlGpmSampleAlloc() for _ in range(2)]
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 0
    request.sample1, request.sample2 = samples
    _call_ignoring_errors(pynvml.nvmlGpmMigSampleGet, handle, 0, samples[0])
    _call_ignoring_errors(pynvml.nvmlGpmMetricsGet, request)
    for sample in samples:
        pynvml.nvmlGpmSampleFree(sample)


def _exercise_newer_families(handle: Any) -> None:
    """Reach the event, GPM-metrics and MIG functions that the table does not call."""
    event_set = pynvml.nvmlEventSetCreate()
    _call_ignoring_errors(
        pynvml.nvmlDeviceRegisterEvents, handle, pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    _call_ignoring_errors(pynvml.nvmlEventSetWait_v2, event_set, 0)
    pynvml.nvmlEventSetFree(event_set)
    _call_ignoring_errors(_gpm_metrics, handle)
    _call_ignoring_errors(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, 0)
    _call_ignoring_errors(pynvml.nvmlDeviceGetGpuInstanceById, handle, 0)
    _call_ignoring_errors(pynvml.nvmlGpuInstanceGetInfo, pynvml.c_nvmlGpuInstance_t())
    _call_ignoring_errors(pynvml.nvmlDeviceGetProcessesUtilizationInfo, handle, 0)


def test_all_simulated_functions_are_exercised(tmp_path: Path) -> None:
    # The shipped scenarios run drivers up to 550; a newer one has the newer functions.
    newer = tmp_path / "training-570.yaml"
    newer.write_text(
        (SCENARIO_DIR / "training.yaml").read_text().replace('"550.90.07"', '"570.86.16"')
    )
    exercised: set[str] = set()
    for scenario_name in ("training", "mixed", "idle", "legacy-v100", str(newer)):
        sim = install(scenario_name, pinned_time=100.0)
        pynvml.nvmlInit()
        for _, system_call in SYSTEM_CALLS:
            system_call()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(handle))
            pynvml.nvmlDeviceGetHandleByPciBusId(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle):
                pynvml.nvmlSystemGetProcessName(process.pid)
            for _, device_call, _ in DEVICE_CALLS:
                _call_ignoring_errors(device_call, handle)
            _call_ignoring_errors(pynvml.nvmlDeviceGetProcessUtilization, handle, 0)
            _exercise_newer_families(handle)
        pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST)
        pynvml.nvmlShutdown()
        exercised |= set(sim.calls)
    assert exercised >= FUNCTION_NAMES - OLDER_BINDING_NAMES


def test_simulated_functions_are_real_nvml_names() -> None:
    source = Path(pynvml.__file__).read_text(encoding="utf-8")
    requested = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    assert FUNCTION_NAMES - requested == OLDER_BINDING_NAMES


def test_unknown_function_is_absent() -> None:
    sim = install("training")
    assert not hasattr(sim, "nvmlDeviceGetTeleportationRate")
    assert "nvmlDeviceGetName" in dir(sim)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, 0)


def test_error_strings_come_from_the_library() -> None:
    install("training")
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_READY)) == "Not Ready"


def test_the_simulators_own_cpu_time_is_counted_on_the_calling_threads() -> None:
    sim = install("training", pinned_time=100.0)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert sim.cpu_seconds > 0
    before, thread_before = sim.cpu_seconds, time.thread_time()
    for _ in range(200):
        pynvml.nvmlDeviceGetUtilizationRates(handle)
    spent, thread_spent = sim.cpu_seconds - before, time.thread_time() - thread_before
    # Part of the thread's time, not all of it: pynvml's own Python is the caller's.
    assert 0 < spent < thread_spent
