"""The chart on each platform: rendered by Helm's engine, validated, and its pod run here.

Every value set of docs/kubernetes.md (the ```yaml blocks headed `# NAME.yaml`) and the other
combinations below are rendered with and without the Prometheus Operator's API versions; every
object is validated against the Kubernetes schemas kubernetes-validate ships and the Operator's
own CRDs (tests/data/crds/, v0.76.2), made strict as the API server's strict field validation
is. Then the exporter's pod is emulated on this machine: its volumes become folders, its
container runs `gpuload serve` with the rendered user, no capabilities and a read-only root (a
mount namespace and setpriv), against a fake kubelet whose pod-resources folder and socket have
the kubelet's modes (0750 and 0755, root's).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import requests
import yaml
from helpers import ROOT, Daemon, follow, series, value_of, wait_until
from test_helm_chart import (
    CHART,
    NAMESPACE,
    OPERATOR_APIS,
    OPERATOR_KINDS,
    WITH_RELAY,
    render_chart,
    render_objects,
    the,
    validate_core,
)
from test_web_config import Authority

from exporter import config, nvml, sim
from exporter.collectors import REGISTRY
from tools.kubelet import FakeKubelet, Pod

DOCS = ROOT / "docs" / "kubernetes.md"
CRDS = Path(__file__).parent / "data" / "crds"
_VALUES_BLOCK = re.compile(r"```yaml\n# ([a-z0-9-]+)\.yaml\n(.*?)```", re.DOTALL)
GPU = "nvidia.com/gpu"


def documented_values() -> dict[str, dict[str, Any]]:
    """docs/kubernetes.md's values files, by name: what the platform sections tell users to set."""
    return {
        name: yaml.safe_load(text) or {} for name, text in _VALUES_BLOCK.findall(DOCS.read_text())
    }


DOCUMENTED = documented_values()
LOCAL_ALERTS = {
    "exporter": {
        "config": {
            "alerting": {
                "targets": {"ops": {"type": "webhook", "url": "http://127.0.0.1:9/hook"}},
                "route": {"targets": ["ops"]},
            }
        }
    }
}
EXTRAS = {
    "exporter": {
        "hostNetwork": True,
        "extraEnv": [
            {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
}
# name -> (values, the API versions the cluster serves)
MATRIX: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "defaults": ({}, OPERATOR_APIS),
    **{name: (values, OPERATOR_APIS) for name, values in DOCUMENTED.items()},
    "no-crds": ({}, ()),
    "no-relay": ({"relay": {"enabled": False}}, OPERATOR_APIS),
    "podmonitor": ({"podMonitor": {"enabled": True}}, OPERATOR_APIS),
    "attribution-off": ({"exporter": {"podResources": {"enabled": False}}}, OPERATOR_APIS),
    "shared-gpus": ({"exporter": {"podResources": {"sharedGPUs": True}}}, OPERATOR_APIS),
    "local-alerts": (LOCAL_ALERTS, OPERATOR_APIS),
    "extras-hostnetwork": (EXTRAS, OPERATOR_APIS),
    "nameoverride": ({"nameOverride": "gpumon"}, OPERATOR_APIS),
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def exporter_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any]
    (container,) = pod_of(objects)["containers"]
    return container


def monitor_endpoint(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (monitor,) = [
        o
        for o in objects
        if o["kind"] in {"ServiceMonitor", "PodMonitor"}
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "exporter"
    ]
    spec = monitor["spec"]
    endpoint: dict[str, Any]
    (endpoint,) = spec.get("endpoints") or spec["podMetricsEndpoints"]
    return endpoint


# --- the documented values --------------------------------------------------------------------


def test_docs_give_values_for_each_platform() -> None:
    assert {"gpu-operator", "eks", "gke", "tls-basic-auth", "gitops"} <= set(DOCUMENTED)


# gitops.yaml forces the Operator's objects on, and helm lint knows no cluster's API versions.
@pytest.mark.parametrize("name", sorted(set(DOCUMENTED) - {"gitops"}))
def test_lint_strict_is_clean_with_the_documented_values(name: str) -> None:
    report = helm.lint(CHART, DOCUMENTED[name], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


# --- validation -------------------------------------------------------------------------------


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The Operator CRD's openAPIV3Schema of `kind`, strict: unknown fields are errors.

    A CRD schema leaves additionalProperties open and the API server prunes unknown fields
    (kubectl's strict field validation makes them errors); a typo here would silently drop a
    setting, so every object with declared properties gets additionalProperties: false.
    """
    plural = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors"}.get(
        kind, "prometheusrules"
    )
    document = yaml.safe_load((CRDS / f"monitoring.coreos.com_{plural}.yaml").read_text())
    (version,) = [v for v in document["spec"]["versions"] if v["name"] == "v1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        strict["additionalProperties"] = False
    return strict


def validate(item: dict[str, Any]) -> None:
    name = f"{item['kind']} {item['metadata']['name']}"
    if item["kind"] in OPERATOR_KINDS:
        assert item["apiVersion"] == "monitoring.coreos.com/v1"
        schema = crd_schema(item["kind"])
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(item), key=str)
        assert not errors, f"{name}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
        )
        return
    validate_core(item)


@pytest.mark.parametrize(("values", "apis"), MATRIX.values(), ids=MATRIX.keys())
def test_every_object_is_valid_for_kubernetes_and_the_operators_crds(
    chart: helm.Chart, values: dict[str, Any], apis: tuple[str, ...]
) -> None:
    objects = render_objects(chart, values, api_versions=apis)
    for item in objects:
        validate(item)
    operator_kinds = {o["kind"] for o in objects} & OPERATOR_KINDS
    assert operator_kinds if apis else not operator_kinds


def test_the_crds_are_strict() -> None:
    """A misspelt endpoint field fails, as it would with the API server's strict validation."""
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "metrics", "honorLabel": True}]},
    }
    with pytest.raises(AssertionError, match="honorLabel"):
        validate(monitor)


# --- 1. pod attribution: root with no capabilities, uid 10001 without it ----------------------


def test_exporter_is_root_without_capabilities_with_pod_attribution(chart: helm.Chart) -> None:
    objects = render_objects(chart, {})
    assert exporter_container(objects)["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts = {m["name"]: m for m in exporter_container(objects)["volumeMounts"]}
    assert mounts["pod-resources"]["readOnly"] is True


def test_exporter_is_uid_10001_without_pod_attribution(chart: helm.Chart) -> None:
    objects = render_objects(chart, {"exporter": {"podResources": {"enabled": False}}})
    security = exporter_container(objects)["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (
        10001,
        10001,
        True,
    )
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "pod-resources" not in {v["name"] for v in pod_of(objects)["volumes"]}


def test_the_values_identity_wins(chart: helm.Chart) -> None:
    values = {"exporter": {"securityContext": {"runAsUser": 2000, "runAsNonRoot": True}}}
    security = exporter_container(render_objects(chart, values))["securityContext"]
    assert (security["runAsUser"], security["runAsNonRoot"]) == (2000, True)


# --- 2. honorLabels ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, {"podMonitor": {"enabled": True}}], ids=["sm", "pm"])
def test_monitor_honors_the_exporters_pod_labels(chart: helm.Chart, values: dict) -> None:
    endpoint = monitor_endpoint(render_objects(chart, values))
    assert endpoint["honorLabels"] is True
    relabelings = endpoint["relabelings"]
    for label in ("node", "instance"):
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": label,
            "action": "replace",
        } in relabelings


# --- 3. NVML: the RuntimeClass ----------------------------------------------------------------


def test_runtime_class_is_nvidia_by_default_and_left_out_on_eks_and_gke(chart: helm.Chart) -> None:
    assert pod_of(render_objects(chart, {}))["runtimeClassName"] == "nvidia"
    for platform in ("eks", "gke"):
        assert "runtimeClassName" not in pod_of(render_objects(chart, DOCUMENTED[platform]))


def test_nvidia_variables_are_on_the_exporter_only(chart: helm.Chart) -> None:
    objects = render_objects(chart, WITH_RELAY)
    env = {e["name"]: e.get("value") for e in exporter_container(objects)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    relay = the(objects, "Deployment", "gpuload-relay")["spec"]["template"]["spec"]
    for container in relay["containers"]:
        assert not [e for e in container.get("env", []) if e["name"].startswith("NVIDIA_")]


# --- 4. without the Prometheus Operator's CRDs -------------------------------------------------


def test_install_without_the_operators_crds_leaves_its_objects_out_and_warns(
    chart: helm.Chart,
) -> None:
    manifests = render_chart(chart, WITH_RELAY, api_versions=())
    objects = render_objects(chart, WITH_RELAY, api_versions=())
    assert not {o["kind"] for o in objects} & OPERATOR_KINDS
    assert {"DaemonSet", "Service", "Deployment"} <= {o["kind"] for o in objects}
    notes = manifests["gpuload/templates/NOTES.txt"]
    assert "WARNING: this cluster does not serve the Prometheus Operator's CRDs" in notes
    assert "no ServiceMonitor and no PrometheusRule was installed" in notes
    assert "--api-versions monitoring.coreos.com/v1/ServiceMonitor" in notes


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ({"serviceMonitor": {"enabled": True}}, "ServiceMonitor"),
        ({"prometheusRule": {"enabled": True}}, "PrometheusRule"),
        ({"podMonitor": {"enabled": True}}, "PodMonitor"),
    ],
)
def test_forcing_an_operator_object_without_its_crd_fails_saying_what_to_install(
    chart: helm.Chart, values: dict[str, Any], kind: str
) -> None:
    with pytest.raises(helm.HelmError) as raised:
        render_chart(chart, values, api_versions=())
    message = str(raised.value)
    assert f"has no monitoring.coreos.com/v1/{kind}" in message
    assert "install the Prometheus Operator's CRDs first" in message
    assert "prometheus-operator-crds" in message


def test_forced_objects_render_with_their_crds(chart: helm.Chart) -> None:
    objects = render_objects(chart, DOCUMENTED["gitops"])
    assert {"ServiceMonitor", "PrometheusRule"} <= {o["kind"] for o in objects}


def test_service_and_pod_monitor_together_fail(chart: helm.Chart) -> None:
    values = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}
    with pytest.raises(helm.HelmError, match="scraped twice"):
        render_chart(chart, values)


def test_pod_monitor_replaces_the_exporters_service_monitor(chart: helm.Chart) -> None:
    objects = render_objects(chart, {"podMonitor": {"enabled": True}, **WITH_RELAY})
    monitors = {(o["kind"], o["metadata"]["name"]) for o in objects if "Monitor" in o["kind"]}
    # The relay keeps its ServiceMonitor.
    assert monitors == {("PodMonitor", "gpuload"), ("ServiceMonitor", "gpuload-relay")}
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    pods = the(objects, "DaemonSet")["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["selector"]["matchLabels"] == pods


# --- 5. node coverage -------------------------------------------------------------------------


def test_any_gpu_node_label_schedules_the_exporter_on_every_taint(chart: helm.Chart) -> None:
    pod = pod_of(render_objects(chart, {}))
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # One expression per term: terms are OR'd, the expressions of one term AND'd.
    assert [term["matchExpressions"] for term in terms] == [
        [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
        [
            {
                "key": "feature.node.kubernetes.io/pci-10de.present",
                "operator": "In",
                "values": ["true"],
            }
        ],
        [{"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}],
        [{"key": "k8s.amazonaws.com/accelerator", "operator": "Exists"}],
        [{"key": "kubernetes.azure.com/accelerator", "operator": "Exists"}],
    ]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"


def test_gke_gets_a_quota_for_its_priority_class(chart: helm.Chart) -> None:
    objects = render_objects(chart, DOCUMENTED["gke"])
    (quota,) = [o for o in objects if o["kind"] == "ResourceQuota"]
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}
    ]
    assert "ResourceQuota" not in {o["kind"] for o in render_objects(chart, {})}


def test_gke_mounts_the_managed_driver_privileged(chart: helm.Chart) -> None:
    objects = render_objects(chart, DOCUMENTED["gke"])
    container = exporter_container(objects)
    assert container["securityContext"]["privileged"] is True
    # The API rejects privileged with allowPrivilegeEscalation false: the chart follows.
    assert container["securityContext"]["allowPrivilegeEscalation"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_of(objects)["volumes"]}
    assert volumes[mounts["/usr/local/nvidia"]]["hostPath"]["path"] == "/home/kubernetes/bin/nvidia"


# --- 6. TLS, basic auth, extra volumes and variables, host network ----------------------------


def test_tls_and_basic_auth_reach_the_pod_the_probes_and_the_monitor(chart: helm.Chart) -> None:
    values = DOCUMENTED["tls-basic-auth"]
    tls_secret = values["web"]["tls"]["existingSecret"]
    auth_secret = values["web"]["basicAuth"]["existingSecret"]
    objects = render_objects(chart, values)
    pod = pod_of(objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == tls_secret
    assert volumes["basic-auth"]["secret"]["secretName"] == auth_secret
    (init,) = pod["initContainers"]
    assert init["command"][:2] == ["python", "/etc/gpuload/web-config.py"]
    assert init["securityContext"] == exporter_container(objects)["securityContext"]
    container = exporter_container(objects)
    for probe in ("livenessProbe", "readinessProbe"):
        # /healthz and /readyz answer without basic auth (docs/security.md).
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
        assert container[probe]["httpGet"]["path"] in {"/healthz", "/readyz"}
    settings = yaml.safe_load(the(objects, "ConfigMap")["data"]["gpuload.yaml"])
    assert settings["web"]["config_file"] == "/run/gpuload/web.yml"
    endpoint = monitor_endpoint(objects)
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": tls_secret, "key": "ca.crt"}},
        "serverName": f"gpuload.{NAMESPACE}.svc",
    }
    assert endpoint["basicAuth"] == {
        "username": {"name": auth_secret, "key": "username"},
        "password": {"name": auth_secret, "key": "password"},
    }


def test_tls_alone_needs_no_init_container(chart: helm.Chart) -> None:
    objects = render_objects(chart, {"web": {"tls": {"existingSecret": "gpuload-tls"}}})
    assert "initContainers" not in pod_of(objects)
    data = the(objects, "ConfigMap")["data"]
    assert yaml.safe_load(data["gpuload.yaml"])["web"]["config_file"] == "/etc/gpuload/web.yml"
    assert yaml.safe_load(data["web.yml"]) == {
        "tls_server_config": {
            "cert_file": "/etc/gpuload-tls/tls.crt",
            "key_file": "/etc/gpuload-tls/tls.key",
        }
    }
    assert "basicAuth" not in monitor_endpoint(objects)


def test_a_web_config_file_no_volume_provides_fails(chart: helm.Chart) -> None:
    values = {"exporter": {"config": {"web": {"config_file": "/etc/web.yml"}}}}
    with pytest.raises(helm.HelmError, match="a file no volume provides"):
        render_chart(chart, values)


def test_extra_env_volumes_and_host_network(chart: helm.Chart) -> None:
    objects = render_objects(chart, EXTRAS)
    pod = pod_of(objects)
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    container = exporter_container(objects)
    assert EXTRAS["exporter"]["extraEnv"][0] in container["env"]
    assert EXTRAS["exporter"]["extraEnv"][1] in container["env"]
    assert {"name": "scratch", "emptyDir": {}} in pod["volumes"]
    assert {"name": "scratch", "mountPath": "/scratch"} in container["volumeMounts"]


# --- 7. the job, the relay's token, the alert queue, memory ------------------------------------


def job_regexes(rule: dict[str, Any]) -> set[str]:
    """The regexes of the rules' `up{job=~"..."}`, as PromQL reads its double-quoted strings."""
    return {
        match.encode().decode("unicode_escape")
        for group in rule["spec"]["groups"]
        for item in group["rules"]
        for match in re.findall(r'up\{job=~"((?:[^"\\]|\\.)*)"\}', item["expr"])
    }


@pytest.mark.parametrize(
    ("values", "job"),
    [
        (WITH_RELAY, "gpuload"),
        ({"nameOverride": "gpumon", **WITH_RELAY}, "gpumon"),
        ({"podMonitor": {"enabled": True}, **WITH_RELAY}, "gpuload"),
        ({"serviceMonitor": {"jobName": "gpu.load+x"}, **WITH_RELAY}, "gpu.load+x"),
    ],
    ids=["defaults", "nameoverride", "podmonitor", "regex-characters"],
)
def test_rules_name_exactly_the_exporters_job_and_never_the_relays(
    chart: helm.Chart, values: dict[str, Any], job: str
) -> None:
    objects = render_objects(chart, values)
    relabelings = monitor_endpoint(objects)["relabelings"]
    assert {"targetLabel": "job", "replacement": job, "action": "replace"} in relabelings
    (regex,) = job_regexes(next(o for o in objects if o["kind"] == "PrometheusRule"))
    assert re.fullmatch(regex, job)
    relay_monitor = next(
        o
        for o in objects
        if o["kind"] == "ServiceMonitor"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "relay"
    )
    # Without jobLabel or a job relabelling, a ServiceMonitor's job is its Service's name.
    assert "jobLabel" not in relay_monitor["spec"]
    (endpoint,) = relay_monitor["spec"]["endpoints"]
    assert "relabelings" not in endpoint
    selector = relay_monitor["spec"]["selector"]["matchLabels"]
    (relay_job,) = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()
    ]
    assert not re.fullmatch(regex, relay_job)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")
def test_promtool_accepts_the_rules_with_a_job_that_needs_escaping(
    chart: helm.Chart, tmp_path: Path
) -> None:
    values = {"serviceMonitor": {"jobName": "gpu.load+x"}}
    rule = the(render_objects(chart, values), "PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_thresholds_job_regex_of_the_values_is_kept(chart: helm.Chart) -> None:
    values = {"prometheusRule": {"thresholds": {"exporter_job_regex": "gpu-.*"}}}
    rule = the(render_objects(chart, values), "PrometheusRule")
    assert job_regexes(rule) == {"gpu-.*"}


def test_gitops_renders_the_same_twice_with_an_existing_relay_secret(chart: helm.Chart) -> None:
    values = DOCUMENTED["gitops"]
    first, second = render_chart(chart, values), render_chart(chart, values)
    assert first == second
    objects = render_objects(chart, values)
    assert "Secret" not in {o["kind"] for o in objects}
    relay = the(objects, "Deployment", "gpuload-relay")["spec"]["template"]["spec"]
    (container,) = relay["containers"]
    token = next(e for e in container["env"] if e["name"] == "RELAY_AUTH_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == values["relay"]["auth"]["existingSecret"]


def test_the_generated_relay_token_is_new_on_each_offline_render(chart: helm.Chart) -> None:
    """Why GitOps needs relay.auth.existingSecret: without a cluster, lookup finds nothing."""
    tokens = {
        the(render_objects(chart, WITH_RELAY), "Secret", "gpuload-relay-auth")["data"]["token"]
        for _ in range(2)
    }
    assert len(tokens) == 2
    secret = the(render_objects(chart, WITH_RELAY), "Secret", "gpuload-relay-auth")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_local_alert_queue_is_on_an_empty_dir(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render_objects(chart, LOCAL_ALERTS)
    pod = pod_of(objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["alert-queue"]
    mounts = {m["name"]: m for m in exporter_container(objects)["volumeMounts"]}
    assert mounts["alert-queue"]["mountPath"] == "/var/lib/gpuload"
    assert "readOnly" not in mounts["alert-queue"]
    path = tmp_path / "gpuload.yaml"
    path.write_text(the(objects, "ConfigMap")["data"]["gpuload.yaml"])
    settings = config.load(
        file=path,
        collectors={name: spec.enabled_by_default for name, spec in REGISTRY.items()},
        collector_options={name: spec.options for name, spec in REGISTRY.items()},
    )
    assert settings.alerting.delivery is not None
    assert str(settings.alerting.delivery.queue.path) == "/var/lib/gpuload/alerts.db"
    assert "alert-queue" not in {v["name"] for v in pod_of(render_objects(chart, {}))["volumes"]}


def test_memory_request_covers_the_measured_resident_set(chart: helm.Chart) -> None:
    resources = exporter_container(render_objects(chart, {}))["resources"]
    assert resources["requests"]["memory"] == "96Mi"  # 72 MiB measured with attribution on


# --- NOTES ------------------------------------------------------------------------------------


def test_notes_say_how_to_check_it_worked(chart: helm.Chart) -> None:
    notes = render_chart(chart, {})["gpuload/templates/NOTES.txt"]
    assert "gpuload_nvml_up" in notes and "gpuload_kubernetes_pod_resources_up" in notes
    assert "serviceMonitor.labels.release=" in notes
    assert "prometheusRule.labels.release=" in notes
    assert "WARNING" not in notes
    labelled = {
        "serviceMonitor": {"labels": {"release": "kps"}},
        "prometheusRule": {"labels": {"release": "kps"}},
    }
    notes = render_chart(chart, labelled)["gpuload/templates/NOTES.txt"]
    assert "labels.release=" not in notes


# --- the pod, run here --------------------------------------------------------------------------


def _can_emulate_pods() -> str:
    """Why the pod emulation cannot run here, or "" when it can."""
    if os.geteuid() != 0:
        return "needs root (setpriv to the pod's user, a mount namespace)"
    for tool in ("setpriv", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "mount",
            "-o",
            "remount,bind,ro",
            "/",
        ],
        check=False,
        capture_output=True,
    )
    if probe.returncode:
        return "cannot remount / read-only in a mount namespace here"
    return ""


needs_pods = pytest.mark.skipif(bool(_can_emulate_pods()), reason=_can_emulate_pods() or "-")


@pytest.fixture(scope="module")
def pod_python() -> Iterator[str]:
    """An interpreter every uid can run, as the image's python, with gpuload's packages.

    This environment's may sit on an interpreter under a folder only its owner may enter (a
    pyenv in its home). So when nobody can run it, a throwaway virtual environment on the
    system's interpreter of the same version reads this one's packages through a .pth file.
    """
    if _runs_as_nobody(sys.executable):
        yield sys.executable
        return
    system = shutil.which(
        f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin"
    )
    if system is None:
        pytest.skip("no python interpreter here that every uid may run")
    folder = Path(tempfile.mkdtemp(prefix="gpuload-pod-python-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        subprocess.run([system, "-m", "venv", "--without-pip", str(folder)], check=True)
        (site_packages,) = folder.glob("lib/python*/site-packages")
        paths = dict.fromkeys(
            [str(ROOT), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
        )
        (site_packages / "gpuload-tests.pth").write_text("\n".join(paths) + "\n")
        interpreter = str(folder / "bin" / "python")
        if not _runs_as_nobody(interpreter):
            pytest.skip("no python interpreter here that every uid may run")
        yield interpreter
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _runs_as_nobody(interpreter: str) -> bool:
    """Whether uid 65534 can run gpuload's web config module with it."""
    probe = "import exporter.web.webconfig"
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    done = subprocess.run(
        [*nobody, interpreter, "-c", probe], cwd=ROOT, check=False, capture_output=True
    )
    return done.returncode == 0


class PodOnThisMachine:
    """One rendered pod's volumes as folders, and its containers run as their security context.

    ConfigMaps come from the rendered objects, Secrets from `secrets`, hostPaths from
    `host_paths`, emptyDirs are empty 0777 folders. Every path a container mounts is rewritten
    to its folder, in the containers' commands and in the ConfigMaps' files (the config file
    names the socket, the web config file and the queue by their paths in the container).
    """

    def __init__(
        self,
        objects: list[dict[str, Any]],
        secrets: dict[str, dict[str, bytes]],
        host_paths: dict[str, Path],
        root: Path,
        python: str,
    ) -> None:
        self.pod = pod_of(objects)
        self.python = python
        self.folders: dict[str, Path] = {}
        configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
        for volume in self.pod["volumes"]:
            if "hostPath" in volume:
                self.folders[volume["name"]] = host_paths[volume["hostPath"]["path"]]
                continue
            folder = root / volume["name"]
            folder.mkdir(mode=0o755)
            if "configMap" in volume:
                data = configmaps[volume["configMap"]["name"]]["data"]
                files = {key: value.encode() for key, value in data.items()}
            elif "secret" in volume:
                stored = secrets[volume["secret"]["secretName"]]
                files = {item["path"]: stored[item["key"]] for item in volume["secret"]["items"]}
            else:
                assert "emptyDir" in volume
                folder.chmod(0o777)  # as the kubelet makes an emptyDir
                files = {}
            for name, content in files.items():
                (folder / name).write_bytes(content)
                (folder / name).chmod(0o644)
            self.folders[volume["name"]] = folder
        containers = [*self.pod.get("initContainers", []), *self.pod["containers"]]
        self.paths = {
            mount["mountPath"]: str(self.folders[mount["name"]])
            for container in containers
            for mount in container["volumeMounts"]
        }
        longest_first = sorted(self.paths, key=len, reverse=True)
        self._path = re.compile("(" + "|".join(map(re.escape, longest_first)) + r")(?=/|$|\s|\")")
        for volume in self.pod["volumes"]:
            if "configMap" in volume:
                for path in self.folders[volume["name"]].iterdir():
                    path.write_text(self.translate(path.read_text()))

    def translate(self, text: str) -> str:
        """`text` with each mount path replaced by its folder."""
        return self._path.sub(lambda match: self.paths[match.group(1)], text)

    def command(self, container: dict[str, Any], argv: list[str]) -> list[str]:
        """`argv`, its mount paths translated, run as the container's security context."""
        security = container["securityContext"]
        assert security["capabilities"] == {"drop": ["ALL"]}
        prefix: list[str] = []
        if security["readOnlyRootFilesystem"]:
            remount = 'mount -o remount,bind,ro / && exec "$@"'
            prefix += ["unshare", "--mount", "--propagation", "private", "--"]
            prefix += ["sh", "-c", remount, "sh"]
        prefix += [
            "setpriv",
            f"--reuid={security['runAsUser']}",
            f"--regid={security['runAsGroup']}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ]
        if not security["allowPrivilegeEscalation"]:
            prefix.append("--no-new-privs")
        return [*prefix, "--", *(self.translate(arg) for arg in argv)]

    def environment(self, container: dict[str, Any]) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
        environment.update(
            {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        )
        # The kubelet sets it in every container: the exporter knows it is on Kubernetes.
        environment["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"
        environment["PYTHONUNBUFFERED"] = "1"
        return environment


def start_exporter(pod: PodOnThisMachine, extra: list[str]) -> Daemon:
    """The exporter container's `gpuload serve`, on the simulated GPUs, on 127.0.0.1."""
    container = next(c for c in pod.pod["containers"] if c["name"] == "exporter")
    argv = [pod.python, "-m", "exporter", *container["args"], *extra]
    process = subprocess.Popen(
        pod.command(container, argv),
        cwd=ROOT,
        env=pod.environment(container),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    return follow(process, what="the exporter container", timeout=60)


SIMULATED = ["--simulate", "idle", "--sim.time", "30", "--web.listen-address", "127.0.0.1:0"]


@pytest.fixture(scope="module")
def gpu_uuid() -> str:
    sim.install("idle", pinned_time=30)
    nvml.init()
    try:
        return nvml.device(6).identity().uuid
    finally:
        nvml.shutdown()
        sim.uninstall()


@pytest.fixture
def kubelet(gpu_uuid: str) -> Iterator[Path]:
    """A fake kubelet with the real one's modes; yields its pod-resources folder."""
    top = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    # In the container the hostPath is mounted at its own path: the folders above it are the
    # runtime's (0755), only the folder itself and the socket keep the kubelet's modes.
    top.chmod(0o755)
    folder = top / "pod-resources"
    folder.mkdir(mode=0o750)
    os.chown(folder, 0, 0)
    server = FakeKubelet(
        folder / "kubelet.sock", [Pod("ml", "train-0", {"main": [(GPU, [gpu_uuid])]})]
    ).start()
    (folder / "kubelet.sock").chmod(0o755)
    yield folder
    server.stop()
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def volumes_root() -> Iterator[Path]:
    # On /dev/shm, its own mount: it stays writable when the emulated container's / is read-only.
    root = Path(tempfile.mkdtemp(prefix="gpuload-pod-", dir="/dev/shm"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_pod(kubelet: Path, volumes_root: Path, pod_python: str) -> Callable[..., PodOnThisMachine]:
    """A rendered pod on this machine, its pod-resources hostPath the fake kubelet's."""

    def make(
        objects: list[dict[str, Any]],
        secrets: dict[str, dict[str, bytes]] | None = None,
        host_paths: dict[str, Path] | None = None,
    ) -> PodOnThisMachine:
        paths = {"/var/lib/kubelet/pod-resources": kubelet, **(host_paths or {})}
        return PodOnThisMachine(objects, secrets or {}, paths, volumes_root, pod_python)

    return make


@pytest.fixture
def exporters() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


FAST_ATTRIBUTION = {
    "exporter": {"config": {"collectors": {"kubernetes": {"refresh": "1s", "timeout": "15s"}}}}
}


def with_fast_attribution(values: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(values)
    exporter = merged.setdefault("exporter", {})
    exporter.setdefault("config", {}).update(FAST_ATTRIBUTION["exporter"]["config"])
    return merged


def process_status(daemon: Daemon) -> dict[str, str]:
    lines = Path(f"/proc/{daemon.process.pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


@needs_pods
def test_rendered_exporter_gets_gpu_pod_info_as_root_without_capabilities(
    chart: helm.Chart,
    make_pod: Callable[..., PodOnThisMachine],
    exporters: list[Daemon],
    gpu_uuid: str,
) -> None:
    objects = render_objects(chart, with_fast_attribution({}))
    pod = make_pod(objects)
    daemon = start_exporter(pod, SIMULATED)
    exporters.append(daemon)
    status = process_status(daemon)
    assert status["Uid"].split()[:2] == ["0", "0"]
    assert status["CapEff"].strip() == "0000000000000000"
    assert status["CapBnd"].strip() == "0000000000000000"
    assert status["NoNewPrivs"].strip() == "1"
    root = next(
        line
        for line in Path(f"/proc/{daemon.process.pid}/mountinfo").read_text().splitlines()
        if line.split()[4] == "/"
    )
    assert "ro" in root.split()[5].split(",")
    wait_until(lambda: series(daemon.metrics(), "gpu_pod_info"), timeout=60, what="gpu_pod_info")
    samples = daemon.metrics()
    (labels,) = series(samples, "gpu_pod_info")
    assert dict(labels)["pod"] == "train-0" and dict(labels)["uuid"] == gpu_uuid
    assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 1


@needs_pods
def test_as_uid_10001_the_kubelets_socket_is_out_of_reach(
    chart: helm.Chart,
    make_pod: Callable[..., PodOnThisMachine],
    kubelet: Path,
    exporters: list[Daemon],
) -> None:
    """What the chart did before: the uid of the image, with the socket folder mounted."""
    values = with_fast_attribution(
        {
            "exporter": {
                "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": True}
            }
        }
    )
    objects = render_objects(chart, values)
    pod = make_pod(objects)
    daemon = start_exporter(pod, SIMULATED)
    exporters.append(daemon)
    assert process_status(daemon)["Uid"].split()[0] == "10001"
    wait_until(
        lambda: value_of(daemon.metrics(), "gpuload_kubernetes_pod_resources_up") == 0,
        timeout=60,
        what="gpuload_kubernetes_pod_resources_up 0",
    )
    assert not series(daemon.metrics(), "gpu_pod_info")
    assert str(kubelet) in daemon.log()


@needs_pods
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_rendered_tls_and_basic_auth_serve_https_with_open_probes(
    chart: helm.Chart,
    make_pod: Callable[..., PodOnThisMachine],
    exporters: list[Daemon],
    tmp_path: Path,
) -> None:
    values = DOCUMENTED["tls-basic-auth"]
    objects = render_objects(chart, values)
    authority = Authority("cluster-ca", tmp_path)
    service_name = f"gpuload.{NAMESPACE}.svc"
    cert, key = authority.issue(service_name, server=True)
    secrets = {
        values["web"]["tls"]["existingSecret"]: {
            "tls.crt": cert.read_bytes(),
            "tls.key": key.read_bytes(),
            "ca.crt": authority.cert_file.read_bytes(),
        },
        values["web"]["basicAuth"]["existingSecret"]: {
            "username": b"prometheus",
            "password": b"correct horse battery staple",
        },
    }
    pod = make_pod(objects, secrets)
    (init,) = pod.pod["initContainers"]
    assert init["command"][0] == "python"
    argv = [pod.python, *init["command"][1:]]
    done = subprocess.run(
        pod.command(init, argv),
        cwd=ROOT,
        env=pod.environment(init),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    daemon = start_exporter(pod, SIMULATED)
    exporters.append(daemon)
    assert daemon.url.startswith("https://")
    container = exporter_container(objects)
    for probe in ("livenessProbe", "readinessProbe"):
        url = daemon.url + container[probe]["httpGet"]["path"].lstrip("/")
        # The kubelet's HTTPS probes do not verify the certificate, nor send credentials. The
        # readiness probe answers 200 once the first collection has finished, as it should.
        wait_until(
            lambda url=url: requests.get(url, verify=False, timeout=10).status_code == 200,
            what=f"the {probe} over HTTPS without credentials",
        )
    assert daemon.get("/metrics", verify=str(authority.cert_file)).status_code == 401
    endpoint = monitor_endpoint(objects)
    auth = endpoint["basicAuth"]
    credentials = tuple(
        secrets[auth[part]["name"]][auth[part]["key"]].decode() for part in ("username", "password")
    )
    ca = endpoint["tlsConfig"]["ca"]["secret"]
    ca_file = tmp_path / "monitor-ca.crt"
    ca_file.write_bytes(secrets[ca["name"]][ca["key"]])
    answer = daemon.get("/metrics", verify=str(ca_file), auth=credentials)
    assert answer.status_code == 200 and "gpuload_nvml_up" in answer.text
    # The certificate holds for the name the monitor checks.
    context = ssl.create_default_context(cafile=str(ca_file))
    port = int(daemon.url.rstrip("/").rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=endpoint["tlsConfig"]["serverName"]) as wrapped,
    ):
        assert wrapped.version() is not None


@needs_pods
def test_rendered_local_alerts_start_on_the_read_only_root(
    chart: helm.Chart, make_pod: Callable[..., PodOnThisMachine], exporters: list[Daemon]
) -> None:
    objects = render_objects(chart, LOCAL_ALERTS)
    pod = make_pod(objects)
    daemon = start_exporter(pod, SIMULATED)
    exporters.append(daemon)
    wait_until(lambda: daemon.get("/readyz").status_code == 200, timeout=60, what="readiness")
    assert daemon.process.poll() is None
    wait_until(
        lambda: (pod.folders["alert-queue"] / "alerts.db").exists(), timeout=30, what="the queue"
    )


@needs_pods
@pytest.mark.parametrize("name", ["defaults", *sorted(set(DOCUMENTED) - {"tls-basic-auth"})])
def test_every_documented_install_starts_each_container_as_rendered(
    name: str,
    chart: helm.Chart,
    make_pod: Callable[..., PodOnThisMachine],
    exporters: list[Daemon],
    tmp_path: Path,
) -> None:
    """The exporter's and the relay's rendered arguments and config, run by the real gpuload.

    tls-basic-auth needs its Secrets made: the test of rendered TLS and basic auth runs it. The
    exporter runs as its security context says (root, read-only, no capability); the relay as
    its config and arguments say, its Secrets any value.
    """
    from relay_helpers import assert_rendered_relay_starts

    objects = render_objects(chart, DOCUMENTED.get(name, {}))
    # Host paths beyond the kubelet's (GKE's driver folder) are empty folders here.
    extra = {
        volume["hostPath"]["path"]: tmp_path / volume["name"]
        for volume in pod_of(objects)["volumes"]
        if "hostPath" in volume and volume["name"] != "pod-resources"
    }
    for folder in extra.values():
        folder.mkdir()
    daemon = start_exporter(make_pod(objects, host_paths=extra), SIMULATED)
    exporters.append(daemon)
    wait_until(lambda: series(daemon.metrics(), "gpu_up"), timeout=60, what="the exporter's GPUs")
    relays = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("relay")
    ]
    if relays:
        assert_rendered_relay_starts(objects, tmp_path)
    assert bool(relays) == ("targets" in DOCUMENTED.get(name, {}).get("relay", {}))
