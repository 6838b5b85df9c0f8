"""Memory: frame buffer and BAR1 usage.

Families:
    gpu_memory_total_bytes, gpu_memory_used_bytes, gpu_memory_free_bytes,
    gpu_memory_reserved_bytes: nvmlDeviceGetMemoryInfo (v2 where the driver has it;
        reserved only with v2).
    gpu_bar1_memory_total_bytes, gpu_bar1_memory_used_bytes: nvmlDeviceGetBAR1MemoryInfo.
"""

from __future__ import annotations

from collections.abc import Iterator

from exporter.collectors.base import Family, Reader, Sample, register
from exporter.nvml import Bar1Memory, Device, MemoryInfo

FAMILIES = (
    Family(
        "gpu_memory_total_bytes",
        "gauge",
        "Total frame buffer memory in bytes (nvmlDeviceGetMemoryInfo total).",
    ),
    Family(
        "gpu_memory_used_bytes",
        "gauge",
        "Frame buffer memory allocated by processes, in bytes (nvmlDeviceGetMemoryInfo_v2 used).",
    ),
    Family(
        "gpu_memory_free_bytes",
        "gauge",
        "Frame buffer memory not allocated, in bytes (nvmlDeviceGetMemoryInfo free).",
    ),
    Family(
        "gpu_memory_reserved_bytes",
        "gauge",
        "Frame buffer memory reserved by the driver and "
        "firmware, in bytes (nvmlDeviceGetMemoryInfo_v2 reserved).",
    ),
    Family(
        "gpu_bar1_memory_total_bytes",
        "gauge",
        "BAR1 (host-mappable) memory size in bytes (nvmlDeviceGetBAR1MemoryInfo).",
    ),
    Family(
        "gpu_bar1_memory_used_bytes",
        "gauge",
        "BAR1 memory in use, in bytes (nvmlDeviceGetBAR1MemoryInfo).",
    ),
)


def _consistent(memory: MemoryInfo | Bar1Memory) -> bool:
    return 0 <= memory.used <= memory.total


@register("memory", FAMILIES)
class MemoryCollector:
    """Frame buffer total, used, free and reserved; BAR1 total and used."""

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield memory sizes in bytes."""
        memory = read(device.memory, valid=_consistent, what="memory")
        if memory is not None:
            yield Sample("gpu_memory_total_bytes", memory.total)
            yield Sample("gpu_memory_used_bytes", memory.used)
            yield Sample("gpu_memory_free_bytes", memory.free)
            if memory.reserved is not None:
                yield Sample("gpu_memory_reserved_bytes", memory.reserved)
        if not read.wants("gpu_bar1_memory_total_bytes") and not read.wants(
            "gpu_bar1_memory_used_bytes"
        ):
            return
        bar1 = read(device.bar1_memory, valid=_consistent, what="bar1")
        if bar1 is not None:
            yield Sample("gpu_bar1_memory_total_bytes", bar1.total)
            yield Sample("gpu_bar1_memory_used_bytes", bar1.used)
