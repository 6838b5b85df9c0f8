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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter import nvml
from exporter.collectors.base import Family, Reader, Sample, register
from exporter.kubernetes import DEFAULT_SOCKET, Allocation, PodResourcesError
from exporter.problems import ProblemLog

if TYPE_CHECKING:
    from exporter.kubernetes.podresources import PendingList, PodResourcesClient

log = logging.getLogger(__name__)

_POD_LABELS = ("gpu", "uuid", "pod", "namespace", "container", "mig_instance")

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
    options={"socket": DEFAULT_SOCKET, "refresh": 10.0, "timeout": 2.0},
)
class KubernetesCollector:
    """GPU-to-pod attribution from the kubelet's PodResources API (gpu_pod_info)."""

    def __init__(
        self,
        socket: str = DEFAULT_SOCKET,
        refresh: float = 10.0,
        timeout: float = 2.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_kubernetes: bool | None = None,
    ) -> None:
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

    def collect(self, read: Reader) -> Iterator[Sample]:
        """Take a finished List answer, start the next one when due, yield the allocations."""
        now = self._clock()
        self._finish_call(now, read)
        if self._pending is None and now >= self._next_call:
            self._start_call(now)
        if self._up is not None:
            yield Sample("gpuload_kubernetes_pod_resources_up", 1 if self._up else 0)
        if self._answered_at is None or now - self._answered_at > self._refresh * _KEEP_REFRESHES:
            return
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

    def close(self) -> None:
        """Cancel a call in flight and close the channel."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _start_call(self, now: float) -> None:
        self._next_call = now + self._refresh
        problem = _socket_problem(self._socket)
        present = problem is None
        if not present and self._socket_present:
            # Seen before and gone now: the kubelet stopped or is restarting. That is a failed
            # refresh (up 0, the last answer kept a while), not a node without Kubernetes.
            self._list_failed("its socket is gone")
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
            self._list_failed(f"List failed: {error.code}")
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

    def _list_failed(self, why: str) -> None:
        self._up = False
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
