"""Critical XID events through an NVML event set."""

from __future__ import annotations

from dataclasses import dataclass

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
        for device in devices:
            try:
                with translated():
                    pynvml.nvmlDeviceRegisterEvents(
                        device.handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
                    )
            except NotSupported:
                continue
            self.registered.append(device.index)

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """Block up to `timeout_ms` for the next XID event; None when none came."""
        try:
            with translated():
                data = pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
                gpu = int(pynvml.nvmlDeviceGetIndex(data.device))
        except NvmlError as error:
            if error.code == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise
        return XidEvent(gpu=gpu, xid=int(data.eventData))

    def free(self) -> None:
        """Release the event set."""
        with translated():
            pynvml.nvmlEventSetFree(self._event_set)
