"""XID events, memory errors, per-process utilization and MIG: through pynvml's public calls."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from exporter.sim import ScenarioError, install, load_scenario

if TYPE_CHECKING:
    from conftest import ManualClock

Writer = Callable[[dict[str, Any]], Path]

XID = pynvml.nvmlEventTypeXidCriticalError


def _xid_set(count: int) -> Any:
    event_set = pynvml.nvmlEventSetCreate()
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceRegisterEvents(handle, XID, event_set)
    return event_set


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _drain(event_set: Any, handles: list[Any]) -> list[tuple[int, int]]:
    """(GPU index, XID) of every event ready now.

    The GPU is found among ``handles`` by address: calls on a lost GPU's handle (after XID 79)
    answer GPU_IS_LOST, nvmlDeviceGetIndex included.
    """
    addresses = [_address(handle) for handle in handles]
    events: list[tuple[int, int]] = []
    while True:
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, 0)
        except pynvml.NVMLError_Timeout:
            return events
        assert data.eventType == XID
        assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
        events.append((addresses.index(_address(data.device)), data.eventData))


# -- events ----------------------------------------------------------------------------------


def test_xid_events_arrive_once_in_time_order(clock: ManualClock) -> None:
    install("fell-off-bus", clock=clock)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    event_set = _xid_set(8)
    clock.at(10)
    assert _drain(event_set, handles) == []
    clock.at(40)
    assert _drain(event_set, handles) == [(1, 13), (5, 31)]
    clock.at(61)
    assert _drain(event_set, handles) == [(6, 43), (3, 79)]
    assert _drain(event_set, handles) == []
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(3))
    second = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(1), XID, second)
    assert _drain(second, handles) == [(1, 13)]  # each set delivers its own copy
    pynvml.nvmlEventSetFree(event_set)
    pynvml.nvmlEventSetFree(second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(second, 0)


def test_event_set_only_reports_registered_gpus(clock: ManualClock) -> None:
    install("fell-off-bus", clock=clock)
    pynvml.nvmlInit()
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(5), XID, event_set)
    clock.at(59)
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert _drain(event_set, handles) == [(5, 31)]


def test_wait_times_out_and_does_not_block_other_threads(clock: ManualClock) -> None:
    install("fell-off-bus", clock=clock)
    pynvml.nvmlInit()
    event_set = _xid_set(8)
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 300)
    assert time.monotonic() - started >= 0.3  # it waited its timeout (never less, however fast)
    # A wait in progress holds up no other call: here one with no end until the clock moves.
    received: list[int] = []
    waiter = threading.Thread(
        target=lambda: received.append(pynvml.nvmlEventSetWait_v2(event_set, 600_000).eventData)
    )
    waiter.start()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(50):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    assert waiter.is_alive() and not received
    clock.at(25)  # XID 13 on GPU 1 at 20 s
    waiter.join(timeout=60)
    assert received == [13]


def test_waiting_thread_receives_an_event_when_the_clock_reaches_it(clock: ManualClock) -> None:
    install("fell-off-bus", clock=clock)
    pynvml.nvmlInit()
    event_set = _xid_set(8)
    clock.at(15)
    received: list[int] = []
    waiter = threading.Thread(
        target=lambda: received.append(pynvml.nvmlEventSetWait_v2(event_set, 5000).eventData)
    )
    waiter.start()
    assert not received  # nothing due yet: it waits, however long the test takes to get here
    clock.at(20)
    waiter.join(timeout=60)
    assert received == [13]


def test_real_time_clock_delivers_when_the_event_is_due(
    base_scenario: dict[str, Any], write_scenario: Writer
) -> None:
    base_scenario["faults"] = [{"kind": "xid", "gpu": 1, "at": 0.2, "code": 48}]
    install(write_scenario(base_scenario))
    pynvml.nvmlInit()
    event_set = _xid_set(2)
    data = pynvml.nvmlEventSetWait_v2(event_set, 60_000)
    assert data.eventData == 48


def test_gpus_without_event_support_refuse_registration(tmp_path: Path) -> None:
    scenario = tmp_path / "no-events.yaml"
    scenario.write_text(
        "driver: {version: '550.90.07', cuda_version: 12040}\n"
        "gpus: [{model: h100-sxm, lacks: [events]}]\n"
        "phases: [{duration: 1h, utilization: 0.5}]\n"
    )
    install(scenario, pinned_time=10.0)
    pynvml.nvmlInit()
    event_set = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(0), XID, event_set)


# -- ECC, row remapping, retired pages -------------------------------------------------------


def _ecc(handle: Any, kind: int, counter: int) -> int:
    return int(pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, counter))


def test_uncorrectable_ecc_raises_counters_and_remap_state(clock: ManualClock) -> None:
    install("ecc-remap", clock=clock)
    pynvml.nvmlInit()
    gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    unc, volatile, aggregate = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, 0, 1
    clock.at(29)
    assert [pynvml.nvmlDeviceGetRemappedRows(h) for h in gpus] == [(0, 0, 0, 0)] * 4
    assert _ecc(gpus[1], unc, volatile) == 0
    clock.at(30)
    assert pynvml.nvmlDeviceGetRemappedRows(gpus[1]) == (0, 1, 1, 0)
    assert _ecc(gpus[1], unc, volatile) == 1
    assert _ecc(gpus[1], unc, aggregate) == 1
    assert pynvml.nvmlDeviceGetRemappedRows(gpus[2]) == (0, 0, 0, 0)
    clock.at(600)
    assert pynvml.nvmlDeviceGetRemappedRows(gpus[2]) == (0, 0, 0, 1)
    assert _ecc(gpus[2], unc, volatile) == 3
    corrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    assert _ecc(gpus[0], corrected, volatile) == 0  # 3 per hour: none yet at 10 min
    assert _ecc(gpus[0], corrected, aggregate) == 3 * 72  # the 3 days before elapsed 0
    clock.at(3600)
    assert _ecc(gpus[0], corrected, volatile) == 3
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(gpus[1], 1)


def test_pending_remap_is_applied_by_a_driver_reload(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    base_scenario["faults"] = [
        {"kind": "ecc_uncorrectable", "gpu": 0, "at": 5, "count": 2},
        {"kind": "driver_not_loaded", "at": 10, "until": 20},
    ]
    install(write_scenario(base_scenario), clock=clock)
    pynvml.nvmlInit()
    clock.at(6)
    assert pynvml.nvmlDeviceGetRemappedRows(pynvml.nvmlDeviceGetHandleByIndex(0)) == (0, 2, 1, 0)
    clock.at(21)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetRemappedRows(handle) == (0, 2, 0, 0)
    unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert (_ecc(handle, unc, 0), _ecc(handle, unc, 1)) == (0, 2)  # volatile restarts


def test_pre_ampere_gpus_retire_pages(clock: ManualClock) -> None:
    install("legacy-v100", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(6)
    double_bit = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    clock.at(299)
    assert pynvml.nvmlDeviceGetRetiredPages(handle, double_bit) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == 0
    clock.at(301)
    (page,) = pynvml.nvmlDeviceGetRetiredPages_v2(handle, double_bit)
    assert page["address"] % 4096 == 0
    assert page["timestamp"] == int(clock.epoch + 300)
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle)


# -- processes -------------------------------------------------------------------------------


def test_process_utilization_splits_the_gpu_and_names_resolve() -> None:
    install("mixed", pinned_time=100.0)
    pynvml.nvmlInit()
    a6000 = pynvml.nvmlDeviceGetHandleByIndex(6)
    samples = pynvml.nvmlDeviceGetProcessUtilization(a6000, 0)
    gpu = pynvml.nvmlDeviceGetUtilizationRates(a6000).gpu
    assert len(samples) == 2
    assert sum(s.smUtil for s in samples) == pytest.approx(gpu, abs=2)
    names = {pynvml.nvmlSystemGetProcessName(s.pid) for s in samples}
    assert names == {"/usr/lib/xorg/Xorg", "python serve.py"}
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # from R550; mixed runs 525
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(a6000, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(a6000, samples[0].timeStamp)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # the P100 lacks it
        pynvml.nvmlDeviceGetProcessUtilization(pynvml.nvmlDeviceGetHandleByIndex(7), 0)
    install("training", pinned_time=100.0)  # driver 550
    pynvml.nvmlInit()
    h100 = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.nvmlDeviceGetProcessesUtilizationInfo(h100, 0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(h100, 0)
    assert info and [(i.pid, i.smUtil) for i in info] == [(s.pid, s.smUtil) for s in samples]
    install("idle", pinned_time=100.0)
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(pynvml.nvmlDeviceGetHandleByIndex(0), 0)


# -- MIG -------------------------------------------------------------------------------------


def test_mig_devices_have_their_own_identity_memory_and_processes() -> None:
    install("a100-mig", pinned_time=100.0)
    pynvml.nvmlInit()
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i) for i in range(7)]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(migs[0]).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    assert pynvml.nvmlDeviceGetName(migs[0]) == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    uuids = {pynvml.nvmlDeviceGetUUID(m) for m in migs}
    assert len(uuids) == 7 and all(u.startswith("MIG-") for u in uuids)
    memory = pynvml.nvmlDeviceGetMemoryInfo(migs[0], version=pynvml.nvmlMemory_v2)
    assert memory.total == 9984 * 2**20  # 9.75 GiB
    assert pynvml.nvmlDeviceGetAttributes_v2(migs[0]).memorySizeMB == 9984
    assert pynvml.nvmlDeviceGetAttributes_v2(migs[0]).gpuInstanceSliceCount == 1
    assert [pynvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == list(range(7, 14))
    assert pynvml.nvmlDeviceGetComputeInstanceId(migs[3]) == 0
    back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migs[2])
    assert pynvml.nvmlDeviceGetIndex(back) == 0
    (process,) = pynvml.nvmlDeviceGetComputeRunningProcesses(migs[0])
    assert (process.usedGpuMemory, process.gpuInstanceId) == (9 * 2**30, 7)
    assert pynvml.nvmlSystemGetProcessName(process.pid) == "triton llama-7b"
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(migs[6]) == []
    assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(parent)) == 6
    used = pynvml.nvmlDeviceGetMemoryInfo(parent, version=pynvml.nvmlMemory_v2).used
    assert used == sum(
        pynvml.nvmlDeviceGetMemoryInfo(m, version=pynvml.nvmlMemory_v2).used for m in migs
    )


def test_gpu_instances_give_their_profile_id_and_placement_to_root_only() -> None:
    install("a100-mig", pinned_time=100.0, caller="root")
    pynvml.nvmlInit()
    # GPU 0: seven 1g.10gb (profile id 19) in GPU instances 7-13, at memory slices 0-6, as
    # `nvidia-smi mig -lgipp` places 1g.10gb ({0,1,2,3,4,5,6}:1).
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    infos = [
        pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(parent, gpu_instance))
        for gpu_instance in range(7, 14)
    ]
    assert [(i.id, i.profileId, i.placement.start, i.placement.size) for i in infos] == [
        (gpu_instance, 19, gpu_instance - 7, 1) for gpu_instance in range(7, 14)
    ]
    assert pynvml.nvmlDeviceGetIndex(infos[0].device) == 0
    # GPU 1: 3g.40gb (profile id 9) in GPU instance 1, 2g.20gb (14) in 3 and 4. The two 2g.20gb
    # take their ids' placements, 0 and 2, so the 3g.40gb goes to its other one, 4.
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    found = {
        gpu_instance: pynvml.nvmlGpuInstanceGetInfo(
            pynvml.nvmlDeviceGetGpuInstanceById(parent, gpu_instance)
        )
        for gpu_instance in (1, 3, 4)
    }
    assert {n: (i.profileId, i.placement.start, i.placement.size) for n, i in found.items()} == {
        1: (9, 4, 4),
        3: (14, 0, 2),
        4: (14, 2, 2),
    }
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetGpuInstanceById(parent, 2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetInfo(pynvml.c_nvmlGpuInstance_t())
    pynvml.nvmlShutdown()

    install("a100-mig", pinned_time=100.0, caller="unprivileged")
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetGpuInstanceById(pynvml.nvmlDeviceGetHandleByIndex(1), 1)
    pynvml.nvmlShutdown()

    install("training", pinned_time=100.0, caller="root")  # no MIG mode
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceById(pynvml.nvmlDeviceGetHandleByIndex(0), 1)


def test_mig_mode_hides_whole_gpu_utilization_and_rejects_empty_slots() -> None:
    install("a100-mig", pinned_time=100.0)
    pynvml.nvmlInit()
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSamples(parent, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert pynvml.nvmlDeviceGetPowerUsage(parent) > 0
    names = [
        pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i))
        for i in range(3)
    ]
    assert [n.rsplit(" ", 1)[1] for n in names] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(mig, pynvml.NVML_TEMPERATURE_GPU)
    install("training", pinned_time=10.0)
    pynvml.nvmlInit()
    whole = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(whole) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(whole, 0)


def test_gpm_per_mig_instance_on_hopper(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    base_scenario["gpus"] = [
        {
            "model": "h100-sxm",
            "mig": [
                {"profile": "3g.40gb", "overrides": {"sm_active": 0.6}},
                {"profile": "3g.40gb", "overrides": {"sm_active": 0.1}},
            ],
        }
    ]
    install(write_scenario(base_scenario), clock=clock)
    pynvml.nvmlInit()
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    instance = pynvml.nvmlDeviceGetGpuInstanceId(
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    )
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmMigSampleGet(parent, instance, first)
    clock.at(1)
    pynvml.nvmlGpmMigSampleGet(parent, instance, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    pynvml.nvmlGpmMetricsGet(request)
    assert request.metrics[0].value == pytest.approx(10.0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMigSampleGet(parent, 13, first)


@pytest.mark.parametrize(
    ("mig", "message"),
    [
        ([{"profile": "1g.10gb", "count": 8}], r"mig\[0\]\.count: expected an integer 1\.\.7"),
        ([{"profile": "5g.50gb"}], r"mig\[0\]\.profile: expected one of"),
        (
            [{"profile": "4g.40gb"}, {"profile": "3g.40gb"}, {"profile": "1g.10gb"}],
            r"mig\[2\]: the instances need more",
        ),
    ],
)
def test_mig_layouts_are_validated(
    base_scenario: dict[str, Any], write_scenario: Writer, mig: list[Any], message: str
) -> None:
    base_scenario["gpus"][0]["mig"] = mig
    with pytest.raises(ScenarioError, match=message):
        load_scenario(write_scenario(base_scenario))


def test_mig_needs_a_mig_capable_model(
    base_scenario: dict[str, Any], write_scenario: Writer
) -> None:
    base_scenario["gpus"] = [{"model": "l4", "mig": [{"profile": "1g.10gb"}]}]
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.mig: NVIDIA L4 does not support MIG"):
        load_scenario(write_scenario(base_scenario))


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"kind": "xid", "gpu": 0}, r"faults\[0\]\.code: required key is missing"),
        ({"kind": "xid", "gpu": 0, "code": 79, "until": 5}, r"faults\[0\]\.until: unknown key"),
        (
            {"kind": "ecc_uncorrectable", "gpu": 1, "count": 1, "remap": "maybe"},
            r"faults\[0\]\.remap: expected one of done, failed, pending",
        ),
    ],
)
def test_new_fault_kinds_are_validated(
    base_scenario: dict[str, Any], write_scenario: Writer, fault: dict[str, Any], message: str
) -> None:
    base_scenario["faults"] = [fault]
    with pytest.raises(ScenarioError, match=message):
        load_scenario(write_scenario(base_scenario))
