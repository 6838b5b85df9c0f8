"""GPUs allocated through Dynamic Resource Allocation (DRA) claims, attributed to their pods.

The claims come as the kubelet reports them (PodResources List, ``dynamic_resources``) from a
real gRPC server (tools/kubelet.py), with devices named as NVIDIA's DRA driver names them
(https://github.com/NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go):
``gpu-<minor>`` and ``gpu-<minor>-mig-<profile>-<GPU instance profile id>-<placement start>``.
The GPUs are the simulated NVML's, whose minor numbers are their indices.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import exposition_text, parse_metrics, series, value_of, wait_until

from exporter import nvml, sim
from exporter.collection import Collection
from exporter.collectors import Reader
from exporter.collectors.kubernetes import DRA_DRIVER, Target, read_directory, resolve
from exporter.kubernetes import Allocation
from exporter.kubernetes.podresources import PodResourcesClient
from tools.kubelet import FakeKubelet, Pod, remove, short_socket_dir

LOGGER = "exporter.collectors.kubernetes"


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    folder = short_socket_dir()
    yield folder
    remove(folder)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[Callable[[list[Pod]], FakeKubelet]]:
    started: list[FakeKubelet] = []

    def start(pods: list[Pod]) -> FakeKubelet:
        server = FakeKubelet(socket_dir / "kubelet.sock", pods).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def collections() -> Iterator[list[Collection]]:
    opened: list[Collection] = []
    yield opened
    for collection in opened:
        collection.close()
    sim.uninstall()


def node(scenario: str, socket: Path, caller: str = "root") -> Collection:
    sim.install(scenario, pinned_time=30, caller=caller)
    # A List deadline far above what an answer takes: no test here is about a slow kubelet.
    settings = {"socket": str(socket), "refresh": 0.1, "timeout": 15.0}
    return Collection({"kubernetes": True}, timeout=15, options={"kubernetes": settings})


def scrape(collection: Collection) -> dict:
    return parse_metrics(exposition_text(collection.run_cycle()))


def cycle_until(collection: Collection, condition: Callable[[dict], bool]) -> dict:
    """Run cycles until one's samples meet `condition`; 30 s at most, which only a defect takes."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        samples = scrape(collection)
        if condition(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def pod_info(samples: dict) -> list[tuple[str, str, str, str]]:
    """(pod, container, gpu, mig_instance) of each gpu_pod_info series."""
    found = [dict(labels) for labels in series(samples, "gpu_pod_info")]
    return sorted((s["pod"], s["container"], s["gpu"], s["mig_instance"]) for s in found)


def uuids(samples: dict) -> dict[str, str]:
    return {dict(labels)["gpu"]: dict(labels)["uuid"] for labels in series(samples, "gpu_up")}


def claim(name: str, *devices: str, driver: str = DRA_DRIVER) -> tuple[str, str, list[str]]:
    return (name, driver, list(devices))


def test_list_flattens_claims_into_allocations_beside_device_plugin_devices(
    kubelet: Callable[[list[Pod]], FakeKubelet], socket_dir: Path
) -> None:
    kubelet(
        [
            Pod(
                "ml",
                "train",
                {"main": [("nvidia.com/gpu", ["GPU-1"])]},
                {"main": [claim("pair", "gpu-0", "gpu-1")], "sidecar": [claim("slice", "gpu-2")]},
            )
        ]
    )
    client = PodResourcesClient(str(socket_dir / "kubelet.sock"), timeout=15)
    try:
        pending = client.start_list()
        wait_until(pending.done, timeout=30, what="the List answer")
        assert pending.result() == [
            Allocation("ml", "train", "main", "nvidia.com/gpu", "GPU-1"),
            Allocation("ml", "train", "main", DRA_DRIVER, "gpu-0", "ml/pair"),
            Allocation("ml", "train", "main", DRA_DRIVER, "gpu-1", "ml/pair"),
            Allocation("ml", "train", "sidecar", DRA_DRIVER, "gpu-2", "ml/slice"),
        ]
    finally:
        client.close()


@pytest.fixture
def h200_directory() -> Iterator[dict[str, Target]]:
    # The recorded H200's layout: 3g.71gb in GPU instance 2 (two compute instances), 2g.35gb in
    # 3, 1g.18gb in 9 and 10, at memory slices 4, 0, 2 and 3.
    sim.install("h200-mig", pinned_time=0, caller="root")
    nvml.init()
    try:
        yield read_directory(Reader())
    finally:
        nvml.shutdown()
        sim.uninstall()


@pytest.mark.parametrize(
    ("device_name", "gpu_instance"),
    [
        ("gpu-0", ""),
        ("gpu-0-mig-3g71gb-9-4", "2"),
        ("gpu-0-mig-2g35gb-14-0", "3"),
        ("gpu-0-mig-1g18gb-19-2", "9"),
        ("gpu-0-mig-1g18gb-19-3", "10"),
        ("gpu-1", None),  # no GPU has minor number 1
        ("gpu-0-mig-1g18gb-19-5", None),  # no GPU instance starts there
        ("gpu-0-mig-3g71gb-9-0", None),
        ("gpu-1-mig-3g71gb-9-4", None),
        ("gpu-vfio-0", None),
        ("gpu0", None),
    ],
)
def test_dra_device_names_resolve_by_minor_number_profile_id_and_placement(
    h200_directory: dict[str, Target], device_name: str, gpu_instance: str | None
) -> None:
    gpu = h200_directory["0"]
    expected = None if gpu_instance is None else Target("0", gpu.uuid, gpu_instance)
    assert resolve(device_name, h200_directory) == expected


def test_claims_on_a_whole_gpu_and_on_mig_devices_give_gpu_pod_info(
    kubelet: Callable[[list[Pod]], FakeKubelet],
    socket_dir: Path,
    collections: list[Collection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    # h100-mig: GPU 0 in MIG mode with 3g.40gb in GPU instance 1 (memory slices 4-7: its first
    # placement, 0, is where the two 2g.20gb fit) and 2g.20gb in 3 and 4 (slices 0-1 and 2-3);
    # GPU 1 whole.
    collection = node("h100-mig", socket_dir / "kubelet.sock")
    collections.append(collection)
    gpus = uuids(scrape(collection))
    kubelet(
        [
            Pod("ml", "whole", claims={"main": [claim("one-gpu", "gpu-1")]}),
            Pod("ml", "slices", claims={"main": [claim("two", "gpu-0-mig-2g20gb-14-2")]}),
            Pod(
                "ml",
                "big",
                {"main": [("nvidia.com/gpu", [gpus["1"]])]},
                {"main": [claim("big", "gpu-0-mig-3g40gb-9-4")], "side": [claim("s", "gpu-1")]},
            ),
            # Another driver's devices, even with names like NVIDIA's, are not GPUs of NVML.
            Pod("ml", "other", claims={"main": [claim("x", "gpu-1", driver="gpu.example.com")]}),
            # A GPU passed through to a VM (vfio-pci) is invisible to NVML: skipped, not logged.
            Pod("ml", "vm", claims={"main": [claim("vm", "gpu-vfio-0")]}),
        ]
    )
    samples = cycle_until(collection, lambda s: len(series(s, "gpu_pod_info")) == 5)
    assert pod_info(samples) == [
        ("big", "main", "0", "1"),
        ("big", "main", "1", ""),
        ("big", "side", "1", ""),
        ("slices", "main", "0", "4"),
        ("whole", "main", "1", ""),
    ]
    uuid_of = {
        dict(labels)["pod"]: dict(labels)["uuid"] for labels in series(samples, "gpu_pod_info")
    }
    assert uuid_of["slices"] == gpus["0"] and uuid_of["whole"] == gpus["1"]
    assert value_of(samples, "gpuload_collector_success", collector="kubernetes") == 1
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_unattributable_claims_are_logged_once_and_leave_the_rest(
    kubelet: Callable[[list[Pod]], FakeKubelet],
    socket_dir: Path,
    collections: list[Collection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    collection = node("idle", socket_dir / "kubelet.sock")  # 8 whole GPUs, minors 0-7
    collections.append(collection)
    scrape(collection)
    server = kubelet(
        [
            Pod("ml", "fine", claims={"main": [claim("ok", "gpu-2")]}),
            Pod("ml", "absent", claims={"main": [claim("far", "gpu-42")]}),
            Pod("ml", "odd", claims={"main": [claim("odd", "gpu-0-foo")], "b": [claim("o", "x")]}),
            Pod("ml", "no-mig", claims={"main": [claim("slice", "gpu-3-mig-1g10gb-19-0")]}),
        ]
    )
    # Several answers, each with the same claims.
    samples = cycle_until(
        collection, lambda s: server.calls >= 4 and bool(series(s, "gpu_pod_info"))
    )
    assert pod_info(samples) == [("fine", "main", "2", "")]
    assert value_of(samples, "gpuload_collector_success", collector="kubernetes") == 1
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 1
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert len(warnings) == 4, warnings
    gpu_0_foo, gpu_3_mig, gpu_42, x = warnings
    assert "DRA device gpu-0-foo of driver gpu.nvidia.com (claims ml/odd)" in gpu_0_foo
    assert "expected a device name gpu-<minor> or gpu-<minor>-mig-" in gpu_0_foo
    assert "GPU 3 has no MIG GPU instance of profile id 19 at memory slice 0" in gpu_3_mig
    assert "(claims ml/far)" in gpu_42 and "no GPU has minor number 42" in gpu_42
    assert "DRA device x " in x


def test_an_unprivileged_caller_gets_whole_gpu_claims_only(
    kubelet: Callable[[list[Pod]], FakeKubelet],
    socket_dir: Path,
    collections: list[Collection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    # NVML tells a GPU instance's profile and placement to a privileged user only.
    collection = node("h100-mig", socket_dir / "kubelet.sock", caller="unprivileged")
    collections.append(collection)
    scrape(collection)
    kubelet(
        [
            Pod("ml", "whole", claims={"main": [claim("one-gpu", "gpu-1")]}),
            Pod("ml", "slices", claims={"main": [claim("two", "gpu-0-mig-2g20gb-14-2")]}),
        ]
    )
    samples = cycle_until(collection, lambda s: bool(series(s, "gpu_pod_info")))
    assert pod_info(samples) == [("whole", "main", "1", "")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "gpu-0-mig-2g20gb-14-2" in warnings[0] and "privileged user" in warnings[0]
