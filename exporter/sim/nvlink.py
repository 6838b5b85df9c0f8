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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.sim.functions import INVALID_ARGUMENT, SUCCESS, Call, device, integer, target
from exporter.sim.scenario import NVLINK_ERROR_COUNTERS

LinkHandler = Callable[..., int]


def _on_link(handler: LinkHandler) -> LinkHandler:
    """Check the link argument (the first after the handle) before running ``handler``."""

    def checked(call: Call, link: Any, *args: Any) -> int:
        number = integer(link)
        if not 0 <= number < call.device.model.nvlink_links:
            return INVALID_ARGUMENT
        return handler(call, number, *args)

    return checked


@device("nvmlDeviceGetNvLinkState", feature="nvlink")
@_on_link
def _state(call: Call, link: int, ref: Any) -> int:
    target(ref).value = int(call.device.link_up(link, call.t))
    return SUCCESS


@device("nvmlDeviceGetNvLinkVersion", feature="nvlink")
@_on_link
def _version(call: Call, link: int, ref: Any) -> int:
    target(ref).value = call.device.model.nvlink_version
    return SUCCESS


@device("nvmlDeviceGetNvLinkErrorCounter", feature="nvlink")
@_on_link
def _error_counter(call: Call, link: int, counter: Any, ref: Any) -> int:
    kind = integer(counter)
    if not 0 <= kind < len(NVLINK_ERROR_COUNTERS):
        return INVALID_ARGUMENT
    return call.put(ref, call.device.link_errors(link, kind, call.t))
