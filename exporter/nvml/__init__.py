"""The only part of gpuload that talks to NVML (the `pynvml` bindings).

Everything above this package sees typed Python values and gpuload's own
exceptions; pynvml's ctypes structures and error classes stay here.
"""

from exporter.nvml.device import Bar1Memory, Device, Identity, MemoryInfo, Utilization
from exporter.nvml.errors import LibraryNotFound, NotSupported, NvmlError, ValueUnavailable
from exporter.nvml.library import DriverInfo, device, device_count, driver_info, init, shutdown

__all__ = [
    "Bar1Memory",
    "Device",
    "DriverInfo",
    "Identity",
    "LibraryNotFound",
    "MemoryInfo",
    "NotSupported",
    "NvmlError",
    "Utilization",
    "ValueUnavailable",
    "device",
    "device_count",
    "driver_info",
    "init",
    "shutdown",
]
