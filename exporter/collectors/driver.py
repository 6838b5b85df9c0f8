"""Driver stack versions, once per node.

Families:
    gpuload_driver_info{driver_version,cuda_driver_version,nvml_version}:
        nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion, nvmlSystemGetNVMLVersion.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from exporter import nvml
from exporter.collectors.base import Family, Reader, Sample, SlowReads, register

FAMILIES = (
    Family(
        "gpuload_driver_info",
        "gauge",
        "NVIDIA driver, CUDA driver API and NVML versions on this node; always 1 "
        "(nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion, nvmlSystemGetNVMLVersion).",
        ("driver_version", "cuda_driver_version", "nvml_version"),
        per_gpu=False,
    ),
)


@register("driver", FAMILIES, scope="node")
class DriverCollector:
    """Driver, CUDA driver and NVML versions."""

    def __init__(self) -> None:
        # A new driver means a new NVML session, and new collectors: reading once is enough.
        self._versions = SlowReads()

    def collect(self, read: Reader) -> Iterator[Sample]:
        """Yield the driver info series."""
        return iter(self._versions(read, partial(self._read, read)))

    def _read(self, read: Reader) -> Iterator[Sample]:
        info = read(nvml.driver_info)
        if info is not None:
            labels = (info.driver_version, info.cuda_driver_version, info.nvml_version)
            yield Sample("gpuload_driver_info", 1, labels)
