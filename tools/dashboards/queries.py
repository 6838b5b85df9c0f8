"""PromQL pieces shared by the dashboards: the node key, the template variables, the pod scope.

A node is known by its ``node`` label where the scrape adds one (the Helm chart's ServiceMonitor
sets it from the Kubernetes node name), else by its ``instance`` (a bare ``gpuload serve``
scraped by address). The ``node`` label stays when the exporter's pod is replaced and its
``instance`` (the pod's address) changes, so the dashboards key every node view on it: the
``$node`` variable lists each node's key, and every query selects a node's series by
``node=~"$node"``, or by ``instance=~"$node"`` where a series has no ``node`` label, and gives the
latter its instance as ``node``. Every series a panel shows therefore has a ``node`` label: the
legends, the table columns and the links to the node detail read it on either kind of install.

The other variables are ``$gpu`` (NVML index) and, for Kubernetes, ``$namespace`` and ``$pod``
over ``gpu_pod_info{gpu,uuid,pod,namespace,container}``. That family may be absent (no
Kubernetes, or a gpuload without it): the pod scope then filters nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from exporter.alerting.rules import GPU, NODE, recording_names
from exporter.alerting.thresholds import Thresholds
from tools.dashboards.grafana import Json, datasource_variable, query_variable

__all__ = ["GPU", "NODE", "Scope", "keyed", "number", "percent", "variables"]

# The `$node` variable's "All": every node key. `.*` would also match a series without a `node`
# label, which the second selector of `keyed` already adds: a bare install counted twice.
ALL_NODES = ".+"
# label_replace's arguments that give a series its instance as its node.
_INSTANCE_AS_NODE = '"node", "$1", "instance", "(.*)"'

Around = Callable[[str], str]


def _selector(metric: str, matchers: list[str]) -> str:
    return f"{metric}{{{', '.join(matchers)}}}"


def _parenthesized(expr: str) -> bool:
    """Whether ``expr`` is one parenthesized group, so that it needs no more parentheses."""
    if not (expr.startswith("(") and expr.endswith(")")):
        return False
    depth = 0
    for index, char in enumerate(expr):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and index < len(expr) - 1:
            return False
    return True


def keyed(metric: str, *matchers: str, around: Around | None = None, node: str = "$node") -> str:
    """The series of ``metric`` on the nodes whose key matches ``node``, each with a ``node`` label.

    Two selectors: the series that have a ``node`` label, and those without one, found by their
    ``instance`` and given it as ``node``. ``around`` builds the expression around each selector
    (``rate(...[w])``: a range needs a selector, not an expression). The result is one
    parenthesized operand.
    """
    wrap = around or (lambda selector: selector)
    labelled = _selector(metric, [f'node=~"{node}"', *matchers])
    bare = _selector(metric, ['node=""', f'instance=~"{node}"', *matchers])
    return f"({wrap(labelled)}\nor label_replace({wrap(bare)}, {_INSTANCE_AS_NODE}))"


class Scope:
    """Label matchers and filters for one dashboard's template variables."""

    def __init__(self, thresholds: Thresholds, *, gpu_variable: bool) -> None:
        self.names = recording_names(thresholds)
        self.gpu_matchers = ['gpu=~"$gpu"'] if gpu_variable else []

    def node(self, metric: str, *extra: str, around: Around | None = None) -> str:
        """The selected nodes' series of ``metric``, whatever its GPU (or without one)."""
        return keyed(metric, *extra, around=around)

    def select(self, metric: str, *extra: str, around: Around | None = None) -> str:
        """The selected nodes' and GPUs' series of ``metric``, with any extra matchers."""
        return keyed(metric, *self.gpu_matchers, *extra, around=around)

    def pods(self, expr: str) -> str:
        """Keep the GPUs of ``expr`` that run a pod of ``$namespace``/``$pod``, or no pod at all.

        The GPUs dropped are those with pods, none of which matches: with "All" (``.*``) or
        without ``gpu_pod_info`` nothing is dropped. A GPU without a pod stays in view under
        any namespace, since it belongs to none. ``expr`` must keep the ``uuid`` label. The
        result is parenthesized, so it is one operand wherever it goes.
        """
        if not _parenthesized(expr):
            expr = f"({expr})"
        return (
            f"({expr}\nunless on (uuid) (\n  group by (uuid) (gpu_pod_info)\n"
            '  unless on (uuid) gpu_pod_info{namespace=~"$namespace", pod=~"$pod"}\n))'
        )

    def gpus(self, metric: str, *extra: str, around: Around | None = None) -> str:
        """Return the selected GPUs' series of ``metric``, in the pod scope."""
        return self.pods(self.select(metric, *extra, around=around))

    def rate(self, counter: str, *extra: str) -> str:
        """The selected GPUs' rate of ``counter`` over each point's ``$__rate_interval``.

        Of a counter of seconds, the exact mean fraction of time over the interval, however
        often it was scraped.
        """
        return self.gpus(counter, *extra, around=lambda s: f"rate({s}[$__rate_interval])")

    def in_use(self, expr: str) -> str:
        """Return ``expr`` for in-use GPUs only (a process, or memory above the floor)."""
        return f"{expr} and on ({GPU}) {self.names['in_use']}"


def number(value: float) -> str:
    """Format a threshold for PromQL and titles: 0.3 -> "0.3"."""
    return f"{value:g}"


def percent(ratio: float) -> str:
    """Format a ratio for a title: 0.3 -> "30%"."""
    return f"{ratio * 100:g}%"


def _values(label: str, metric: str, *matchers: str, node: str = "$node") -> str:
    """A variable's query: the values of ``label`` on the selected nodes' series of ``metric``."""
    return f"query_result(group by ({label}) {keyed(metric, *matchers, node=node)})"


def _capture(label: str) -> str:
    """The variable's regex that takes a label's value out of a ``query_result`` line."""
    return f'/{re.escape(label)}="([^"]+)"/'


def variables(*, one_node: bool, gpu: bool, pods: bool = True) -> list[Json]:
    """Return the template variables: data source, node, GPU, and the Kubernetes pod scope."""
    result = [
        datasource_variable(),
        query_variable(
            "node",
            "Node",
            _values("node", "gpu_info", node=ALL_NODES),
            multi=not one_node,
            include_all=not one_node,
            all_value=ALL_NODES,
            regex=_capture("node"),
            sort=5,
            description="Nodes with GPUs: the `node` label where the scrape sets one (the Helm"
            " chart's ServiceMonitor does), else the gpuload target's `instance`",
        ),
    ]
    if gpu:
        result.append(
            query_variable(
                "gpu",
                "GPU",
                _values("gpu", "gpu_info"),
                regex=_capture("gpu"),
                description="NVML index of the GPU",
            )
        )
    if not pods:
        return result
    return [
        *result,
        query_variable(
            "namespace",
            "Namespace",
            _values("namespace", "gpu_pod_info"),
            regex=_capture("namespace"),
            sort=5,
            description="Kubernetes namespace of the pods using the GPUs; empty without "
            "gpu_pod_info, which then filters nothing",
        ),
        query_variable(
            "pod",
            "Pod",
            _values("pod", "gpu_pod_info", 'namespace=~"$namespace"'),
            regex=_capture("pod"),
            sort=5,
            description="Kubernetes pod using the GPUs; empty without gpu_pod_info",
        ),
    ]
