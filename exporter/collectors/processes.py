"""Who uses the GPU: compute processes, their memory and their SM utilization.

Families:
    gpu_processes: number of compute processes (nvmlDeviceGetComputeRunningProcesses);
        absent where the exporter cannot see them (below).
    gpuload_processes_visible: 1 where the driver can list the GPU's processes to the
        exporter, 0 where it cannot because the exporter runs outside the host's PID namespace.
    gpu_process_memory_used_bytes{pid,process}: memory of the `top` processes by memory;
        the rest summed under pid="" process="(other)" so cardinality stays bounded.
    gpu_process_sm_utilization_ratio{pid,process}: mean SM utilization of each of those
        processes since the previous collection (nvmlDeviceGetProcessUtilization), where
        the GPU reports it; 0 for a process the driver has no sample of (it samples only
        processes that used the GPU, and answers NOT_FOUND when none did).

The driver translates each process's PID into the caller's PID namespace and skips the
processes that are not in it (open-gpu-kernel-modules ``_gpuConvertPid``, ``os_find_ns_pid``):
in a container without ``hostPID`` every list is empty, whatever runs. So outside the host's
PID namespace gpu_processes is not exported (0 would be a lie, and the alert rules then judge
"in use" by memory held), gpuload_processes_visible says 0, and one log line says what to change.
Names come from nvmlSystemGetProcessName.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict
from collections.abc import Iterator

from exporter import nvml
from exporter.collectors.base import Family, Reader, Sample, register
from exporter.nvml import Device, ProcessMemory, ProcessUtilization

log = logging.getLogger(__name__)

OTHER = ("", "(other)")
# The inode of the initial (host's) PID namespace: PROC_PID_INIT_INO in the kernel's
# include/linux/proc_ns.h, fixed since Linux 3.8.
_HOST_PID_NAMESPACE_INODE = 0xEFFFFFFC

FAMILIES = (
    Family(
        "gpu_processes",
        "gauge",
        "Compute processes running on the GPU (nvmlDeviceGetComputeRunningProcesses).",
    ),
    Family(
        "gpuload_processes_visible",
        "gauge",
        "1 where the driver lists the GPU's processes to gpuload, 0 where gpuload runs outside "
        "the host's PID namespace and sees none (Kubernetes: hostPID: true).",
    ),
    Family(
        "gpu_process_memory_used_bytes",
        "gauge",
        "GPU memory used by a process, in bytes, "
        'for the top processes by memory; the rest summed as process="(other)" '
        "(nvmlDeviceGetComputeRunningProcesses).",
        ("pid", "process"),
    ),
    Family(
        "gpu_process_sm_utilization_ratio",
        "gauge",
        "Fraction of time the process had a "
        "kernel on the SMs since the previous collection, 0..1 "
        "(nvmlDeviceGetProcessUtilization).",
        ("pid", "process"),
    ),
)


# Four processes per GPU and the rest summed: a series budget (docs/fleet.md) that still shows a
# training job, its data-loader workers' share, or an inference server and its neighbours.
@register("processes", FAMILIES, options={"top": 4, "host_pid_namespace": "auto"})
class ProcessesCollector:
    """Compute processes per GPU, their memory and SM utilization (top N by memory)."""

    def __init__(self, top: int = 4, host_pid_namespace: str = "auto") -> None:
        """``host_pid_namespace``: false says the driver hides the processes from gpuload.

        ``gpuload serve`` turns ``auto`` into true or false at start (`resolve_host_pid_namespace`).
        """
        self._top = top
        self._visible = host_pid_namespace != "false"
        if not self._visible:
            _say_processes_are_not_visible()
        self._names: dict[int, str] = {}
        self._last_seen_us = 0
        self._sm_ratios: dict[tuple[str, str], float] = {}

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the process count and per-process series for the largest processes."""
        yield Sample("gpuload_processes_visible", float(self._visible))
        if not self._visible:
            return
        processes = read(device.compute_processes)
        if processes is None:
            return
        yield Sample("gpu_processes", len(processes))
        by_memory = sorted(processes, key=lambda p: p.used_bytes or 0, reverse=True)
        shown, rest = by_memory[: self._top], by_memory[self._top :]
        labels = {p.pid: (str(p.pid), self._name(p.pid)) for p in shown}
        self._names = {pid: self._names[pid] for pid in labels if pid in self._names}
        for process in shown:
            if process.used_bytes is not None:
                yield Sample(
                    "gpu_process_memory_used_bytes", process.used_bytes, labels[process.pid]
                )
        if rest:
            yield Sample("gpu_process_memory_used_bytes", _total_memory(rest), OTHER)
        yield from self._utilization(device, read, labels)

    def _utilization(
        self, device: Device, read: Reader, labels: dict[int, tuple[str, str]]
    ) -> Iterator[Sample]:
        samples = read(device.process_utilization, self._last_seen_us)
        if samples is None:
            return
        if samples:
            self._last_seen_us = max(sample.timestamp_us for sample in samples)
            self._sm_ratios = _sm_ratios(samples, labels)
        elif _gpu_idle(device, read):
            # The driver samples only processes that used the GPU: none, and the GPU idle now.
            self._sm_ratios = {}
        # Otherwise no sample period has passed since the last collection: the figures hold.
        # A shown process without a sample used no SM.
        for key in labels.values():
            yield Sample("gpu_process_sm_utilization_ratio", self._sm_ratios.get(key, 0.0), key)
        if OTHER in self._sm_ratios:
            yield Sample("gpu_process_sm_utilization_ratio", self._sm_ratios[OTHER], OTHER)

    def _name(self, pid: int) -> str:
        if pid not in self._names:
            self._names[pid] = nvml.process_name(pid)
        return self._names[pid]


def resolve_host_pid_namespace(setting: str) -> str:
    """``true`` or ``false`` for the ``host_pid_namespace`` setting: ``auto`` asks the kernel."""
    if setting != "auto":
        return setting
    try:
        inode = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return "true"  # no /proc, or no namespaces: nothing makes the driver hide processes
    return str(inode == _HOST_PID_NAMESPACE_INODE).lower()


@functools.cache
def _say_processes_are_not_visible() -> None:
    log.warning(
        "gpuload runs outside the host's PID namespace, where the driver lists no GPU "
        "processes: gpu_processes and the per-process series are not exported "
        "(Kubernetes: set hostPID: true, Helm value exporter.hostPID)"
    )


def _sm_ratios(
    samples: list[ProcessUtilization], labels: dict[int, tuple[str, str]]
) -> dict[tuple[str, str], float]:
    """Mean SM utilization per shown process; the others' means added up under OTHER."""
    percents: dict[int, list[int]] = defaultdict(list)
    for sample in samples:
        percents[sample.pid].append(sample.sm_percent)
    ratios: dict[tuple[str, str], float] = defaultdict(float)
    for pid, values in percents.items():
        ratios[labels.get(pid, OTHER)] += sum(values) / len(values) / 100
    return {key: min(ratio, 1.0) for key, ratio in ratios.items()}


def _gpu_idle(device: Device, read: Reader) -> bool:
    rates = read(device.utilization, what="utilization")
    return rates is not None and rates.gpu_percent == 0


def _total_memory(processes: list[ProcessMemory]) -> int:
    return sum(p.used_bytes or 0 for p in processes)
