"""Simulated NVML memory error functions: ECC counters, row remapping and retired pages.

ECC counters grow at the GPU's ``ecc_corrected_per_hour`` / ``ecc_uncorrected_per_hour`` rates
and jump by the count of each ``ecc_uncorrectable`` fault from its time on; a GPU with
``ecc_enabled: false`` reports ECC off and no counts. Ampere and newer
data-centre GPUs (feature ``row_remapping``) remap the failing rows: the fault's ``remap`` decides
whether the remap is pending (until the next GPU reset, a driver reload), done or failed. Older
GPUs (feature ``retired_pages``) retire one page per uncorrectable error instead, pending
blacklisting until the next reset. Each GPU answers NOT_SUPPORTED for the mechanism it lacks.
"""

from __future__ import annotations

from typing import Any

from exporter.sim.functions import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    Call,
    device,
    integer,
    target,
)

# nvmlPageRetirementCause_t
_MULTIPLE_SINGLE_BIT = 0
_DOUBLE_BIT = 1


@device("nvmlDeviceGetEccMode")
def _ecc_mode(call: Call, current: Any, pending: Any) -> int:
    enabled = int(call.device.spec.ecc_enabled)
    target(current).value = enabled
    target(pending).value = enabled
    return SUCCESS


@device("nvmlDeviceGetTotalEccErrors")
def _ecc_errors(call: Call, error_type: Any, counter_type: Any, ref: Any) -> int:
    if not call.device.spec.ecc_enabled:
        # ECC off: nvidia-smi reports every count N/A (nvidia-smi-xml/rtx-4000-sff-ada-v13.xml,
        # `ECC Mode: Disabled`), so the driver answers none.
        return NOT_SUPPORTED
    kind, counter = integer(error_type), integer(counter_type)
    if kind not in (0, 1) or counter not in (0, 1):
        return INVALID_ARGUMENT
    return call.put(ref, call.device.ecc_errors(kind == 1, counter == 1, call.t))


@device("nvmlDeviceGetRemappedRows")
def _remapped_rows(call: Call, corrected: Any, uncorrected: Any, pending: Any, failed: Any) -> int:
    rows = call.device.remapped_rows(call.t)
    for ref, value in zip((corrected, uncorrected, pending, failed), rows, strict=True):
        target(ref).value = int(value)
    return SUCCESS


def _pages(call: Call, cause: Any) -> list[tuple[int, float]] | int:
    reason = integer(cause)
    if reason not in (_MULTIPLE_SINGLE_BIT, _DOUBLE_BIT):
        return INVALID_ARGUMENT
    # Single-bit errors are corrected in place here; only double-bit errors retire pages.
    return call.device.retired_pages(call.t) if reason == _DOUBLE_BIT else []


def _page_list(call: Call, cause: Any, count_ref: Any, addresses: Any, times: Any) -> int:
    pages = _pages(call, cause)
    if isinstance(pages, int):
        return pages
    count = target(count_ref)
    capacity = count.value
    count.value = len(pages)
    if addresses is None or capacity < len(pages):
        return INSUFFICIENT_SIZE if pages else SUCCESS
    for k, (page, at) in enumerate(pages):
        addresses[k] = page
        if times is not None:
            times[k] = call.sim.unix_us(at) // 1_000_000  # seconds since the epoch
    return SUCCESS


@device("nvmlDeviceGetRetiredPages")
def _retired_pages(call: Call, cause: Any, count: Any, addresses: Any) -> int:
    return _page_list(call, cause, count, addresses, None)


@device("nvmlDeviceGetRetiredPages_v2")
def _retired_pages_v2(call: Call, cause: Any, count: Any, addresses: Any, times: Any = None) -> int:
    # pynvml sizes the list with (device, cause, count, NULL), without the times argument.
    return _page_list(call, cause, count, addresses, times)


@device("nvmlDeviceGetRetiredPagesPendingStatus")
def _retirement_pending(call: Call, ref: Any) -> int:
    target(ref).value = int(call.device.retirement_pending(call.t))
    return SUCCESS
