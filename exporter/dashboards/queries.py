"""PromQL pieces shared by the dashboards: selectors for the template variables, the pod scope.

The variables are ``$node`` (the ``node`` label the Helm chart's ServiceMonitor sets), ``$instance``
(the gpuload targets on those nodes), ``$gpu`` (NVML index) and, for Kubernetes, ``$namespace``
and ``$pod`` over ``gpu_pod_info{gpu,uuid,pod,namespace,container}``. ``gpu_pod_info`` and the
``node`` label may be absent (no Kubernetes, a bare ``gpuload serve``): "All" then filters nothing.
"""

from __future__ import annotations

import re

from exporter.alerting.rules import GPU, NODE, recording_names
from exporter.alerting.thresholds import Thresholds
from exporter.dashboards.grafana import Json, datasource_variable, query_variable

__all__ = ["GPU", "NODE", "Scope", "number", "percent", "variables"]

# One series selector, which needs no parentheses before `unless`.
_SELECTOR = re.compile(r"[a-zA-Z_:][\w:]*(\{[^{}]*\})?")


class Scope:
    """Label matchers and filters for one dashboard's template variables."""

    def __init__(self, thresholds: Thresholds, *, gpu_variable: bool) -> None:
        self.names = recording_names(thresholds)
        matchers = ['node=~"$node"', 'instance=~"$instance"']
        if gpu_variable:
            matchers.append('gpu=~"$gpu"')
        self.matchers = ", ".join(matchers)

    def select(self, metric: str, *extra: str) -> str:
        """Return ``metric{node=~"$node", instance=~"$instance", ...}`` with any extra matchers."""
        return f"{metric}{{{', '.join((self.matchers, *extra))}}}"

    def pods(self, expr: str) -> str:
        """Keep the GPUs of ``expr`` that run a pod of ``$namespace``/``$pod``, or no pod at all.

        The GPUs dropped are those with pods, none of which matches: with "All" (``.*``) or
        without ``gpu_pod_info`` nothing is dropped. A GPU without a pod stays in view under
        any namespace, since it belongs to none. ``expr`` must keep the ``uuid`` label. The
        result is parenthesized, so it is one operand wherever it goes.
        """
        if not _SELECTOR.fullmatch(expr):
            expr = f"({expr})"
        return (
            f"({expr}\nunless on (uuid) (\n  group by (uuid) (gpu_pod_info)\n"
            '  unless on (uuid) gpu_pod_info{namespace=~"$namespace", pod=~"$pod"}\n))'
        )

    def gpus(self, metric: str, *extra: str) -> str:
        """Return the selected GPUs' series of ``metric``, in the pod scope."""
        return self.pods(self.select(metric, *extra))

    def in_use(self, expr: str) -> str:
        """Return ``expr`` for in-use GPUs only (a process, or memory above the floor)."""
        return f"{expr} and on ({GPU}) {self.names['in_use']}"


def number(value: float) -> str:
    """Format a threshold for PromQL and titles: 0.3 -> "0.3"."""
    return f"{value:g}"


def percent(ratio: float) -> str:
    """Format a ratio for a title: 0.3 -> "30%"."""
    return f"{ratio * 100:g}%"


def variables(*, one_node: bool, gpu: bool) -> list[Json]:
    """Return the template variables: data source, node, GPU, and the Kubernetes pod scope."""
    result = [
        datasource_variable(),
        query_variable(
            "node",
            "Node",
            "label_values(gpu_info, node)",
            multi=not one_node,
            description="Kubernetes node (the `node` label the ServiceMonitor sets); empty"
            " without one, which then filters nothing",
        ),
        query_variable(
            "instance",
            "Exporter",
            'label_values(gpu_info{node=~"$node"}, instance)',
            multi=not one_node,
            include_all=not one_node,
            description="gpuload targets on the selected node(s) (the `instance` label)",
        ),
    ]
    if gpu:
        result.append(
            query_variable(
                "gpu",
                "GPU",
                'label_values(gpu_info{instance=~"$instance"}, gpu)',
                description="NVML index of the GPU",
            )
        )
    result += [
        query_variable(
            "namespace",
            "Namespace",
            'label_values(gpu_pod_info{instance=~"$instance"}, namespace)',
            description="Kubernetes namespace of the pods using the GPUs; empty without "
            "gpu_pod_info, which then filters nothing",
        ),
        query_variable(
            "pod",
            "Pod",
            'label_values(gpu_pod_info{instance=~"$instance", namespace=~"$namespace"}, pod)',
            description="Kubernetes pod using the GPUs; empty without gpu_pod_info",
        ),
    ]
    return result
