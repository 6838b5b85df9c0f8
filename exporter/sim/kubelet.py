"""A simulated kubelet: the pods of a scenario's ``kubernetes:`` section, on the scenario's clock.

`gpuload serve --simulate` starts one when the scenario has that section, in a private temporary
folder, and points the ``kubernetes`` collector at it. Every answer is the pods running at the
scenario time of the moment (a pod runs from its ``from`` until its ``until``):

- the PodResources API (v1, gRPC on a unix socket): ``List`` and ``Get`` with ``devices`` as
  NVIDIA's device plugin (github.com/NVIDIA/k8s-device-plugin) allocates them: resource
  ``nvidia.com/gpu`` with GPU UUIDs, ``<UUID>::<n>`` for time-sliced replicas, and
  ``nvidia.com/mig-<profile>`` with MIG device UUIDs; DRA claims in ``dynamic_resources`` as
  NVIDIA's DRA driver publishes them (:func:`claim_resources`);
- the API server's pod list, ``GET /api/v1/pods`` on 127.0.0.1, a v1 ``PodList``
  (:func:`pod_object`), honouring ``fieldSelector=spec.nodeName=<node>``;
- a ``/proc`` tree holding ``<pid>/cgroup`` for each process of a running pod, in the shape the
  container's ``cgroup`` and ``runtime`` choose (:func:`cgroup_text`), rewritten as pods start and
  stop.

:class:`PodResourcesServer` is the gRPC server alone, serving whatever list a callable gives;
the fake kubelet of the tests (tools/kubelet.py) serves its hand-made pods with it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc

from exporter.kubernetes import podresources_v1_pb2 as api
from exporter.sim.library import SimulatedNvml
from exporter.sim.model import POD_QOS_CLASSES, PodContainer, PodSpec
from exporter.sim.pods import made_uid
from exporter.sim.scenario import MIG_PROFILES

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
# NVIDIA's DRA driver: its name (cmd/gpu-kubelet-plugin/driver.go DriverName) and the CDI kind of
# a claim's devices (cdi.go: cdiVendor "k8s." + DriverName, cdiClaimClass "claim").
DRA_DRIVER = "gpu.nvidia.com"
_CDI_KIND = f"k8s.{DRA_DRIVER}/claim"
# The API group of the owners a pod names (k8s.io/api: apps/v1 and batch/v1 types.go).
_API_VERSIONS = {
    "ReplicaSet": "apps/v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}
_CONTAINER_SCHEMES = {"containerd": "containerd", "cri-o": "cri-o"}
# How often the /proc tree is compared with the running pods.
PROC_REFRESH_SECONDS = 1.0


class PodResourcesServer:
    """A gRPC ``v1.PodResourcesLister`` (List, Get) on a unix socket, serving ``pods()``.

    ``before_call`` runs at the start of every call with the call's context (a test's fake
    kubelet counts calls and holds them there).
    """

    def __init__(
        self,
        socket_path: Path,
        pods: Callable[[], Sequence[api.PodResources]],
        *,
        before_call: Callable[[grpc.ServicerContext], None] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self._pods = pods
        self._before_call = before_call
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=api.ListPodResourcesRequest.FromString,
                response_serializer=api.ListPodResourcesResponse.SerializeToString,
            ),
            "Get": grpc.unary_unary_rpc_method_handler(
                self._get,
                request_deserializer=api.GetPodResourcesRequest.FromString,
                response_serializer=api.GetPodResourcesResponse.SerializeToString,
            ),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),)
        )
        if not self._server.add_insecure_port(f"unix:{socket_path}"):
            raise OSError(f"cannot listen on the unix socket {socket_path}")

    def start(self) -> PodResourcesServer:
        """Start serving; return self."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving; calls in flight are cancelled."""
        self._server.stop(grace=None)

    def _list(
        self, request: api.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api.ListPodResourcesResponse:
        if self._before_call is not None:
            self._before_call(context)
        return api.ListPodResourcesResponse(pod_resources=list(self._pods()))

    def _get(
        self, request: api.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api.GetPodResourcesResponse:
        if self._before_call is not None:
            self._before_call(context)
        for pod in self._pods():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return api.GetPodResourcesResponse(pod_resources=pod)
        context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("abort returned")


class PodListServer:
    """``GET /api/v1/pods[?fieldSelector=spec.nodeName=NODE]`` on 127.0.0.1, a v1 PodList."""

    def __init__(self, node: str, pods: Callable[[], list[dict[str, Any]]]) -> None:
        self.node = node
        self._pods = pods
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="simulated-pod-list", daemon=True
        )

    @property
    def url(self) -> str:
        """The pod list's URL, without a field selector."""
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/api/v1/pods"

    def start(self) -> PodListServer:
        """Start serving in a daemon thread; return self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def answer(self, target: str) -> tuple[HTTPStatus, dict[str, Any]]:
        """The status and JSON body for a GET of ``target`` (a path and query)."""
        url = urlsplit(target)
        if url.path.rstrip("/") != "/api/v1/pods":
            return HTTPStatus.NOT_FOUND, _status("the server could not find the requested resource")
        items = self._pods()
        for selector in parse_qs(url.query).get("fieldSelector", []):
            for term in filter(None, selector.split(",")):
                field, _, value = term.partition("=")
                if field != "spec.nodeName":
                    message = f'"{field}" is not a known field selector: only "spec.nodeName"'
                    return HTTPStatus.BAD_REQUEST, _status(message)
                items = [item for item in items if item["spec"]["nodeName"] == value]
        return HTTPStatus.OK, {"kind": "PodList", "apiVersion": "v1", "items": items}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        answer = self.answer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Say nothing: the collector's requests would fill the log."""

        return Handler


def _status(message: str) -> dict[str, Any]:
    # The API server's error body (k8s.io/apimachinery metav1.Status).
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}


class ProcTree:
    """A folder standing for /proc: ``<pid>/cgroup`` for each process given to `write`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._texts: dict[int, str] = {}
        self._lock = threading.Lock()

    def write(self, texts: Mapping[int, str]) -> None:
        """Make the tree hold exactly ``texts`` (PID -> its cgroup file's text)."""
        with self._lock:
            self._write(texts)

    def _write(self, texts: Mapping[int, str]) -> None:
        for pid in set(self._texts) - set(texts):
            shutil.rmtree(self.root / str(pid), ignore_errors=True)
        for pid, text in texts.items():
            if self._texts.get(pid) == text:
                continue
            folder = self.root / str(pid)
            folder.mkdir(parents=True, exist_ok=True)
            # Renamed into place: a reader sees the whole file or none.
            partial = folder / "cgroup.partial"
            partial.write_text(text)
            os.replace(partial, folder / "cgroup")
        self._texts = dict(texts)


def cgroup_text(pod: PodSpec, container: PodContainer) -> str:
    """The text of ``/proc/PID/cgroup`` for a process of ``container``.

    The shapes of tests/test_pod_cgroups.py, which exporter/kubernetes/cgroups.py cites: the
    kubelet's pod cgroups (systemd ``kubepods-<qos>-pod<uid_with_underscores>.slice``, cgroupfs
    ``<qos>/pod<uid>``; a guaranteed pod sits under kubepods itself) and the runtime's container
    cgroup (containerd ``cri-containerd-<id>.scope`` or ``<id>``, CRI-O ``crio-<id>.scope`` or
    ``crio-<id>``). cgroup v1 has a line per hierarchy; ``namespaced`` is what a reader in a
    private cgroup namespace sees, relative to its own root.
    """
    systemd_uid = pod.uid.replace("-", "_")
    qos = "" if pod.qos == "guaranteed" else pod.qos
    cid = container.id
    if container.runtime == "cri-o":
        scope, directory = f"crio-{cid}.scope", f"crio-{cid}"
    else:
        scope, directory = f"cri-containerd-{cid}.scope", cid
    if qos:
        slices = f"kubepods-{qos}.slice/kubepods-{qos}-pod{systemd_uid}.slice/{scope}"
        cgroupfs = f"/kubepods/{qos}/pod{pod.uid}/{directory}"
    else:
        slices = f"kubepods-pod{systemd_uid}.slice/{scope}"
        cgroupfs = f"/kubepods/pod{pod.uid}/{directory}"
    systemd = f"/kubepods.slice/{slices}"
    shape = container.cgroup
    if shape == "systemd-v2":
        return f"0::{systemd}\n"
    if shape == "cgroupfs-v2":
        return f"0::{cgroupfs}\n"
    if shape == "namespaced":
        return f"0::/../../{slices}\n"
    path = systemd if shape == "systemd-v1" else cgroupfs
    return f"12:hugetlb:/\n11:memory:{path}\n10:cpu,cpuacct:{path}\n1:name=systemd:/\n"


def pod_object(pod: PodSpec, node: str, seed: int) -> dict[str, Any]:
    """The pod as the API server writes it in a v1 PodList (the fields gpuload reads).

    Only the nearest owner is referenced, as Kubernetes does: a ReplicaSet names its Deployment
    in its own ownerReferences, not in its pods'.
    """
    metadata: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
    if pod.labels:
        metadata["labels"] = dict(pod.labels)
    if pod.owners:
        kind, name = pod.owners[0]
        metadata["ownerReferences"] = [
            {
                "apiVersion": _API_VERSIONS.get(kind, "v1"),
                "kind": kind,
                "name": name,
                "uid": made_uid(seed, "owner", pod.namespace, kind, name),
                "controller": True,
            }
        ]
    statuses = [
        {"name": c.name, "containerID": f"{_CONTAINER_SCHEMES[c.runtime]}://{c.id}"}
        for c in pod.containers
    ]
    return {
        "metadata": metadata,
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "qosClass": POD_QOS_CLASSES[pod.qos],
            "containerStatuses": statuses,
        },
    }


class Devices:
    """Names of the simulated GPUs and MIG devices as the device plugin and DRA driver give them."""

    def __init__(self, library: SimulatedNvml) -> None:
        self._gpus = library.gpus

    def gpu_uuid(self, index: int) -> str:
        """A GPU's UUID (nvmlDeviceGetUUID)."""
        return self._gpus[index].uuid

    def mig(self, index: int, instance: int) -> tuple[str, str]:
        """(resource name, MIG device UUID) of a GPU instance's first compute instance."""
        device = next(m for m in self._gpus[index].mig if m.gpu_instance_id == instance)
        return f"nvidia.com/mig-{device.spec.profile}", device.uuid

    def dra_gpu_name(self, index: int) -> str:
        """The DRA driver's name of a whole GPU: ``gpu-<minor>`` (deviceinfo.go CanonicalName).

        The simulator answers nvmlDeviceGetMinorNumber with the GPU's index.
        """
        return f"gpu-{index}"

    def dra_mig_name(self, index: int, instance: int) -> str:
        """The DRA driver's name of a MIG device (mig.go ToCanonicalName).

        ``gpu-<parent minor>-mig-<profile, dots dropped, RFC 1123>-<GI profile id>-<placement
        start>``, with the profile id and placement start the simulated nvmlGpuInstanceGetInfo
        answers for that GPU instance.
        """
        gpu = self._gpus[index]
        spec = next(m.spec for m in gpu.mig if m.gpu_instance_id == instance)
        profile = MIG_PROFILES[gpu.model.mig_profiles][spec.profile]
        name = _rfc1123(spec.profile.replace(".", ""))
        return f"gpu-{index}-mig-{name}-{profile.profile_id}-{spec.placement_start}"


def _rfc1123(name: str) -> str:
    # mig.go toRFC1123Compliant: lower case, anything but [a-z0-9-.] to "-", "-" trimmed.
    return re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-").removesuffix(".")[:253]


def pod_resources(pod: PodSpec, devices: Devices, node: str) -> api.PodResources:
    """The pod as the kubelet's PodResources List describes it."""
    containers = []
    for container in pod.containers:
        by_resource: dict[str, list[str]] = {}
        for index in container.gpus:
            by_resource.setdefault(GPU_RESOURCE, []).append(devices.gpu_uuid(index))
        for index, replica in container.shared:
            by_resource.setdefault(GPU_RESOURCE, []).append(f"{devices.gpu_uuid(index)}::{replica}")
        for index, instance in container.mig:
            resource, uuid = devices.mig(index, instance)
            by_resource.setdefault(resource, []).append(uuid)
        containers.append(
            api.ContainerResources(
                name=container.name,
                devices=[
                    api.ContainerDevices(resource_name=resource, device_ids=ids)
                    for resource, ids in by_resource.items()
                ],
                dynamic_resources=claim_resources(pod, container, devices, node),
            )
        )
    return api.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


def claim_resources(
    pod: PodSpec, container: PodContainer, devices: Devices, node: str
) -> list[api.DynamicResource]:
    """A container's DRA claim as NVIDIA's DRA driver publishes it (cmd/gpu-kubelet-plugin/).

    One ClaimResource per device: driver ``gpu.nvidia.com``, pool the node's name, the device's
    canonical name, and its CDI device ``k8s.gpu.nvidia.com/claim=<claim UID>-<device name>``
    (cdi.go GetClaimDeviceName).
    """
    claim = container.claim
    if claim is None:
        return []
    names = [devices.dra_gpu_name(i) for i in claim.gpus]
    names += [devices.dra_mig_name(i, instance) for i, instance in claim.mig]
    return [
        api.DynamicResource(
            claim_name=claim.name,
            claim_namespace=pod.namespace,
            claim_resources=[
                api.ClaimResource(
                    driver_name=DRA_DRIVER,
                    pool_name=node,
                    device_name=name,
                    cdi_devices=[api.CDIDevice(name=f"{_CDI_KIND}={claim.uid}-{name}")],
                )
                for name in names
            ],
        )
    ]


# The cgroup (v2, systemd) of a process the node runs outside Kubernetes.
HOST_CGROUP = "0::/system.slice/gpu-benchmark.service\n"


class SimulatedKubelet:
    """The scenario's kubelet: PodResources socket, pod list and /proc tree, while started."""

    def __init__(self, library: SimulatedNvml, *, proc_refresh: float = PROC_REFRESH_SECONDS):
        kubernetes = library.scenario.kubernetes
        if kubernetes is None:
            raise ValueError(f"scenario {library.scenario.name} has no kubernetes section")
        self.node = kubernetes.node
        self._library = library
        self._pods = kubernetes.pods
        self._seed = library.scenario.seed
        self._clock = library.elapsed
        self._devices = Devices(library)
        self._proc_refresh = proc_refresh
        self.folder = Path(tempfile.mkdtemp(prefix="gpuload-kubelet-"))
        self.proc = ProcTree(self.folder / "proc")
        self.proc.root.mkdir()
        self.pod_resources_server = PodResourcesServer(
            self.folder / "kubelet.sock", self.pod_resources
        )
        self.pod_list_server = PodListServer(self.node, self.pod_list)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._refresh_proc, name="simulated-proc", daemon=True
        )

    @property
    def collector_options(self) -> dict[str, Any]:
        """The ``kubernetes`` collector's options that point it at this kubelet."""
        return {
            "socket": str(self.pod_resources_server.socket_path),
            "pods": f"{self.pod_list_server.url}?fieldSelector=spec.nodeName={self.node}",
            "proc": str(self.proc.root),
            "on_kubernetes": True,
        }

    def start(self) -> SimulatedKubelet:
        """Serve the socket and the pod list, and keep the /proc tree current; return self."""
        self.refresh()
        self.pod_resources_server.start()
        self.pod_list_server.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the folder."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.pod_resources_server.stop()
        self.pod_list_server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def running(self) -> list[PodSpec]:
        """The pods running at the scenario time now."""
        t = self._clock()
        return [pod for pod in self._pods if pod.running(t)]

    def pod_resources(self) -> list[api.PodResources]:
        """The PodResources List answer now."""
        return [pod_resources(pod, self._devices, self.node) for pod in self.running()]

    def pod_list(self) -> list[dict[str, Any]]:
        """The items of the v1 PodList now."""
        return [pod_object(pod, self.node, self._seed) for pod in self.running()]

    def refresh(self) -> None:
        """Rewrite the /proc tree: the processes of the pods running now, and the node's own."""
        t = self._clock()
        # A GPU process outside any pod (a job started on the host) is a systemd service's.
        texts = {
            process.pid: HOST_CGROUP
            for gpu in self._library.gpus
            for kind in ("compute", "graphics")
            for process in gpu.processes(t, kind)
        }
        texts.update(
            {
                pid: cgroup_text(pod, container)
                for pod in self.running()
                for container in pod.containers
                for pid in container.pids
            }
        )
        self.proc.write(texts)

    def _refresh_proc(self) -> None:
        while not self._stop.wait(self._proc_refresh):
            try:
                self.refresh()
            except OSError as error:
                log.warning("simulated kubelet: cannot write %s: %s", self.proc.root, error)
