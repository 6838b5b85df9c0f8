"""Pod attribution: which pod, namespace and container each GPU is allocated to.

Families:
    gpu_pod_info{gpu,uuid,pod,namespace,container,mig_instance}: 1 for each GPU (or MIG
        instance: `mig_instance` is its GPU instance id, empty for a whole GPU) and each
        container a device plugin or a DRA claim allocated it to, from the kubelet's
        PodResources API (List). Join a per-GPU series to its pod with
        ``gpu_utilization_ratio * on(instance, gpu, uuid) group_left(pod, namespace) gpu_pod_info``
        (with time-sliced GPUs, several pods share one: put gpu_pod_info on the left).
    gpuload_kubernetes_pod_resources_up: 1 if the kubelet's last List answer arrived in
        time, 0 if it failed, the socket seen before is gone, or on Kubernetes the socket is
        missing or this process may not use it; absent off Kubernetes without the socket.

The kubelet names devices by the ids the device plugin gave them: for NVIDIA's plugin,
GPU UUIDs (``GPU-...``), MIG device UUIDs (``MIG-...``; ``MIG-GPU-<uuid>/<gi>/<ci>`` on
old drivers), a ``::N`` suffix for time-sliced replicas, or GPU indices with its
``deviceIDStrategy=index``; for GKE's plugin (container-engine-accelerators), the device node's
name, ``nvidiaN``, N being the GPU's minor number (nvmlDeviceGetMinorNumber). The ids are
mapped to GPU indices with what NVML reports (nvmlDeviceGetUUID and the minor number on each
GPU and, in MIG mode, the UUID of each MIG device handle), read only when an answer names a
device not mapped yet.

Devices of Dynamic Resource Allocation claims are taken from NVIDIA's DRA driver only (driver
``gpu.nvidia.com``; https://github.com/NVIDIA/k8s-dra-driver-gpu at 22407113785e,
cmd/gpu-kubelet-plugin/main.go DriverName), by the names its ResourceSlices give them:
``gpu-<minor>`` for a whole GPU (deviceinfo.go, GpuInfo.CanonicalName: the minor number is
nvmlDeviceGetMinorNumber's, nvlib.go) and
``gpu-<parent minor>-mig-<profile name>-<GPU instance profile id>-<placement start>`` for a MIG
device (mig.go, MigSpecTuple.ToCanonicalName; its own parser, canonicalMigNameRegex, reads the
three numbers and ignores the name). A MIG device is the GPU instance whose nvmlGpuInstanceGetInfo
(of nvmlDeviceGetGpuInstanceById's handle) gives that profile id and placement start, as the
driver finds it (nvlib.go, FindMigDevBySpec); NVML answers a privileged user only. Devices
passed through to VMs, ``gpu-vfio-<index>`` (deviceinfo.go, VfioDeviceInfo.CanonicalName), are
bound to vfio-pci and invisible to NVML: they are skipped. A name of another shape, or one that
no GPU matches, leaves its containers without gpu_pod_info and is logged once (a WARNING naming
the device and why).

The List call is started without waiting and read on a later cycle, so a kubelet that
hangs delays nothing; its deadline is `timeout`. The last answer is kept through a few
failed refreshes, so that one slow answer does not reset alerts joined on gpu_pod_info.
Off Kubernetes (no ``KUBERNETES_SERVICE_HOST`` in the environment, which the kubelet sets in
every container) and without the socket, the collector exports nothing, says so once at INFO
and does not import grpc. On Kubernetes a missing socket (its folder not mounted) or one this
process may not use (the kubelet makes the folder 0750 and the socket 0755, both root's: a
non-root uid can neither reach nor connect to it) is a WARNING naming the path and the fix, and
``gpuload_kubernetes_pod_resources_up 0``, which GPULoadPodResourcesDown alerts on.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter import nvml
from exporter.collectors.base import Family, Reader, Sample, SecondsCounter, register
from exporter.kubernetes import DEFAULT_SOCKET, Allocation, PodResourcesError
from exporter.kubernetes.cgroups import ProcessUnattributed, process_pod
from exporter.kubernetes.pods import PendingPods, PodListError, PodListSource, PodName
from exporter.nvml import Device
from exporter.problems import ProblemLog

if TYPE_CHECKING:
    from exporter.kubernetes.podresources import PendingList, PodResourcesClient

log = logging.getLogger(__name__)

_POD_LABELS = ("gpu", "uuid", "pod", "namespace", "container", "mig_instance")
# A pod's share of a whole GPU: a MIG instance is its pod's alone (gpu_pod_info names it).
_SHARE_LABELS = ("gpu", "uuid", "pod", "namespace", "container")

FAMILIES = (
    Family(
        "gpu_pod_info",
        "gauge",
        "1 for each container a GPU (or MIG instance: mig_instance) is allocated to, from the "
        "kubelet's PodResources API (List); GPU UUIDs mapped to indices by nvmlDeviceGetUUID.",
        _POD_LABELS,
        per_gpu=False,
    ),
    Family(
        "gpu_pod_memory_used_bytes",
        "gauge",
        "GPU memory used by a container's processes on a GPU, in bytes (each process's "
        "usedGpuMemory, nvmlDeviceGetComputeRunningProcesses); with collectors.kubernetes.pods.",
        _SHARE_LABELS,
        per_gpu=False,
    ),
    Family(
        "gpu_pod_utilization_seconds_total",
        "counter",
        "Seconds a container's processes had a kernel on the GPU, integrated from NVML's "
        "per-process samples (nvmlDeviceGetProcessUtilization): rate() is the container's share "
        "of the GPU's time; with collectors.kubernetes.pods.",
        _SHARE_LABELS,
        per_gpu=False,
    ),
    Family(
        "gpuload_kubernetes_attribution_errors_total",
        "counter",
        "What was left unattributed to a pod, by cause: a process per collection "
        "(process_exited, proc_unreadable, cgroup_unknown, pod_unknown) or a failed call "
        "(kubelet_slow, kubelet_unavailable, kubelet_garbage, pods_slow, pods_unavailable, "
        "pods_garbage).",
        ("cause",),
        per_gpu=False,
    ),
    Family(
        "gpuload_kubernetes_pod_resources_up",
        "gauge",
        "1 if the kubelet's PodResources List answered in time at the last refresh, else 0 "
        "(also once its socket is gone, and on Kubernetes while it is missing or not usable "
        "by this process); absent off Kubernetes without the socket.",
        per_gpu=False,
    ),
)

# The last answer stays valid through this many refresh intervals without a new one.
_KEEP_REFRESHES = 3
# Device plugins of these resources hand out NVIDIA GPUs and MIG devices.
_NVIDIA_RESOURCE = "nvidia.com/"
# gRPC's status for a kubelet that did not answer in time, and for an answer that is not a
# ListPodResourcesResponse (grpcio: "Exception deserializing response"); any other is unavailable.
_KUBELET_CAUSES = {"DEADLINE_EXCEEDED": "kubelet_slow", "INTERNAL": "kubelet_garbage"}
_REPLICA_SUFFIX = re.compile(r"::\d+$")
_LEGACY_MIG_ID = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/\d+$")
# NVIDIA's DRA driver and the names of its devices (the module docstring cites each shape).
DRA_DRIVER = "gpu.nvidia.com"
_DRA_GPU = re.compile(r"^gpu-(\d+)$")
_DRA_MIG = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
_DRA_VFIO = re.compile(r"^gpu-vfio-\d+$")
_DRA_SHAPES = "gpu-<minor> or gpu-<minor>-mig-<profile>-<profile id>-<placement start>"


@dataclass(frozen=True)
class Target:
    """What a device id names: a GPU by index and UUID, and a MIG instance or ""."""

    gpu: str
    uuid: str
    mig_instance: str = ""


@register(
    "kubernetes",
    FAMILIES,
    scope="node",
    options={
        "socket": DEFAULT_SOCKET,
        "refresh": 10.0,
        "timeout": 2.0,
        "pods": "",
        "proc": "/proc",
        "node": "",
    },
)
class KubernetesCollector:
    """GPU-to-pod attribution from the kubelet's PodResources API (gpu_pod_info)."""

    def __init__(
        self,
        socket: str = DEFAULT_SOCKET,
        refresh: float = 10.0,
        timeout: float = 2.0,
        pods: str = "",
        proc: str = "/proc",
        node: str = "",
        *,
        clock: Callable[[], float] | None = None,
        on_kubernetes: bool | None = None,
    ) -> None:
        """``pods``: where pod UIDs are named (`PodListSource`), "" for no per-process shares.

        ``clock``: the node's clock; by default the collection's (the scenario's under --simulate).
        """
        self._socket = socket
        # The kubelet gives every container KUBERNETES_SERVICE_HOST.
        self._on_kubernetes = (
            "KUBERNETES_SERVICE_HOST" in os.environ if on_kubernetes is None else on_kubernetes
        )
        self._refresh = refresh
        self._timeout = timeout
        self._clock = clock
        self._client: PodResourcesClient | None = None
        self._pending: PendingList | None = None
        self._next_call = 0.0
        self._socket_present: bool | None = None
        self._up: bool | None = None
        self._allocations: list[Allocation] = []
        self._answered_at: float | None = None
        self._directory: dict[str, Target] = {}
        self._problems = ProblemLog(log)
        self._errors: Counter[str] = Counter()
        self._shares = _pod_shares(pods, proc, node, timeout)

    def collect(self, read: Reader) -> Iterator[Sample]:
        """Take finished answers, start calls when due, yield the allocations and shares."""
        now = self._clock() if self._clock is not None else read.now
        self._finish_call(now, read)
        if self._shares is not None:
            self._shares.finish_call(now, self._count)
        if now >= self._next_call:
            self._next_call = now + self._refresh
            if self._pending is None:
                self._start_call()
            if self._shares is not None:
                self._shares.start_call()
        if self._up is not None:
            yield Sample("gpuload_kubernetes_pod_resources_up", 1 if self._up else 0)
        if self._answered_at is not None and now - self._answered_at <= self._kept_for:
            yield from self._pod_info()
        causes: tuple[str, ...] = KUBELET_CAUSES if self._up is not None else ()
        if self._shares is not None:
            yield from self._shares.collect(read, now, self._kept_for, self._count)
            causes += SHARE_CAUSES
        for cause in causes:
            yield Sample(
                "gpuload_kubernetes_attribution_errors_total", self._errors[cause], (cause,)
            )

    @property
    def _kept_for(self) -> float:
        return self._refresh * _KEEP_REFRESHES

    def _pod_info(self) -> Iterator[Sample]:
        labels: set[tuple[str, ...]] = set()
        for allocation in self._allocations:
            target = resolve(allocation.device_id, self._directory)
            if target is not None:
                labels.add(
                    (
                        target.gpu,
                        target.uuid,
                        allocation.pod,
                        allocation.namespace,
                        allocation.container,
                        target.mig_instance,
                    )
                )
        for label_values in sorted(labels):
            yield Sample("gpu_pod_info", 1, label_values)

    def _count(self, cause: str, example: str) -> None:
        """Count one thing left unattributed; its cause's first occurrence is logged, once."""
        if cause not in self._errors:
            log.warning(
                "collector kubernetes: left unattributed (%s), counted in "
                "gpuload_kubernetes_attribution_errors_total{cause=%r} and not logged again: %s",
                cause,
                cause,
                example,
            )
        self._errors[cause] += 1

    def close(self) -> None:
        """Cancel a call in flight and close the channel."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _start_call(self) -> None:
        problem = _socket_problem(self._socket)
        present = problem is None
        if not present and self._socket_present:
            # Seen before and gone now: the kubelet stopped or is restarting. That is a failed
            # refresh (up 0, the last answer kept a while), not a node without Kubernetes.
            self._list_failed("kubelet_unavailable", "its socket is gone")
            return
        if present != self._socket_present:
            self._log_socket(problem)
            self._socket_present = present
        if not present:
            # On Kubernetes a missing or forbidden socket is a fault to alert on, not absence.
            self._up = False if self._on_kubernetes else None
            self._answered_at = None
            return
        if self._client is None:
            # Imported here: grpc and protobuf cost ~10 MB of memory, wasted without the socket.
            from exporter.kubernetes.podresources import PodResourcesClient

            self._client = PodResourcesClient(self._socket, timeout=self._timeout)
        self._pending = self._client.start_list()

    def _log_socket(self, problem: str | None) -> None:
        if problem is None:
            log.info("collector kubernetes: reading pod allocations from %s", self._socket)
        elif self._on_kubernetes:
            log.warning(
                "collector kubernetes: on Kubernetes, but %s: no gpu_pod_info, "
                "gpuload_kubernetes_pod_resources_up is 0",
                problem,
            )
        else:
            log.info(
                "collector kubernetes: no kubelet pod-resources socket at %s (not on Kubernetes, "
                "or the socket's folder is not mounted): no gpu_pod_info until it appears",
                self._socket,
            )

    def _finish_call(self, now: float, read: Reader) -> None:
        if self._pending is None or not self._pending.done():
            return
        pending, self._pending = self._pending, None
        try:
            found = pending.result()
        except PodResourcesError as error:
            self._list_failed(
                _KUBELET_CAUSES.get(error.code, "kubelet_unavailable"), f"List failed: {error.code}"
            )
            return
        self._problems.resolve("list", "collector kubernetes: the kubelet answers again")
        self._up = True
        self._answered_at = now
        self._allocations = [a for a in found if _attributable(a)]
        if any(resolve(a.device_id, self._directory) is None for a in self._allocations):
            self._directory = read_directory(read)
        self._report_claims()

    def _report_claims(self) -> None:
        """Log once each DRA device that names no GPU here, and once when it does again."""
        claims: dict[str, set[str]] = {}
        for allocation in self._allocations:
            if allocation.claim:
                claims.setdefault(allocation.device_id, set()).add(allocation.claim)
        for name, claimed in sorted(claims.items()):
            key = ("claim", name)
            if resolve(name, self._directory) is not None:
                self._problems.resolve(key, "collector kubernetes: DRA device %s attributed", name)
                continue
            self._problems.report(
                key,
                "collector kubernetes: DRA device %s of driver %s (claims %s) is not attributed, "
                "no gpu_pod_info for its containers: %s",
                name,
                DRA_DRIVER,
                ", ".join(sorted(claimed)),
                _unattributed(name, self._directory),
            )

    def _list_failed(self, cause: str, why: str) -> None:
        self._up = False
        self._errors[cause] += 1
        self._problems.report(
            "list",
            "collector kubernetes: the kubelet's pod-resources socket %s: %s; "
            "GPUs keep reporting, without pod labels after %.0fs",
            self._socket,
            why,
            self._refresh * _KEEP_REFRESHES,
        )


def _socket_problem(path: str) -> str | None:
    """Why this process cannot use the kubelet's socket at ``path``, or None if it can."""
    try:
        os.stat(path)
    except PermissionError:
        return (
            f"uid {os.getuid()} may not reach the kubelet's pod-resources socket {path} (the "
            "kubelet makes its folder 0750 root): run the exporter as root with no "
            "capabilities, as the Helm chart does with pod attribution on"
        )
    except OSError:
        return (
            f"no kubelet pod-resources socket at {path}: mount the kubelet's pod-resources "
            "folder there (hostPath /var/lib/kubelet/pod-resources)"
        )
    if not os.access(path, os.W_OK):
        # Connecting to a Unix socket needs write permission on it.
        return (
            f"uid {os.getuid()} may not connect to the kubelet's pod-resources socket {path} "
            "(the kubelet makes it 0755 root): run the exporter as root with no capabilities, "
            "as the Helm chart does with pod attribution on"
        )
    return None


def _attributable(allocation: Allocation) -> bool:
    """Whether an allocation is an NVIDIA GPU's: a device plugin's or NVIDIA's DRA driver's."""
    if allocation.resource == DRA_DRIVER:
        return not _DRA_VFIO.match(allocation.device_id)
    return allocation.resource.startswith(_NVIDIA_RESOURCE)


def resolve(device_id: str, directory: dict[str, Target]) -> Target | None:
    """The GPU (and MIG instance) a device plugin's device id or a DRA device name names, or None.

    Device plugins' ids (UUIDs, indices, ``nvidiaN``) never take the DRA driver's shapes.
    """
    device_id = _REPLICA_SUFFIX.sub("", device_id)
    if device_id in directory:
        return directory[device_id]
    legacy = _LEGACY_MIG_ID.match(device_id)
    if legacy and legacy.group(1) in directory:
        parent = directory[legacy.group(1)]
        return Target(parent.gpu, parent.uuid, legacy.group(2))
    claimed = _DRA_MIG.match(device_id)
    if claimed:
        minor, _profile, profile_id, start = claimed.groups()
        return directory.get(_mig_key(int(minor), int(profile_id), int(start)))
    return None


def _mig_key(minor: int, profile_id: int, placement_start: int) -> str:
    """The directory's key for a MIG GPU instance as the DRA driver places it (no profile name)."""
    return f"gpu-{minor}-mig-{profile_id}-{placement_start}"


def _unattributed(name: str, directory: dict[str, Target]) -> str:
    """Why a DRA device name names no GPU of this node."""
    mig = _DRA_MIG.match(name)
    shape = mig or _DRA_GPU.match(name)
    if shape is None:
        return f"expected a device name {_DRA_SHAPES} (NVIDIA's DRA driver)"
    minor = int(shape.group(1))
    parent = directory.get(f"gpu-{minor}")
    if parent is None or mig is None:
        return f"no GPU has minor number {minor} (nvmlDeviceGetMinorNumber)"
    return (
        f"GPU {parent.gpu} has no MIG GPU instance of profile id {mig.group(3)} at memory slice "
        f"{mig.group(4)} (nvmlGpuInstanceGetInfo, which NVML answers a privileged user only)"
    )


def read_directory(read: Reader) -> dict[str, Target]:
    """Every GPU's and MIG device's UUID (and each GPU's index) mapped to what it names."""
    directory: dict[str, Target] = {}
    for index in range(read(nvml.device_count) or 0):
        device = read(nvml.device, index)
        identity = read(device.identity) if device is not None else None
        if device is None or identity is None:
            continue
        gpu = Target(str(index), identity.uuid)
        directory[identity.uuid] = directory[str(index)] = gpu
        minor = read(device.minor_number)
        if minor is not None:
            # GKE's device plugin and NVIDIA's DRA driver name a GPU by its minor number.
            directory[f"nvidia{minor}"] = directory[f"gpu-{minor}"] = gpu
        if read(device.mig_mode_enabled):
            directory.update(_mig_directory(read, device, gpu, minor))
    return directory


def _mig_directory(
    read: Reader, device: nvml.Device, gpu: Target, minor: int | None
) -> dict[str, Target]:
    """A MIG GPU's MIG device UUIDs and, with its minor number, its GPU instances' DRA keys."""
    directory: dict[str, Target] = {}
    placed: set[int] = set()
    for instance in read(device.mig_devices) or []:
        target = Target(gpu.gpu, gpu.uuid, str(instance.gpu_instance))
        mig = read(instance.device.identity)
        if mig is not None:
            directory[mig.uuid] = target
        if minor is None or instance.gpu_instance in placed:
            continue  # a GPU instance's compute instances share its placement
        placed.add(instance.gpu_instance)
        info = read(device.gpu_instance_info, instance.gpu_instance)
        if info is not None:
            directory[_mig_key(minor, info.profile_id, info.placement_start)] = target
    return directory


# What gpuload_kubernetes_attribution_errors_total counts, every cause exported from the start
# so that rate() sees the first one.
KUBELET_CAUSES = ("kubelet_slow", "kubelet_unavailable", "kubelet_garbage")
SHARE_CAUSES = (
    "process_exited",
    "proc_unreadable",
    "cgroup_unknown",
    "pod_unknown",
    "pods_slow",
    "pods_unavailable",
    "pods_garbage",
)


def _pod_shares(pods: str, proc: str, node: str, timeout: float) -> _PodShares | None:
    """Per-process shares when ``pods`` names a source; None, said once, when it cannot work."""
    if not pods:
        return None
    try:
        return _PodShares(PodListSource(pods, node, timeout), proc)
    except ValueError as error:
        log.warning("collector kubernetes: no per-pod shares of GPUs: %s", error)
        return None


class _PodShares:
    """Every process on each whole GPU, joined to its pod: memory and SM time per container.

    A process's pod comes from its cgroup (`cgroups.process_pod`), the pod's name from the pods
    list (`pods.PodListSource`). Memory is each process's usedGpuMemory, summed. SM time is
    integrated from NVML's per-process samples: each process's mean SM percent over the samples
    since the last collection, times the seconds between collections. A MIG instance is not
    shared out: its pod holds it whole (gpu_pod_info), and its own series are the pod's.
    """

    def __init__(self, source: PodListSource, proc: str) -> None:
        self._source = source
        self._proc = proc
        self._pending: PendingPods | None = None
        self._pods: dict[str, PodName] = {}
        self._answered_at: float | None = None
        self._last_sample_us: dict[int, int] = {}
        self._seconds: dict[tuple[str, ...], SecondsCounter] = {}
        self._failing = False

    def start_call(self) -> None:
        if self._pending is None:
            self._pending = self._source.start()

    def finish_call(self, now: float, count: Callable[[str, str], None]) -> None:
        if self._pending is None or not self._pending.done():
            return
        pending, self._pending = self._pending, None
        try:
            self._pods = pending.result()
        except PodListError as error:
            count(error.cause, f"{self._source.url}: {error}")
            self._failing = True
            return
        if self._failing:
            log.info("collector kubernetes: the pods list answers again")
            self._failing = False
        self._answered_at = now

    def collect(
        self, read: Reader, now: float, kept_for: float, count: Callable[[str, str], None]
    ) -> Iterator[Sample]:
        """The shares of every whole GPU's processes, by container."""
        if self._answered_at is None or now - self._answered_at > kept_for:
            self._seconds.clear()
            return
        memory: dict[tuple[str, ...], int] = {}
        busy: dict[tuple[str, ...], float] = {}
        measured: set[tuple[str, ...]] = set()
        for index in range(read(nvml.device_count) or 0):
            device = read(nvml.device, index)
            identity = read(device.identity) if device is not None else None
            if device is None or identity is None or read(device.mig_mode_enabled):
                continue
            gpu = (str(index), identity.uuid)
            processes = _processes(device, read)
            ratios = self._sm_ratios(index, device, read)
            for pid, used in processes.items():
                container = self._container(pid, count)
                if container is None:
                    continue
                key: tuple[str, ...] = (*gpu, *container)
                memory[key] = memory.get(key, 0) + used
                if ratios is not None:
                    measured.add(key)
                    busy[key] = busy.get(key, 0.0) + ratios.get(pid, 0.0)
        for shown in sorted(memory):
            yield Sample("gpu_pod_memory_used_bytes", memory[shown], shown)
        self._seconds = {key: self._seconds.get(key) or SecondsCounter() for key in measured}
        for shown in sorted(measured):
            seconds = self._seconds[shown].add(busy[shown], now)
            yield Sample("gpu_pod_utilization_seconds_total", seconds, shown)

    def _container(
        self, pid: int, count: Callable[[str, str], None]
    ) -> tuple[str, str, str] | None:
        """(pod, namespace, container) of a process; None outside a pod or unattributed."""
        try:
            found = process_pod(self._proc, pid)
        except ProcessUnattributed as error:
            count(error.cause, str(error))
            return None
        if found is None:
            return None  # a host process (Xorg, a job outside Kubernetes): nobody's share
        pod = self._pods.get(found.pod_uid)
        if pod is None:
            count("pod_unknown", f"pid {pid}: pod UID {found.pod_uid} is not in the pods list")
            return None
        return pod.name, pod.namespace, pod.containers.get(found.container_id, "")

    def _sm_ratios(self, index: int, device: Device, read: Reader) -> dict[int, float] | None:
        """Each process's mean SM fraction over NVML's samples since the last collection.

        None where the GPU has no per-process samples (NOT_SUPPORTED): no SM time is exported.
        No new sample means no process used an engine (the driver samples only those).
        """
        samples = read(device.process_utilization, self._last_sample_us.get(index, 0))
        if samples is None:
            return None
        if samples:
            self._last_sample_us[index] = max(sample.timestamp_us for sample in samples)
        percents: dict[int, list[int]] = {}
        for sample in samples:
            percents.setdefault(sample.pid, []).append(sample.sm_percent)
        return {pid: sum(values) / len(values) / 100 for pid, values in percents.items()}


def _processes(device: Device, read: Reader) -> dict[int, int]:
    """Every compute and graphics process on the GPU, by PID, with its memory in bytes."""
    found: dict[int, int] = {}
    for listing in (device.compute_processes, device.graphics_processes):
        for process in read(listing) or []:
            # A process with both kinds of context is listed twice, with the same memory.
            found[process.pid] = max(found.get(process.pid, 0), process.used_bytes or 0)
    return found
