"""Utilization: how busy the GPU's engines were since the previous collection.

Families:
    gpu_utilization_ratio: mean of nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES) since the
        previous collection; nvmlDeviceGetUtilizationRates().gpu where samples are unsupported
        or none is new (the driver adds none while the GPU is idle: NOT_FOUND).
    gpu_memory_utilization_ratio: the same with MEMORY_UTILIZATION_SAMPLES / .memory.
    gpu_encoder_utilization_ratio: nvmlDeviceGetEncoderUtilization / 100.
    gpu_decoder_utilization_ratio: nvmlDeviceGetDecoderUtilization / 100.
    gpu_<each of the above>_seconds_total: the same fractions integrated over time, from every
        sample between collections (the encoder and decoder from their instant readings).
    gpu_idle_seconds_total: time in GPU utilization samples below 1%: no kernel at all.

Prometheus scrapes every 15-60 s: a gauge of the last second keeps 1 s out of 15, and a
`max_over_time` of it sees whatever the scrape happened to land on. `rate()` of the counters is
the exact mean over any window. NVML's utilization sample is the fraction of its sample period
(1/6 s to 1 s) in which a kernel ran; a 0% sample is a whole period with nothing running: a GPU
that a job holds and that often sits fully idle is waiting for its input (the data loader), where
a steady small workload runs something in nearly every period.

NVML samples utilization every 1/6 s to 1 s depending on the product; averaging all
samples since the last collection reports a sawtooth load as its true mean rather than
whatever the instant reading happened to be.
"""

from __future__ import annotations

from collections.abc import Iterator

from exporter.collectors.base import (
    Family,
    Reader,
    Sample,
    SecondsCounter,
    is_percent,
    ratio_from_percent,
    register,
    seconds_family,
    seconds_name,
)
from exporter.nvml import Device

FAMILIES: tuple[Family, ...] = (
    Family(
        "gpu_utilization_ratio",
        "gauge",
        "Fraction of time a kernel ran on the GPU since the previous collection, 0..1 (mean "
        "of nvmlDeviceGetSamples GPU utilization, else nvmlDeviceGetUtilizationRates). Says "
        "nothing about how many SMs were busy: see gpu_sm_active_ratio.",
    ),
    Family(
        "gpu_memory_utilization_ratio",
        "gauge",
        "Fraction of time device memory was being read or written since the previous "
        "collection, 0..1 (nvmlDeviceGetSamples memory utilization, else "
        "nvmlDeviceGetUtilizationRates).",
    ),
    Family(
        "gpu_encoder_utilization_ratio",
        "gauge",
        "Fraction of time the video encoder was busy, 0..1 (nvmlDeviceGetEncoderUtilization).",
    ),
    Family(
        "gpu_decoder_utilization_ratio",
        "gauge",
        "Fraction of time the video decoder was busy, 0..1 (nvmlDeviceGetDecoderUtilization).",
    ),
)
RATIOS = {family.name: family for family in FAMILIES}
# The activity each ratio is a fraction of time of, for its counter's help.
_ACTIVITY = {
    "gpu_utilization_ratio": "a kernel running on the GPU",
    "gpu_memory_utilization_ratio": "device memory being read or written",
    "gpu_encoder_utilization_ratio": "the video encoder busy",
    "gpu_decoder_utilization_ratio": "the video decoder busy",
}
IDLE = Family(
    "gpu_idle_seconds_total",
    "counter",
    "Seconds in which the GPU ran no kernel at all: NVML utilization samples below 1% (a whole "
    "sample period idle), or a reading of 0% where the GPU has no samples. rate() is the "
    "fraction of a window the GPU sat fully idle; held by a job, that is waiting for input.",
)
FAMILIES += (*(seconds_family(RATIOS[n], how) for n, how in _ACTIVITY.items()), IDLE)

# On the first collection there is no previous one: average the last second of samples.
_FIRST_WINDOW_US = 1_000_000
# A GPU utilization sample below this percent is a sample period with no kernel running.
_IDLE_BELOW_PERCENT = 1.0


@register("utilization", FAMILIES)
class UtilizationCollector:
    """GPU and memory-controller utilization (sample means), encoder and decoder."""

    def __init__(self) -> None:
        self._last_seen_us = {"gpu": 0, "memory": 0}
        self._seconds = {name: SecondsCounter() for name in (*_ACTIVITY, IDLE.name)}

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the utilization ratios that this GPU reports, and their counters of seconds."""
        gpu, memory, idle = self._sample_means(device, read)
        if gpu is None or memory is None:
            # No samples (older GPUs, MIG), or no new one since the last collection: the
            # driver's ring runs dry on an idle GPU, so the last mean is not what it does now.
            rates = read(
                device.utilization,
                valid=lambda u: is_percent(u.gpu_percent) and is_percent(u.memory_percent),
                what="utilization",
            )
            if rates is not None:
                gpu = rates.gpu_percent if gpu is None else gpu
                memory = rates.memory_percent if memory is None else memory
        if idle is None and gpu is not None:
            idle = 1.0 if gpu < _IDLE_BELOW_PERCENT else 0.0
        readings = {
            "gpu_utilization_ratio": gpu,
            "gpu_memory_utilization_ratio": memory,
            "gpu_encoder_utilization_ratio": read(
                device.encoder_utilization_percent, valid=is_percent
            ),
            "gpu_decoder_utilization_ratio": read(
                device.decoder_utilization_percent, valid=is_percent
            ),
        }
        for name, percent in readings.items():
            if percent is None:
                continue
            ratio = ratio_from_percent(percent)
            yield Sample(name, ratio)
            yield Sample(seconds_name(name), self._seconds[name].add(ratio, read.now))
        if idle is not None:
            yield Sample(IDLE.name, self._seconds[IDLE.name].add(idle, read.now))

    def _sample_means(self, device: Device, read: Reader) -> tuple[float | None, ...]:
        """Mean percent of GPU and memory samples, and the fraction of idle GPU samples.

        All since the last collection (None: no new sample); None for all when the GPU has no
        samples (older GPUs, GPUs in MIG mode).
        """
        means: list[float | None] = []
        idle = None
        for kind in ("gpu", "memory"):
            samples = read(
                device.utilization_samples,
                kind,
                self._last_seen_us[kind],
                valid=_all_percent,
                what=f"{kind} utilization samples",
            )
            if samples is None:
                return (None, None, None)
            values = self._new_values(kind, samples)
            means.append(sum(values) / len(values) if values else None)
            if kind == "gpu" and values:
                idle = sum(value < _IDLE_BELOW_PERCENT for value in values) / len(values)
        return (*means, idle)

    def _new_values(self, kind: str, samples: list[tuple[int, float]]) -> list[float]:
        if not samples:
            return []
        newest = max(timestamp for timestamp, _ in samples)
        if self._last_seen_us[kind] == 0:
            samples = [(t, v) for t, v in samples if t > newest - _FIRST_WINDOW_US]
        self._last_seen_us[kind] = newest
        return [value for _, value in samples]


def _all_percent(samples: list[tuple[int, float]]) -> bool:
    return all(is_percent(value) for _, value in samples)
