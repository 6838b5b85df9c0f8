"""The chart's monitor and rules, as the Prometheus Operator applies them, name the right pods.

The Operator turns a ServiceMonitor endpoint into a scrape job whose targets carry labels of
their own, set from Kubernetes service discovery before the endpoint's relabelings: `namespace`,
`service`, `pod`, `container`, `endpoint` and `job` (prometheus-operator,
pkg/prometheus/promcfg.go, generateServiceMonitorConfig). Those are the exporter pod's. The
exporter's `gpu_pod_info` carries `pod`, `namespace` and `container` of the workload, so whether
the scraped labels survive depends on the endpoint's `honorLabels`. Here a real Prometheus
scrapes a real `gpuload serve` (simulated NVML, a fake kubelet with the workload's pods) with
such a job built from the rendered ServiceMonitor, loads the rendered PrometheusRule's groups,
and the documented join names the workload's pod.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import requests
import yaml
from helpers import Daemon, parse_metrics, run_prometheus, series, wait_until
from test_helm_chart import render_objects

from tools import chart as chart_files
from tools.kubelet import FakeKubelet, Pod, short_socket_dir

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus")
NAMESPACE = "monitoring"
NODE = "gpu-node-7"
EXPORTER_POD = "gpuload-x7k2p"
GPU = "nvidia.com/gpu"


def rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart as Helm renders it for a cluster that has the Prometheus Operator's CRDs."""
    return render_objects(helm.Chart.load(str(chart_files.CHART)), values)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def operator_job(monitor: dict[str, Any], service: dict[str, Any], address: str) -> dict[str, Any]:
    """The scrape job the Operator would generate for the monitor's first endpoint."""
    endpoint = monitor["spec"]["endpoints"][0]
    job_label = monitor["spec"].get("jobLabel")
    job = service["metadata"]["labels"].get(job_label, service["metadata"]["name"])
    discovered = {
        "__meta_kubernetes_namespace": NAMESPACE,
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_pod_name": EXPORTER_POD,
        "__meta_kubernetes_pod_container_name": "gpuload",
        "__meta_kubernetes_pod_node_name": NODE,
    }
    # The Operator's own target labels, then the endpoint's relabelings.
    relabelings: list[dict[str, Any]] = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"target_label": "job", "replacement": job},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    for rule in endpoint.get("relabelings", []):
        relabelings.append({_snake(key): value for key, value in rule.items()})
    return {
        "job_name": f"serviceMonitor/{NAMESPACE}/{monitor['metadata']['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "scrape_interval": "1s",
        "scrape_timeout": "900ms",
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": [{"targets": [address], "labels": discovered}],
        "relabel_configs": relabelings,
    }


@pytest.fixture
def kubelet_socket() -> Iterator[Path]:
    folder = short_socket_dir()
    yield folder / "kubelet.sock"
    shutil.rmtree(folder, ignore_errors=True)


def start_prometheus(
    tmp_path: Path, jobs: list[dict[str, Any]], rules: dict[str, Any], start: Callable[..., Any]
) -> str:
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(yaml.safe_dump(rules), encoding="utf-8")
    config = {
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": jobs,
    }
    return run_prometheus(start, tmp_path, config)


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    response = requests.get(prometheus + "/api/v1/query", params={"query": expr}, timeout=5)
    found: list[dict[str, Any]] = response.json()["data"]["result"]
    return found


def test_the_rendered_monitor_attributes_gpus_to_the_workloads_pods(
    tmp_path: Path,
    kubelet_socket: Path,
    daemon_factory: Callable[..., Daemon],
    processes: Callable[..., subprocess.Popen[str]],
) -> None:
    objects = rendered({})
    (monitor,) = [
        o for o in objects if o["kind"] == "ServiceMonitor" and "relay" not in o["metadata"]["name"]
    ]
    (service,) = [
        o
        for o in objects
        if o["kind"] == "Service" and o["metadata"]["name"] == monitor["metadata"]["name"]
    ]
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    # Beside it, what the chart shipped before (honorLabels false), scraping the same exporter
    # under another job: the Operator's `pod`/`namespace` would win over the exporter's.
    (before,) = [
        o
        for o in rendered({"serviceMonitor": {"honorLabels": False}})
        if o["kind"] == "ServiceMonitor" and "relay" not in o["metadata"]["name"]
    ]
    before["metadata"]["name"] = "before"
    before["spec"]["endpoints"][0]["relabelings"].append(
        {"targetLabel": "job", "replacement": "before"}
    )

    config = tmp_path / "gpuload.yaml"
    config.write_text(
        yaml.safe_dump(
            {"collectors": {"kubernetes": {"socket": str(kubelet_socket), "refresh": 1}}}
        ),
        encoding="utf-8",
    )
    kubelet_env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    probe = daemon_factory("--simulate", "training", "--config", str(config), env=kubelet_env)
    uuids = {
        dict(labels)["gpu"]: dict(labels)["uuid"]
        for labels in series(parse_metrics(probe.get("/metrics").text), "gpu_info")
    }
    kubelet = FakeKubelet(
        kubelet_socket,
        [
            Pod("ml", "train-0", {"trainer": [(GPU, [uuids["0"], uuids["1"]])]}),
            Pod("research", "notebook-3", {"jupyter": [(GPU, [uuids["5"]])]}),
        ],
    ).start()
    try:
        wait_until(
            lambda: series(parse_metrics(probe.get("/metrics").text), "gpu_pod_info"),
            what="gpu_pod_info from the fake kubelet",
        )
        address = probe.url.removeprefix("http://").rstrip("/")
        prometheus = start_prometheus(
            tmp_path,
            [operator_job(monitor, service, address), operator_job(before, service, address)],
            {"groups": rule["spec"]["groups"]},
            processes,
        )
        wait_until(lambda: len(query(prometheus, "up == 1")) == 2, what="both jobs scraped")
        # The join docs/kubernetes.md documents, on the chart's job.
        (job,) = {r["metric"]["job"] for r in query(prometheus, "up")} - {"before"}
        join = (
            f'gpu_utilization_ratio{{job="{job}"}} * on (instance, gpu, uuid)'
            f' group_left (namespace, pod) gpu_pod_info{{job="{job}"}}'
        )
        wait_until(lambda: len(query(prometheus, join)) == 3, what="three GPUs joined to pods")
        wait_until(
            lambda: len(query(prometheus, 'gpu_pod_info{job="before"}')) == 3,
            what="the same allocations under the old settings",
        )
        joined = sorted(
            (r["metric"]["gpu"], r["metric"]["namespace"], r["metric"]["pod"])
            for r in query(prometheus, join)
        )
        old = query(prometheus, 'gpu_pod_info{job="before"}')
        ups = {r["metric"]["job"]: r["metric"] for r in query(prometheus, "up")}
    finally:
        kubelet.stop()
    assert joined == [
        ("0", "ml", "train-0"),
        ("1", "ml", "train-0"),
        ("5", "research", "notebook-3"),
    ]
    # The chart's relabelling: the node, as `node` and as `instance`.
    assert ups[job]["instance"] == NODE and ups[job]["node"] == NODE
    # The defect the chart's honorLabels fixes: every GPU "belongs" to the exporter's pod.
    assert {r["metric"]["pod"] for r in old} == {EXPORTER_POD}
    assert {r["metric"]["exported_pod"] for r in old} == {"train-0", "notebook-3"}
