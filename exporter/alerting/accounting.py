"""gpuload's accounting rules: how many GPUs each pod, namespace, owner and team holds and uses.

``gpuload.accounting`` records at every evaluation, in GPU-equivalents, what each allocation of
``gpu_pod_info`` holds and uses, split by the state the fleet rules give its GPU
(``gpu:gpu_state:5m``; ``hung`` where the bottleneck rules call the GPU hung, so a hung job at
100% is not "used"). Summed over a period, ``sum_over_time()`` of these series times the
group's :data:`INTERVAL` is GPU-time; a gap in the data leaves the evaluations out, it is never
filled in.

- A whole GPU counts 1, split equally among the allocations of ``gpu_pod_info`` on it (the
  replicas of a time-sliced or MPS-shared GPU).
- A MIG instance counts as its share of the SMs of its GPU's MIG instances
  (``gpu_mig_multiprocessors``: NVML gives SMs per MIG device only), so a GPU's instances add up
  to 1 and GPU-equivalents add up to the GPUs.
- Used comes from the utilization counters over the short window: a whole GPU's utilization; a
  shared GPU's per-pod share (``gpu_pod_utilization_seconds_total``), or its utilization split
  like the allocation where the shares are not exported; a MIG instance's SM activity. An A100's
  MIG instances have no SM activity: allocated, in state ``unmeasured``, with no used series,
  never a used of 0.
- What no pod holds (a free GPU, the MIG instances no pod holds) is its own line,
  ``gpuload:gpu_unallocated:gpus``, per GPU.

The group reads the owner rules' ``gpuload:gpu_pod_owner:info``, which reads kube-state-metrics:
the local evaluator leaves it out like :mod:`exporter.alerting.owners`.
"""

from __future__ import annotations

from exporter.alerting.definition import Group, Recording
from exporter.alerting.expressions import GPU, recording_names, short_rate
from exporter.alerting.owners import GPU_POD_OWNER
from exporter.alerting.thresholds import Thresholds

GROUP = "gpuload.accounting"
# How often the group is evaluated: each recorded sample stands for this long.
INTERVAL = "1m"
INTERVAL_SECONDS = 60
MIG_FRACTION = "gpuload:gpu_mig_instance:fraction"
ALLOCATED = "gpuload:gpu_allocated:gpus"
USED = "gpuload:gpu_used:gpus"
UNALLOCATED = "gpuload:gpu_unallocated:gpus"
UNALLOCATED_USED = "gpuload:gpu_unallocated_used:gpus"
# The levels an allocation is summed to, each with the labels it keeps besides ``state``.
LEVELS = {
    "namespace": "namespace",
    "owner": "namespace, owner_kind, owner_name",
    "team": "team",
}
# The state a GPU the bottleneck rules call hung is accounted in, whatever its fleet state.
HUNG = "hung"
# The states an allocation is accounted in: the fleet's, and hung.
ACCOUNTED_STATES = ("idle", "underutilized", "healthy", "saturated", HUNG, "unmeasured", "lost")
WHOLE = 'mig_instance=""'
MIG = 'mig_instance!=""'
INSTANCE = f"{GPU}, mig_instance"
HOLDER = f"{GPU}, namespace, pod, container"
NOT_LOCAL = "it reads the owner rules, which read kube-state-metrics"


def level_names(level: str) -> tuple[str, str]:
    """The allocated and used series of one level of :data:`LEVELS`."""
    return f"{level}:gpu_allocated:gpus", f"{level}:gpu_used:gpus"


def accounting_group(thresholds: Thresholds) -> Group:
    """The accounting rules, in the order they read each other."""
    return Group(
        GROUP,
        (
            Recording(
                MIG_FRACTION,
                f"sum by ({INSTANCE}) (gpu_mig_multiprocessors)\n"
                f"/ on ({GPU}) group_left ()\n"
                f"sum by ({GPU}) (gpu_mig_multiprocessors)",
            ),
            Recording(ALLOCATED, _allocated(thresholds)),
            Recording(USED, _used(thresholds)),
            Recording(UNALLOCATED, _unallocated(thresholds)),
            Recording(UNALLOCATED_USED, _unallocated_used(thresholds)),
            *(
                Recording(name, f"sum by ({labels}, state) ({source})")
                for level, labels in LEVELS.items()
                for name, source in zip(level_names(level), (ALLOCATED, USED), strict=True)
            ),
        ),
        interval=INTERVAL,
        not_local=NOT_LOCAL,
    )


def _state(thresholds: Thresholds) -> str:
    """Each GPU's one state: hung where the bottleneck rules say so, else its fleet state.

    The newest state where two are within the lookback: a state that ended without a staleness
    marker (after a Prometheus restart, in backfilled blocks) must not count a GPU twice.
    """
    names = recording_names(thresholds)
    return (
        "(\n"
        f'  label_replace(group by ({GPU}) ({names["bottleneck"]}{{bottleneck="{HUNG}"}}),'
        f' "state", "{HUNG}", "", "")\n'
        f"  or on ({GPU})\n"
        f"  group by ({GPU}, state) (topk by ({GPU}) (1, timestamp({names['state']})))\n"
        ")"
    )


def _allocated(thresholds: Thresholds) -> str:
    """Each allocation's GPU-equivalents, with its pod's owner and team and its GPU's state."""
    return (
        "(\n"
        f"  {GPU_POD_OWNER}{{{WHOLE}}}\n"
        f"  / on ({GPU}) group_left ()\n"
        f"  count by ({GPU}) (gpu_pod_info{{{WHOLE}}})\n"
        "  or\n"
        f"  {GPU_POD_OWNER}{{{MIG}}}\n"
        f"  * on ({INSTANCE}) group_left ()\n"
        f"  {MIG_FRACTION}\n"
        f"  / on ({INSTANCE}) group_left ()\n"
        f"  count by ({INSTANCE}) (gpu_pod_info{{{MIG}}})\n"
        ")\n"
        f"* on ({GPU}) group_left (state)\n"
        f"{_state(thresholds)}"
    )


def _used(thresholds: Thresholds) -> str:
    """Each allocation's GPU-equivalents in use over the short window."""
    names = recording_names(thresholds)
    short, gap = thresholds.short_window, thresholds.gap_tolerance
    share = short_rate("gpu_pod_utilization_seconds_total", short, gap)
    shared = f"count by ({GPU}) (gpu_pod_info{{{WHOLE}}}) > 1"
    return (
        # A whole GPU one allocation holds: its utilization.
        f"{ALLOCATED}{{{WHOLE}}} * on ({GPU}) group_left () {names['avg_short']}\n"
        f"unless on ({GPU}) ({shared})\n"
        "or\n"
        # A shared GPU: each container's measured share...
        f"({ALLOCATED}{{{WHOLE}}} > bool 0)\n"
        f"* on ({HOLDER}) group_left ()\n"
        f"(\n{_indented(share)}\n)\n"
        "or\n"
        # ...or, where shares are not exported, its utilization split like the allocation.
        f"{ALLOCATED}{{{WHOLE}}} * on ({GPU}) group_left () {names['avg_short']}\n"
        "or\n"
        # A MIG instance: its SM activity (none on an A100: no used series).
        f"{ALLOCATED}{{{MIG}}} * on ({INSTANCE}) group_left () {names['mig_sm_active_short']}"
    )


def _unallocated(thresholds: Thresholds) -> str:
    """The GPU-equivalents of each GPU no pod holds: a free GPU, or its unheld MIG instances."""
    return (
        "(\n"
        f"  group by ({GPU}) (gpu_up) unless on ({GPU}) gpu_pod_info\n"
        "  or\n"
        f"  sum by ({GPU}) ({MIG_FRACTION} unless on ({INSTANCE}) gpu_pod_info)\n"
        ")\n"
        f"* on ({GPU}) group_left (state)\n"
        f"{_state(thresholds)}"
    )


def _unallocated_used(thresholds: Thresholds) -> str:
    """What the GPUs and MIG instances no pod holds use: work outside Kubernetes."""
    names = recording_names(thresholds)
    return (
        f"{UNALLOCATED} * on ({GPU}) group_left () {names['avg_short']}\n"
        "or\n"
        f"sum by ({GPU}) (\n"
        f"  {MIG_FRACTION} * on ({INSTANCE}) group_left () {names['mig_sm_active_short']}\n"
        f"  unless on ({INSTANCE}) gpu_pod_info\n"
        ")\n"
        f"* on ({GPU}) group_left (state)\n"
        f"({UNALLOCATED} > bool 0)"
    )


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
