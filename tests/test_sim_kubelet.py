"""The simulated kubelet of a scenario's ``kubernetes:`` section, on the scenario's clock.

Its answers are read the way gpuload reads a real kubelet's: PodResources over the real unix
socket (grpcio), the PodList over HTTP, the /proc tree with exporter.kubernetes.cgroups. The
scenario time is a clock the tests move by hand; nothing waits on the wall clock.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pynvml
import pytest
import requests
import yaml
from helpers import Clock, series, wait_until

from exporter import nvml, sim
from exporter.kubernetes import podresources_v1_pb2 as api
from exporter.kubernetes.cgroups import PodCgroup, pod_of
from exporter.sim.kubelet import SimulatedKubelet
from exporter.sim.scenario import SCENARIO_DIR, ScenarioError, parse_scenario

PODS = yaml.safe_load((SCENARIO_DIR / "pods.yaml").read_text())
NIGHTLY = "nightly-eval-28911520-7xk2p"  # ends at 6m
BEFORE, AFTER = 60.0, 400.0  # scenario seconds either side of its end


def document() -> dict[str, Any]:
    return copy.deepcopy(PODS)


def pod_entry(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(pod for pod in doc["kubernetes"]["pods"] if pod["name"] == name)


@pytest.fixture
def start() -> Iterator[Callable[..., tuple[SimulatedKubelet, Clock]]]:
    """Start the kubelet of a scenario document (pods.yaml by default) at scenario time 60 s."""
    started: list[SimulatedKubelet] = []

    def run(doc: dict[str, Any] | None = None) -> tuple[SimulatedKubelet, Clock]:
        clock = Clock(BEFORE)
        library = sim.install(parse_scenario(doc or document(), "pods"), clock=clock, epoch=0)
        kubelet = SimulatedKubelet(library, proc_refresh=3600).start()
        started.append(kubelet)
        return kubelet, clock

    yield run
    for kubelet in started:
        kubelet.stop()
    sim.uninstall()


def uuids() -> dict[str, str]:
    """GPU index (and ``index/gpu instance`` for MIG devices) -> UUID, as NVML reports them."""
    found = {}
    nvml.init()
    try:
        for index in range(nvml.device_count()):
            device = nvml.device(index)
            found[str(index)] = device.identity().uuid
            for instance in device.mig_devices() if device.mig_mode_enabled() else []:
                found[f"{index}/{instance.gpu_instance}"] = instance.device.identity().uuid
    finally:
        nvml.shutdown()
    return found


# -- the schema ------------------------------------------------------------------------------


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = re.findall(r"[^.\[\]]+", path)
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_set("kubernetes", []), "kubernetes: expected a mapping"),
        (_set("kubernetes.pods.0.image", "x"), "kubernetes.pods[0].image: unknown key"),
        (
            _set("kubernetes.pods.0.containers.0.gpus", [8]),
            "kubernetes.pods[0].containers[0].gpus[0]: expected an integer 0..7",
        ),
        (
            _set("kubernetes.pods.0.containers.0.gpus", [3]),
            "kubernetes.pods[0].containers[0].gpus[0]: GPU 3 is in MIG mode: "
            "allocate its instances with mig",
        ),
        (
            _set("kubernetes.pods.5.containers.0.mig", [{"gpu": 3, "instance": 7}]),
            "kubernetes.pods[5].containers[0].mig[0].instance: "
            "expected a GPU instance id of GPU 3: 2, 3",
        ),
        (
            _set("kubernetes.pods.5.containers.0.mig", [{"gpu": 0, "instance": 1}]),
            "kubernetes.pods[5].containers[0].mig[0].gpu: GPU 0 is not in MIG mode (no mig list)",
        ),
        (
            _set("kubernetes.pods.1.containers.0.pids", [5101]),
            "kubernetes.pods[1].containers[0].pids[0]: "
            "PID 5101 already belongs to pod research/trainer-7d9f8-x2k4q",
        ),
        (
            _set("kubernetes.pods.0.owners", ["trainer-7d9f8"]),
            "kubernetes.pods[0].owners[0]: expected Kind/name, e.g. ReplicaSet/trainer-7d9f8",
        ),
        (
            _set("kubernetes.pods.0.qos", "gold"),
            "kubernetes.pods[0].qos: expected one of besteffort, burstable, guaranteed",
        ),
        (
            _set("kubernetes.pods.0.containers.0.cgroup", "v3"),
            "kubernetes.pods[0].containers[0].cgroup: expected one of cgroupfs-v1, cgroupfs-v2, "
            "namespaced, systemd-v1, systemd-v2",
        ),
        (
            _set("kubernetes.pods.8.until", 0),
            "kubernetes.pods[8].until: must be later than 'from'",
        ),
        (
            _set("kubernetes.pods.7.containers.0.claim", {"name": "vllm-gpu"}),
            "kubernetes.pods[7].containers[0].claim: expected gpus or mig: "
            "the devices the claim was allocated",
        ),
        (
            _set("gpus.2.overrides.processes.0.weight", 0),
            "gpus[2].overrides.processes[0].weight: expected a number greater than 0"
            " (the process's share of the load)",
        ),
    ],
)
def test_a_bad_kubernetes_section_is_one_line_naming_the_key(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = document()
    change(doc)
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(doc, "pods")
    assert str(raised.value) == message


# -- PodResources ------------------------------------------------------------------------------


def list_pods(kubelet: SimulatedKubelet) -> dict[str, api.PodResources]:
    with grpc.insecure_channel(f"unix:{kubelet.pod_resources_server.socket_path}") as channel:
        call = channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=api.ListPodResourcesRequest.SerializeToString,
            response_deserializer=api.ListPodResourcesResponse.FromString,
        )
        answer = call(api.ListPodResourcesRequest(), timeout=30)
    return {pod.name: pod for pod in answer.pod_resources}


def get_pod(kubelet: SimulatedKubelet, namespace: str, name: str) -> api.PodResources:
    with grpc.insecure_channel(f"unix:{kubelet.pod_resources_server.socket_path}") as channel:
        call = channel.unary_unary(
            "/v1.PodResourcesLister/Get",
            request_serializer=api.GetPodResourcesRequest.SerializeToString,
            response_deserializer=api.GetPodResourcesResponse.FromString,
        )
        request = api.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        return call(request, timeout=30).pod_resources


def devices(pod: api.PodResources) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (container.name, found.resource_name, tuple(found.device_ids))
        for container in pod.containers
        for found in container.devices
    ]


def test_list_answers_the_running_pods_with_their_devices(start: Callable[..., Any]) -> None:
    kubelet, clock = start()
    gpu = uuids()
    pods = list_pods(kubelet)
    assert len(pods) == 9
    assert devices(pods["trainer-7d9f8-x2k4q"]) == [("main", "nvidia.com/gpu", (gpu["0"],))]
    # NVIDIA's device plugin numbers a time-sliced GPU's replicas.
    shared = [devices(pods[name]) for name in ("ranker-5c6b7-8vd2m", "tagger-6f4d9-qq7lz")]
    assert shared == [
        [("server", "nvidia.com/gpu", (f"{gpu['2']}::0",))],
        [("server", "nvidia.com/gpu", (f"{gpu['2']}::1",))],
    ]
    assert devices(pods["finetune-lora"]) == [("main", "nvidia.com/gpu", (f"{gpu['2']}::2",))]
    assert devices(pods["llm-serve-0"]) == [("triton", "nvidia.com/mig-3g.40gb", (gpu["3/2"],))]
    assert devices(pods["embed-7b9c5-k2m8n"]) == [
        ("triton", "nvidia.com/mig-2g.20gb", (gpu["3/3"],))
    ]
    assert devices(pods[NIGHTLY]) == [("eval", "nvidia.com/gpu", (gpu["5"],))]
    assert pods["vllm-0"].namespace == "inference"
    assert devices(pods["vllm-0"]) == []
    assert get_pod(kubelet, "research", NIGHTLY) == pods[NIGHTLY]

    clock.now = AFTER
    assert NIGHTLY not in list_pods(kubelet)
    assert len(list_pods(kubelet)) == 8
    with pytest.raises(grpc.RpcError) as raised:
        get_pod(kubelet, "research", NIGHTLY)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_dra_claim_is_published_as_nvidias_dra_driver_does(start: Callable[..., Any]) -> None:
    kubelet, _ = start()
    claim = list_pods(kubelet)["vllm-0"].containers[0].dynamic_resources
    pynvml.nvmlInit()
    try:
        minor = pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(4))
    finally:
        pynvml.nvmlShutdown()
    uid = pod_entry(PODS, "vllm-0")["containers"][0]["claim"].get("uid")
    assert uid is None  # made from the seed: read it back from the CDI device's name
    (resource,) = claim[0].claim_resources
    uid = resource.cdi_devices[0].name.removeprefix("k8s.gpu.nvidia.com/claim=")[:36]
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", uid)
    assert list(claim) == [
        api.DynamicResource(
            claim_name="vllm-gpu",
            claim_namespace="inference",
            claim_resources=[
                api.ClaimResource(
                    driver_name="gpu.nvidia.com",
                    pool_name="gpu-node-7",
                    device_name=f"gpu-{minor}",
                    cdi_devices=[api.CDIDevice(name=f"k8s.gpu.nvidia.com/claim={uid}-gpu-{minor}")],
                )
            ],
        )
    ]


def test_a_mig_claim_names_each_device_by_profile_id_and_placement(
    start: Callable[..., Any],
) -> None:
    """mig.go ToCanonicalName: gpu-<minor>-mig-<profile without dots>-<GI profile id>-<start>.

    The profile id is the GPU instance profile's id (nvmlGpuInstanceProfileInfo_t.id, as
    `nvidia-smi mig -lgip` lists it): 3g.40gb is 9, at memory slices 4-7; 2g.20gb is 14 at 0-1;
    1g.10gb+me is 20 at 2, its "+" made "-".
    """
    doc = document()
    doc["gpus"][3]["mig"].append({"profile": "1g.10gb+me"})
    claim = {"name": "split", "uid": "0f0e0d0c-0b0a-4909-8807-060504030201"}
    claim["mig"] = [{"gpu": 3, "instance": n} for n in (2, 3, 7)]  # type: ignore[assignment]
    pod_entry(doc, "vllm-0")["containers"][0]["claim"] = claim
    kubelet, _ = start(doc)
    (dynamic,) = list_pods(kubelet)["vllm-0"].containers[0].dynamic_resources
    names = [resource.device_name for resource in dynamic.claim_resources]
    assert names == ["gpu-3-mig-3g40gb-9-4", "gpu-3-mig-2g20gb-14-0", "gpu-3-mig-1g10gb-me-20-2"]
    cdi = [resource.cdi_devices[0].name for resource in dynamic.claim_resources]
    assert cdi == [f"k8s.gpu.nvidia.com/claim={claim['uid']}-{name}" for name in names]


# -- the PodList -------------------------------------------------------------------------------


def test_the_pod_list_has_the_api_servers_shape(start: Callable[..., Any]) -> None:
    kubelet, clock = start()
    answer = requests.get(kubelet.collector_options["pods"], timeout=30)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "application/json"
    pod_list = answer.json()
    assert (pod_list["kind"], pod_list["apiVersion"]) == ("PodList", "v1")
    items = {item["metadata"]["name"]: item for item in pod_list["items"]}
    assert len(items) == 9
    trainer = items["trainer-7d9f8-x2k4q"]
    uid = trainer["metadata"]["uid"]
    owner_uid = trainer["metadata"]["ownerReferences"][0]["uid"]
    (container_id,) = [c["containerID"] for c in trainer["status"]["containerStatuses"]]
    assert re.fullmatch(r"containerd://[0-9a-f]{64}", container_id)
    assert trainer == {
        "metadata": {
            "name": "trainer-7d9f8-x2k4q",
            "namespace": "research",
            "uid": uid,
            "labels": {"team": "vision", "app": "trainer"},
            # Only the nearest owner: the ReplicaSet, whose own owner is the Deployment.
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7d9f8",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": "gpu-node-7"},
        "status": {
            "phase": "Running",
            "qosClass": "Burstable",
            "containerStatuses": [{"name": "main", "containerID": container_id}],
        },
    }
    assert "ownerReferences" not in items["notebook-ana"]["metadata"]  # a bare pod
    assert items["notebook-ana"]["status"]["qosClass"] == "BestEffort"
    assert items["llm-serve-0"]["status"]["qosClass"] == "Guaranteed"
    job = items[NIGHTLY]["metadata"]["ownerReferences"][0]
    assert (job["apiVersion"], job["kind"], job["name"]) == (
        "batch/v1",
        "Job",
        "nightly-eval-28911520",
    )
    ranker = items["ranker-5c6b7-8vd2m"]["status"]["containerStatuses"][0]["containerID"]
    assert ranker.startswith("cri-o://")

    clock.now = AFTER
    later = requests.get(kubelet.collector_options["pods"], timeout=30).json()["items"]
    assert NIGHTLY not in {item["metadata"]["name"] for item in later}
    assert len(later) == 8


def test_the_pod_list_honours_the_node_field_selector(start: Callable[..., Any]) -> None:
    kubelet, _ = start()
    base = kubelet.pod_list_server.url
    node = requests.get(base, params={"fieldSelector": "spec.nodeName=gpu-node-7"}, timeout=30)
    assert len(node.json()["items"]) == 9
    other = requests.get(base, params={"fieldSelector": "spec.nodeName=gpu-node-8"}, timeout=30)
    assert other.json() == {"kind": "PodList", "apiVersion": "v1", "items": []}
    unknown = requests.get(base, params={"fieldSelector": "metadata.name=x"}, timeout=30)
    assert unknown.status_code == 400
    assert requests.get(base.replace("/pods", "/nodes"), timeout=30).status_code == 404


# -- /proc -------------------------------------------------------------------------------------


def test_each_process_cgroup_names_its_pod_and_container(start: Callable[..., Any]) -> None:
    kubelet, clock = start()
    items = json.loads(requests.get(kubelet.pod_list_server.url, timeout=30).text)["items"]
    # The benchmark on GPU 6 runs outside any pod: its cgroup is the host's.
    expected: dict[int, PodCgroup | None] = {7301: None}
    for pod in PODS["kubernetes"]["pods"]:
        item = next(i for i in items if i["metadata"]["name"] == pod["name"])
        for container, status in zip(
            pod["containers"], item["status"]["containerStatuses"], strict=True
        ):
            container_id = status["containerID"].split("://")[1]
            for pid in container["pids"]:
                expected[pid] = PodCgroup(item["metadata"]["uid"], container_id)
    root = Path(kubelet.collector_options["proc"])
    found = {int(pid): pod_of((root / pid / "cgroup").read_text()) for pid in os.listdir(root)}
    assert found == expected
    # Every shape the scenario asks for is there: v2 and v1, both drivers, a cgroup namespace.
    texts = {pid: (root / str(pid) / "cgroup").read_text() for pid in expected}
    assert texts[7301].startswith("0::/system.slice/")
    assert texts[5201].startswith("0::/kubepods/besteffort/pod")
    assert "/crio-" in texts[5301]
    assert texts[5401].startswith("0::/../../kubepods-burstable.slice/")
    assert texts[5501].startswith("12:hugetlb:/\n11:memory:/kubepods.slice/")
    assert texts[5601].startswith("12:hugetlb:/\n11:memory:/kubepods/pod")  # guaranteed
    assert texts[5651].startswith("0::/kubepods.slice/kubepods-pod")

    clock.now = AFTER
    kubelet.refresh()
    assert sorted(int(pid) for pid in os.listdir(root)) == sorted(set(expected) - {5801})


# -- NVML --------------------------------------------------------------------------------------


def compute_pids(index: int) -> set[int]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    if pynvml.nvmlDeviceGetMigMode(handle)[0]:
        return {
            process.pid
            for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
            for process in _mig_processes(handle, slot)
        }
    return {process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def _mig_processes(handle: Any, slot: int) -> list[Any]:
    try:
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
    except pynvml.NVMLError_NotFound:
        return []
    return list(pynvml.nvmlDeviceGetComputeRunningProcesses(mig))


def test_nvml_lists_no_process_of_a_pod_that_is_not_running() -> None:
    doc = document()
    # The pods end while their GPUs' phases still list their processes.
    pod_entry(doc, NIGHTLY)["until"] = "3m"
    pod_entry(doc, "embed-7b9c5-k2m8n")["until"] = "3m"
    pod_entry(doc, "trainer-7d9f8-x2k4q")["from"] = "2m"
    clock = Clock(BEFORE)
    sim.install(parse_scenario(doc, "pods"), clock=clock, epoch=0)
    pynvml.nvmlInit()
    try:
        assert (compute_pids(0), compute_pids(3), compute_pids(5)) == (set(), {5601, 5651}, {5801})
        clock.now = 200.0
        assert (compute_pids(0), compute_pids(3), compute_pids(5)) == ({5101}, {5601}, set())
        assert compute_pids(6) == {7301}  # a process outside any pod runs on
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall()


def test_process_utilization_is_split_by_weight() -> None:
    doc = document()
    doc["gpus"][2]["overrides"]["utilization"] = 0.6
    sim.install(parse_scenario(doc, "pods"), pinned_time=BEFORE)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(2)
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall()
    # Weights 3, 1 and 2 of 60 %.
    assert {sample.pid: sample.smUtil for sample in samples} == {5301: 30, 5401: 10, 5501: 20}


# -- gpuload serve -----------------------------------------------------------------------------


def test_serve_simulate_pods_attributes_gpus_to_pods(daemon_factory: Callable[..., Any]) -> None:
    daemon = daemon_factory(
        "--simulate", "pods", "--sim.time", str(BEFORE), "--collect.interval", "200ms"
    )
    wait_until(lambda: series(daemon.metrics(), "gpu_pod_info"), timeout=30, what="gpu_pod_info")
    found = {
        (labels["gpu"], labels["mig_instance"], labels["namespace"], labels["pod"])
        for labels in map(dict, series(daemon.metrics(), "gpu_pod_info"))
    }
    assert found >= {
        ("0", "", "research", "trainer-7d9f8-x2k4q"),
        ("1", "", "notebooks", "notebook-ana"),
        ("2", "", "inference", "ranker-5c6b7-8vd2m"),
        ("2", "", "inference", "tagger-6f4d9-qq7lz"),
        ("2", "", "research", "finetune-lora"),
        ("3", "2", "inference", "llm-serve-0"),
        ("3", "3", "inference", "embed-7b9c5-k2m8n"),
        ("5", "", "research", NIGHTLY),
    }
    assert not {gpu for gpu, *_ in found} & {"6", "7"}
    assert dict(series(daemon.metrics(), "gpuload_kubernetes_pod_resources_up")) == {(): 1.0}
    socket = re.search(r"pod resources at (\S+)", daemon.log())
    assert socket is not None
    assert daemon.stop() == 0
    assert not Path(socket.group(1)).parent.exists()  # the kubelet's folder goes with it
