"""XID errors: critical driver events, received by a thread waiting on an NVML event set.

Families:
    gpu_xid_errors_total{xid}: critical XID events per GPU and XID code since the exporter
        started (nvmlEventSetWait_v2 with nvmlEventTypeXidCriticalError).
    gpu_last_xid_code: the last XID code seen on the GPU, 0 when none.
    gpuload_xid_instance_events_withheld: per GPU in MIG mode, 1 when NVML does not deliver
        the XIDs of its MIG instances to this process, else 0 (see below).

In MIG mode nvmlEventSetWait_v2 "reports all the events for the available instances, only if
the caller has appropriate privileges. In absence of required privileges, only the events which
affect all the instances (i.e. whole device) are reported" (nvml.h): nothing fails, the events
are just missing. nvml.h gives a MIG GPU's whole-GPU memory (nvmlDeviceGetMemoryInfo) on the
same condition, so when the event thread starts, each MIG GPU's memory is read once: the
driver's own NO_PERMISSION tells that this process is not privileged, on a real node and on the
simulator alike, whatever the process's user id says inside its container.

The wait runs in its own thread so that collection never blocks on it. The thread is
started on the first collection, stopped (within one wait timeout) before NVML shuts
down, and started again on the next collection if it died.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator

import pynvml

from exporter import nvml
from exporter.collectors.base import Family, Reader, Sample, register
from exporter.nvml import Device, NotSupported, NvmlError, XidEventSet

log = logging.getLogger(__name__)

FAMILIES = (
    Family(
        "gpu_xid_errors_total",
        "counter",
        "Critical XID errors reported by the driver since "
        "the exporter started, by XID code (nvmlEventSetWait_v2).",
        ("xid",),
    ),
    Family(
        "gpu_last_xid_code",
        "gauge",
        "Code of the last critical XID error on the GPU, 0 "
        "when none since the exporter started (nvmlEventSetWait_v2).",
    ),
    Family(
        "gpuload_xid_instance_events_withheld",
        "gauge",
        "1 for a GPU in MIG mode whose MIG instances' XID errors NVML does not deliver to this "
        "process, which is not privileged (nvmlEventSetWait_v2): gpu_xid_errors_total lacks them. "
        "0 when they are delivered.",
    ),
)

# What to change: the same advice as for any read NVML keeps from an unprivileged caller.
_PERMISSION_HINT = (
    "run gpuload as root (Helm: exporter.securityContext.runAsUser: 0 and runAsNonRoot: false) "
    "if you need them"
)

# How long one wait blocks: also the longest a stop request waits for the thread.
_WAIT_MS = 500


class XidTally:
    """XID counts per GPU, shared by successive event threads so counters never go back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int]] = Counter()
        self._last: dict[int, int] = {}

    def add(self, gpu: int, xid: int) -> None:
        """Count one event."""
        with self._lock:
            self._counts[(gpu, xid)] += 1
            self._last[gpu] = xid

    def snapshot(self) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
        """Copies of the counts and last codes, consistent with each other."""
        with self._lock:
            return dict(self._counts), dict(self._last)


class XidWatcher:
    """The event thread: waits on an XID event set until stopped."""

    def __init__(self, tally: XidTally) -> None:
        self.uuids: dict[int, str] = {}
        # GPU index -> whether NVML withholds its MIG instances' events; MIG GPUs only.
        self.instance_events_withheld: dict[int, bool] = {}
        self.error: NvmlError | None = None
        self._tally = tally
        self._event_set: XidEventSet | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)

    def start(self) -> bool:
        """Open the event set for every GPU and start waiting; False where events are absent."""
        devices = []
        for index in range(nvml.device_count()):
            try:
                device = nvml.device(index)
                self.uuids[index] = device.identity().uuid
            except NvmlError as error:
                # A GPU already lost cannot report events; the others still can.
                log.debug("GPU %d left out of the XID event set: %s", index, error)
                continue
            devices.append(device)
            withheld = _instance_events_withheld(device)
            if withheld is not None:
                self.instance_events_withheld[index] = withheld
        try:
            self._event_set = XidEventSet(devices)
        except NotSupported:
            return False
        if not self._event_set.registered:
            return False
        self._thread.start()
        return True

    @property
    def alive(self) -> bool:
        """True while the thread is waiting for events."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop waiting and release the event set."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=_WAIT_MS / 1000 * 4)
        if self._event_set is not None:
            try:
                self._event_set.free()
            except NvmlError as error:
                log.debug("freeing the XID event set: %s", error)
            self._event_set = None

    def _run(self) -> None:
        assert self._event_set is not None
        while not self._stop.is_set():
            try:
                event = self._event_set.wait(_WAIT_MS)
            except NvmlError as error:
                self.error = error
                return
            if event is not None:
                log.warning("GPU %d reported XID %d", event.gpu, event.xid)
                self._tally.add(event.gpu, event.xid)


def _instance_events_withheld(device: Device) -> bool | None:
    """For a GPU in MIG mode, whether NVML keeps its instances' events from this process.

    None for a GPU not in MIG mode, whose events are all whole-GPU ones.
    """
    try:
        if not device.mig_mode_enabled():
            return None
    except NvmlError:
        return None  # not MIG-capable, or gone: no instance events to miss
    try:
        device.memory()
    except NvmlError as error:
        return error.code == pynvml.NVML_ERROR_NO_PERMISSION
    return False


@register("xid", FAMILIES, scope="node")
class XidCollector:
    """Critical XID errors per GPU, from an NVML event thread."""

    def __init__(self) -> None:
        self._tally = XidTally()
        self._watcher: XidWatcher | None = None
        self._supported = True
        self._warned = False  # the missing instance events are logged once

    def collect(self, read: Reader) -> Iterator[Sample]:
        """Yield the XID counts seen by the event thread; (re)start it if it is not running."""
        if self._watcher is not None and not self._watcher.alive:
            # The thread died on an NVML error: report it, and start a new one below.
            if self._watcher.error is not None:
                read.record(self._watcher.error)
            self._watcher.stop()
            self._watcher = None
        if not self._supported:
            return
        if self._watcher is None:
            watcher = XidWatcher(self._tally)
            started = read(watcher.start, what="XID event set")
            if not started:
                # Without an error this driver or these GPUs have no XID events at all.
                self._supported = read.last_error is not None
                watcher.stop()
                return
            self._watcher = watcher
        counts, last = self._tally.snapshot()
        uuids = self._watcher.uuids
        for (gpu, xid), count in sorted(counts.items()):
            yield Sample("gpu_xid_errors_total", count, (str(gpu), uuids.get(gpu, ""), str(xid)))
        for gpu, uuid in sorted(uuids.items()):
            yield Sample("gpu_last_xid_code", last.get(gpu, 0), (str(gpu), uuid))
        withheld = self._watcher.instance_events_withheld
        for gpu, hidden in sorted(withheld.items()):
            labels = (str(gpu), uuids.get(gpu, ""))
            yield Sample("gpuload_xid_instance_events_withheld", int(hidden), labels)
        self._warn_once([gpu for gpu, hidden in sorted(withheld.items()) if hidden])

    def _warn_once(self, gpus: list[int]) -> None:
        if not gpus or self._warned:
            return
        self._warned = True
        log.warning(
            "collector xid: NVML does not deliver the XID errors of MIG instances on GPU %s to "
            "this process (not privileged); gpu_xid_errors_total counts only whole-GPU ones. %s",
            ", ".join(map(str, gpus)),
            _PERMISSION_HINT,
        )

    def close(self) -> None:
        """Stop the event thread."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
