"""Profiling metrics from GPU performance monitoring (GPM): Hopper and newer GPUs.

Families (time-averaged between consecutive collections, 0..1):
    gpu_sm_active_ratio: NVML_GPM_METRIC_SM_UTIL.
    gpu_sm_occupancy_ratio: NVML_GPM_METRIC_SM_OCCUPANCY.
    gpu_tensor_active_ratio: NVML_GPM_METRIC_ANY_TENSOR_UTIL.
    gpu_dram_active_ratio: NVML_GPM_METRIC_DRAM_BW_UTIL.
    gpu_fp16_active_ratio, gpu_fp32_active_ratio, gpu_fp64_active_ratio: NVML_GPM_METRIC_FPxx_UTIL.
    gpu_integer_active_ratio: NVML_GPM_METRIC_INTEGER_UTIL.

Each GPU's two GPM sample buffers (nvmlGpmSampleAlloc) are allocated on its first
collection and freed (nvmlGpmSampleFree) when the GPU is dropped or the daemon stops.
GPUs without GPM (nvmlGpmQueryDeviceSupport) export none of these families; gpu_info's
`profiling` label says which GPUs have them.
"""

from __future__ import annotations

from collections.abc import Iterator

from exporter.collectors.base import Family, Reader, Sample, ratio_from_percent, register
from exporter.nvml import GPM_METRICS, Device, GpmSampler

HELP = {
    "sm_active": "Fraction of time at least one warp was resident on an SM, averaged over SMs",
    "sm_occupancy": "Resident warps as a fraction of the maximum an SM can hold",
    "tensor_active": "Fraction of time any tensor core pipe was active",
    "dram_active": "Fraction of peak device memory bandwidth used: the memory-bandwidth signal",
    "fp16_active": "Fraction of time the FP16 pipe was active",
    "fp32_active": "Fraction of time the FP32 pipe was active",
    "fp64_active": "Fraction of time the FP64 pipe was active",
    "integer_active": "Fraction of time the integer pipe was active",
}


def family_name(metric: str) -> str:
    """The family of a GPM metric, e.g. sm_active -> gpu_sm_active_ratio."""
    return f"gpu_{metric}_ratio"


FAMILIES = tuple(
    Family(
        family_name(metric),
        "gauge",
        f"{HELP[metric]}, 0..1, since the previous "
        f"collection (GPM metric {metric_id}, nvmlGpmMetricsGet).",
    )
    for metric, metric_id in GPM_METRICS.items()
)


def gpm_samples(metrics: dict[str, float], prefix: str = "gpu_") -> Iterator[Sample]:
    """Samples for the GPM metrics NVML computed, as ratios."""
    for metric, percent in metrics.items():
        if 0 <= percent <= 100:
            yield Sample(f"{prefix}{metric}_ratio", ratio_from_percent(percent))


@register("gpm", FAMILIES)
class GpmCollector:
    """SM, tensor, DRAM bandwidth and pipe activity from GPM (Hopper and newer)."""

    def __init__(self) -> None:
        self._supported: bool | None = None
        self._sampler: GpmSampler | None = None

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Take a GPM sample and yield the metrics since the previous one."""
        if self._supported is None:
            supported = read(device.gpm_supported)
            if supported is None and read.last_error is not None:
                return  # could not ask: ask again next cycle
            self._supported = bool(supported)
        if not self._supported:
            return
        if self._sampler is None:
            self._sampler = read(device.gpm_sampler)
            if self._sampler is None:
                return
        metrics = read(self._sampler.take, what="gpm_sample")
        if metrics:
            yield from gpm_samples(metrics)

    def close(self) -> None:
        """Free the GPM sample buffers."""
        if self._sampler is not None:
            self._sampler.free()
            self._sampler = None
