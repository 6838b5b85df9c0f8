"""Pod attribution against a real gRPC kubelet on a unix socket, and without one.

The fake kubelet (tests/kubelet_helpers.py) is a grpcio server implementing the v1
PodResourcesLister; the GPUs are the simulated NVML's, so UUIDs map to indices as NVML says.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import parse_metrics, series, value_of
from kubelet_helpers import FakeKubelet, Pod, remove, short_socket_dir
from prometheus_client import generate_latest

from exporter import nvml, sim
from exporter.collection import Collection, Snapshot
from exporter.collectors import Reader
from exporter.collectors.kubernetes import KubernetesCollector, Target, resolve
from exporter.kubernetes import Allocation, PodResourcesError
from exporter.kubernetes.podresources import PodResourcesClient
from exporter.server.http import build_registry

GPU = "nvidia.com/gpu"


def scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(generate_latest(build_registry(lambda: snapshot)).decode())


def pod_info(samples: dict) -> list[dict[str, str]]:
    return sorted(
        (dict(labels) for labels in series(samples, "gpu_pod_info")),
        key=lambda labels: (labels["gpu"], labels["mig_instance"], labels["pod"]),
    )


def info(gpu: str, uuid: str, pod: str, container: str = "main", mig: str = "") -> dict:
    return {
        "gpu": gpu,
        "uuid": uuid,
        "pod": pod,
        "namespace": "ml",
        "container": container,
        "mig_instance": mig,
    }


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


def node(scenario: str, socket: Path, **options: float) -> Collection:
    sim.install(scenario, pinned_time=30)
    settings = {"socket": str(socket), "refresh": 0.2, "timeout": 0.5, **options}
    return Collection({"kubernetes": True}, timeout=5, options={"kubernetes": settings})


@pytest.fixture
def collections() -> Iterator[list[Collection]]:
    opened: list[Collection] = []
    yield opened
    for collection in opened:
        collection.close()
    sim.uninstall()


def cycle_until(collection: Collection, condition: Callable[[dict], bool]) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        samples = scrape(collection.run_cycle())
        if condition(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def uuids(samples: dict) -> dict[str, str]:
    return {dict(labels)["gpu"]: dict(labels)["uuid"] for labels in series(samples, "gpu_up")}


# Device ids as device plugins write them, resolved against a two-GPU node whose second GPU
# has a MIG device in GPU instance 3.
DIRECTORY = {
    "GPU-aaaa": Target("0", "GPU-aaaa"),
    "0": Target("0", "GPU-aaaa"),
    "GPU-bbbb": Target("1", "GPU-bbbb"),
    "1": Target("1", "GPU-bbbb"),
    "MIG-cccc": Target("1", "GPU-bbbb", "3"),
}


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        ("GPU-aaaa", Target("0", "GPU-aaaa")),
        ("GPU-bbbb::3", Target("1", "GPU-bbbb")),  # a time-sliced replica
        ("MIG-cccc", Target("1", "GPU-bbbb", "3")),
        ("MIG-GPU-bbbb/5/0", Target("1", "GPU-bbbb", "5")),  # drivers before R470
        ("1", Target("1", "GPU-bbbb")),  # deviceIDStrategy=index
        ("GPU-ffff", None),  # another node's GPU, or one NVML does not see
        ("nvidia0", None),
        ("MIG-GPU-ffff/1/0", None),
    ],
)
def test_device_plugin_ids_resolve_to_gpu_and_mig_instance(
    device_id: str, expected: Target | None
) -> None:
    assert resolve(device_id, DIRECTORY) == expected


def test_list_over_the_unix_socket_returns_every_container_device(
    kubelet: Callable[[list[Pod]], FakeKubelet], socket_dir: Path
) -> None:
    kubelet(
        [
            Pod("ml", "train-0", {"main": [(GPU, ["GPU-1", "GPU-2"])], "sidecar": []}),
            Pod("infra", "fpga", {"app": [("example.com/fpga", ["fpga0"])]}),
        ]
    )
    client = PodResourcesClient(str(socket_dir / "kubelet.sock"), timeout=2)
    try:
        pending = client.start_list()
        deadline = time.monotonic() + 5
        while not pending.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pending.result() == [
            Allocation("ml", "train-0", "main", GPU, "GPU-1"),
            Allocation("ml", "train-0", "main", GPU, "GPU-2"),
            Allocation("infra", "fpga", "app", "example.com/fpga", "fpga0"),
        ]
    finally:
        client.close()


def test_pods_are_attributed_to_gpus_by_nvml_uuid(
    kubelet: Callable[[list[Pod]], FakeKubelet], socket_dir: Path, collections: list[Collection]
) -> None:
    collection = node("idle", socket_dir / "kubelet.sock")
    collections.append(collection)
    gpus = uuids(scrape(collection.run_cycle()))
    kubelet(
        [
            Pod("ml", "train-0", {"main": [(GPU, [gpus["0"], gpus["1"]])]}),
            Pod("ml", "notebook", {"main": [(GPU, [f"{gpus['5']}::0"])], "sidecar": []}),
            Pod("ml", "notebook-2", {"main": [(GPU, [f"{gpus['5']}::1"])]}),
            Pod("ml", "by-index", {"main": [(GPU, ["7"])]}),
            Pod("ml", "elsewhere", {"main": [(GPU, ["GPU-00000000-0000-0000-0000-000000000000"])]}),
            Pod("ml", "fpga", {"main": [("example.com/fpga", ["3"])]}),
        ]
    )
    samples = cycle_until(collection, lambda s: bool(series(s, "gpu_pod_info")))
    assert pod_info(samples) == [
        info("0", gpus["0"], "train-0"),
        info("1", gpus["1"], "train-0"),
        info("5", gpus["5"], "notebook"),
        info("5", gpus["5"], "notebook-2"),
        info("7", gpus["7"], "by-index"),
    ]
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 1
    assert value_of(samples, "gpuload_collector_success", collector="kubernetes") == 1


def test_mig_devices_are_attributed_to_their_gpu_and_instance(
    kubelet: Callable[[list[Pod]], FakeKubelet], socket_dir: Path, collections: list[Collection]
) -> None:
    collection = node("a100-mig", socket_dir / "kubelet.sock")
    collections.append(collection)
    gpus = uuids(scrape(collection.run_cycle()))
    # What NVML reports for GPU 1's MIG devices: (GPU instance, MIG UUID).
    instances = [(m.gpu_instance, m.device.identity().uuid) for m in nvml.device(1).mig_devices()]
    (first_gi, first_uuid), (second_gi, second_uuid) = instances[:2]
    kubelet(
        [
            Pod("ml", "small", {"main": [("nvidia.com/mig-3g.40gb", [first_uuid])]}),
            Pod("ml", "smaller", {"main": [(GPU, [second_uuid])]}),
            Pod("ml", "legacy", {"main": [(GPU, [f"MIG-{gpus['0']}/7/0"])]}),
        ]
    )
    samples = cycle_until(collection, lambda s: len(series(s, "gpu_pod_info")) == 3)
    assert pod_info(samples) == [
        info("0", gpus["0"], "legacy", mig="7"),
        info("1", gpus["1"], "small", mig=str(first_gi)),
        info("1", gpus["1"], "smaller", mig=str(second_gi)),
    ]


def test_missing_socket_exports_nothing_and_logs_once_at_info(
    kubelet: Callable[[list[Pod]], FakeKubelet],
    socket_dir: Path,
    collections: list[Collection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.collectors.kubernetes")
    collection = node("idle", socket_dir / "kubelet.sock", refresh=0.05)
    collections.append(collection)
    for _ in range(5):
        samples = scrape(collection.run_cycle())
        time.sleep(0.06)
    assert series(samples, "gpu_pod_info") == {}
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") is None
    assert value_of(samples, "gpuload_collector_success", collector="kubernetes") == 1
    assert len(series(samples, "gpu_up")) == 8
    records = [r for r in caplog.records if r.name == "exporter.collectors.kubernetes"]
    assert [r.levelno for r in records] == [logging.INFO]
    assert "no kubelet pod-resources socket at" in records[0].getMessage()

    # The kubelet starts later (or the socket's folder gets mounted): attribution begins.
    gpus = uuids(samples)
    kubelet([Pod("ml", "late", {"main": [(GPU, [gpus["2"]])]})])
    samples = cycle_until(collection, lambda s: bool(series(s, "gpu_pod_info")))
    assert pod_info(samples) == [info("2", gpus["2"], "late")]


def test_hung_kubelet_times_out_and_the_exporter_keeps_reporting(
    kubelet: Callable[[list[Pod]], FakeKubelet],
    socket_dir: Path,
    collections: list[Collection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.collectors.kubernetes")
    collection = node("idle", socket_dir / "kubelet.sock", refresh=0.1, timeout=0.3)
    collections.append(collection)
    gpus = uuids(scrape(collection.run_cycle()))
    server = kubelet([Pod("ml", "train-0", {"main": [(GPU, [gpus["3"]])]})])
    server.hanging.set()
    slowest = 0.0
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        started = time.monotonic()
        samples = scrape(collection.run_cycle())
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    assert server.calls >= 2, "the collector retries after each deadline"
    assert slowest < 0.25, "a hung kubelet never holds up a collection cycle"
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 0
    assert series(samples, "gpu_pod_info") == {}
    assert len(series(samples, "gpu_up")) == 8
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "DEADLINE_EXCEEDED" in warnings[0]

    server.hanging.clear()
    samples = cycle_until(collection, lambda s: bool(series(s, "gpu_pod_info")))
    assert pod_info(samples) == [info("3", gpus["3"], "train-0")]
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 1
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_last_answer_is_kept_through_short_outages_only(
    kubelet: Callable[[list[Pod]], FakeKubelet], socket_dir: Path, collections: list[Collection]
) -> None:
    sim.install("idle", pinned_time=30)
    nvml.init()
    try:
        uuid = nvml.device(4).identity().uuid
    finally:
        nvml.shutdown()
    server = kubelet([Pod("ml", "train-0", {"main": [(GPU, [uuid])]})])
    now = [0.0]
    collector = KubernetesCollector(
        str(socket_dir / "kubelet.sock"), refresh=10.0, timeout=0.2, clock=lambda: now[0]
    )

    def collect_at(moment: float) -> list:
        now[0] = moment
        nvml.init()
        try:
            return list(collector.collect(Reader()))
        finally:
            nvml.shutdown()

    def settled(moment: float) -> list:
        """Collect at `moment`, then again once the call started then has ended (0.2 s)."""
        collect_at(moment)
        time.sleep(0.3)
        return collect_at(moment)

    try:
        assert any(s.family == "gpu_pod_info" for s in settled(0))
        server.hanging.set()
        # Failed refreshes at 10 s and 20 s: the answer from 0 s still stands at 30 s...
        for moment in (10, 20, 30):
            samples = settled(moment)
        assert [s.labels[:3] for s in samples if s.family == "gpu_pod_info"] == [
            ("4", uuid, "train-0")
        ]
        # ...and is dropped once it is older than three refresh intervals.
        assert not any(s.family == "gpu_pod_info" for s in settled(31))
    finally:
        collector.close()


def test_pod_resources_error_names_the_grpc_status(socket_dir: Path) -> None:
    client = PodResourcesClient(str(socket_dir / "absent.sock"), timeout=1)
    try:
        pending = client.start_list()
        deadline = time.monotonic() + 5
        while not pending.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(PodResourcesError) as raised:
            pending.result()
        assert raised.value.code == "UNAVAILABLE"
    finally:
        client.close()


def test_daemon_serves_gpu_pod_info_over_http(
    kubelet: Callable[[list[Pod]], FakeKubelet], socket_dir: Path, daemon_factory, tmp_path: Path
) -> None:
    sim.install("idle", pinned_time=30)
    nvml.init()
    try:
        uuid = nvml.device(6).identity().uuid
    finally:
        nvml.shutdown()
        sim.uninstall()
    kubelet([Pod("ml", "train-0", {"main": [(GPU, [uuid])]})])
    config = tmp_path / "gpuload.yaml"
    config.write_text(
        f"collectors:\n  kubernetes:\n    socket: {socket_dir / 'kubelet.sock'}\n    refresh: 1s\n"
    )
    daemon = daemon_factory(
        "--simulate",
        "idle",
        "--sim.time",
        "30",
        "--collect.interval",
        "200ms",
        "--config",
        str(config),
    )
    deadline = time.monotonic() + 10
    while not series(samples := daemon.metrics(), "gpu_pod_info"):
        assert time.monotonic() < deadline, "gpu_pod_info never appeared"
        time.sleep(0.1)
    assert pod_info(samples) == [info("6", uuid, "train-0")]
    assert daemon.get("/healthz").status_code == 200
