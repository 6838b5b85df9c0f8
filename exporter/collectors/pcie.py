"""PCIe link state and health.

Families:
    gpu_pcie_link_generation: nvmlDeviceGetCurrPcieLinkGeneration.
    gpu_pcie_link_max_generation: nvmlDeviceGetMaxPcieLinkGeneration (GPU and slot together).
    gpu_pcie_link_width: nvmlDeviceGetCurrPcieLinkWidth.
    gpu_pcie_link_max_width: nvmlDeviceGetMaxPcieLinkWidth.
    gpu_pcie_replay_errors_total: nvmlDeviceGetPcieReplayCounter.
"""

from __future__ import annotations

from collections.abc import Iterator

from exporter.collectors.base import Family, Reader, Sample, register
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
)

# PCIe 1.0 to 7.0; x1 to x32.
_GENERATIONS = range(1, 8)
_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


@register("pcie", FAMILIES)
class PcieCollector:
    """PCIe link generation and width, current and maximum, and replay errors."""

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the link state and the replay counter."""
        readings = (
            ("gpu_pcie_link_generation", device.pcie_link_generation, _GENERATIONS),
            ("gpu_pcie_link_max_generation", device.pcie_link_max_generation, _GENERATIONS),
            ("gpu_pcie_link_width", device.pcie_link_width, _WIDTHS),
            ("gpu_pcie_link_max_width", device.pcie_link_max_width, _WIDTHS),
        )
        for family, call, allowed in readings:
            value = read(call, valid=allowed.__contains__, what=family)
            if value is not None:
                yield Sample(family, value)
        replays = read(device.pcie_replay_count, valid=lambda n: n >= 0)
        if replays is not None:
            yield Sample("gpu_pcie_replay_errors_total", replays)
