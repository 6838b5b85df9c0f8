"""Power draw, the enforced limit and the energy counter.

Families:
    gpu_power_usage_watts: nvmlDeviceGetPowerUsage (mW; a 1 s average on Ampere and newer).
    gpu_power_limit_watts: nvmlDeviceGetEnforcedPowerLimit (mW).
    gpu_energy_consumption_joules_total: field NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ, Volta+),
        the counter nvmlDeviceGetTotalEnergyConsumption returns, read in the field values call
        the other collectors make anyway: one call fewer per GPU per cycle.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pynvml

from exporter.collectors.base import Family, FieldId, Reader, Sample, SlowReads, register
from exporter.nvml import Device

FAMILIES = (
    Family(
        "gpu_power_usage_watts",
        "gauge",
        "Power drawn by the board in watts "
        "(nvmlDeviceGetPowerUsage; a 1 s average on Ampere and newer, instant before).",
    ),
    Family(
        "gpu_power_limit_watts",
        "gauge",
        "Power limit the GPU enforces, in watts (nvmlDeviceGetEnforcedPowerLimit).",
    ),
    Family(
        "gpu_energy_consumption_joules_total",
        "counter",
        "Energy consumed since the driver loaded, in joules "
        "(field NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION).",
    ),
)

_ENERGY_FIELD = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION

# No board draws more than this; a larger reading is a broken sensor.
_MAX_PLAUSIBLE_MILLIWATTS = 5_000_000


def _plausible_power(milliwatts: int) -> bool:
    return 0 <= milliwatts <= _MAX_PLAUSIBLE_MILLIWATTS


@register("power", FAMILIES)
class PowerCollector:
    """Board power draw, enforced power limit and energy consumed."""

    def __init__(self) -> None:
        # An administrator may change the limit (nvidia-smi -pl): read once per slow interval.
        self._limit = SlowReads()

    def fields(self, slow_due: bool) -> tuple[FieldId, ...]:
        """The energy counter, read with the other collectors' fields."""
        return (_ENERGY_FIELD,)

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield power in watts and energy in joules."""
        usage = read(device.power_usage_milliwatts, valid=_plausible_power, what="power.draw")
        if usage is not None:
            yield Sample("gpu_power_usage_watts", usage / 1000.0)
        yield from self._limit(read, partial(self._read_limit, device, read))
        (energy,) = read(device.field_values, (_ENERGY_FIELD,), what="energy") or (None,)
        if energy is not None:
            yield Sample("gpu_energy_consumption_joules_total", energy / 1000.0)

    def _read_limit(self, device: Device, read: Reader) -> Iterator[Sample]:
        limit = read(device.power_limit_milliwatts, valid=_plausible_power, what="power.limit")
        if limit is not None:
            yield Sample("gpu_power_limit_watts", limit / 1000.0)
