"""Fan speed (absent on passively cooled data-centre GPUs).

Families:
    gpu_fan_speed_ratio: nvmlDeviceGetFanSpeed / 100 (the intended speed).
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
        "gpu_fan_speed_ratio",
        "gauge",
        "Intended fan speed as a fraction of its maximum, 0..1 "
        "(nvmlDeviceGetFanSpeed). Absent on passively cooled GPUs.",
    ),
)


@register("fan", FAMILIES)
class FanCollector:
    """Fan speed as a fraction of its maximum."""

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the fan speed ratio where the GPU has a fan."""
        # Fans may be driven past 100% of their rated speed; NVML caps the report there.
        speed = read(device.fan_speed_percent, valid=is_percent, what="fan.speed")
        if speed is not None:
            yield Sample("gpu_fan_speed_ratio", ratio_from_percent(speed))
