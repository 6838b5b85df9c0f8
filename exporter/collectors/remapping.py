"""Memory repair: row remapping (Ampere and newer), or page retirement before it.

Families:
    gpu_remapped_rows{type="correctable"|"uncorrectable"}: nvmlDeviceGetRemappedRows.
    gpu_row_remap_pending: a remap waits for the next GPU reset (nvmlDeviceGetRemappedRows).
    gpu_row_remap_failed: a remap failed: the GPU needs service (nvmlDeviceGetRemappedRows).
    gpu_retired_pages{cause="single_bit"|"double_bit"}: nvmlDeviceGetRetiredPages, on GPUs
        without row remapping.
    gpu_retired_pages_pending: nvmlDeviceGetRetiredPagesPendingStatus.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pynvml

from exporter.collectors.base import Family, Reader, Sample, SlowReads, register
from exporter.nvml import Device

FAMILIES = (
    Family(
        "gpu_remapped_rows",
        "gauge",
        "Memory rows remapped because of correctable or "
        "uncorrectable errors (nvmlDeviceGetRemappedRows).",
        ("type",),
    ),
    Family(
        "gpu_row_remap_pending",
        "gauge",
        "1 if a row remap waits for a GPU reset (nvmlDeviceGetRemappedRows), else 0.",
    ),
    Family(
        "gpu_row_remap_failed",
        "gauge",
        "1 if a row remap failed (nvmlDeviceGetRemappedRows): the GPU needs service, else 0.",
    ),
    Family(
        "gpu_retired_pages",
        "gauge",
        "Memory pages retired, by cause (nvmlDeviceGetRetiredPages; GPUs before row remapping).",
        ("cause",),
    ),
    Family(
        "gpu_retired_pages_pending",
        "gauge",
        "1 if a page retirement waits for a reboot "
        "(nvmlDeviceGetRetiredPagesPendingStatus), else 0.",
    ),
)

_CAUSES = {
    "single_bit": pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    "double_bit": pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
}


@register("remapping", FAMILIES)
class RemappingCollector:
    """Row remapping state, or retired pages on GPUs without row remapping."""

    def __init__(self) -> None:
        self._state = SlowReads()

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the memory repair state this GPU reports (read once per slow interval)."""
        return iter(self._state(read, partial(self._read, device, read)))

    def _read(self, device: Device, read: Reader) -> Iterator[Sample]:
        rows = read(device.remapped_rows)
        if rows is not None:
            yield Sample("gpu_remapped_rows", rows.correctable, ("correctable",))
            yield Sample("gpu_remapped_rows", rows.uncorrectable, ("uncorrectable",))
            yield Sample("gpu_row_remap_pending", 1 if rows.pending else 0)
            yield Sample("gpu_row_remap_failed", 1 if rows.failed else 0)
            return
        for cause_name, cause in _CAUSES.items():
            count = read(device.retired_page_count, cause)
            if count is not None:
                yield Sample("gpu_retired_pages", count, (cause_name,))
        pending = read(device.retired_pages_pending)
        if pending is not None:
            yield Sample("gpu_retired_pages_pending", 1 if pending else 0)
