"""Each pod's share of a GPU: every process joined to its pod through its cgroup and a PodList.

The GPU is the simulated NVML's, on a clock the test moves; the processes' ``/proc/PID/cgroup``
files are written here; the pods list is a real HTTP server on 127.0.0.1 answering a v1 PodList.
Expected figures are the simulator's own per-process readings, summed by pod.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from helpers import Clock, wait_until

from exporter import nvml, sim
from exporter.collectors import Reader, Sample
from exporter.collectors.kubernetes import KubernetesCollector
from exporter.kubernetes.pods import PodListError, PodListSource, parse_pod_list

POD_A = "0b3c3a51-7a9e-4a52-8f3e-1d2a6f0c9e01"
POD_B = "9d8e7f60-1111-4c22-9a33-b44c55d66e77"
ID_A, ID_B = "a" * 64, "b" * 64
GIB = 1024**3

# A /proc entry that cannot be read: its `cgroup` a folder (EISDIR), as a refused read would be.
UNREADABLE = 5007

SCENARIO = {
    "description": "one H100 time-sliced between two pods, a host process and two odd ones",
    "driver": {"version": "550.90.07", "cuda_version": 12040},
    "gpus": [{"model": "h100-sxm"}],
    "phases": [
        {
            "name": "shared",
            "duration": "1h",
            "utilization": 0.9,
            "processes": [
                {"name": "python train.py", "memory": "10GiB", "pid": 5001},
                {"name": "python serve.py", "memory": "20GiB", "pid": 5002},
                {"name": "python worker.py", "memory": "1GiB", "pid": 5003},
                {"name": "Xorg", "memory": "1GiB", "pid": 5004},
                {"name": "exited", "memory": "1GiB", "pid": 5005},
                {"name": "odd", "memory": "1GiB", "pid": 5006},
                {"name": "unreadable", "memory": "1GiB", "pid": UNREADABLE},
            ],
        }
    ],
}

# Each process's cgroup as the kernel shows it (cgroup v2, the kubelet's systemd driver,
# containerd), or None where the process has exited.
CGROUPS: dict[int, str | None] = {
    5001: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    f"{POD_A.replace('-', '_')}.slice/cri-containerd-{ID_A}.scope\n",
    5002: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
    f"{POD_B.replace('-', '_')}.slice/cri-containerd-{ID_B}.scope\n",
    5003: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    f"{POD_A.replace('-', '_')}.slice/cri-containerd-{ID_A}.scope\n",
    5004: "0::/system.slice/display-manager.service\n",
    5005: None,
    5006: "0::/kubepods.slice/kubepods-burstable.slice/something-else.scope\n",
}


def pod_list(*pods: tuple[str, str, str, str, str]) -> dict:
    """A v1 PodList of (uid, namespace, name, container, container ID)."""
    return {
        "kind": "PodList",
        "apiVersion": "v1",
        "items": [
            {
                "metadata": {"uid": uid, "namespace": namespace, "name": name},
                "spec": {"nodeName": "node-1"},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {"name": container, "containerID": f"containerd://{container_id}"}
                    ],
                },
            }
            for uid, namespace, name, container, container_id in pods
        ],
    }


PODS = pod_list(
    (POD_A, "research", "train-0", "trainer", ID_A), (POD_B, "serving", "api-7f9c", "server", ID_B)
)


class PodListServer:
    """A pods list over HTTP; `body` is what it answers, `hold` keeps every answer back."""

    def __init__(self) -> None:
        self.body: bytes = json.dumps(PODS).encode()
        self.hold = threading.Event()
        self.released = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if owner.hold.is_set():
                    owner.released.wait(30)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}/api/v1/pods"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def server() -> Iterator[PodListServer]:
    running = PodListServer()
    yield running
    running.stop()


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    for pid, text in CGROUPS.items():
        if text is not None:
            (root / str(pid)).mkdir(parents=True)
            (root / str(pid) / "cgroup").write_text(text)
    (root / str(UNREADABLE) / "cgroup").mkdir(parents=True)
    return root


@pytest.fixture
def clock(tmp_path: Path) -> Iterator[Clock]:
    scenario = tmp_path / "shared.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    now = Clock(0.0)
    sim.install(scenario, clock=now, epoch=0, caller="root", sleep=lambda _: None)
    nvml.init()
    yield now
    nvml.shutdown()
    sim.uninstall()


def collector_for(url: str, proc: Path, timeout: float = 15.0) -> KubernetesCollector:
    # No kubelet socket: per-process shares stand on their own.
    return KubernetesCollector(
        "/nonexistent/kubelet.sock",
        refresh=10.0,
        timeout=timeout,
        pods=url,
        proc=str(proc),
        on_kubernetes=False,
    )


def collect(collector: KubernetesCollector, clock: Clock) -> list[Sample]:
    return list(collector.collect(Reader(now=clock.now)))


def by_pod(samples: list[Sample], family: str) -> dict[tuple[str, ...], float]:
    return {s.labels[2:]: s.value for s in samples if s.family == family}


def errors(samples: list[Sample]) -> dict[str, float]:
    return {
        s.labels[0]: s.value
        for s in samples
        if s.family == "gpuload_kubernetes_attribution_errors_total"
    }


def answered(collector: KubernetesCollector, clock: Clock) -> Callable[[], bool]:
    return lambda: bool(by_pod(collect(collector, clock), "gpu_pod_memory_used_bytes"))


def test_each_pod_gets_the_memory_and_sm_time_of_its_own_processes(
    server: PodListServer, proc: Path, clock: Clock
) -> None:
    collector = collector_for(server.url, proc)
    wait_until(answered(collector, clock), what="the pods list's first answer")
    # The simulator's per-process readings over the next 10 s: the truth the shares must sum to.
    device = nvml.device(0)
    clock.now = 10.0
    readings = {s.pid: s.sm_percent / 100 for s in device.process_utilization(0)}
    memory = {p.pid: p.used_bytes for p in device.compute_processes()}
    samples = collect(collector, clock)

    trainer, server_ = ("train-0", "research", "trainer"), ("api-7f9c", "serving", "server")
    assert by_pod(samples, "gpu_pod_memory_used_bytes") == {
        trainer: memory[5001] + memory[5003],
        server_: memory[5002],
    }
    assert memory[5001] + memory[5003] == 11 * GIB
    seconds = by_pod(samples, "gpu_pod_utilization_seconds_total")
    assert seconds[trainer] == pytest.approx((readings[5001] + readings[5003]) * 10)
    assert seconds[server_] == pytest.approx(readings[5002] * 10)
    assert seconds[trainer] > 0
    # No pid label anywhere, and the host process is nobody's share.
    assert {s.labels[:2] for s in samples if s.family.startswith("gpu_pod_")} == {
        ("0", device.identity().uuid)
    }
    # The process that exited and the path of an unknown shape are counted, by cause.
    counted = errors(samples)
    assert counted["process_exited"] >= 1 and counted["cgroup_unknown"] >= 1
    assert counted["proc_unreadable"] >= 1
    assert counted["pod_unknown"] == 0 and counted["pods_garbage"] == 0
    collector.close()


def test_each_cause_is_logged_once_not_every_cycle(
    server: PodListServer, proc: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    collector = collector_for(server.url, proc)
    with caplog.at_level(logging.WARNING, logger="exporter.collectors.kubernetes"):
        wait_until(answered(collector, clock), what="the pods list's first answer")
        for moment in (1.0, 2.0, 3.0):
            clock.now = moment
            samples = collect(collector, clock)
    assert errors(samples)["process_exited"] >= 4  # once per collection
    lines = [r.getMessage() for r in caplog.records]
    assert sum("(process_exited)" in line for line in lines) == 1
    assert sum("(cgroup_unknown)" in line for line in lines) == 1
    collector.close()


def test_a_pod_missing_from_the_list_is_unattributed_and_counted(
    server: PodListServer, proc: Path, clock: Clock
) -> None:
    server.body = json.dumps(pod_list((POD_A, "research", "train-0", "trainer", ID_A))).encode()
    collector = collector_for(server.url, proc)
    wait_until(answered(collector, clock), what="the pods list's first answer")
    samples = collect(collector, clock)
    assert set(by_pod(samples, "gpu_pod_memory_used_bytes")) == {("train-0", "research", "trainer")}
    assert errors(samples)["pod_unknown"] >= 1
    collector.close()


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        (b"<html>not found</html>", "pods_garbage"),
        (b'{"kind": "Status", "code": 403}', "pods_garbage"),
        (b"\xff\xfe", "pods_garbage"),
    ],
)
def test_an_answer_that_is_not_a_pod_list_is_counted_and_shares_nothing(
    server: PodListServer, proc: Path, clock: Clock, body: bytes, cause: str
) -> None:
    server.body = body
    collector = collector_for(server.url, proc)
    wait_until(lambda: errors(collect(collector, clock)).get(cause, 0) >= 1, what=cause)
    samples = collect(collector, clock)
    assert by_pod(samples, "gpu_pod_memory_used_bytes") == {}
    collector.close()


def test_a_slow_pods_list_never_holds_up_a_collection_and_is_counted(
    server: PodListServer, proc: Path, clock: Clock
) -> None:
    server.hold.set()
    collector = collector_for(server.url, proc, timeout=0.2)
    # Collections return while the call waits; once its deadline passes, it counts as slow.
    wait_until(lambda: errors(collect(collector, clock)).get("pods_slow", 0) >= 1, what="pods_slow")
    server.hold.clear()
    server.released.set()
    clock.now = 10.0  # the next refresh
    wait_until(answered(collector, clock), what="the answer after the slow one")
    collector.close()


def test_a_pods_list_that_is_gone_is_counted(proc: Path, clock: Clock) -> None:
    gone = PodListServer()
    gone.stop()
    collector = collector_for(gone.url, proc)
    wait_until(
        lambda: errors(collect(collector, clock)).get("pods_unavailable", 0) >= 1,
        what="pods_unavailable",
    )
    collector.close()


def test_the_pod_list_parser_keeps_what_joins_and_says_what_is_wrong() -> None:
    pods = parse_pod_list(json.dumps(PODS).encode())
    assert pods[POD_A].name == "train-0" and pods[POD_A].containers == {ID_A: "trainer"}
    # Items without a UID or name cannot be joined and are left out, not fatal.
    partial = {"items": [{"metadata": {"name": "x"}}, 7, PODS["items"][1]]}
    assert set(parse_pod_list(json.dumps(partial).encode())) == {POD_B}
    with pytest.raises(PodListError, match="no list under 'items'") as raised:
        parse_pod_list(b'{"kind": "Status"}')
    assert raised.value.cause == "pods_garbage"


def test_the_in_cluster_source_needs_the_node_name_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.raises(ValueError, match="NODE_NAME"):
        PodListSource("apiserver")
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert PodListSource("apiserver").url == (
        "https://10.0.0.1:6443/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-7&resourceVersion=0"
    )
    with pytest.raises(ValueError, match="expected"):
        PodListSource("kubelet")
