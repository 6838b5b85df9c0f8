"""Simulated NVML NVLink functions: link state, version and error counters.

A model's ``nvlink_links`` sets how many links its GPUs have (H100 SXM 18, A100 SXM4 12,
V100 SXM2 6; PCIe cards none, so they answer NOT_SUPPORTED). A link index at or beyond the
GPU's count answers INVALID_ARGUMENT. Links listed in a GPU's ``nvlink_down`` are inactive for
the whole scenario, and an ``nvlink_down`` fault takes one down for its window; the GPU's
``nvlink_tx``/``nvlink_rx`` traffic is then shared by the remaining links (see the throughput
fields 138/139 in :mod:`~exporter.sim.functions`). Error counters grow at the GPU's
``nvlink_errors_per_hour`` rates, on every link; replay and recovery are also the field values
161/162 (NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY / _RECOVERY, scope = link), unless the GPU lacks
``nvlink_error_fields`` (older drivers), and the link state is also field 165
(NVML_FI_DEV_NVLINK_GET_STATE, scope = link) unless it lacks ``nvlink_state_field``.

Hopper and newer have no per-link CRC counters: NVML's change log (v520->v525) says
NVML_NVLINK_ERROR_DL_CRC_FLIT / _CRC_DATA were "removed in Hopper, replaced with
NVML_FI_DEV_NVLINK_ERROR_DL_CRC". Asked for them, the counter call answers NOT_SUPPORTED (nvml.h
lists it "if the device doesn't support this feature"; the change log does not name the code),
and field 163 (scope = link) counts the CRC errors of both rates instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.sim.functions import (
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    Call,
    device,
    integer,
    target,
)
from exporter.sim.model import ARCHITECTURES, NVLINK_ERROR_COUNTERS

LinkHandler = Callable[..., int]

# NVML_NVLINK_ERROR_DL_CRC_FLIT and _CRC_DATA, gone from Hopper on (see the module docstring).
_CRC_COUNTERS = (NVLINK_ERROR_COUNTERS.index("crc_flit"), NVLINK_ERROR_COUNTERS.index("crc_data"))
_HOPPER = ARCHITECTURES["hopper"]


def _on_link(handler: LinkHandler) -> LinkHandler:
    """Check the link argument (the first after the handle) before running ``handler``."""

    def checked(call: Call, link: Any, *args: Any) -> int:
        number = integer(link)
        if not 0 <= number < call.device.model.nvlink_links:
            return INVALID_ARGUMENT
        return handler(call, number, *args)

    return checked


@device("nvmlDeviceGetNvLinkState")
@_on_link
def _state(call: Call, link: int, ref: Any) -> int:
    target(ref).value = int(call.device.link_up(link, call.t))
    return SUCCESS


@device("nvmlDeviceGetNvLinkVersion")
@_on_link
def _version(call: Call, link: int, ref: Any) -> int:
    target(ref).value = call.device.model.nvlink_version
    return SUCCESS


@device("nvmlDeviceGetNvLinkErrorCounter")
@_on_link
def _error_counter(call: Call, link: int, counter: Any, ref: Any) -> int:
    kind = integer(counter)
    if not 0 <= kind < len(NVLINK_ERROR_COUNTERS):
        return INVALID_ARGUMENT
    if kind in _CRC_COUNTERS and call.device.model.architecture >= _HOPPER:
        return NOT_SUPPORTED
    return call.put(ref, call.device.link_errors(link, kind, call.t))
