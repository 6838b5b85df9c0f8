"""A fake kubelet: a real gRPC PodResourcesLister (List, Get) on a unix socket.

It serves hand-made pods with the simulated kubelet's server (exporter/sim/kubelet.py).

The golden files (``tools/golden.py``) and the tests allocate GPUs to pods with it.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from exporter import nvml, sim
from exporter.kubernetes import podresources_v1_pb2 as api
from exporter.sim.kubelet import PodResourcesServer


@dataclass
class Pod:
    """A pod the fake kubelet reports, with the devices allocated to each container.

    ``claims`` are Dynamic Resource Allocation claims, reported as the kubelet does in
    ``dynamic_resources``: each (claim name, driver name, [device names]) is a ResourceClaim in
    the pod's namespace whose devices come from one pool, ``node``. A device's CDI name is the
    one NVIDIA's DRA driver gives it (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/cdi.go
    GetClaimDeviceName: ``k8s.<driver>/claim=<claim UID>-<device name>``).
    """

    namespace: str
    name: str
    # container name -> [(resource name, [device ids])]
    containers: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)
    # container name -> [(claim name, driver name, [device names])]
    claims: dict[str, list[tuple[str, str, list[str]]]] = field(default_factory=dict)

    def message(self) -> api.PodResources:
        """The pod as the PodResources API describes it."""
        names = dict.fromkeys([*self.containers, *self.claims])
        return api.PodResources(
            name=self.name,
            namespace=self.namespace,
            containers=[
                api.ContainerResources(
                    name=container,
                    devices=[
                        api.ContainerDevices(
                            resource_name=resource,
                            device_ids=ids,
                            topology=api.TopologyInfo(nodes=[api.NUMANode(ID=0)]),
                        )
                        for resource, ids in self.containers.get(container, [])
                    ],
                    cpu_ids=[2, 3],
                    dynamic_resources=[
                        self._claim(*claim) for claim in self.claims.get(container, [])
                    ],
                )
                for container in names
            ],
        )

    def _claim(self, name: str, driver: str, devices: list[str]) -> api.DynamicResource:
        uid = uuid.uuid5(uuid.NAMESPACE_URL, f"claim:{self.namespace}/{name}")
        return api.DynamicResource(
            claim_name=name,
            claim_namespace=self.namespace,
            claim_resources=[
                api.ClaimResource(
                    driver_name=driver,
                    pool_name="node",
                    device_name=device,
                    cdi_devices=[api.CDIDevice(name=f"k8s.{driver}/claim={uid}-{device}")],
                )
                for device in devices
            ],
        )


class FakeKubelet:
    """Serves `pods`; while `hanging` is set, every call waits until released or stopped."""

    def __init__(self, socket_path: Path, pods: list[Pod]) -> None:
        self.socket_path = socket_path
        self.pods = pods
        self.calls = 0
        self.hanging = threading.Event()
        self._released = threading.Event()
        self._server = PodResourcesServer(
            socket_path,
            lambda: [pod.message() for pod in self.pods],
            before_call=self._wait_if_hanging,
        )

    def start(self) -> FakeKubelet:
        """Start serving; return self."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Release any hanging call and stop serving."""
        self._released.set()
        self._server.stop()

    def _wait_if_hanging(self, context: grpc.ServicerContext) -> None:
        self.calls += 1
        while self.hanging.is_set() and not self._released.wait(0.05):
            if not context.is_active():
                return


def short_socket_dir() -> Path:
    """A folder for a unix socket: its path must stay under 108 bytes, unlike pytest's tmp_path."""
    return Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))


def remove(folder: Path) -> None:
    """Remove a socket's folder and what is in it."""
    shutil.rmtree(folder, ignore_errors=True)


def mig_node_kubelet(scenario: str, seed: int) -> tuple[FakeKubelet, Path]:
    """A kubelet allocating the first MIG device of each GPU of `scenario` to a pod.

    Returns the started server and a gpuload config file pointing the kubernetes
    collector at it (in the socket's folder, removed by `stop_and_remove`).
    """
    sim.install(scenario, seed=seed, pinned_time=0)
    nvml.init()
    try:
        pods = []
        for index in range(nvml.device_count()):
            instance = nvml.device(index).mig_devices()[0]
            resource = f"nvidia.com/mig-{instance.profile}"
            uuid = instance.device.identity().uuid
            pods.append(Pod("ml", f"train-{index}", {"main": [(resource, [uuid])]}))
    finally:
        nvml.shutdown()
        sim.uninstall()
    folder = short_socket_dir()
    server = FakeKubelet(folder / "kubelet.sock", pods).start()
    config = folder / "gpuload.yaml"
    config.write_text(f"collectors:\n  kubernetes:\n    socket: {server.socket_path}\n")
    return server, config


def stop_and_remove(server: FakeKubelet) -> None:
    """Stop the kubelet and remove its socket's folder."""
    server.stop()
    remove(server.socket_path.parent)
