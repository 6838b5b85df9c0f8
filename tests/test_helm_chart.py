"""The Helm chart, rendered and linted by Helm's own engine (helm-python-sdk embeds it).

Every rendered core object is checked against the Kubernetes schemas of the last four minor
versions kubernetes-validate ships; the Prometheus Operator's objects are checked against its CRDs
in tests/test_helm_platforms.py, with the platforms' values. The PrometheusRule must be the
shipped rules with the chosen thresholds and the chart's job, and the chart's copies must match
alert_rules/ and grafana/dashboards/.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from helm_python import _native
from kubernetes_validate import utils as validate_utils

from exporter import config
from exporter.alerting import thresholds
from exporter.collectors import REGISTRY
from exporter.relay import config as relay_config
from tools import RULES_DIR, render_rules
from tools import chart as chart_files

CHART = chart_files.CHART
NAMESPACE = "monitoring"
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# What a cluster with the Prometheus Operator's CRDs serves, as `helm template --api-versions`
# gives it: the chart renders its monitors and rules only for such a cluster (enabled: auto).
OPERATOR_APIS = tuple(f"monitoring.coreos.com/v1/{kind}" for kind in sorted(OPERATOR_KINDS))
KUBE_VERSIONS = sorted(
    set(validate_utils.all_versions()), key=lambda v: tuple(int(part) for part in v.split("."))
)[-4:]

# The relay runs only with a target: without one the chart deploys nothing for it.
WITH_RELAY: dict[str, Any] = {
    "relay": {
        "targets": {
            "ops": {"type": "webhook", "secrets": {"url": {"name": "relay-targets", "key": "ops"}}}
        },
        "route": {"targets": ["ops"]},
    }
}

FULL_RELAY = {
    "relay": {
        "targets": {
            "slack-ops": {
                "type": "slack",
                "secrets": {"url": {"name": "relay-targets", "key": "slack-ops-url"}},
                "settings": {"min_interval": "2s"},
            },
            "pager": {
                "type": "pagerduty",
                "secrets": {"routing_key": {"name": "relay-targets", "key": "pagerduty"}},
            },
        },
        "route": {
            "targets": ["slack-ops"],
            "routes": [{"matchers": ['severity="critical"'], "targets": ["pager"]}],
        },
        "persistence": {"enabled": True, "storageClassName": "fast"},
    },
    "networkPolicy": {"enabled": True},
}
CUSTOM_THRESHOLDS = {
    "prometheusRule": {
        "thresholds": {
            "window": "10m",
            "short_window": "2m",
            "team_label": "app_kubernetes_io_team",
            "alerts": {
                "GPUUtilizationLow": {"below": 0.25, "for": "15m", "severity": "info"},
                "GPUTemperatureHigh": {"margin_celsius": 3},
                "GPUXidError": {"xids": [79, 48], "for": "1m"},
                "GPULoadStale": {"max_age": "2m30s"},
                "GPUFellOffBus": {"for": "0s", "keep_firing_for": "30m"},
            },
        }
    }
}
MIG_NODES = {
    "exporter": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "nvidia.com/mig.strategy",
                                "operator": "In",
                                "values": ["single", "mixed"],
                            }
                        ]
                    }
                ]
            }
        },
        "runtimeClassName": "nvidia",
        "priorityClassName": "system-node-critical",
    }
}
SHARED_GPUS: dict[str, Any] = {"exporter": {"podResources": {"sharedGPUs": True}}}
# Objects without a namespace.
CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding"}
COMBINATIONS = {
    "defaults": {},
    "shared-gpus": SHARED_GPUS,
    "no-servicemonitor": {"serviceMonitor": {"enabled": False}},
    "no-relay": {"relay": {"enabled": False}},
    "custom-thresholds": CUSTOM_THRESHOLDS,
    "mig-node-selector": MIG_NODES,
    "full-relay": FULL_RELAY,
    "minimal": {
        "relay": {"enabled": False},
        "dashboards": {"enabled": False},
        "prometheusRule": {"enabled": False},
        "serviceMonitor": {"enabled": False},
        "exporter": {"podResources": {"enabled": False}},
    },
}


@pytest.fixture(scope="module")
def loaded() -> helm.Chart:
    with helm.Chart.load(CHART) as chart:
        yield chart


def render_chart(
    chart: helm.Chart, values: dict[str, Any], *, api_versions: tuple[str, ...] = OPERATOR_APIS
) -> dict[str, str]:
    """The chart rendered as `helm template --api-versions ...` would: template path -> text.

    Chart.render offers no api_versions argument; the options of libhelm_c's render, which it
    calls, do (the Capabilities.APIVersions of helm template), so this passes them itself.
    """
    options = {
        "name": "gpuload",
        "namespace": NAMESPACE,
        "is_install": True,
        "api_versions": list(api_versions),
    }
    rendered = _native.call_string(
        "helm_render", chart._raw(), json.dumps(values), json.dumps(options)
    )
    manifests: dict[str, str] = json.loads(rendered)
    return manifests


def render_objects(
    chart: helm.Chart, values: dict[str, Any], *, api_versions: tuple[str, ...] = OPERATOR_APIS
) -> list[dict[str, Any]]:
    manifests = render_chart(chart, values, api_versions=api_versions)
    return [
        document
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document
    ]


def the(objects: list[dict[str, Any]], kind: str, name: str = "gpuload") -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objects}


def test_chart_copies_match_alert_rules_and_grafana() -> None:
    stale = [str(path.relative_to(chart_files.ROOT)) for path in chart_files.stale_files()]
    assert stale == [], f"run scripts/refresh-chart and commit: {stale}"


@pytest.mark.parametrize("values", COMBINATIONS.values(), ids=COMBINATIONS.keys())
def test_lint_strict_is_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


def validate_core(item: dict[str, Any]) -> None:
    """A Kubernetes object, strictly against the schemas of each of KUBE_VERSIONS."""
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(item, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{item['kind']} {item['metadata']['name']} on {version}: {error}")


@pytest.mark.parametrize("values", COMBINATIONS.values(), ids=COMBINATIONS.keys())
def test_core_objects_validate_against_the_last_four_kubernetes_versions(
    loaded: helm.Chart, values: dict[str, Any]
) -> None:
    objects = render_objects(loaded, values)
    assert len(KUBE_VERSIONS) == 4
    for item in objects:
        if item["kind"] in OPERATOR_KINDS:
            continue
        validate_core(item)
        if item["kind"] in CLUSTER_KINDS:
            assert "namespace" not in item["metadata"]
        else:
            assert item["metadata"]["namespace"] == NAMESPACE or item["kind"] == "ConfigMap"


def test_defaults_render_every_part(loaded: helm.Chart) -> None:
    exporter = {"ServiceAccount", "ConfigMap", "DaemonSet", "Service", "ServiceMonitor"}
    exporter |= {"PrometheusRule"}
    assert kinds(render_objects(loaded, {})) == exporter
    objects = render_objects(loaded, WITH_RELAY)
    assert kinds(objects) == exporter | {"Deployment", "Secret", "PodDisruptionBudget"}
    assert "NetworkPolicy" not in kinds(objects) and "PersistentVolumeClaim" not in kinds(objects)


def test_the_relay_is_deployed_only_with_a_target_and_a_route(loaded: helm.Chart) -> None:
    """Gpuload relay refuses to start without a target: the default install must not crash-loop."""
    notes = render_chart(loaded, {})["gpuload/templates/NOTES.txt"]
    assert "The relay is not deployed until relay.targets names a target" in notes
    no_route = {"relay": {**WITH_RELAY["relay"], "route": {}}}
    with pytest.raises(Exception, match=r"relay\.route: give the top route's targets"):
        render_objects(loaded, no_route)


def test_toggles_leave_their_objects_out(loaded: helm.Chart) -> None:
    assert "ServiceMonitor" not in kinds(render_objects(loaded, COMBINATIONS["no-servicemonitor"]))
    without_relay = render_objects(loaded, COMBINATIONS["no-relay"])
    assert "Deployment" not in kinds(without_relay) and "Secret" not in kinds(without_relay)
    assert kinds(render_objects(loaded, COMBINATIONS["minimal"])) == {
        "ServiceAccount",
        "ConfigMap",
        "DaemonSet",
        "Service",
    }


def test_daemonset_runs_on_gpu_nodes_locked_down(loaded: helm.Chart) -> None:
    daemonset = the(render_objects(loaded, {}), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    ]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"
    (container,) = pod["containers"]
    assert container["args"] == ["serve", "--config", "/etc/gpuload/gpuload.yaml"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    assert daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_mig_node_selector_runtime_and_priority_class(loaded: helm.Chart) -> None:
    pod = the(render_objects(loaded, MIG_NODES), "DaemonSet")["spec"]["template"]["spec"]
    affinity = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == (
        "nvidia.com/mig.strategy"
    )
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"


def test_exporter_config_is_one_gpuload_accepts(loaded: helm.Chart, tmp_path: Path) -> None:
    configmap = the(render_objects(loaded, {}), "ConfigMap")
    path = tmp_path / "gpuload.yaml"
    path.write_text(configmap["data"]["gpuload.yaml"])
    settings = config.load(
        file=path,
        collectors={name: spec.enabled_by_default for name, spec in REGISTRY.items()},
        collector_options={name: spec.options for name, spec in REGISTRY.items()},
    )
    assert settings.web.listen_address == ":19400"
    assert settings.collector_options["kubernetes"]["socket"] == (
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )


def exporter_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    return pod


def exporter_settings(objects: list[dict[str, Any]]) -> dict[str, Any]:
    settings: dict[str, Any] = yaml.safe_load(the(objects, "ConfigMap")["data"]["gpuload.yaml"])
    return settings


def test_the_history_survives_a_container_restart_by_default_and_a_rollout_on_a_host_path(
    loaded: helm.Chart, tmp_path: Path
) -> None:
    path = "/var/lib/gpuload/history/history.json.gz"
    for values, volume in [
        ({}, {"name": "history", "emptyDir": {"sizeLimit": "64Mi"}}),
        (
            {"exporter": {"history": {"hostPath": "/var/lib/gpuload-history"}}},
            {
                "name": "history",
                "hostPath": {"path": "/var/lib/gpuload-history", "type": "DirectoryOrCreate"},
            },
        ),
    ]:
        objects = render_objects(loaded, values)
        pod = exporter_pod(objects)
        assert volume in pod["volumes"], pod["volumes"]
        (container,) = pod["containers"]
        mount = {"name": "history", "mountPath": "/var/lib/gpuload/history"}
        assert mount in container["volumeMounts"]
        file = tmp_path / "gpuload.yaml"
        file.write_text(the(objects, "ConfigMap")["data"]["gpuload.yaml"])
        settings = config.load(
            file=file,
            collectors={name: spec.enabled_by_default for name, spec in REGISTRY.items()},
            collector_options={name: spec.options for name, spec in REGISTRY.items()},
        )
        assert settings.history.path == path


def test_defaults_grant_no_kubernetes_api_access_and_no_host_pids(loaded: helm.Chart) -> None:
    objects = render_objects(loaded, {})
    pod = exporter_pod(objects)
    assert "hostPID" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert the(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    assert not kinds(objects) & CLUSTER_KINDS
    assert "kube-api-access" not in {v["name"] for v in pod["volumes"]}
    assert "pods" not in exporter_settings(objects)["collectors"]["kubernetes"]
    (container,) = pod["containers"]
    # NODE_NAME is there either way: the status page names the node with it.
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_shared_gpus_add_host_pids_a_token_and_get_list_on_pods(loaded: helm.Chart) -> None:
    values = {
        "exporter": {"podResources": {"sharedGPUs": True}, "hostPID": False},
        "web": {"basicAuth": {"existingSecret": "gpuload-basic-auth"}},
    }
    objects = render_objects(loaded, values)
    pod = exporter_pod(objects)
    assert pod["hostPID"] is True
    assert the(objects, "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    ]
    binding = the(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpuload",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuload", "namespace": NAMESPACE}
    ]
    for item in (the(objects, "ClusterRole"), binding):
        assert item["metadata"]["labels"]["app.kubernetes.io/component"] == "exporter"
    assert exporter_settings(objects)["collectors"]["kubernetes"]["pods"] == "apiserver"
    # The token reaches the exporter container, not the init container, and no other pod.
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["kube-api-access"] == {
        "name": "kube-api-access",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    }
    (init,) = pod["initContainers"]
    assert "kube-api-access" not in {m["name"] for m in init["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    sources = volumes["kube-api-access"]["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
    assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # The security context stays the pod-attribution one: root with every capability dropped.
    assert container["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_shared_gpus_bind_the_named_service_account(loaded: helm.Chart) -> None:
    values = {**SHARED_GPUS, "serviceAccount": {"create": False, "name": "gpu-monitor"}}
    objects = render_objects(loaded, values)
    assert "ServiceAccount" not in kinds(objects)
    assert exporter_pod(objects)["serviceAccountName"] == "gpu-monitor"
    (subject,) = the(objects, "ClusterRoleBinding")["subjects"]
    assert subject == {"kind": "ServiceAccount", "name": "gpu-monitor", "namespace": NAMESPACE}


def test_shared_gpus_leave_the_exporters_egress_open(loaded: helm.Chart) -> None:
    """The API server is reached because the exporter's NetworkPolicy restricts ingress only."""
    objects = render_objects(loaded, {**SHARED_GPUS, "networkPolicy": {"enabled": True}})
    policy = the(objects, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]


def test_shared_gpus_without_pod_attribution_fail_saying_what_to_set(loaded: helm.Chart) -> None:
    values = {"exporter": {"podResources": {"enabled": False, "sharedGPUs": True}}}
    with pytest.raises(Exception, match="gpuload") as raised:
        render_objects(loaded, values)
    needs = "exporter.podResources.sharedGPUs needs exporter.podResources.enabled: true"
    assert needs in str(raised.value)


def test_shared_gpus_exporter_config_is_one_gpuload_accepts(
    loaded: helm.Chart, tmp_path: Path
) -> None:
    options = {name: spec.options for name, spec in REGISTRY.items()}
    if "pods" not in options["kubernetes"]:
        pytest.skip("the kubernetes collector declares no `pods` option yet")
    path = tmp_path / "gpuload.yaml"
    path.write_text(the(render_objects(loaded, SHARED_GPUS), "ConfigMap")["data"]["gpuload.yaml"])
    settings = config.load(
        file=path,
        collectors={name: spec.enabled_by_default for name, spec in REGISTRY.items()},
        collector_options=options,
    )
    assert settings.collector_options["kubernetes"]["pods"] == "apiserver"


def test_servicemonitor_adds_the_node_label(loaded: helm.Chart) -> None:
    values = {"serviceMonitor": {"interval": "30s", "labels": {"release": "kps"}}}
    monitor = the(render_objects(loaded, values), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["interval"] == "30s"
    assert endpoint["relabelings"][0] == {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    }
    selector = monitor["spec"]["selector"]["matchLabels"]
    service = the(render_objects(loaded, values), "Service")
    assert selector == service["spec"]["selector"]


def shipped_groups() -> list[dict[str, Any]]:
    files = ("gpuload-recording.rules.yml", "gpuload-alerts.rules.yml")
    return [
        group
        for name in files
        for group in yaml.safe_load((RULES_DIR / name).read_text())["groups"]
    ]


def rendered_groups(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The groups `python -m tools.render_rules` makes of a thresholds document."""
    return [
        group
        for text in render_rules.render(thresholds.parse(document)).values()
        for group in yaml.safe_load(text)["groups"]
    ]


def test_prometheus_rule_is_the_shipped_rules_for_the_charts_job(loaded: helm.Chart) -> None:
    rule = the(render_objects(loaded, {}), "PrometheusRule")
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text())
    assert document["exporter_job_regex"] != "gpuload"
    # The shipped rules' own regex would match the relay's job too; the chart's names its job.
    assert rule["spec"]["groups"] == rendered_groups({**document, "exporter_job_regex": "gpuload"})
    shipped = shipped_groups()
    assert rendered_groups(document) == shipped
    assert len(rule["spec"]["groups"]) == len(shipped)


def test_prometheus_rule_takes_the_thresholds_from_values(loaded: helm.Chart) -> None:
    rule = the(render_objects(loaded, CUSTOM_THRESHOLDS), "PrometheusRule")
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text())
    merged = copy.deepcopy(document)
    overrides = CUSTOM_THRESHOLDS["prometheusRule"]["thresholds"]
    merged["window"] = overrides["window"]
    merged["short_window"] = overrides["short_window"]
    merged["team_label"] = overrides["team_label"]
    merged["exporter_job_regex"] = "gpuload"
    for name, fields in overrides["alerts"].items():
        merged["alerts"][name].update(fields)
    assert rule["spec"]["groups"] == rendered_groups(merged)
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    low = alerts["GPUUtilizationLow"]
    assert "rate2m[3m]) unless on" in low["expr"] and ")) < 0.25" in low["expr"]
    assert low["for"] == "15m"
    assert low["labels"]["severity"] == "info" and "below 25%" in low["annotations"]["description"]
    assert "for" not in alerts["GPUFellOffBus"]
    assert alerts["GPUFellOffBus"]["keep_firing_for"] == "30m"
    assert '"79|48"' in alerts["GPUXidError"]["expr"]
    assert "> 150" in alerts["GPULoadStale"]["expr"]
    (team,) = [
        r
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "gpuload:pod_team" in str(r.get("record"))
    ]
    assert 'kube_pod_labels{label_app_kubernetes_io_team!=""}' in team["expr"]


def test_dashboards_are_configmaps_for_grafanas_sidecar(loaded: helm.Chart) -> None:
    objects = render_objects(loaded, {"dashboards": {"namespace": "grafana"}})
    dashboards = {
        key: (o, value)
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"
        for key, value in o["data"].items()
    }
    shipped = sorted(chart_files.DASHBOARDS.glob("*.json"))
    assert sorted(dashboards) == [path.name for path in shipped]
    for path in shipped:
        configmap, text = dashboards[path.name]
        assert json.loads(text) == json.loads(path.read_text())
        assert configmap["metadata"]["namespace"] == "grafana"
        assert configmap["metadata"]["annotations"]["k8s-sidecar-target-directory"] == "gpuload"


def test_relay_config_is_one_the_relay_accepts(loaded: helm.Chart, tmp_path: Path) -> None:
    objects = render_objects(loaded, FULL_RELAY)
    deployment = the(objects, "Deployment", "gpuload-relay")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e
    }
    assert secrets == {
        "RELAY_AUTH_TOKEN": {"name": "gpuload-relay-auth", "key": "token"},
        "RELAY_TARGET_SLACK_OPS_URL": {"name": "relay-targets", "key": "slack-ops-url"},
        "RELAY_TARGET_PAGER_ROUTING_KEY": {"name": "relay-targets", "key": "pagerduty"},
    }
    path = tmp_path / "relay.yaml"
    path.write_text(the(objects, "ConfigMap", "gpuload-relay")["data"]["relay.yaml"])
    settings = relay_config.load(
        file=path,
        environ={
            "RELAY_AUTH_TOKEN": "t0ken",
            "RELAY_TARGET_SLACK_OPS_URL": "https://hooks.example/1",
            "RELAY_TARGET_PAGER_ROUTING_KEY": "rk",
        },
    )
    assert settings.web.listen_address == ":19401"
    assert sorted(settings.targets) == ["pager", "slack-ops"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["queue"]["persistentVolumeClaim"]["claimName"] == "gpuload-relay"
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    claim = the(objects, "PersistentVolumeClaim", "gpuload-relay")
    assert claim["spec"]["storageClassName"] == "fast"
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies == {"gpuload", "gpuload-relay"}


@pytest.mark.parametrize("values", [WITH_RELAY, FULL_RELAY], ids=["one-target", "full"])
def test_the_relay_pod_starts_with_what_the_chart_renders(
    loaded: helm.Chart, values: dict[str, Any], tmp_path: Path
) -> None:
    """The container's own arguments and rendered config, run by the real `gpuload relay`."""
    from relay_helpers import assert_rendered_relay_starts

    objects = render_objects(loaded, values)
    (container,) = the(objects, "Deployment", "gpuload-relay")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["args"] == ["relay", "--config", "/etc/gpuload-relay/relay.yaml"]
    assert_rendered_relay_starts(objects, tmp_path)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"exporter": {"port": "metrics"}}, "at '/exporter/port': got string, want integer"),
        (
            {"prometheusRule": {"thresholds": {"alerts": {"GPUUtilizationLow": {"below": 30}}}}},
            "at '/prometheusRule/thresholds/alerts/GPUUtilizationLow/below': maximum",
        ),
        (
            {"prometheusRule": {"thresholds": {"alerts": {"GPUUtilizationLow": {"bellow": 1}}}}},
            "additional properties 'bellow' not allowed",
        ),
        (
            {"prometheusRule": {"thresholds": {"alerts": {"GPUFellOffBus": {"for": "1 min"}}}}},
            "at '/prometheusRule/thresholds/alerts/GPUFellOffBus/for'",
        ),
        (
            # The key as Kubernetes writes it: kube-state-metrics' label_ name has `_` for `.`, `/`.
            {"prometheusRule": {"thresholds": {"team_label": "app.kubernetes.io/team"}}},
            "at '/prometheusRule/thresholds/team_label'",
        ),
        ({"relay": {"targets": {"ops": {"type": "slak"}}}}, "at '/relay/targets/ops/type'"),
        (
            # A setting of another kind: the schema takes each kind's declared settings only.
            {"relay": {"targets": {"ops": {"type": "slack", "settings": {"at_all": True}}}}},
            "invalid propertyName 'at_all'",
        ),
        (
            {
                "relay": {
                    "targets": {
                        "ops": {
                            "type": "slack",
                            "secrets": {"routing_key": {"name": "relay", "key": "pd"}},
                        }
                    }
                }
            },
            "invalid propertyName 'routing_key'",
        ),
        ({"serviceMonitor": {"enabeld": False}}, "additional properties 'enabeld' not allowed"),
        ({"serviceMonitor": {"enabled": "yes"}}, "at '/serviceMonitor/enabled'"),
        ({"web": {"tls": {"existingSecret": "Not_A_Name"}}}, "at '/web/tls/existingSecret'"),
        ({"exporter": {"env": [{"name": "PATH", "value": "/"}]}}, "at '/exporter/env/0/name'"),
    ],
)
def test_bad_values_fail_with_the_schemas_message(
    loaded: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match="gpuload") as raised:
        loaded.render(values=values, name="gpuload", namespace=NAMESPACE)
    assert message in str(raised.value)


def test_notes_say_where_metrics_and_alerts_go(loaded: helm.Chart) -> None:
    notes = loaded.render(values=FULL_RELAY, name="gpuload", namespace=NAMESPACE)[
        "gpuload/templates/NOTES.txt"
    ]
    assert "port-forward daemonset/gpuload 19400" in notes
    assert "http://gpuload-relay.monitoring.svc:19401/alerts" in notes
    assert "pager, slack-ops" in notes
