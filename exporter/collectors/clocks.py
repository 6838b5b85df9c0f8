"""Clocks and the reasons they are held down.

Families:
    gpu_clock_hertz{clock}: nvmlDeviceGetClockInfo (MHz) for graphics, sm, memory.
    gpu_clock_max_hertz{clock}: nvmlDeviceGetMaxClockInfo (MHz).
    gpu_clock_event_active{reason}: bits of nvmlDeviceGetCurrentClocksEventReasons
        (the former "throttle reasons").
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pynvml

from exporter.collectors.base import Family, Reader, Sample, SlowReads, register
from exporter.nvml import Device
from exporter.nvml.device import CLOCK_TYPES

# Reason label -> NVML bit. sw_thermal/hw_thermal/hw_slowdown/sw_power_cap are the
# ones that cost performance; gpu_idle is the normal state of an unused GPU.
REASONS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clocks": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

FAMILIES = (
    Family(
        "gpu_clock_hertz",
        "gauge",
        "Current clock frequency in hertz, by clock domain (nvmlDeviceGetClockInfo).",
        ("clock",),
    ),
    Family(
        "gpu_clock_max_hertz",
        "gauge",
        "Maximum clock frequency in hertz, by clock domain (nvmlDeviceGetMaxClockInfo).",
        ("clock",),
    ),
    Family(
        "gpu_clock_event_active",
        "gauge",
        "1 while this reason holds the clocks down, else 0 "
        f"(nvmlDeviceGetCurrentClocksEventReasons); reasons: {', '.join(REASONS)}.",
        ("reason",),
    ),
)

_MHZ = 1_000_000
# Clocks above 100 GHz do not exist: such a reading is corrupt.
_MAX_PLAUSIBLE_MHZ = 100_000


def _plausible_mhz(mhz: int) -> bool:
    return 0 <= mhz <= _MAX_PLAUSIBLE_MHZ


@register("clocks", FAMILIES)
class ClocksCollector:
    """Current and maximum clocks per domain, and the active clock event reasons."""

    def __init__(self) -> None:
        self._maxima = SlowReads()

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield clocks in hertz and one 0/1 series per clock event reason."""
        for clock in CLOCK_TYPES:
            if not read.wants("gpu_clock_hertz", clock):  # graphics: the SM clock's twin
                continue
            current = read(device.clock_mhz, clock, valid=_plausible_mhz, what=clock)
            if current is not None:
                yield Sample("gpu_clock_hertz", current * _MHZ, (clock,))
        yield from self._maxima(read, partial(self._maximum_clocks, device, read))
        mask = read(device.clock_event_reasons)
        if mask is not None:
            for reason, bit in REASONS.items():
                yield Sample("gpu_clock_event_active", 1 if mask & bit else 0, (reason,))

    def _maximum_clocks(self, device: Device, read: Reader) -> Iterator[Sample]:
        for clock in CLOCK_TYPES:
            if not read.wants("gpu_clock_max_hertz", clock):
                continue
            peak = read(device.max_clock_mhz, clock, valid=_plausible_mhz, what=clock)
            if peak is not None:
                yield Sample("gpu_clock_max_hertz", peak * _MHZ, (clock,))
