"""The simulated driver checks the structs it is given as a real driver does.

A driver reads and writes its own layout at the caller's address (`exporter.sim.records`, copied
from nvml.h): a wrong version field is refused, a struct of another layout reads garbage, and
the simulator never writes past the caller's object (nvml-facts.md, "Struct sizes"). The wrong
structs are declared here and passed through pynvml's function pointers; pynvml's own structs
must read what the header's layout reads, in every supported nvidia-ml-py release.
"""

from __future__ import annotations

import ctypes
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest
from helpers import Clock

from exporter import sim
from exporter.sim import records

SCENARIO = """
name: struct-checks
driver: {version: "570.86.16", cuda_version: 12080}
gpus:
  - model: h100-sxm
  - model: h100-sxm
    mig:
      - {profile: 3g.40gb, overrides: {processes: [{name: triton, memory: 30GiB}]}}
phases:
  - duration: 1h
    utilization: 0.9
    memory_utilization: 0.5
    memory_used: 40GiB
    processes:
      - {name: python train.py, memory: 30GiB}
      - {name: python eval.py, memory: 10GiB}
      - {name: tritonserver, memory: 5GiB}
faults:
  - {kind: xid, gpu: 0, at: 10, code: 79}
"""

PROCESSES = 3  # on GPU 0
GUARD = 64  # bytes after the caller's object that must stay as they were
UNTOUCHED = 0xAB


@dataclass(frozen=True)
class Node:
    """The simulated machine's handles: GPU 0, the MIG device of GPU 1, two GPM samples of GPU 0."""

    gpu: Any
    mig: Any
    samples: tuple[Any, Any]


def _install(tmp_path: Path, scenario: str, at: float) -> Clock:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(scenario))
    clock = Clock(at)
    sim.install(path, clock=clock, epoch=0)
    pynvml.nvmlInit()
    return clock


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    clock = _install(tmp_path, SCENARIO, at=30)
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(1), 0)
    samples = (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
    pynvml.nvmlGpmSampleGet(gpu, samples[0])
    clock.now += 1
    pynvml.nvmlGpmSampleGet(gpu, samples[1])
    try:
        yield Node(gpu, mig, samples)
    finally:
        for sample in samples:
            pynvml.nvmlGpmSampleFree(sample)
        pynvml.nvmlShutdown()
        sim.uninstall()


def _call(name: str, *args: Any) -> int:
    """Call C function ``name`` of the installed library directly, with ctypes arguments."""
    return int(pynvml._nvmlGetFunctionPointer(name)(*args))


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _guarded(kind: type[Any]) -> tuple[Any, Any]:
    """An object of ``kind`` at the start of a buffer GUARD bytes longer, all bytes 0xAB."""
    size = ctypes.sizeof(kind)
    buffer = (ctypes.c_ubyte * (size + GUARD))(*[UNTOUCHED] * (size + GUARD))
    return kind.from_buffer(buffer), buffer


def _guard_intact(buffer: Any, kind: type[Any]) -> bool:
    return bytes(buffer)[ctypes.sizeof(kind) :] == bytes([UNTOUCHED]) * GUARD


# --- What the versions are -----------------------------------------------------------------


def test_struct_versions_are_the_nvml_h_macros_pynvml_sends() -> None:
    assert records.MEMORY_V2 == pynvml.nvmlMemory_v2 == 0x02000028
    assert records.TEMPERATURE_V1 == pynvml.nvmlTemperature_v1 == 0x0100000C
    utilization_info = records.PROCESSES_UTILIZATION_INFO_V1
    assert utilization_info == pynvml.ProcessesUtilizationInfo_v1 == 0x01000018
    # GPM's are plain numbers, not NVML_STRUCT_VERSION (go-nvml issue 168 sent the latter).
    assert records.GPM_SUPPORT_VERSION == pynvml.NVML_GPM_SUPPORT_VERSION == 1
    assert records.GPM_METRICS_GET_VERSION == pynvml.NVML_GPM_METRICS_GET_VERSION == 1


# pynvml's struct -> the driver's record it must match, field by field
PYNVML_LAYOUTS = [
    ("c_nvmlMemory_t", records.Memory),
    ("c_nvmlMemory_v2_t", records.MemoryV2),
    ("c_nvmlBAR1Memory_t", records.Bar1Memory),
    ("c_nvmlUtilization_t", records.Utilization),
    ("nvmlPciInfo_t", records.PciInfo),
    ("nvmlPciInfo_v2_t", records.PciInfoV2),
    ("c_nvmlSample_t", records.Sample),
    ("c_nvmlValue_t", records.Value),
    ("c_nvmlProcessUtilizationSample_t", records.ProcessUtilizationSample),
    ("c_nvmlProcessUtilizationInfo_v1_t", records.ProcessUtilizationInfo),
    ("c_nvmlProcessesUtilizationInfo_v1_t", records.ProcessesUtilizationInfo),
    ("c_nvmlTemperature_v1_t", records.Temperature),
    ("c_nvmlEventData_t", records.EventData),
    ("c_nvmlDeviceAttributes", records.DeviceAttributes),
    ("c_nvmlGpmSupport_t", records.GpmSupport),
    ("c_nvmlGpmMetric_t", records.GpmMetric),
    ("c_nvmlGpmMetricsGet_t", records.GpmMetricsGet),
    # pynvml's _v3 record is 24 bytes, as the drivers from 535.104.05 on write it.
    ("c_nvmlProcessInfo_v3_t", records.ProcessInfoV2),
    ("c_nvmlProcessInfo_v2_t", records.ProcessInfoV2),
]


def _layout(kind: type[Any]) -> dict[str, tuple[int, int]]:
    return {
        name: (getattr(kind, name).offset, getattr(kind, name).size) for name, *_ in kind._fields_
    }


@pytest.mark.parametrize(("name", "record"), PYNVML_LAYOUTS, ids=[n for n, _ in PYNVML_LAYOUTS])
def test_pynvml_declares_each_struct_as_nvml_h_does(name: str, record: type[Any]) -> None:
    declared, driver = _layout(getattr(pynvml, name)), _layout(record)
    if name == "c_nvmlGpmMetricsGet_t":
        # NVML_GPM_METRIC_MAX differs by release (98 in 12.570, 477 in 13.615); the driver writes
        # only numMetrics entries, so only where the array starts matters.
        assert declared.pop("metrics")[0] == driver.pop("metrics")[0]
    else:
        assert ctypes.sizeof(getattr(pynvml, name)) == ctypes.sizeof(record)
    assert declared == driver


# --- Wrong versions --------------------------------------------------------------------------


def _request(record: type[Any], version: int, node: Node) -> Any:
    """``record`` filled with 0xAB, with ``version`` and the inputs the call needs."""
    request, _ = _guarded(record)
    request.version = version
    if record is records.Temperature:
        request.sensorType = pynvml.NVML_TEMPERATURE_GPU
    if record is records.ProcessesUtilizationInfo:
        request.processSamplesCount, request.lastSeenTimeStamp, request.procUtilArray = 0, 0, None
    if record is records.GpmMetricsGet:
        request.numMetrics = 0
        request.sample1, request.sample2 = (_address(s) for s in node.samples)
    return request


def _versioned_call(name: str, node: Node, request: Any) -> int:
    if name == "nvmlGpmMetricsGet":
        return _call(name, ctypes.byref(request))
    return _call(name, node.gpu, ctypes.byref(request))


class _MemoryWithoutReserved(ctypes.Structure):
    """nvmlMemory_v2_t with its `reserved` field missing: 32 bytes."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


# (C function, the driver's struct, a wrong version, what the driver answers)
WRONG_VERSIONS = [
    # nvmlDeviceGetMemoryInfo_v2 answers FUNCTION_NOT_FOUND (nvidia-settings issue 78).
    ("nvmlDeviceGetMemoryInfo_v2", records.MemoryV2, 2, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
    ("nvmlDeviceGetMemoryInfo_v2", records.MemoryV2, 0, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
    (
        "nvmlDeviceGetMemoryInfo_v2",
        records.MemoryV2,
        records.struct_version(_MemoryWithoutReserved, 2),
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    ),
    (
        "nvmlDeviceGetTemperatureV",
        records.Temperature,
        1,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ),
    (
        "nvmlDeviceGetTemperatureV",
        records.Temperature,
        0x0200000C,  # a version 2 the header does not have
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ),
    (
        "nvmlDeviceGetProcessesUtilizationInfo",
        records.ProcessesUtilizationInfo,
        1,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ),
    (
        "nvmlGpmQueryDeviceSupport",
        records.GpmSupport,
        records.struct_version(records.GpmSupport, 1),  # what go-nvml sent (issue 168)
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ),
    ("nvmlGpmMetricsGet", records.GpmMetricsGet, 0, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
    ("nvmlGpmMetricsGet", records.GpmMetricsGet, 2, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
]


@pytest.mark.parametrize(("name", "record", "version", "answer"), WRONG_VERSIONS)
def test_a_wrong_struct_version_is_refused_and_nothing_written(
    node: Node, name: str, record: type[Any], version: int, answer: int
) -> None:
    request = _request(record, version, node)
    before = bytes(request)
    assert _versioned_call(name, node, request) == answer
    assert bytes(request) == before


@pytest.mark.parametrize(
    ("name", "record", "version"),
    [
        ("nvmlDeviceGetMemoryInfo_v2", records.MemoryV2, records.MEMORY_V2),
        ("nvmlDeviceGetTemperatureV", records.Temperature, records.TEMPERATURE_V1),
        (
            "nvmlDeviceGetProcessesUtilizationInfo",
            records.ProcessesUtilizationInfo,
            records.PROCESSES_UTILIZATION_INFO_V1,
        ),
        ("nvmlGpmQueryDeviceSupport", records.GpmSupport, records.GPM_SUPPORT_VERSION),
        ("nvmlGpmMetricsGet", records.GpmMetricsGet, records.GPM_METRICS_GET_VERSION),
    ],
)
def test_the_right_struct_version_is_answered(
    node: Node, name: str, record: type[Any], version: int
) -> None:
    answer = _versioned_call(name, node, _request(record, version, node))
    # The utilization info is a size query here (no array): INSUFFICIENT_SIZE, not a mismatch.
    assert answer in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


# --- A process struct of the wrong layout ----------------------------------------------------


class _ProcessInfoWithoutInstanceIds(ctypes.Structure):
    """A process record without gpuInstanceId/computeInstanceId: the _v1 layout."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _process_list(caller_record: type[Any]) -> tuple[list[tuple[int, int]], Any, Any]:
    """(pid, memory) of each record as ``caller_record`` reads _v3's list; the array; its buffer."""
    array_type = caller_record * PROCESSES
    array, buffer = _guarded(array_type)
    count = ctypes.c_uint(PROCESSES)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = "nvmlDeviceGetComputeRunningProcesses_v3"
    assert _call(name, handle, ctypes.byref(count), array) == pynvml.NVML_SUCCESS
    assert count.value == PROCESSES
    return [(row.pid, row.usedGpuMemory) for row in array], array_type, buffer


@pytest.mark.parametrize(
    ("driver", "wrong", "right"),
    [
        # the _v1 layout (16 bytes, no instance ids) given to _v3, which writes 24-byte records
        ("570.86.16", _ProcessInfoWithoutInstanceIds, records.ProcessInfoV2),
        # the 24-byte record (pynvml's own) given to an early R535 _v3, which writes 32 bytes
        ("535.54.03", pynvml.c_nvmlProcessInfo_v3_t, records.ProcessInfoEarlyR535),
    ],
)
def test_a_wrong_process_struct_reads_garbage_past_the_first_record(
    tmp_path: Path, driver: str, wrong: type[Any], right: type[Any]
) -> None:
    _install(tmp_path, SCENARIO.replace("570.86.16", driver), at=30)
    try:
        truth, _, _ = _process_list(right)
        read, array_type, buffer = _process_list(wrong)
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall()
    assert {memory for _, memory in truth} == {30 * 2**30, 10 * 2**30, 5 * 2**30}
    assert read[0] == truth[0]  # where both layouts agree
    assert read[1:] != truth[1:], read
    assert _guard_intact(buffer, array_type)  # the driver's larger records stop at the array's end


# --- Structs declared too small ----------------------------------------------------------------


def _short(record: type[Any], count: int) -> type[ctypes.Structure]:
    """A caller's declaration of ``record`` with only its first ``count`` fields."""
    fields = list(record._fields_[:count])
    return type(f"Short{record.__name__}", (ctypes.Structure,), {"_fields_": fields})


def _event(node: Node, ref: Any) -> int:
    event_set = pynvml.nvmlEventSetCreate()
    try:
        pynvml.nvmlDeviceRegisterEvents(node.gpu, pynvml.nvmlEventTypeXidCriticalError, event_set)
        return _call("nvmlEventSetWait_v2", event_set, ref, ctypes.c_uint(0))
    finally:
        pynvml.nvmlEventSetFree(event_set)


def _samples(node: Node, array: Any) -> int:
    count, kind = ctypes.c_uint(len(array)), ctypes.c_uint(0)
    since = ctypes.c_ulonglong(0)
    gpu_utilization = ctypes.c_uint(pynvml.NVML_GPU_UTILIZATION_SAMPLES)
    return _call(
        "nvmlDeviceGetSamples",
        node.gpu,
        gpu_utilization,
        since,
        ctypes.byref(kind),
        ctypes.byref(count),
        array,
    )


def _process_utilization(node: Node, array: Any) -> int:
    count = ctypes.c_uint(len(array))
    return _call(
        "nvmlDeviceGetProcessUtilization",
        node.gpu,
        array,
        ctypes.byref(count),
        ctypes.c_ulonglong(0),
    )


def _processes(node: Node, array: Any) -> int:
    count = ctypes.c_uint(len(array))
    return _call("nvmlDeviceGetComputeRunningProcesses_v3", node.gpu, ctypes.byref(count), array)


def _utilization_info(node: Node, array: Any) -> int:
    element = array._type_

    class Info(ctypes.Structure):
        # The caller's nvmlProcessesUtilizationInfo_v1_t, pointing at its own record type.
        _fields_ = [
            ("version", ctypes.c_uint),
            ("processSamplesCount", ctypes.c_uint),
            ("lastSeenTimeStamp", ctypes.c_ulonglong),
            ("procUtilArray", ctypes.POINTER(element)),
        ]

    info = Info(records.PROCESSES_UTILIZATION_INFO_V1, len(array), 0)
    info.procUtilArray = ctypes.cast(array, ctypes.POINTER(element))
    return _call("nvmlDeviceGetProcessesUtilizationInfo", node.gpu, ctypes.byref(info))


def _gpm_request(request: Any, node: Node) -> None:
    """Ask for two metrics between the node's samples (addresses, or pynvml's sample pointers)."""
    request.version, request.numMetrics = records.GPM_METRICS_GET_VERSION, 2
    if isinstance(request, pynvml.c_nvmlGpmMetricsGet_t):
        request.sample1, request.sample2 = node.samples
    else:
        request.sample1, request.sample2 = (_address(s) for s in node.samples)
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL


class _ShortGpmMetricsGet(ctypes.Structure):
    """nvmlGpmMetricsGet_t with room for two metrics (a release with a smaller METRIC_MAX)."""

    _fields_ = [*records.GpmMetricsGet._fields_[:4], ("metrics", records.GpmMetric * 2)]


def _nothing(struct: Any, node: Node) -> None:
    return None


def _version(version: int, **inputs: int) -> Callable[[Any, Node], None]:
    def prepare(struct: Any, node: Node) -> None:
        struct.version = version
        for name, value in inputs.items():
            setattr(struct, name, value)

    return prepare


def _by_ref(name: str, handle: str = "gpu") -> Callable[[Node, Any], int]:
    return lambda node, struct: _call(name, getattr(node, handle), ctypes.byref(struct))


@dataclass(frozen=True)
class TooSmall:
    """A call, the driver's record (or array), and a caller's smaller declaration of it."""

    name: str
    driver: type[Any]
    caller: type[Any]
    invoke: Callable[[Node, Any], int]
    prepare: Callable[[Any, Node], None] = _nothing


TOO_SMALL = [
    TooSmall(
        "utilization",
        records.Utilization,
        _short(records.Utilization, 1),
        _by_ref("nvmlDeviceGetUtilizationRates"),
    ),
    TooSmall(
        "memory", records.Memory, _short(records.Memory, 2), _by_ref("nvmlDeviceGetMemoryInfo")
    ),
    TooSmall(
        # the right version number on a struct without `reserved`: it reads free where reserved is
        "memory_v2",
        records.MemoryV2,
        _MemoryWithoutReserved,
        _by_ref("nvmlDeviceGetMemoryInfo_v2"),
        _version(records.MEMORY_V2),
    ),
    TooSmall(
        "bar1",
        records.Bar1Memory,
        _short(records.Bar1Memory, 1),
        _by_ref("nvmlDeviceGetBAR1MemoryInfo"),
    ),
    TooSmall(
        # pynvml's legacy struct (52 bytes) given to _v3, which writes 68
        "pci_v3",
        records.PciInfo,
        pynvml.nvmlPciInfo_v2_t,
        _by_ref("nvmlDeviceGetPciInfo_v3"),
    ),
    TooSmall(
        "temperature_v",
        records.Temperature,
        _short(records.Temperature, 2),
        _by_ref("nvmlDeviceGetTemperatureV"),
        _version(records.TEMPERATURE_V1, sensorType=pynvml.NVML_TEMPERATURE_GPU),
    ),
    TooSmall(
        "attributes",
        records.DeviceAttributes,
        _short(records.DeviceAttributes, 8),
        _by_ref("nvmlDeviceGetAttributes_v2", handle="mig"),
    ),
    TooSmall("event", records.EventData, _short(records.EventData, 3), _event),
    TooSmall(
        "gpm_support",
        records.GpmSupport,
        _short(records.GpmSupport, 1),
        _by_ref("nvmlGpmQueryDeviceSupport"),
        _version(1),
    ),
    TooSmall(
        "gpm_metrics",
        records.GpmMetricsGet,
        _ShortGpmMetricsGet,
        lambda node, struct: _call("nvmlGpmMetricsGet", ctypes.byref(struct)),
        _gpm_request,
    ),
    TooSmall("samples", records.Sample * 4, _short(records.Sample, 1) * 4, _samples),
    TooSmall(
        "process_utilization",
        records.ProcessUtilizationSample * PROCESSES,
        _short(records.ProcessUtilizationSample, 2) * PROCESSES,
        _process_utilization,
    ),
    TooSmall(
        "processes_utilization_info",
        records.ProcessUtilizationInfo * PROCESSES,
        _short(records.ProcessUtilizationInfo, 3) * PROCESSES,
        _utilization_info,
    ),
    TooSmall(
        "processes",
        records.ProcessInfoV2 * PROCESSES,
        _ProcessInfoWithoutInstanceIds * PROCESSES,
        _processes,
    ),
]


@pytest.mark.parametrize("case", TOO_SMALL, ids=[case.name for case in TOO_SMALL])
def test_a_struct_declared_too_small_gets_only_its_own_bytes(node: Node, case: TooSmall) -> None:
    assert ctypes.sizeof(case.caller) < ctypes.sizeof(case.driver)
    full, _ = _guarded(case.driver)
    small, buffer = _guarded(case.caller)
    for struct in (full, small):
        case.prepare(struct, node)
        assert case.invoke(node, struct) == pynvml.NVML_SUCCESS
    assert _guard_intact(buffer, case.caller), bytes(buffer)
    # The bytes it has are the start of the driver's record, whatever the caller named them.
    assert bytes(small) == bytes(full)[: ctypes.sizeof(case.caller)]


def test_a_memory_v2_struct_without_reserved_reads_garbage(node: Node) -> None:
    right = records.MemoryV2(version=records.MEMORY_V2)
    wrong = _MemoryWithoutReserved(version=records.MEMORY_V2)
    for struct in (right, wrong):
        assert _call("nvmlDeviceGetMemoryInfo_v2", node.gpu, ctypes.byref(struct)) == 0
    assert wrong.total == right.total
    assert (wrong.free, wrong.used) == (right.reserved, right.free)


# --- pynvml's own structs --------------------------------------------------------------------


def _raw(name: str, record: type[Any], handle: str = "gpu", **inputs: int) -> Callable[[Node], Any]:
    """Read ``name`` into the header's ``record`` (its ``inputs`` set): the record's bytes."""

    def read(node: Node) -> bytes:
        struct = record(**inputs)
        assert _call(name, getattr(node, handle), ctypes.byref(struct)) == 0
        return bytes(struct)

    return read


def _temperature(node: Node) -> int:
    request = records.Temperature(records.TEMPERATURE_V1, pynvml.NVML_TEMPERATURE_GPU)
    assert _call("nvmlDeviceGetTemperatureV", node.gpu, ctypes.byref(request)) == 0
    return int(request.temperature)


def _pynvml_gpm_metrics(node: Node) -> bytes:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    _gpm_request(request, node)
    pynvml.nvmlGpmMetricsGet(request)
    return b"".join(bytes(metric) for metric in request.metrics[:2])


def _raw_gpm_metrics(node: Node) -> bytes:
    request = records.GpmMetricsGet()
    _gpm_request(request, node)
    assert _call("nvmlGpmMetricsGet", ctypes.byref(request)) == 0
    return b"".join(bytes(metric) for metric in request.metrics[:2])


def _raw_event(node: Node) -> bytes:
    data = records.EventData()
    assert _event(node, ctypes.byref(data)) == 0
    return bytes(data)


def _pynvml_event(node: Node) -> bytes:
    event_set = pynvml.nvmlEventSetCreate()
    try:
        pynvml.nvmlDeviceRegisterEvents(node.gpu, pynvml.nvmlEventTypeXidCriticalError, event_set)
        return bytes(pynvml.nvmlEventSetWait_v2(event_set, 0))
    finally:
        pynvml.nvmlEventSetFree(event_set)


def _rows(
    read: Callable[[Node, Any], int], record: type[Any], count: int
) -> Callable[[Node], bytes]:
    def rows(node: Node) -> bytes:
        array = (record * count)()
        assert read(node, array) == 0
        return bytes(array)

    return rows


def _pynvml_processes(node: Node) -> list[tuple[int, int, int, int]]:
    return [
        (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v3(node.gpu)
    ]


def _raw_processes(node: Node) -> list[tuple[int, int, int, int]]:
    array = (records.ProcessInfoV2 * PROCESSES)()
    assert _processes(node, array) == 0
    return [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in array]


def _joined(structs: Any) -> bytes:
    return b"".join(bytes(struct) for struct in structs)


# (what is read, through pynvml's public call, through the header's layout)
PYNVML_READS: list[tuple[str, Callable[[Node], Any], Callable[[Node], Any]]] = [
    (
        "memory",
        lambda n: bytes(pynvml.nvmlDeviceGetMemoryInfo(n.gpu)),
        _raw("nvmlDeviceGetMemoryInfo", records.Memory),
    ),
    (
        "memory_v2",
        lambda n: bytes(pynvml.nvmlDeviceGetMemoryInfo(n.gpu, version=pynvml.nvmlMemory_v2)),
        _raw("nvmlDeviceGetMemoryInfo_v2", records.MemoryV2, version=records.MEMORY_V2),
    ),
    (
        "bar1",
        lambda n: bytes(pynvml.nvmlDeviceGetBAR1MemoryInfo(n.gpu)),
        _raw("nvmlDeviceGetBAR1MemoryInfo", records.Bar1Memory),
    ),
    (
        "utilization",
        lambda n: bytes(pynvml.nvmlDeviceGetUtilizationRates(n.gpu)),
        _raw("nvmlDeviceGetUtilizationRates", records.Utilization),
    ),
    (
        "pci",
        lambda n: bytes(pynvml.nvmlDeviceGetPciInfo(n.gpu)),
        _raw("nvmlDeviceGetPciInfo_v3", records.PciInfo),
    ),
    (
        "attributes",
        lambda n: bytes(pynvml.nvmlDeviceGetAttributes_v2(n.mig)),
        _raw("nvmlDeviceGetAttributes_v2", records.DeviceAttributes, handle="mig"),
    ),
    (
        "temperature_v",
        lambda n: pynvml.nvmlDeviceGetTemperatureV(n.gpu, pynvml.NVML_TEMPERATURE_GPU),
        _temperature,
    ),
    ("event", _pynvml_event, _raw_event),
    (
        "gpm_support",
        lambda n: bytes(pynvml.nvmlGpmQueryDeviceSupport(n.gpu)),
        _raw("nvmlGpmQueryDeviceSupport", records.GpmSupport, version=records.GPM_SUPPORT_VERSION),
    ),
    ("gpm_metrics", _pynvml_gpm_metrics, _raw_gpm_metrics),
    (
        "samples",
        lambda n: _joined(
            pynvml.nvmlDeviceGetSamples(n.gpu, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)[1][:4]
        ),
        _rows(_samples, records.Sample, 4),
    ),
    (
        "process_utilization",
        lambda n: _joined(pynvml.nvmlDeviceGetProcessUtilization(n.gpu, 0)),
        _rows(_process_utilization, records.ProcessUtilizationSample, PROCESSES),
    ),
    (
        "processes_utilization_info",
        lambda n: _joined(pynvml.nvmlDeviceGetProcessesUtilizationInfo(n.gpu, 0)),
        _rows(_utilization_info, records.ProcessUtilizationInfo, PROCESSES),
    ),
    ("processes", _pynvml_processes, _raw_processes),
]


@pytest.mark.parametrize(
    ("what", "through_pynvml", "through_header"), PYNVML_READS, ids=[r[0] for r in PYNVML_READS]
)
def test_pynvml_structs_read_what_the_driver_writes(
    node: Node,
    what: str,
    through_pynvml: Callable[[Node], Any],
    through_header: Callable[[Node], Any],
) -> None:
    expected = through_header(node)
    assert any(expected) if isinstance(expected, bytes) else expected  # a reading, not zeros
    assert through_pynvml(node) == expected
