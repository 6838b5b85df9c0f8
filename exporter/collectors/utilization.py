"""Utilization: how busy the GPU's engines were since the previous collection.

Families:
    gpu_utilization_ratio: mean of nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES) since the
        previous collection; nvmlDeviceGetUtilizationRates().gpu where samples are unsupported
        or none is new (the driver adds none while the GPU is idle: NOT_FOUND).
    gpu_memory_utilization_ratio: the same with MEMORY_UTILIZATION_SAMPLES / .memory.
    gpu_encoder_utilization_ratio: nvmlDeviceGetEncoderUtilization / 100.
    gpu_decoder_utilization_ratio: nvmlDeviceGetDecoderUtilization / 100.

NVML samples utilization every 1/6 s to 1 s depending on the product; averaging all
samples since the last collection reports a sawtooth load as its true mean rather than
whatever the instant reading happened to be.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from exporter.collectors.base import (
    Family,
    Reader,
    Sample,
    is_percent,
    ratio_from_percent,
    register,
)
from exporter.nvml import Device

FAMILIES = (
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

# On the first collection there is no previous one: average the last second of samples.
_FIRST_WINDOW_US = 1_000_000


@register("utilization", FAMILIES)
class UtilizationCollector:
    """GPU and memory-controller utilization (sample means), encoder and decoder."""

    def __init__(self) -> None:
        self._last_seen_us = {"gpu": 0, "memory": 0}

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the utilization ratios that this GPU reports."""
        means = self._sample_means(device, read)
        if None in means:
            # No samples (older GPUs, MIG), or no new one since the last collection: the
            # driver's ring runs dry on an idle GPU, so the last mean is not what it does now.
            rates = read(
                device.utilization,
                valid=lambda u: is_percent(u.gpu_percent) and is_percent(u.memory_percent),
                what="utilization",
            )
            instant = (None, None) if rates is None else (rates.gpu_percent, rates.memory_percent)
            means = tuple(
                now if mean is None else mean for mean, now in zip(means, instant, strict=True)
            )
        gpu, memory = means
        if gpu is not None:
            yield Sample("gpu_utilization_ratio", ratio_from_percent(gpu))
        if memory is not None:
            yield Sample("gpu_memory_utilization_ratio", ratio_from_percent(memory))
        encoder = read(device.encoder_utilization_percent, valid=is_percent)
        if encoder is not None:
            yield Sample("gpu_encoder_utilization_ratio", ratio_from_percent(encoder))
        decoder = read(device.decoder_utilization_percent, valid=is_percent)
        if decoder is not None:
            yield Sample("gpu_decoder_utilization_ratio", ratio_from_percent(decoder))

    def _sample_means(self, device: Device, read: Reader) -> tuple[float | None, ...]:
        """Mean percent of each kind since the last collection (None: no new sample).

        None for both when the GPU has no samples (older GPUs, GPUs in MIG mode).
        """
        means = []
        for kind in ("gpu", "memory"):
            samples = read(
                partial(device.utilization_samples, kind, self._last_seen_us[kind]),
                valid=_all_percent,
                what=f"{kind} utilization samples",
            )
            if samples is None:
                return (None, None)
            means.append(self._mean_of_new(kind, samples))
        return tuple(means)

    def _mean_of_new(self, kind: str, samples: list[tuple[int, float]]) -> float | None:
        if not samples:
            return None
        newest = max(timestamp for timestamp, _ in samples)
        if self._last_seen_us[kind] == 0:
            samples = [(t, v) for t, v in samples if t > newest - _FIRST_WINDOW_US]
        self._last_seen_us[kind] = newest
        return sum(value for _, value in samples) / len(samples)


def _all_percent(samples: list[tuple[int, float]]) -> bool:
    return all(is_percent(value) for _, value in samples)
