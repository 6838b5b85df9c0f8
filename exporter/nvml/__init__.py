"""The only part of gpuload that talks to NVML (the `pynvml` bindings).

Everything above this package sees typed Python values and gpuload's own
exceptions; pynvml's ctypes structures and error classes stay here.
"""

from exporter.names import GPM_METRICS
from exporter.nvml.device import (
    Bar1Memory,
    Device,
    FieldAnswer,
    GpuInstanceInfo,
    Identity,
    MemoryInfo,
    MigDevice,
    ProcessMemory,
    ProcessUtilization,
    RemappedRows,
    Utilization,
)
from exporter.nvml.errors import LibraryNotFound, NotSupported, NvmlError, ValueUnavailable
from exporter.nvml.events import XidEvent, XidEventSet
from exporter.nvml.gpm import GpmSampler
from exporter.nvml.library import (
    DriverInfo,
    cuda_driver_version,
    device,
    device_count,
    driver_info,
    exported_functions,
    init,
    process_name,
    shutdown,
)

__all__ = [
    "GPM_METRICS",
    "Bar1Memory",
    "Device",
    "DriverInfo",
    "FieldAnswer",
    "GpmSampler",
    "GpuInstanceInfo",
    "Identity",
    "LibraryNotFound",
    "MemoryInfo",
    "MigDevice",
    "NotSupported",
    "NvmlError",
    "ProcessMemory",
    "ProcessUtilization",
    "RemappedRows",
    "Utilization",
    "ValueUnavailable",
    "XidEvent",
    "XidEventSet",
    "cuda_driver_version",
    "device",
    "device_count",
    "driver_info",
    "exported_functions",
    "init",
    "process_name",
    "shutdown",
]
