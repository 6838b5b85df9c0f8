"""Utilization: how busy the GPU's engines were.

Families:
    gpu_utilization_ratio: nvmlDeviceGetUtilizationRates().gpu / 100.
    gpu_memory_utilization_ratio: nvmlDeviceGetUtilizationRates().memory / 100.
    gpu_encoder_utilization_ratio: nvmlDeviceGetEncoderUtilization / 100.
    gpu_decoder_utilization_ratio: nvmlDeviceGetDecoderUtilization / 100.
"""

from __future__ import annotations

from collections.abc import Iterator

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
        "Fraction of the last sample period in which a kernel ran on the GPU, 0..1 "
        "(nvmlDeviceGetUtilizationRates gpu). Says nothing about how many SMs were busy.",
    ),
    Family(
        "gpu_memory_utilization_ratio",
        "gauge",
        "Fraction of the last sample period in which device memory was being read or written, "
        "0..1 (nvmlDeviceGetUtilizationRates memory).",
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


@register("utilization", FAMILIES)
class UtilizationCollector:
    """GPU, memory-controller, encoder and decoder utilization."""

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the utilization ratios that this GPU reports."""
        rates = read(
            device.utilization,
            valid=lambda u: is_percent(u.gpu_percent) and is_percent(u.memory_percent),
            what="utilization",
        )
        if rates is not None:
            yield Sample("gpu_utilization_ratio", ratio_from_percent(rates.gpu_percent))
            yield Sample("gpu_memory_utilization_ratio", ratio_from_percent(rates.memory_percent))
        encoder = read(device.encoder_utilization_percent, valid=is_percent)
        if encoder is not None:
            yield Sample("gpu_encoder_utilization_ratio", ratio_from_percent(encoder))
        decoder = read(device.decoder_utilization_percent, valid=is_percent)
        if decoder is not None:
            yield Sample("gpu_decoder_utilization_ratio", ratio_from_percent(decoder))
