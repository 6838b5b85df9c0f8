"""NVLink: link state, traffic and error counters, on GPUs that have NVLink.

Families (per GPU, summed over its links):
    gpu_nvlink_transmit_bytes_total, gpu_nvlink_receive_bytes_total, gpu_nvlink_crc_errors_total,
    gpu_nvlink_replay_errors_total, gpu_nvlink_recovery_errors_total: the per-link counters
        below, summed; left out of a cycle in which a link's counter could not be read, so that
        a sum never goes down (Prometheus would read that as a counter reset).
    gpu_nvlink_links_up: active links.
    gpu_nvlink_link_down{link}: 1 for each inactive link of a GPU with at least one active
        link; no series while every link is up, and none on a GPU that uses no NVLink at all
        (a PCIe card without a bridge): at most the GPU's link count, only while it is broken.

Families per link (label `link`), only with `collectors.nvlink.per_link: true`: at 18 links
and 6 families they are 108 series per H100, most of a GPU's series (docs/fleet.md):
    gpu_nvlink_link_transmit_bytes_total, gpu_nvlink_link_receive_bytes_total: field values
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX (KiB, scope = link), every link in one
        nvmlDeviceGetFieldValues call.
    gpu_nvlink_link_up, gpu_nvlink_link_replay_errors_total, gpu_nvlink_link_recovery_errors_total:
        field values NVML_FI_DEV_NVLINK_GET_STATE and NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY /
        _RECOVERY (scope = link), every link in one call per slow interval; where a driver
        answers NOT_SUPPORTED for a field, nvmlDeviceGetNvLinkState or
        nvmlDeviceGetNvLinkErrorCounter DL_REPLAY / DL_RECOVERY for that link.
    gpu_nvlink_link_crc_errors_total{type="flit"|"data"|"all"}: nvmlDeviceGetNvLinkErrorCounter
        DL_CRC_FLIT / DL_CRC_DATA per link where the GPU has them; on Hopper and newer, which
        lost them ("removed in Hopper, replaced with NVML_FI_DEV_NVLINK_ERROR_DL_CRC", NVML
        change log v520->v525), that field's one count per link, as type="all". Summed over
        `type`, a link's CRC errors read alike on every architecture.

The links a GPU has are found once, on its first collection, by asking each link's
state until NVML says the link does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import pynvml

from exporter.collectors.base import Family, FieldId, Reader, Sample, SlowReads, register
from exporter.nvml import Device, NvmlError

PER_LINK = (
    Family(
        "gpu_nvlink_link_up",
        "gauge",
        "1 while the NVLink link is active, else 0 (field NVML_FI_DEV_NVLINK_GET_STATE, else "
        "nvmlDeviceGetNvLinkState).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_link_transmit_bytes_total",
        "counter",
        "Data bytes sent over the link (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_link_receive_bytes_total",
        "counter",
        "Data bytes received over the link (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_link_replay_errors_total",
        "counter",
        "Data-link replays on the link (field NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, else "
        "nvmlDeviceGetNvLinkErrorCounter DL_REPLAY).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_link_recovery_errors_total",
        "counter",
        "Data-link recoveries on the link (field NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, else "
        "nvmlDeviceGetNvLinkErrorCounter DL_RECOVERY).",
        ("link",),
    ),
    Family(
        "gpu_nvlink_link_crc_errors_total",
        "counter",
        "CRC errors on the link, by flit or data (nvmlDeviceGetNvLinkErrorCounter DL_CRC_FLIT / "
        "DL_CRC_DATA), or all of them on Hopper and newer (field NVML_FI_DEV_NVLINK_ERROR_DL_CRC).",
        ("link", "type"),
    ),
)
# Per-GPU total -> the per-link family it sums.
TOTALS = {
    "gpu_nvlink_transmit_bytes_total": "gpu_nvlink_link_transmit_bytes_total",
    "gpu_nvlink_receive_bytes_total": "gpu_nvlink_link_receive_bytes_total",
    "gpu_nvlink_crc_errors_total": "gpu_nvlink_link_crc_errors_total",
    "gpu_nvlink_replay_errors_total": "gpu_nvlink_link_replay_errors_total",
    "gpu_nvlink_recovery_errors_total": "gpu_nvlink_link_recovery_errors_total",
}
_PER_LINK_HELP = {family.name: family.help for family in PER_LINK}
# 108 series on an H100: exported only where asked for (docs/fleet.md).
_PER_LINK_ONLY = "Only with collectors.nvlink.per_link: true."
FAMILIES = (
    *(
        Family(total, "counter", _PER_LINK_HELP[link].replace("the link", "all its links", 1))
        for total, link in TOTALS.items()
    ),
    Family(
        "gpu_nvlink_links_up",
        "gauge",
        "NVLink links active (field NVML_FI_DEV_NVLINK_GET_STATE, else nvmlDeviceGetNvLinkState).",
    ),
    Family(
        "gpu_nvlink_link_down",
        "gauge",
        "1 for each inactive link of a GPU with at least one active link; no series while "
        "every link is up (field NVML_FI_DEV_NVLINK_GET_STATE, else nvmlDeviceGetNvLinkState).",
        ("link",),
    ),
    *(replace(family, help=f"{family.help} {_PER_LINK_ONLY}") for family in PER_LINK),
)

# (family, field id, nvmlDeviceGetNvLinkErrorCounter counter): read as field values, the
# counter call per link being the fallback for drivers without those fields.
_ERROR_FIELDS = (
    (
        "gpu_nvlink_link_replay_errors_total",
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    ),
    (
        "gpu_nvlink_link_recovery_errors_total",
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    ),
)
# Its value is NVML_FEATURE_ENABLED for an active link, as nvmlDeviceGetNvLinkState's is.
_STATE_FIELD = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
_CRC_COUNTERS = (
    (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "flit"),
    (pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, "data"),
)
# Hopper's replacement for the two counters: one count per link (scope = link).
_CRC_FIELD = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC
# (family, field id, multiplier to bytes)
_THROUGHPUT = (
    ("gpu_nvlink_link_transmit_bytes_total", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1024),
    ("gpu_nvlink_link_receive_bytes_total", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 1024),
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


@register("nvlink", FAMILIES, options={"per_link": False})
class NvlinkCollector:
    """NVLink link state, traffic and error counters, per GPU (or per link)."""

    def __init__(self, per_link: bool = False) -> None:
        self._per_link = per_link
        self._links: list[int] | None = None
        # Link state and error counters change rarely: read once per slow interval.
        self._health = SlowReads()
        # Set once the GPU shows it has no per-link CRC counters but the CRC field (Hopper+).
        self._crc_from_field = False

    def fields(self, slow_due: bool) -> list[FieldId]:
        """Every link's traffic; its state and errors when slow reads are due."""
        per_link = [field for _, field, _ in _THROUGHPUT]
        if slow_due:
            per_link += [_STATE_FIELD, *(field for _, field, _ in _ERROR_FIELDS), _CRC_FIELD]
        return [(field, link) for field in per_link for link in self._links or ()]

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield each link's state, bytes and errors."""
        if self._links is None:
            self._links = _links_of(device)
        if not self._links:
            return
        traffic = [(family, field) for family, field, _ in _THROUGHPUT]
        per_link = [
            *self._fields(device, read, traffic),
            *self._health(read, partial(self._link_health, device, read)),
        ]
        yield from _per_gpu(per_link, self._links)
        if self._per_link:
            yield from per_link

    def _link_health(self, device: Device, read: Reader) -> Iterator[Sample]:
        assert self._links is not None
        health = [("gpu_nvlink_link_up", _STATE_FIELD)]
        health += [(family, field) for family, field, _ in _ERROR_FIELDS]
        health += [("gpu_nvlink_link_crc_errors_total", _CRC_FIELD)]
        yield from self._fields(device, read, health)

    def _crc_errors(
        self, device: Device, read: Reader, link: int, field: int | None
    ) -> Iterator[Sample]:
        """A link's flit and data CRC counters; Hopper's one CRC field where it has no counters."""
        if not self._crc_from_field:
            absent = True  # both counters answered that they do not exist, not an error
            for counter, kind in _CRC_COUNTERS:
                count = read(device.nvlink_error_count, link, counter)
                absent = absent and count is None and read.last_error is None
                if count is not None:
                    yield Sample("gpu_nvlink_link_crc_errors_total", count, (str(link), kind))
            if not absent or field is None:
                return
            self._crc_from_field = True
        if field is not None:
            yield Sample("gpu_nvlink_link_crc_errors_total", field, (str(link), "all"))

    def _fields(
        self, device: Device, read: Reader, per_link: list[tuple[str, int]]
    ) -> Iterator[Sample]:
        """Field values of every link in one call: traffic, or state and errors."""
        assert self._links is not None
        wanted = [(family, field, link) for family, field in per_link for link in self._links]
        fields = [(field, link) for _, field, link in wanted]
        values = read(device.field_values, fields) or [None] * len(fields)
        scale = {field: multiplier for _, field, multiplier in _THROUGHPUT}
        fallback = {field: counter for _, field, counter in _ERROR_FIELDS}
        for (family, field, link), value in zip(wanted, values, strict=True):
            if field == _CRC_FIELD:
                yield from self._crc_errors(device, read, link, value)
                continue
            if field == _STATE_FIELD:
                value = _link_up(device, read, link, value)
            elif value is None and field in fallback:
                value = read(device.nvlink_error_count, link, fallback[field])
            if value is not None:
                yield Sample(family, value * scale.get(field, 1), (str(link),))


def _link_up(device: Device, read: Reader, link: int, field: int | None) -> int | None:
    """1 for an active link, from the state field, else from nvmlDeviceGetNvLinkState."""
    if field is not None:
        return int(field == pynvml.NVML_FEATURE_ENABLED)
    active = read(device.nvlink_active, link)
    return None if active is None else int(active)


def _per_gpu(per_link: list[Sample], links: list[int]) -> Iterator[Sample]:
    """The GPU's totals of its links' samples; a total only when every link was read."""
    every_link = {str(link) for link in links}
    for total, family in TOTALS.items():
        values = [sample for sample in per_link if sample.family == family]
        if values and {sample.labels[0] for sample in values} == every_link:
            yield Sample(total, sum(sample.value for sample in values))
    state = {s.labels[0]: s.value for s in per_link if s.family == "gpu_nvlink_link_up"}
    if set(state) != every_link:
        return
    yield Sample("gpu_nvlink_links_up", sum(state.values()))
    if any(state.values()):
        for link, up in state.items():
            if not up:
                yield Sample("gpu_nvlink_link_down", 1, (link,))
