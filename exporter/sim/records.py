"""The structs the simulated driver reads and writes, in the driver's own layout (nvml.h).

A real driver reads its own layout from the caller's address and writes its own record size
there, whatever ctypes struct the caller declared: a caller whose struct has another layout reads
garbage (nvml-facts.md, "Struct sizes"). The handlers do the same with :func:`read` and
:func:`write`, which never touch a byte past the caller's object (where a driver would overwrite
whatever follows it).

The classes copy nvml.h of NVML 13.3.29 (NVIDIA/go-nvml ``pkg/nvml/nvml.h``; line numbers
below), except where a class names an older header. They are the simulator's own definitions,
never pynvml's, so that a pynvml release declaring a struct differently is caught.
"""

from __future__ import annotations

import ctypes
from typing import Any, TypeVar

Record = TypeVar("Record", bound="ctypes.Structure | ctypes.Array[Any]")

_BUS_ID = 32  # NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE (:171)
_BUS_ID_V2 = 16  # NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE (:176)

# NVML_GPM_METRIC_MAX, the length of nvmlGpmMetricsGet_t.metrics: 333 in NVML 13.3.29 (:13808),
# 477 in nvidia-ml-py 13.615 (the newest, which the simulator takes), 98 in 12.570. The version
# (1) does not change with it: a driver fills only the numMetrics entries asked for, so a caller
# of any release reads them.
GPM_METRIC_MAX = 477


def struct_version(record: type[ctypes.Structure], version: int) -> int:
    """NVML_STRUCT_VERSION(name, ver): the struct's size with the version in the top byte (:141)."""
    return ctypes.sizeof(record) | version << 24


class Memory(ctypes.Structure):
    """nvmlMemory_t (:261): nvmlDeviceGetMemoryInfo."""

    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t (:274): nvmlDeviceGetMemoryInfo_v2."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


MEMORY_V2 = struct_version(MemoryV2, 2)  # nvmlMemory_v2 (:283), 0x02000028


class Bar1Memory(ctypes.Structure):
    """nvmlBAR1Memory_t (:288): nvmlDeviceGetBAR1MemoryInfo."""

    _fields_ = [
        ("bar1Total", ctypes.c_ulonglong),
        ("bar1Free", ctypes.c_ulonglong),
        ("bar1Used", ctypes.c_ulonglong),
    ]


class Utilization(ctypes.Structure):
    """nvmlUtilization_t (:251): nvmlDeviceGetUtilizationRates."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (:202), 68 bytes: nvmlDeviceGetPciInfo_v3."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * _BUS_ID_V2),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * _BUS_ID),
    ]


class PciInfoV2(ctypes.Structure):
    """The 52-byte nvmlPciInfo_t of older nvml.h: what nvmlDeviceGetPciInfo_v2 writes.

    busId[16] where busIdLegacy now is, then four reserved words where the 32-byte busId now
    starts; the larger struct came with _v3, the default since (:120). The current header still
    declares _v2 for older binaries (:14524) without saying which layout it writes; pynvml's
    ``nvmlPciInfo_v2_t`` ("legacy pciInfo used for _v1 and _v2") agrees with this one.
    """

    _fields_ = [
        ("busId", ctypes.c_char * _BUS_ID_V2),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint),
        ("reserved2", ctypes.c_uint),
        ("reserved3", ctypes.c_uint),
    ]


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t (:305), 16 bytes: nvmlDeviceGet*RunningProcesses (no suffix)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t (:320), 24 bytes: what _v2, and _v3 from 535.98 on, write."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class ProcessInfoEarlyR535(ctypes.Structure):
    """The 32-byte record early R535 drivers wrote from _v3 (usedGpuCcProtectedMemory added).

    nvidia-settings src/nvml.h 535.43.02 :285-296; the layout of nvmlProcessDetail_v1_t (:336)
    since (see `branches.EARLY_R535_PROCESS_RECORD`).
    """

    _fields_ = [*ProcessInfoV2._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


class Value(ctypes.Union):
    """nvmlValue_t (:671)."""

    _fields_ = [
        ("dVal", ctypes.c_double),
        ("siVal", ctypes.c_int),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("usVal", ctypes.c_ushort),
    ]


class Sample(ctypes.Structure):
    """nvmlSample_t (:685): the records of nvmlDeviceGetSamples."""

    _fields_ = [("timeStamp", ctypes.c_ulonglong), ("sampleValue", Value)]


class ProcessUtilizationSample(ctypes.Structure):
    """nvmlProcessUtilizationSample_t (:1386): the records of nvmlDeviceGetProcessUtilization."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class ProcessUtilizationInfo(ctypes.Structure):
    """nvmlProcessUtilizationInfo_v1_t (:1409): the records procUtilArray points to."""

    _fields_ = [
        ("timeStamp", ctypes.c_ulonglong),
        ("pid", ctypes.c_uint),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
        ("jpgUtil", ctypes.c_uint),
        ("ofaUtil", ctypes.c_uint),
    ]


class ProcessesUtilizationInfo(ctypes.Structure):
    """nvmlProcessesUtilizationInfo_v1_t (:1420): nvmlDeviceGetProcessesUtilizationInfo."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("processSamplesCount", ctypes.c_uint),
        ("lastSeenTimeStamp", ctypes.c_ulonglong),
        ("procUtilArray", ctypes.c_void_p),  # nvmlProcessUtilizationInfo_v1_t *
    ]


# nvmlProcessesUtilizationInfo_v1 (:1422), 0x01000018
PROCESSES_UTILIZATION_INFO_V1 = struct_version(ProcessesUtilizationInfo, 1)


class Temperature(ctypes.Structure):
    """nvmlTemperature_v1_t (:6013): nvmlDeviceGetTemperatureV."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("sensorType", ctypes.c_uint),  # nvmlTemperatureSensors_t
        ("temperature", ctypes.c_int),
    ]


TEMPERATURE_V1 = struct_version(Temperature, 1)  # nvmlTemperature_v1 (:6017), 0x0100000C


class EventData(ctypes.Structure):
    """nvmlEventData_t (:3243): what nvmlEventSetWait_v2 writes."""

    _fields_ = [
        ("device", ctypes.c_void_p),  # nvmlDevice_t
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class DeviceAttributes(ctypes.Structure):
    """nvmlDeviceAttributes_t (:368): nvmlDeviceGetAttributes_v2."""

    _fields_ = [
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("gpuInstanceSliceCount", ctypes.c_uint),
        ("computeInstanceSliceCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
    ]


class GpuInstancePlacement(ctypes.Structure):
    """nvmlGpuInstancePlacement_t (:12570): memory slices, the first and how many."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class GpuInstanceInfo(ctypes.Structure):
    """nvmlGpuInstanceInfo_t (:12652): nvmlGpuInstanceGetInfo."""

    _fields_ = [
        ("device", ctypes.c_void_p),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", GpuInstancePlacement),
    ]


class GpmSupport(ctypes.Structure):
    """nvmlGpmSupport_t (:13866): nvmlGpmQueryDeviceSupport."""

    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


GPM_SUPPORT_VERSION = 1  # NVML_GPM_SUPPORT_VERSION (:13868): a plain 1, not NVML_STRUCT_VERSION


class GpmMetricInfo(ctypes.Structure):
    """nvmlGpmMetricMetricInfo_t (:13832): pointers to the driver's static strings."""

    _fields_ = [
        ("shortName", ctypes.c_char_p),
        ("longName", ctypes.c_char_p),
        ("unit", ctypes.c_char_p),
    ]


class GpmMetric(ctypes.Structure):
    """nvmlGpmMetric_t (:13843)."""

    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),  # nvmlReturn_t
        ("value", ctypes.c_double),
        ("metricInfo", GpmMetricInfo),
    ]


class GpmMetricsGet(ctypes.Structure):
    """nvmlGpmMetricsGet_t (:13855): nvmlGpmMetricsGet."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_void_p),  # nvmlGpmSample_t: a struct holding one pointer
        ("sample2", ctypes.c_void_p),
        ("metrics", GpmMetric * GPM_METRIC_MAX),
    ]


GPM_METRICS_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION (:13857): a plain 1 as well


def _caller_object(argument: Any) -> Any:
    """The ctypes object behind ``byref(x)`` (x), or the argument itself (an array, a struct)."""
    caller = getattr(argument, "_obj", argument)
    if isinstance(caller, (ctypes._Pointer, ctypes.c_void_p)):
        # Its size is the pointer's, not the buffer's: the bound on writes would be wrong.
        raise TypeError("pass the array or struct itself, or byref() of it, not a pointer")
    return caller


def read(source: Any, record: type[Record]) -> Record:
    """The caller's struct behind ``source`` as the driver reads it: in its own layout.

    Bytes past the end of the caller's object read as zero (a driver would read whatever lies
    there).
    """
    caller = _caller_object(source)
    copy = record()
    size = min(ctypes.sizeof(copy), ctypes.sizeof(caller))
    ctypes.memmove(ctypes.addressof(copy), ctypes.addressof(caller), size)
    return copy


def write(destination: Any, record: ctypes.Structure | ctypes.Array[Any]) -> None:
    """Write ``record``'s bytes (a struct or an array of records) over the caller's object.

    ``destination`` is ``byref(x)`` or x itself; at most ``ctypes.sizeof(x)`` bytes are written.
    """
    caller = _caller_object(destination)
    size = min(ctypes.sizeof(record), ctypes.sizeof(caller))
    ctypes.memmove(ctypes.addressof(caller), ctypes.addressof(record), size)


def write_at(address: int, record: ctypes.Structure | ctypes.Array[Any], room: int) -> None:
    """Write ``record``'s bytes at a caller's pointer, at most ``room`` bytes of them."""
    ctypes.memmove(address, ctypes.addressof(record), min(ctypes.sizeof(record), max(room, 0)))


def declared_size(source: Any, offset: int, default: int) -> int:
    """The record size the caller's struct declares for its pointer field at ``offset``.

    For the arrays a struct points to (procUtilArray), the caller's buffer is
    count x that size; ``default`` (the driver's own record size) when the caller's struct
    declares no typed pointer there.
    """
    layout = type(_caller_object(source))
    for name, kind, *_ in getattr(layout, "_fields_", ()):
        if getattr(layout, name).offset == offset and issubclass(kind, ctypes._Pointer):
            return ctypes.sizeof(kind._type_)
    return default
