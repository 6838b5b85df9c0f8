"""ECC mode and error counts.

Families:
    gpu_ecc_mode_enabled: nvmlDeviceGetEccMode (current).
    gpu_ecc_errors_total{type="corrected"|"uncorrected",counter="volatile"|"aggregate"}:
        nvmlDeviceGetTotalEccErrors. Volatile counts reset at driver reload, aggregate
        counts persist across reboots.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pynvml

from exporter.collectors.base import Family, Reader, Sample, SlowReads, register
from exporter.nvml import Device

FAMILIES = (
    Family(
        "gpu_ecc_mode_enabled",
        "gauge",
        "1 if ECC is enabled on the GPU's memory (nvmlDeviceGetEccMode), else 0.",
    ),
    Family(
        "gpu_ecc_errors_total",
        "counter",
        "Memory ECC errors by type (corrected, "
        "uncorrected) and counter (volatile: since driver load; aggregate: lifetime) "
        "(nvmlDeviceGetTotalEccErrors).",
        ("type", "counter"),
    ),
)

_TYPES = {
    "corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
_COUNTERS = {"volatile": pynvml.NVML_VOLATILE_ECC, "aggregate": pynvml.NVML_AGGREGATE_ECC}


@register("ecc", FAMILIES)
class EccCollector:
    """ECC mode and corrected/uncorrected error counts."""

    def __init__(self) -> None:
        self._counts = SlowReads()

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield ECC mode and, where ECC is on, the error counters (once per slow interval)."""
        return iter(self._counts(read, partial(self._read, device, read)))

    def _read(self, device: Device, read: Reader) -> Iterator[Sample]:
        enabled = read(device.ecc_mode_enabled)
        if enabled is None:
            return
        yield Sample("gpu_ecc_mode_enabled", 1 if enabled else 0)
        if not enabled:
            return
        for type_name, error_type in _TYPES.items():
            for counter_name, counter in _COUNTERS.items():
                count = read(device.ecc_error_count, error_type, counter)
                if count is not None:
                    yield Sample("gpu_ecc_errors_total", count, (type_name, counter_name))
