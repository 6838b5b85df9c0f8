"""Temperatures and the thresholds at which the GPU slows down or shuts down.

Families:
    gpu_temperature_celsius{sensor="gpu"}: nvmlDeviceGetTemperatureV (GPU core).
    gpu_temperature_celsius{sensor="memory"}: field NVML_FI_DEV_MEMORY_TEMP (HBM GPUs).
    gpu_temperature_slowdown_threshold_celsius: nvmlDeviceGetTemperatureThreshold(SLOWDOWN).
    gpu_temperature_shutdown_threshold_celsius: nvmlDeviceGetTemperatureThreshold(SHUTDOWN).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pynvml

from exporter.collectors.base import Family, FieldId, Reader, Sample, SlowReads, register
from exporter.nvml import Device

FAMILIES = (
    Family(
        "gpu_temperature_celsius",
        "gauge",
        "Temperature in degrees Celsius, by sensor: gpu "
        "(nvmlDeviceGetTemperatureV) or memory (field NVML_FI_DEV_MEMORY_TEMP).",
        ("sensor",),
    ),
    Family(
        "gpu_temperature_slowdown_threshold_celsius",
        "gauge",
        "GPU temperature at which the "
        "GPU slows its clocks (nvmlDeviceGetTemperatureThreshold SLOWDOWN).",
    ),
    Family(
        "gpu_temperature_shutdown_threshold_celsius",
        "gauge",
        "GPU temperature at which the GPU shuts down (nvmlDeviceGetTemperatureThreshold SHUTDOWN).",
    ),
)


_THRESHOLDS = (
    ("gpu_temperature_slowdown_threshold_celsius", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ("gpu_temperature_shutdown_threshold_celsius", pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
)


def _plausible(celsius: int) -> bool:
    # NVML reports unsigned degrees; anything outside this is a broken sensor.
    return 0 <= celsius < 150


@register("temperature", FAMILIES)
class TemperatureCollector:
    """GPU and memory temperatures, slowdown and shutdown thresholds."""

    def __init__(self) -> None:
        self._thresholds = SlowReads()

    def fields(self, slow_due: bool) -> tuple[FieldId, ...]:
        """The memory temperature, read with the other collectors' fields."""
        return (pynvml.NVML_FI_DEV_MEMORY_TEMP,)

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield temperatures in degrees Celsius."""
        core = read(device.temperature_celsius, valid=_plausible, what="temperature.gpu")
        if core is not None:
            yield Sample("gpu_temperature_celsius", core, ("gpu",))
        memory = read(device.memory_temperature_celsius, valid=_plausible, what="temp.memory")
        if memory is not None:
            yield Sample("gpu_temperature_celsius", memory, ("memory",))
        yield from self._thresholds(read, partial(self._read_thresholds, device, read))

    def _read_thresholds(self, device: Device, read: Reader) -> Iterator[Sample]:
        for family, kind in _THRESHOLDS:
            value = read(
                device.temperature_threshold_celsius,
                kind,
                valid=_plausible,
                what=family,
            )
            if value is not None:
                yield Sample(family, value)
