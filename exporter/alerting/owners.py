"""gpuload's owner rules: which workload and which team holds each GPU a pod is allocated.

``gpuload.owners`` joins kube-state-metrics onto ``gpu_pod_info`` (the kubelet's allocations,
:mod:`exporter.collectors.kubernetes`), so that any GPU series sums by workload or by team:

- ``gpuload:pod_owner:info{namespace, pod, owner_kind, owner_name}``: a GPU pod's top controller.
  ``kube_pod_owner`` names the pod's controller; a ReplicaSet's own controller (a Deployment,
  or another kind such as an Argo Rollout) from ``kube_replicaset_owner``, and a Job's (a CronJob)
  from ``kube_job_owner``, replace it. A ReplicaSet or Job without a controller stays itself;
  a pod without one (kube-state-metrics writes ``owner_kind="<none>"``) is its own owner,
  ``owner_kind="Pod"``. Only controller owners (``owner_is_controller="true"``) count.
- ``gpuload:pod_team:info{namespace, pod, team}``: a GPU pod's team, the pod label named by
  ``team_label`` (``kube_pod_labels{label_<team_label>}``).
- ``gpuload:gpu_pod_owner:info``: ``gpu_pod_info`` with ``owner_kind``, ``owner_name`` and
  ``team`` joined on. A pod kube-state-metrics does not know, or one without the team label, is
  kept with those labels empty, so that sums by owner or team never lose a GPU.

kube-state-metrics' own target labels (``instance``, ``job``) are aggregated away, and every
join takes one series per pod (``max by``, ``topk``): two kube-state-metrics replicas that
report the same pod are neither an error nor counted twice. The families and their labels are
kube-state-metrics' (https://github.com/kubernetes/kube-state-metrics, ``internal/store/pod.go``,
``replicaset.go``, ``job.go``; ``docs/metrics/workload/pod-metrics.md``).

The exporter never has kube-state-metrics' series, so the local evaluator leaves the group out
(:attr:`~exporter.alerting.definition.Group.not_local`).
"""

from __future__ import annotations

from exporter.alerting.definition import Group, Recording
from exporter.alerting.thresholds import Thresholds

POD_OWNER = "gpuload:pod_owner:info"
POD_TEAM = "gpuload:pod_team:info"
GPU_POD_OWNER = "gpuload:gpu_pod_owner:info"
POD = "namespace, pod"
OWNER = "namespace, pod, owner_kind, owner_name"
CONTROLLER = 'owner_is_controller="true"'
NOT_LOCAL = "it reads kube-state-metrics, whose series an exporter never has"
# The kinds whose own controller replaces them: the kube-state-metrics family that names it and
# that family's label for the owned object's name.
RESOLVED = {
    "ReplicaSet": ("kube_replicaset_owner", "replicaset"),
    "Job": ("kube_job_owner", "job_name"),
}


def owners_group(thresholds: Thresholds) -> Group:
    """The owner and team rules, in the order they read each other."""
    return Group(
        "gpuload.owners",
        (owner_rule(), team_rule(thresholds), gpu_owner_rule()),
        not_local=NOT_LOCAL,
    )


def owner_rule() -> Recording:
    """``gpuload:pod_owner:info``: each way a pod's top controller is found, one pod in one way.

    One rule, the ways joined by ``or``: `promtool check rules` calls two rules that record one
    name with the same labels duplicates.
    """
    kinds = "|".join(RESOLVED)
    # No controller: `<none>` (no owner at all) or owners none of which is the controller.
    bare = f"max by ({POD}) (kube_pod_owner)\nunless on ({POD}) kube_pod_owner{{{CONTROLLER}}}"
    ways = [
        *(_resolved(kind) for kind in RESOLVED),
        *(_unresolved(kind) for kind in RESOLVED),
        f'max by ({OWNER}) (kube_pod_owner{{{CONTROLLER}, owner_kind!~"{kinds}"}})',
        # Its own owner: owner_kind "Pod", owner_name the pod's.
        "label_replace(\n"
        "  label_replace(\n"
        f"{_indented(_indented(bare))},\n"
        '    "owner_name", "$1", "pod", "(.*)"\n'
        "  ),\n"
        '  "owner_kind", "Pod", "", ""\n'
        ")",
    ]
    return Recording(POD_OWNER, _gpu_pods("(\n" + _indented("\nor\n".join(ways)) + "\n)"))


def _resolved(kind: str) -> str:
    """The pods whose controller of ``kind`` has a controller itself, owned by that one."""
    family, name = RESOLVED[kind]
    # The pod's owner_name renamed to the owned object's label, then that object's controller's
    # kind and name copied over it; one controller per object, whatever the replicas report.
    return (
        f"max by ({OWNER}) (\n"
        "  label_replace(\n"
        f'    kube_pod_owner{{{CONTROLLER}, owner_kind="{kind}"}},\n'
        f'    "{name}", "$1", "owner_name", "(.*)"\n'
        "  )\n"
        f"  * on (namespace, {name}) group_left (owner_kind, owner_name)\n"
        f"  topk by (namespace, {name}) (1, {family}{{{CONTROLLER}}})\n"
        ")"
    )


def _unresolved(kind: str) -> str:
    """The pods whose controller of ``kind`` has no controller: owned by it."""
    family, name = RESOLVED[kind]
    return (
        f'max by ({OWNER}) (kube_pod_owner{{{CONTROLLER}, owner_kind="{kind}"}})\n'
        "unless on (namespace, owner_name)\n"
        f'label_replace({family}{{{CONTROLLER}}}, "owner_name", "$1", "{name}", "(.*)")'
    )


def team_rule(thresholds: Thresholds) -> Recording:
    """``gpuload:pod_team:info``: the team label's value, for a GPU pod that has one."""
    label = f"label_{thresholds.team_label}"
    return Recording(
        POD_TEAM,
        _gpu_pods(
            f"max by ({POD}, team) (\n"
            f'  label_replace(kube_pod_labels{{{label}!=""}}, "team", "$1", "{label}", "(.*)")\n'
            ")"
        ),
    )


def gpu_owner_rule() -> Recording:
    """``gpuload:gpu_pod_owner:info``: every allocation, with its pod's owner and team if known.

    Each join's right side is one series per pod: the pod's one owner (or team), or, for a pod
    without one, a series of its namespace and name alone, whose missing labels stay empty.
    """
    every_pod = f"group by ({POD}) (gpu_pod_info)"

    def one_per_pod(record: str) -> str:
        return f"(\n  topk by ({POD}) (1, {record})\n  or on ({POD})\n  {every_pod}\n)"

    return Recording(
        GPU_POD_OWNER,
        "gpu_pod_info\n"
        f"* on ({POD}) group_left (owner_kind, owner_name)\n"
        f"{one_per_pod(POD_OWNER)}\n"
        f"* on ({POD}) group_left (team)\n"
        f"{one_per_pod(POD_TEAM)}",
    )


def _gpu_pods(expr: str) -> str:
    """``expr`` for the pods some GPU is allocated to: one series each, not one per pod."""
    return f"{expr}\nand on ({POD}) gpu_pod_info"


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
