"""Pod attribution: which pod, namespace and container each GPU is allocated to.

Families:
    gpu_pod_info{gpu,uuid,pod,namespace,container,mig_instance}: 1 for each GPU (or MIG
        instance: `mig_instance` is its GPU instance id, empty for a whole GPU) and each
        container a device plugin allocated it to, from the kubelet's PodResources API
        (List). Join a per-GPU series to its pod with
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
        self._allocations = [a for a in found if a.resource.startswith(_NVIDIA_RESOURCE)]
        if any(resolve(a.device_id, self._directory) is None for a in self._allocations):
            self._directory = read_directory(read)

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


def resolve(device_id: str, directory: dict[str, Target]) -> Target | None:
    """The GPU (and MIG instance) a device plugin's device id names, or None."""
    device_id = _REPLICA_SUFFIX.sub("", device_id)
    if device_id in directory:
        return directory[device_id]
    legacy = _LEGACY_MIG_ID.match(device_id)
    if legacy and legacy.group(1) in directory:
        parent = directory[legacy.group(1)]
        return Target(parent.gpu, parent.uuid, legacy.group(2))
    return None


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
            directory[f"nvidia{minor}"] = gpu
        if not read(device.mig_mode_enabled):
            continue
        for instance in read(device.mig_devices) or []:
            mig = read(instance.device.identity)
            if mig is not None:
                directory[mig.uuid] = Target(gpu.gpu, gpu.uuid, str(instance.gpu_instance))
    return directory
