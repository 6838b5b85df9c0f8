"""Critical XID events through an NVML event set."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

from exporter.nvml.device import Device
from exporter.nvml.errors import NotSupported, NvmlError, translated


@dataclass(frozen=True)
class XidEvent:
    """A critical XID error reported by the driver for one GPU."""

    gpu: int
    xid: int


class XidEventSet:
    """An NVML event set registered for critical XID errors on every GPU that supports them."""

    def __init__(self, devices: list[Device]) -> None:
        with translated():
            self._event_set = pynvml.nvmlEventSetCreate()
        self.registered: list[int] = []
        # By handle address: a lost GPU answers no call, nvmlDeviceGetIndex included.
        self._index_by_handle: dict[int | None, int] = {}
        for device in devices:
            try:
                with translated():
                    pynvml.nvmlDeviceRegisterEvents(
                        device.handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
                    )
            except NotSupported:
                continue
            self.registered.append(device.index)
            self._index_by_handle[_address(device.handle)] = device.index

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """Block up to `timeout_ms` for the next XID event; None when none came."""
        try:
            with translated():
                data = pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except NvmlError as error:
            if error.code == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise
        gpu = self._index_by_handle.get(_address(data.device), -1)
        return XidEvent(gpu=gpu, xid=int(data.eventData))

    def free(self) -> None:
        """Release the event set."""
        with translated():
            pynvml.nvmlEventSetFree(self._event_set)


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value
