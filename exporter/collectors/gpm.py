"""Profiling metrics from GPU performance monitoring (GPM): Hopper and newer GPUs.

Families (time-averaged between consecutive collections, 0..1):
    gpu_sm_active_ratio: NVML_GPM_METRIC_SM_UTIL.
    gpu_sm_occupancy_ratio: NVML_GPM_METRIC_SM_OCCUPANCY.
    gpu_tensor_active_ratio: NVML_GPM_METRIC_ANY_TENSOR_UTIL.
    gpu_dram_active_ratio: NVML_GPM_METRIC_DRAM_BW_UTIL.
    gpu_fp16_active_ratio, gpu_fp32_active_ratio, gpu_fp64_active_ratio: NVML_GPM_METRIC_FPxx_UTIL.
    gpu_integer_active_ratio: NVML_GPM_METRIC_INTEGER_UTIL.
    gpu_graphics_active_ratio: NVML_GPM_METRIC_GRAPHICS_UTIL (DCGM's PROF_GR_ENGINE_ACTIVE).
    gpu_<metric>_seconds_total: each of them integrated over time (`rate()` is its exact mean
        over any window, at any scrape interval; the ratio is the last interval's).

Each GPU's two GPM sample buffers (nvmlGpmSampleAlloc) are allocated on its first
collection and freed (nvmlGpmSampleFree) when the GPU is dropped or the daemon stops.
GPUs without GPM (nvmlGpmQueryDeviceSupport) export none of these families; gpu_info's
`profiling` label says which GPUs have them.
"""

from __future__ import annotations

from collections.abc import Iterator

from exporter.collectors.base import (
    Family,
    Reader,
    Sample,
    SecondsCounter,
    ratio_from_percent,
    register,
    seconds_family,
)
from exporter.names import GPM_METRICS
from exporter.nvml import Device, GpmSampler

HELP = {
    "sm_active": "Fraction of time at least one warp was resident on an SM, averaged over SMs",
    "sm_occupancy": "Resident warps as a fraction of the maximum an SM can hold",
    "tensor_active": "Fraction of time any tensor core pipe was active",
    "dram_active": "Fraction of peak device memory bandwidth used: the memory-bandwidth signal",
    "fp16_active": "Fraction of time the FP16 pipe was active",
    "fp32_active": "Fraction of time the FP32 pipe was active",
    "fp64_active": "Fraction of time the FP64 pipe was active",
    "integer_active": "Fraction of time the integer pipe was active",
    "graphics_active": "Fraction of time the graphics engine (graphics or compute work) was active",
}


def family_name(metric: str) -> str:
    """The family of a GPM metric, e.g. sm_active -> gpu_sm_active_ratio."""
    return f"gpu_{metric}_ratio"


RATIOS = tuple(
    Family(
        family_name(metric),
        "gauge",
        f"{HELP[metric]}, 0..1, since the previous "
        f"collection (GPM metric {metric_id}, nvmlGpmMetricsGet).",
    )
    for metric, metric_id in GPM_METRICS.items()
)
# What each metric is a fraction of time of, for its counter's help.
ACTIVITY = {
    "sm_active": "SMs with a warp resident, averaged over SMs",
    "sm_occupancy": "warps resident as a fraction of the maximum, averaged over SMs",
    "tensor_active": "tensor core pipes active",
    "dram_active": "peak device memory bandwidth in use",
    "fp16_active": "the FP16 pipe active",
    "fp32_active": "the FP32 pipe active",
    "fp64_active": "the FP64 pipe active",
    "integer_active": "the integer pipe active",
    "graphics_active": "the graphics engine active",
}
FAMILIES = RATIOS + tuple(
    seconds_family(ratio, ACTIVITY[metric])
    for ratio, metric in zip(RATIOS, GPM_METRICS, strict=True)
)


class GpmSeconds:
    """The GPM metrics of one GPU or MIG instance as ratios and counters of seconds."""

    def __init__(self) -> None:
        self._counters = {metric: SecondsCounter() for metric in GPM_METRICS}

    def samples(
        self,
        metrics: dict[str, float],
        now: float,
        prefix: str = "gpu_",
        labels: tuple[str, ...] = (),
    ) -> Iterator[Sample]:
        """Samples for the GPM metrics NVML computed since the previous GPM sample."""
        for metric, counter in self._counters.items():
            percent = metrics.get(metric)
            if not metrics:
                counter.add(0.0, now)  # the first GPM sample: the counters' clock starts
            if percent is None or not 0 <= percent <= 100:
                continue
            ratio = ratio_from_percent(percent)
            yield Sample(f"{prefix}{metric}_ratio", ratio, labels)
            yield Sample(f"{prefix}{metric}_seconds_total", counter.add(ratio, now), labels)


@register("gpm", FAMILIES)
class GpmCollector:
    """Graphics engine, SM, tensor, DRAM bandwidth and pipe activity from GPM (Hopper and newer)."""

    def __init__(self) -> None:
        self._supported: bool | None = None
        self._sampler: GpmSampler | None = None
        self._seconds = GpmSeconds()

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
        if metrics is not None:
            yield from self._seconds.samples(metrics, read.now)

    def close(self) -> None:
        """Free the GPM sample buffers."""
        if self._sampler is not None:
            self._sampler.free()
            self._sampler = None
