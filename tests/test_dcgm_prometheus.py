"""dcgm-exporter's dashboard 12239 and OpenCost's GPU query on gpuload, through a real Prometheus.

One Prometheus for the whole module. It first scrapes `gpuload serve --simulate` with
`--metrics.dcgm-compat` on an H100 node and on an A100 node (no GPM), and runs every panel query
of dcgm-exporter's published dashboard (`../shared/dcgm/dcgm-exporter-dashboard.json`) with its
variables set as Grafana sets them from `label_values(...)`: to All and to each single value.
Then it is reloaded with a third job, built from the chart's rendered ServiceMonitor as the
Prometheus Operator builds it, scraping a node whose GPUs a fake kubelet allocates to pods:
OpenCost's GPU usage query must give one row per container that holds a GPU.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import ROOT, Daemon, answers, free_port, start_daemon, wait_until
from test_helm_prometheus import EXPORTER_POD, NODE, operator_job, rendered
from test_pods_scenario import holdings

SHARED = ROOT.parent / "shared" / "dcgm"
DASHBOARD = SHARED / "dcgm-exporter-dashboard.json"
pytestmark = [
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus"),
    pytest.mark.skipif(
        not DASHBOARD.exists(), reason=f"dcgm-exporter's published files are not at {SHARED}"
    ),
]

DRIVER = {"version": "550.90.07", "cuda_version": 12040}
H100_NODE = {
    "description": "2x H100 SXM at work",
    "driver": DRIVER,
    "gpus": [{"model": "h100-sxm", "count": 2}],
    "phases": [{"duration": "1h", "utilization": {"value": 0.7, "noise": 0.05}}],
}
A100_NODE = {
    "description": "2x A100 SXM4 (no GPM) at work",
    "driver": DRIVER,
    "gpus": [{"model": "a100-sxm4-80gb", "count": 2}],
    "phases": [{"duration": "1h", "utilization": {"value": 0.6, "noise": 0.05}}],
}
# Each dashboard panel's metric, as gpuload's own family from the same scrape.
SAME_AS = {
    "DCGM_FI_DEV_GPU_TEMP": 'gpu_temperature_celsius{sensor="gpu"}',
    "DCGM_FI_DEV_POWER_USAGE": "gpu_power_usage_watts",
    "DCGM_FI_DEV_SM_CLOCK": 'gpu_clock_hertz{clock="sm"} / 1e6',
    "DCGM_FI_DEV_GPU_UTIL": "gpu_utilization_ratio * 100",
    "DCGM_FI_DEV_FB_USED": "floor(gpu_memory_used_bytes / 1048576)",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gpu_tensor_active_ratio",
}


@dataclass
class Prometheus:
    """Debian's Prometheus, its config file, and a reload (SIGHUP) with more jobs."""

    process: subprocess.Popen[bytes]
    config_file: Path
    url: str

    def reload(self, jobs: list[dict[str, Any]]) -> None:
        self.config_file.write_text(yaml.safe_dump(_config(jobs), sort_keys=False))
        self.process.send_signal(signal.SIGHUP)

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = requests.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        assert answer.status_code == 200, f"{expr}: {answer.text}"
        found: list[dict[str, Any]] = answer.json()["data"]["result"]
        return found

    def label_values(self, metric: str, label: str) -> list[str]:
        answer = requests.get(
            f"{self.url}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=10
        )
        values: list[str] = answer.json()["data"]
        return values


def _config(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"}, "scrape_configs": jobs}


def _job(name: str, daemon: Daemon) -> dict[str, Any]:
    address = daemon.url.removeprefix("http://").rstrip("/")
    return {"job_name": name, "static_configs": [{"targets": [address]}]}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    folder = tmp_path_factory.mktemp("nodes")
    started: dict[str, Daemon] = {}
    try:
        for name, scenario in (("h100", H100_NODE), ("a100", A100_NODE)):
            path = folder / f"{name}.yaml"
            path.write_text(yaml.safe_dump(scenario))
            started[name] = start_daemon("--simulate", str(path), "--metrics.dcgm-compat")
        yield started
    finally:
        for daemon in started.values():
            daemon.stop()


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, nodes: dict[str, Daemon]
) -> Iterator[Prometheus]:
    folder = tmp_path_factory.mktemp("prometheus")
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(_config([_job(n, d) for n, d in nodes.items()])))
    port = free_port()
    binary = shutil.which("prometheus")
    assert binary is not None
    with (folder / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(url + "/-/ready") or process.poll() is not None, what="ready")
        assert process.poll() is None, (folder / "prometheus.log").read_text()
        yield Prometheus(process, config_file, url)
    finally:
        process.terminate()
        process.wait(timeout=30)


def grafana_value(values: list[str]) -> str:
    """A multi-value variable as Grafana interpolates it into PromQL: regex-escaped, (a|b)."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value) for value in values]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"


def panels() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [
        (panel["type"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def test_dashboard_12239_shows_every_panel_from_gpuload(
    nodes: dict[str, Daemon], prometheus: Prometheus
) -> None:
    gpus_of = {name: 2 for name in nodes}
    instance_of = {name: daemon.url.split("//")[1].rstrip("/") for name, daemon in nodes.items()}
    wait_until(
        lambda: (
            len(prometheus.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) == gpus_of["h100"]
            and len(prometheus.query("DCGM_FI_DEV_GPU_TEMP")) == sum(gpus_of.values())
        ),
        timeout=30,
        what="both nodes' DCGM fields scraped",
    )
    instances = prometheus.label_values("DCGM_FI_DEV_GPU_TEMP", "instance")
    gpus = prometheus.label_values("DCGM_FI_DEV_GPU_TEMP", "gpu")
    assert sorted(instances) == sorted(instance_of.values())
    assert sorted(gpus) == ["0", "1"]
    node_of = {address: name for name, address in instance_of.items()}
    for kind, expr in panels():
        metric = re.match(r"\w*\(?(DCGM_\w+)", expr.removeprefix("avg(").removeprefix("sum("))
        assert metric is not None, expr
        for chosen_instances in [instances, *([one] for one in instances)]:
            for chosen_gpus in [gpus, *([one] for one in gpus)]:
                query = expr.replace("$instance", grafana_value(chosen_instances)).replace(
                    "$gpu", grafana_value(chosen_gpus)
                )
                found = prometheus.query(query)
                with_gpm = [i for i in chosen_instances if node_of[i] == "h100"]
                shown = with_gpm if "TENSOR" in expr else chosen_instances
                expected = len(shown) * len(chosen_gpus)
                if kind == "gauge":  # avg() and sum(): one series, or none of nothing
                    expected = min(1, expected)
                assert len(found) == expected, (query, found)
    for field, own in SAME_AS.items():
        joined = f"{field} - on (instance, gpu) ({own})"
        differences = prometheus.query(joined)
        gpm_only = field.startswith("DCGM_FI_PROF_")
        assert len(differences) == (2 if gpm_only else 4), joined
        assert all(float(r["value"][1]) == pytest.approx(0, abs=1e-9) for r in differences)


def test_the_migration_doc_says_the_tensor_panel_is_empty_without_gpm() -> None:
    doc = (ROOT / "docs" / "migrating-from-dcgm-exporter.md").read_text(encoding="utf-8")
    assert "Tensor Core Utilization" in doc and "A100" in doc


def pods_node(folder: Path) -> tuple[list[str], set[tuple[str, str, str]]]:
    """The shipped pods scenario: its daemon's arguments, and every (container, pod, namespace).

    Its simulated kubelet holds whole GPUs, a time-sliced one shared by three pods, two MIG
    instances and a DRA claim; GPU 6 runs a job outside any pod and GPU 7 is free.
    """
    config = folder / "gpuload.yaml"
    config.write_text(yaml.safe_dump({"collectors": {"kubernetes": {"refresh": 1}}}))
    expected = {(container, pod, namespace) for _, _, namespace, pod, container in holdings()}
    return ["--simulate", "pods", "--config", str(config)], expected


OPENCOST = (
    'avg(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[1h])) '
    "by (container, pod, namespace)"
)


def test_opencost_sees_one_row_per_container_that_holds_a_gpu(
    tmp_path: Path, nodes: dict[str, Daemon], prometheus: Prometheus
) -> None:
    arguments, expected = pods_node(tmp_path)
    daemon = None
    try:
        daemon = start_daemon(*arguments, "--metrics.dcgm-compat")
        objects = rendered({"exporter": {"config": {"metrics": {"dcgm_compat": True}}}})
        (monitor,) = [
            o
            for o in objects
            if o["kind"] == "ServiceMonitor" and "relay" not in o["metadata"]["name"]
        ]
        (service,) = [
            o
            for o in objects
            if o["kind"] == "Service" and o["metadata"]["name"] == monitor["metadata"]["name"]
        ]
        address = daemon.url.removeprefix("http://").rstrip("/")
        chart_job = operator_job(monitor, service, address)
        prometheus.reload([*(_job(n, d) for n, d in nodes.items()), chart_job])

        def rows() -> set[tuple[str, str, str]]:
            return {
                (r["metric"]["container"], r["metric"]["pod"], r["metric"]["namespace"])
                for r in prometheus.query(OPENCOST)
            }

        wait_until(lambda: rows() == expected, timeout=60, what="one row per container")
        # The GPUs nobody holds are served, without a pod: none of gpuload's own. (Nor has the
        # shared GPU's own series, beside its containers' shares, or the MIG GPU's, beside its
        # instances'.)
        served = prometheus.query(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{instance="{NODE}"}}')
        assert {r["metric"]["gpu"] for r in served if "pod" not in r["metric"]} == {
            "2",
            "3",
            "6",
            "7",
        }
        assert all(r["metric"].get("pod") != EXPORTER_POD for r in served)
        assert all("container" in r["metric"] for r in served if "pod" in r["metric"])
    finally:
        if daemon is not None:
            daemon.stop()
