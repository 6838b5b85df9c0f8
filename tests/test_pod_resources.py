"""Pod attribution against a real gRPC kubelet on a unix socket, and without one.

The fake kubelet (tools/kubelet.py) is a grpcio server implementing the v1
PodResourcesLister; the GPUs are the simulated NVML's, so UUIDs map to indices as NVML says.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from helpers import exposition_text, parse_metrics, series, value_of, wait_until

from exporter import nvml, sim
from exporter.collection import Collection
from exporter.collectors import Reader, Sample
from exporter.collectors.kubernetes import KubernetesCollector, Target, resolve
from exporter.kubernetes import Allocation, PodResourcesError
from exporter.kubernetes.podresources import PodResourcesClient
from exporter.snapshot import Snapshot
from tools.kubelet import FakeKubelet, Pod, remove, short_socket_dir

GPU = "nvidia.com/gpu"


def scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


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
    # A List deadline far above what an answer takes, even on a loaded machine: only the tests
    # about a kubelet that does not answer choose a short one.
    settings = {"socket": str(socket), "refresh": 0.2, "timeout": 15.0, **options}
    return Collection({"kubernetes": True}, timeout=15, options={"kubernetes": settings})


@pytest.fixture
def collections() -> Iterator[list[Collection]]:
    opened: list[Collection] = []
    yield opened
    for collection in opened:
        collection.close()
    sim.uninstall()


def cycle_until(collection: Collection, condition: Callable[[dict], bool]) -> dict:
    """Run cycles until one's samples meet `condition`; 30 s at most, which only a defect takes."""
    deadline = time.monotonic() + 30
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
    "nvidia1": Target("1", "GPU-bbbb"),
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
        ("nvidia1", Target("1", "GPU-bbbb")),  # GKE's plugin: /dev/nvidia1, the minor number
        ("GPU-ffff", None),  # another node's GPU, or one NVML does not see
        ("nvidia7", None),
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
    client = PodResourcesClient(str(socket_dir / "kubelet.sock"), timeout=15)
    try:
        pending = client.start_list()
        wait_until(pending.done, timeout=30, what="the List answer")
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
            Pod("ml", "on-gke", {"main": [(GPU, ["nvidia3"])]}),
            Pod("ml", "elsewhere", {"main": [(GPU, ["GPU-00000000-0000-0000-0000-000000000000"])]}),
            Pod("ml", "fpga", {"main": [("example.com/fpga", ["3"])]}),
        ]
    )
    samples = cycle_until(collection, lambda s: bool(series(s, "gpu_pod_info")))
    assert pod_info(samples) == [
        info("0", gpus["0"], "train-0"),
        info("1", gpus["1"], "train-0"),
        info("3", gpus["3"], "on-gke"),
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


def test_a_hung_kubelet_never_holds_up_a_collection_cycle(
    kubelet: Callable[[list[Pod]], FakeKubelet], socket_dir: Path, collections: list[Collection]
) -> None:
    server = kubelet([])
    server.hanging.set()
    # A refresh interval and a deadline longer than the test: one List, which the kubelet
    # answers only when the test lets it, so the cycles below can only end by not waiting.
    collection = node("idle", socket_dir / "kubelet.sock", refresh=60, timeout=60)
    collections.append(collection)
    gpus = uuids(scrape(collection.run_cycle()))  # the first cycle starts the List
    server.pods = [Pod("ml", "train-0", {"main": [(GPU, [gpus["3"]])]})]
    wait_until(lambda: server.calls == 1, what="the kubelet to hold the List")
    for _ in range(3):
        samples = scrape(collection.run_cycle())
        assert len(series(samples, "gpu_up")) == 8
        assert value_of(samples, "gpuload_collector_success", collector="kubernetes") == 1
        assert value_of(samples, "gpuload_kubernetes_pod_resources_up") is None  # no answer yet
        assert series(samples, "gpu_pod_info") == {}

    server.hanging.clear()
    samples = cycle_until(collection, lambda s: bool(series(s, "gpu_pod_info")))
    # The answer is that of the List the cycles above did not wait for.
    assert server.calls == 1
    assert pod_info(samples) == [info("3", gpus["3"], "train-0")]
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 1


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
    # A List starts only once the one before it has ended: a third one means two deadlines
    # have passed, each retried.
    samples = cycle_until(
        collection,
        lambda s: server.calls >= 3 and value_of(s, "gpuload_kubernetes_pod_resources_up") == 0,
    )
    assert series(samples, "gpu_pod_info") == {}
    assert len(series(samples, "gpu_up")) == 8
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "DEADLINE_EXCEEDED" in warnings[0]
    # Each deadline passed is counted, by its cause.
    slow = value_of(samples, "gpuload_kubernetes_attribution_errors_total", cause="kubelet_slow")
    assert slow is not None and slow >= 2

    server.hanging.clear()
    samples = cycle_until(collection, lambda s: bool(series(s, "gpu_pod_info")))
    assert pod_info(samples) == [info("3", gpus["3"], "train-0")]
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 1
    assert any("answers again" in r.getMessage() for r in caplog.records)


class RefusingKubelet(FakeKubelet):
    """A fake kubelet whose List fails at once (UNAVAILABLE) while `refusing` is set."""

    def __init__(self, socket_path: Path, pods: list[Pod]) -> None:
        super().__init__(socket_path, pods)
        self.refusing = threading.Event()

    def _wait_if_hanging(self, context: grpc.ServicerContext) -> None:
        if self.refusing.is_set():
            self.calls += 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "the kubelet is restarting")
            raise AssertionError("abort returned")
        super()._wait_if_hanging(context)


def test_last_answer_is_kept_through_short_outages_only(
    socket_dir: Path, collections: list[Collection]
) -> None:
    sim.install("idle", pinned_time=30)
    nvml.init()
    try:
        uuid = nvml.device(4).identity().uuid
    finally:
        nvml.shutdown()
    server = RefusingKubelet(
        socket_dir / "kubelet.sock", [Pod("ml", "train-0", {"main": [(GPU, [uuid])]})]
    )
    server.start()
    now = [0.0]
    # The collector's clock is the test's; a List deadline no answer comes near.
    collector = KubernetesCollector(
        str(socket_dir / "kubelet.sock"), refresh=10.0, timeout=15.0, clock=lambda: now[0]
    )

    def collect_at(moment: float) -> list[Sample]:
        now[0] = moment
        nvml.init()
        try:
            return list(collector.collect(Reader()))
        finally:
            nvml.shutdown()

    def pods(samples: list[Sample]) -> list[tuple[str, ...]]:
        return [s.labels[:3] for s in samples if s.family == "gpu_pod_info"]

    def up(samples: list[Sample]) -> float | None:
        found = [s.value for s in samples if s.family == "gpuload_kubernetes_pod_resources_up"]
        return found[0] if found else None

    try:
        # The List started at 0 s is read by a later collection, still at 0 s.
        collect_at(0)
        wait_until(lambda: pods(collect_at(0)), what="the kubelet's first answer")
        server.refusing.set()
        # Failed refreshes at 10 s and 20 s: the answer from 0 s still stands at 30 s...
        collect_at(10)
        wait_until(lambda: up(collect_at(10)) == 0, what="the failed refresh at 10 s")
        collect_at(20)  # another List, refused too; read now or later, it changes nothing
        samples = collect_at(30)
        assert pods(samples) == [("4", uuid, "train-0")]
        assert up(samples) == 0
        refused = [
            s.value
            for s in samples
            if s.family == "gpuload_kubernetes_attribution_errors_total"
            and s.labels == ("kubelet_unavailable",)
        ]
        assert refused and refused[0] >= 1
        # ...and is dropped once it is older than three refresh intervals.
        assert pods(collect_at(31)) == []
    finally:
        collector.close()
        server.stop()


def test_pod_resources_error_names_the_grpc_status(socket_dir: Path) -> None:
    # A deadline far above how long failing takes: the status must be UNAVAILABLE, never
    # DEADLINE_EXCEEDED because the machine was slow.
    client = PodResourcesClient(str(socket_dir / "absent.sock"), timeout=15)
    try:
        pending = client.start_list()
        wait_until(pending.done, timeout=30, what="the failed List")
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
        f"collectors:\n  kubernetes:\n    socket: {socket_dir / 'kubelet.sock'}\n"
        "    refresh: 1s\n    timeout: 15s\n"
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
    wait_until(lambda: series(daemon.metrics(), "gpu_pod_info"), timeout=30, what="gpu_pod_info")
    assert pod_info(daemon.metrics()) == [info("6", uuid, "train-0")]
    assert daemon.get("/healthz").status_code == 200


def test_on_kubernetes_a_missing_socket_is_a_warning_and_up_0(
    socket_dir: Path,
    collections: list[Collection],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kubelet gives every container KUBERNETES_SERVICE_HOST; the socket's folder is not
    # mounted: a fault to alert on (GPULoadPodResourcesDown), not a node without Kubernetes.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    caplog.set_level(logging.INFO, logger="exporter.collectors.kubernetes")
    missing = socket_dir / "kubelet.sock"
    collection = node("idle", missing, refresh=0.05)
    collections.append(collection)
    for _ in range(3):
        samples = scrape(collection.run_cycle())
        time.sleep(0.06)
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 0
    assert series(samples, "gpu_pod_info") == {}
    records = [r for r in caplog.records if r.name == "exporter.collectors.kubernetes"]
    assert [r.levelno for r in records] == [logging.WARNING]
    assert f"no kubelet pod-resources socket at {missing}" in records[0].getMessage()


def as_uid_10001(script: str) -> str:
    """Run a Python script as the image's user, with no supplementary groups; its stdout.

    The interpreter starts as root, imports what the script needs (grpc and the pod-resources
    client too, which the collector imports once it finds the socket), and only then gives up
    root: the checkout and its venv need not be readable by uid 10001 (a clone under a 0700
    folder is not).
    """
    drop = (
        "import logging, os, sys\n"
        "import grpc\n"
        "import exporter.collectors.kubernetes, exporter.kubernetes.podresources\n"
        "os.setgroups([])\n"
        "os.setgid(10001)\n"
        "os.setuid(10001)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", drop + script],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become uid 10001")
def test_as_a_non_root_uid_the_kubelets_modes_forbid_the_socket_and_say_so() -> None:
    """The kubelet's real modes forbid the socket to uid 10001, and the collector says which.

    The folder is 0750 root and the socket 0755 root. Run as uid 10001 (the image's user), the
    collector names the missing permission and reports up 0.
    """
    base = Path(tempfile.mkdtemp(prefix="gpuload-kubelet-", dir="/tmp"))
    try:
        base.chmod(0o755)
        folder = base / "pod-resources"
        folder.mkdir(mode=0o750)
        server = FakeKubelet(folder / "kubelet.sock", [Pod("ml", "train-0", {"main": []})])
        server.start()
        try:
            (folder / "kubelet.sock").chmod(0o755)
            probe = (
                "import logging, sys\n"
                "logging.basicConfig(stream=sys.stdout, format='%(levelname)s %(message)s')\n"
                "from exporter.collectors.base import Reader\n"
                "from exporter.collectors.kubernetes import KubernetesCollector\n"
                f"c = KubernetesCollector({str(folder / 'kubelet.sock')!r}, on_kubernetes=True)\n"
                "up = [s.value for s in c.collect(Reader())"
                " if s.family == 'gpuload_kubernetes_pod_resources_up']\n"
                "print('up', up)\n"
            )
            as_user = as_uid_10001(probe)
            assert (
                "WARNING collector kubernetes: on Kubernetes, but uid 10001 may not reach"
                in as_user
            )
            assert "up [0]" in as_user
            folder.chmod(0o755)  # the folder reachable, the socket still root's 0755
            as_user = as_uid_10001(probe)
            assert "uid 10001 may not connect to the kubelet's pod-resources socket" in as_user
            assert "up [0]" in as_user
        finally:
            server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_kubelet_answering_garbage_is_counted_and_attributes_nothing(
    socket_dir: Path, collections: list[Collection], caplog: pytest.LogCaptureFixture
) -> None:
    """A List answer that does not decode as ListPodResourcesResponse: kubelet_garbage."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    garbage = grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"\xff\xff\xff\xff not protobuf",
        request_deserializer=None,
        response_serializer=None,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": garbage}),)
    )
    server.add_insecure_port(f"unix:{socket_dir / 'kubelet.sock'}")
    server.start()
    try:
        collection = node("idle", socket_dir / "kubelet.sock")
        collections.append(collection)
        caplog.set_level(logging.WARNING, logger="exporter.collectors.kubernetes")
        samples = cycle_until(
            collection,
            lambda s: (
                (
                    value_of(
                        s, "gpuload_kubernetes_attribution_errors_total", cause="kubelet_garbage"
                    )
                    or 0
                )
                >= 2
            ),
        )
    finally:
        server.stop(None)
    assert series(samples, "gpu_pod_info") == {}
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 0
    assert len(series(samples, "gpu_up")) == 8
    # Logged once, not once per failed refresh.
    assert sum("List failed: INTERNAL" in r.getMessage() for r in caplog.records) == 1
