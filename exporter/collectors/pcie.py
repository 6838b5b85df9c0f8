"""PCIe link state and health.

Families:
    gpu_pcie_link_generation: nvmlDeviceGetCurrPcieLinkGeneration.
    gpu_pcie_link_max_generation: nvmlDeviceGetMaxPcieLinkGeneration (GPU and slot together).
    gpu_pcie_link_width: nvmlDeviceGetCurrPcieLinkWidth.
    gpu_pcie_link_max_width: nvmlDeviceGetMaxPcieLinkWidth.
    gpu_pcie_replay_errors_total: nvmlDeviceGetPcieReplayCounter.
    gpu_pcie_transmit_bytes_total, gpu_pcie_receive_bytes_total: field values
        NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES (bytes since driver load, R555 and later),
        in one nvmlDeviceGetFieldValues call, where the first reading proves them wider than
        32 bits (nvml.h: "Value can be wrapped"; at 32 bits they wrap faster than any
        collection). Otherwise nvmlDeviceGetPcieThroughput (KiB/s over a 20 ms window; each
        call blocks that long) integrated over time since the exporter started. Each GPU is
        collected in its own worker, so those 20 ms waits run in parallel across GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from functools import partial

import pynvml

from exporter.collectors.base import Family, FieldId, Reader, Sample, SlowReads, register
from exporter.nvml import Device

FAMILIES = (
    Family(
        "gpu_pcie_link_generation",
        "gauge",
        "Current PCIe link generation; it drops when "
        "the GPU idles (nvmlDeviceGetCurrPcieLinkGeneration).",
    ),
    Family(
        "gpu_pcie_link_max_generation",
        "gauge",
        "Highest PCIe generation the GPU and its slot "
        "support together (nvmlDeviceGetMaxPcieLinkGeneration).",
    ),
    Family(
        "gpu_pcie_link_width",
        "gauge",
        "Current PCIe link width in lanes (nvmlDeviceGetCurrPcieLinkWidth).",
    ),
    Family(
        "gpu_pcie_link_max_width",
        "gauge",
        "Widest PCIe link the GPU and its slot support, in lanes (nvmlDeviceGetMaxPcieLinkWidth).",
    ),
    Family(
        "gpu_pcie_replay_errors_total",
        "counter",
        "PCIe link-level retransmissions since the "
        "driver loaded (nvmlDeviceGetPcieReplayCounter); a rising rate means a bad link.",
    ),
    Family(
        "gpu_pcie_transmit_bytes_total",
        "counter",
        "Bytes the GPU sent over PCIe (field NVML_FI_DEV_PCIE_COUNT_TX_BYTES, else "
        "nvmlDeviceGetPcieThroughput integrated over time).",
    ),
    Family(
        "gpu_pcie_receive_bytes_total",
        "counter",
        "Bytes the GPU received over PCIe (field NVML_FI_DEV_PCIE_COUNT_RX_BYTES, else "
        "nvmlDeviceGetPcieThroughput integrated over time).",
    ),
)

_BYTE_FIELDS: list[int | tuple[int, int]] = [
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
]
_TRAFFIC = (("tx", "gpu_pcie_transmit_bytes_total"), ("rx", "gpu_pcie_receive_bytes_total"))
# A byte-counter field at or above this is wider than 32 bits, and usable as a counter.
_WRAP_32 = 2**32

# PCIe 1.0 to 7.0; x1 to x32.
_GENERATIONS = range(1, 8)
_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


def _link_health(device: Device, read: Reader) -> Iterator[Sample]:
    """The link's capability and its replay (error) counter."""
    maxima = (
        ("gpu_pcie_link_max_generation", device.pcie_link_max_generation, _GENERATIONS),
        ("gpu_pcie_link_max_width", device.pcie_link_max_width, _WIDTHS),
    )
    yield from _link_readings(read, maxima)
    replays = read(device.pcie_replay_count, valid=lambda n: n >= 0)
    if replays is not None:
        yield Sample("gpu_pcie_replay_errors_total", replays)


def _link_readings(
    read: Reader, readings: tuple[tuple[str, Callable[[], int], Collection[int]], ...]
) -> Iterator[Sample]:
    for family, call, allowed in readings:
        value = read(call, valid=allowed.__contains__, what=family)
        if value is not None:
            yield Sample(family, value)


@register("pcie", FAMILIES)
class PcieCollector:
    """PCIe link generation and width, current and maximum, replay errors and traffic."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        # The throughput fallback integrates over this clock's seconds; a test moves its own.
        self._clock = clock
        # Which source the traffic counters come from, fixed at the first success so
        # that a counter never jumps between two sources.
        self._source: str | None = None
        self._integrated = {"tx": 0.0, "rx": 0.0}
        self._last_read: float | None = None
        # The link's capability and its replay counter change rarely: once per slow interval.
        self._health = SlowReads()

    def fields(self, slow_due: bool) -> Sequence[FieldId]:
        """The byte counters, unless this GPU lacks them."""
        return _BYTE_FIELDS if self._source in (None, "fields") else ()

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the link state and the replay counter."""
        # The current link trains down when idle and must be seen at once; its maxima do not.
        current = (
            ("gpu_pcie_link_generation", device.pcie_link_generation, _GENERATIONS),
            ("gpu_pcie_link_width", device.pcie_link_width, _WIDTHS),
        )
        yield from _link_readings(read, current)
        yield from self._health(read, partial(_link_health, device, read))
        yield from self._traffic(device, read)

    def _traffic(self, device: Device, read: Reader) -> Iterator[Sample]:
        if self._source in (None, "fields"):
            counters = read(device.field_values, _BYTE_FIELDS)
            values = [v for v in counters or () if v is not None]
            if self._source is None:
                # The fields count bytes since the driver loaded and "can be wrapped" at a width
                # nvml.h does not give: at 32 bits they wrap every ~86 ms at Gen5 x16, faster
                # than any collection. Used only once a reading proves them wider; otherwise,
                # or on any error, the sampled throughput is integrated instead.
                wide = len(values) == len(_TRAFFIC) and min(values) >= _WRAP_32
                self._source = "fields" if wide else "throughput"
            if self._source == "fields":
                if len(values) == len(_TRAFFIC):
                    for (_, family), value in zip(_TRAFFIC, values, strict=True):
                        yield Sample(family, value)
                return
        yield from self._integrated_throughput(device, read)

    def _integrated_throughput(self, device: Device, read: Reader) -> Iterator[Sample]:
        rates = {
            direction: read(device.pcie_throughput_kib_per_second, direction)
            for direction, _ in _TRAFFIC
        }
        if None in rates.values():
            return
        self._source = "throughput"
        now = self._clock()
        elapsed = 0.0 if self._last_read is None else now - self._last_read
        self._last_read = now
        for direction, family in _TRAFFIC:
            self._integrated[direction] += (rates[direction] or 0) * 1024 * elapsed
            yield Sample(family, round(self._integrated[direction]))
