"""The shipped pods scenario end to end: every way a GPU reaches a pod, as Prometheus sees it.

`gpuload serve --simulate pods` runs the simulated kubelet (pod resources, a PodList and a /proc
tree); a real Prometheus scrapes it. The truth is the scenario file: which pod holds which GPU,
MIG instance or DRA claim, and which PIDs are whose; the shares are the simulator's own
per-process readings, summed by pod. The pod that ends midway is followed on the scenario's clock,
in process, where the clock is the test's.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import Clock, Daemon, run_prometheus, wait_until

from exporter import nvml, sim
from exporter.collectors import Reader
from exporter.collectors.kubernetes import KubernetesCollector
from exporter.sim.kubelet import SimulatedKubelet
from exporter.sim.scenario import SCENARIO_DIR

SCENARIO = yaml.safe_load((SCENARIO_DIR / "pods.yaml").read_text(encoding="utf-8"))
PODS = SCENARIO["kubernetes"]["pods"]
ENDED = next(pod for pod in PODS if "until" in pod)


def holdings() -> set[tuple[str, str, str, str, str]]:
    """(gpu, mig_instance, namespace, pod, container) for every device a container holds."""
    held = set()
    for pod in PODS:
        for container in pod["containers"]:
            claim = container.get("claim", {})
            whole = [
                *container.get("gpus", []),
                *container.get("shared", []),
                *claim.get("gpus", []),
            ]
            mig = [*container.get("mig", []), *claim.get("mig", [])]
            where = [(str(g), "") for g in whole] + [
                (str(m["gpu"]), str(m["instance"])) for m in mig
            ]
            held |= {(g, i, pod["namespace"], pod["name"], container["name"]) for g, i in where}
    return held


def owner_of(pid: int) -> tuple[str, str, str]:
    """(namespace, pod, container) of a PID, from the scenario."""
    for pod in PODS:
        for container in pod["containers"]:
            if pid in container.get("pids", []):
                return pod["namespace"], pod["name"], container["name"]
    raise KeyError(pid)


def simulated_shares(gpu: int) -> tuple[dict[tuple[str, str, str], float], float]:
    """The simulator's per-process SM readings on ``gpu``, summed by container, and the GPU's."""
    sim.install("pods", pinned_time=100)
    nvml.init()
    try:
        device = nvml.device(gpu)
        readings = device.process_utilization(0)
        utilization = device.utilization().gpu_percent / 100
    finally:
        nvml.shutdown()
        sim.uninstall()
    shares: dict[tuple[str, str, str], float] = {}
    for reading in readings:
        key = owner_of(reading.pid)
        shares[key] = shares.get(key, 0.0) + reading.sm_percent / 100
    return shares, utilization


def query(prometheus: str, expr: str, at: dict[str, float] | None = None) -> list[dict[str, Any]]:
    params = {"query": expr, **(at or {})}
    answer = requests.get(prometheus + "/api/v1/query", params=params, timeout=10)
    found: list[dict[str, Any]] = answer.json()["data"]["result"]
    return found


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus")
def test_prometheus_sees_every_gpu_of_the_pods_scenario_with_its_pod(
    tmp_path: Path,
    daemon_factory: Callable[..., Daemon],
    processes: Callable[..., subprocess.Popen[str]],
) -> None:
    config = tmp_path / "gpuload.yaml"
    config.write_text(yaml.safe_dump({"collectors": {"kubernetes": {"refresh": 1}}}))
    daemon = daemon_factory("--simulate", "pods", "--config", str(config))
    address = daemon.url.removeprefix("http://").rstrip("/")
    job = {
        "job_name": "gpuload",
        "scrape_interval": "1s",
        "scrape_timeout": "900ms",
        "static_configs": [{"targets": [address]}],
    }
    prometheus = run_prometheus(processes, tmp_path, {"scrape_configs": [job]})
    truth = holdings()
    shares_seen = "count_over_time(gpu_pod_utilization_seconds_total{gpu='2'}[10s]) >= 10"

    def attributed() -> set[tuple[str, ...]]:
        return {
            tuple(
                r["metric"].get(k, "")
                for k in ("gpu", "mig_instance", "namespace", "pod", "container")
            )
            for r in query(prometheus, "gpu_pod_info")
        }

    wait_until(lambda: attributed() == truth, timeout=60, what="every holding in Prometheus")
    wait_until(
        lambda: len(query(prometheus, shares_seen)) == 3,
        timeout=60,
        what="ten scrapes of the shared GPU's shares",
    )

    # Whole GPUs, the time-sliced one's three pods, both MIG instances and the DRA claim.
    assert ("4", "", "inference", "vllm-0", "vllm") in truth
    assert {("3", "2"), ("3", "3")} <= {(g, i) for g, i, *_ in truth}
    # GPU 6 runs a job outside Kubernetes and GPU 7 nothing: nobody's, on every pod family.
    for family in (
        "gpu_pod_info",
        "gpu_pod_memory_used_bytes",
        "gpu_pod_utilization_seconds_total",
    ):
        assert query(prometheus, f'{family}{{gpu=~"6|7"}}') == []
    # The shared GPU's shares are the simulator's per-process readings, summed by pod. Every
    # collection adds to each pod's counter over the same interval, so over one window of scrapes
    # the pods' increases stand exactly as their readings do, whatever the collections' timing.
    at = {"time": time.time()}  # both queries at one instant: over the same scrapes
    window = "increase(%s{gpu='2'}[10s])"
    pods = {
        (r["metric"]["namespace"], r["metric"]["pod"], r["metric"]["container"]): float(
            r["value"][1]
        )
        for r in query(prometheus, window % "gpu_pod_utilization_seconds_total", at)
    }
    (gpu,) = query(prometheus, window % "gpu_utilization_seconds_total", at)
    whole = float(gpu["value"][1])
    expected, utilization = simulated_shares(2)
    assert set(pods) == set(expected) and len(pods) == 3
    for key, share in expected.items():
        assert pods[key] / sum(pods.values()) == pytest.approx(
            share / sum(expected.values()), rel=1e-6
        ), key
    assert sum(expected.values()) == pytest.approx(utilization)
    # Together they are the GPU's own utilization: not to the last digit, as the GPU's counter
    # integrates NVML's own sample periods and the pods' the collections' intervals (docs).
    assert sum(pods.values()) == pytest.approx(whole, rel=0.05)
    errors = query(prometheus, "sum(gpuload_kubernetes_attribution_errors_total)")
    assert float(errors[0]["value"][1]) == 0


def test_the_pod_that_ends_is_gone_at_the_next_kubelet_refresh() -> None:
    until = float(str(ENDED["until"]).removesuffix("m")) * 60
    clock = Clock(until - 30)
    library = sim.install("pods", clock=clock, epoch=0, caller="root", sleep=lambda _: None)
    kubelet = SimulatedKubelet(library).start()
    collector = KubernetesCollector(refresh=10.0, timeout=15.0, **kubelet.collector_options)
    try:

        def holders() -> set[str]:
            kubelet.refresh()
            nvml.init()
            try:
                samples = list(collector.collect(Reader(now=clock.now)))
            finally:
                nvml.shutdown()
            return {s.labels[2] for s in samples if s.family.startswith("gpu_pod_")}

        wait_until(lambda: ENDED["name"] in holders(), what="the pod before it ends")
        clock.now = until - 1  # a refresh, still running: it holds its GPU
        wait_until(lambda: ENDED["name"] in holders(), what="the refresh before the end")
        clock.now = until + 5  # ended, before the next refresh: the last answer stands
        assert ENDED["name"] in holders()
        clock.now = until + 9  # the next refresh: gone as soon as its answer is read
        wait_until(lambda: ENDED["name"] not in holders(), what="the pod gone")
    finally:
        collector.close()
        kubelet.stop()
        sim.uninstall()
