"""NVLink: per-link state, traffic and error counters, on GPUs that have NVLink.

Families (label `link`, the link index):
    gpu_nvlink_link_up: nvmlDeviceGetNvLinkState.
    gpu_nvlink_transmit_bytes_total, gpu_nvlink_receive_bytes_total: field values
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX (KiB, scope = link), one call per GPU.
    gpu_nvlink_replay_errors_total, gpu_nvlink_recovery_errors_total,
    gpu_nvlink_crc_errors_total{type="flit"|"data"}: nvmlDeviceGetNvLinkErrorCounter.

The links a GPU has are found once, on its first collection, by asking each link's
state until NVML says the link does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pynvml

from exporter.collectors.base import Family, Reader, Sample, register
from exporter.nvml import Device, NvmlError

FAMILIES = (
    Family(
        "gpu_nvlink_link_up",
        "gauge",
        "1 while the NVLink link is active (nvmlDeviceGetNvLinkState), else 0.",
        ("link",),
    ),
    Family(
        "gpu_nvlink_transmit_bytes_total",
        "counter",
        "Data bytes sent over the link (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_receive_bytes_total",
        "counter",
        "Data bytes received over the link (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_replay_errors_total",
        "counter",
        "Data-link replays on the link (nvmlDeviceGetNvLinkErrorCounter DL_REPLAY).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_recovery_errors_total",
        "counter",
        "Data-link recoveries on the link (nvmlDeviceGetNvLinkErrorCounter DL_RECOVERY).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_crc_errors_total",
        "counter",
        "CRC errors on the link, by flit or data "
        "(nvmlDeviceGetNvLinkErrorCounter DL_CRC_FLIT / DL_CRC_DATA).",
        ("link", "type"),
    ),
)

_ERROR_COUNTERS = (
    ("gpu_nvlink_replay_errors_total", pynvml.NVML_NVLINK_ERROR_DL_REPLAY, ()),
    ("gpu_nvlink_recovery_errors_total", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY, ()),
    ("gpu_nvlink_crc_errors_total", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, ("flit",)),
    ("gpu_nvlink_crc_errors_total", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, ("data",)),
)
_THROUGHPUT = (
    ("gpu_nvlink_transmit_bytes_total", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
    ("gpu_nvlink_receive_bytes_total", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
)


def _links_of(device: Device) -> list[int]:
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            device.nvlink_active(link)
        except NvmlError:
            # Not supported (no NVLink) or invalid argument (past the last link).
            break
        links.append(link)
    return links


@register("nvlink", FAMILIES)
class NvlinkCollector:
    """NVLink link state, traffic and error counters per link."""

    def __init__(self) -> None:
        self._links: list[int] | None = None

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield each link's state, bytes and errors."""
        if self._links is None:
            self._links = _links_of(device)
        if not self._links:
            return
        for link in self._links:
            active = read(partial(device.nvlink_active, link))
            if active is not None:
                yield Sample("gpu_nvlink_link_up", 1 if active else 0, (str(link),))
        yield from self._traffic(device, read)
        for link in self._links:
            for family, counter, extra in _ERROR_COUNTERS:
                count = read(partial(device.nvlink_error_count, link, counter))
                if count is not None:
                    yield Sample(family, count, (str(link), *extra))

    def _traffic(self, device: Device, read: Reader) -> Iterator[Sample]:
        assert self._links is not None
        fields = [(field, link) for _, field in _THROUGHPUT for link in self._links]
        values = read(partial(device.field_values, fields)) or []
        for family_field, value in zip(fields, values, strict=False):
            field, link = family_field
            if value is not None:
                family = next(name for name, fid in _THROUGHPUT if fid == field)
                yield Sample(family, value * 1024, (str(link),))
