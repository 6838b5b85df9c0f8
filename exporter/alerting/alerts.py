"""gpuload's alerts: one definition each, in the groups Prometheus evaluates them in.

The utilization, inventory and exporter alerts are defined here, the hardware's in
:mod:`exporter.alerting.health`.

Every alert carries ``severity`` and the annotations ``summary``, ``description`` (the GPU, the
instance, the node when the chart's relabelling adds one, and the measured value), ``value`` and
``runbook_url``. Each definition also says what of it the exporter's local evaluator can judge on
its own samples (:attr:`~exporter.alerting.definition.Alert.not_local`).

Optional families are handled where a fallback exists: "in use" is a process *or* memory above
the floor (of the GPU or of one of its MIG instances). ``GPUMemoryBandwidthBound`` needs the
GPM profiling families (Hopper and newer) and has no fallback.
"""

from __future__ import annotations

from exporter.alerting.definition import Alert, AlertDefinition, Group
from exporter.alerting.expressions import (
    COUNT,
    GPU,
    INSTANCE,
    MIG_INSTANCE,
    NODE,
    PERCENT,
    WHERE,
    above_for,
    bridged,
    held_while_down,
    hung_power,
    indented,
    literal,
    percent,
    points,
    recording_names,
    starved_condition,
    unless_vanished,
)
from exporter.alerting.health import HEALTH
from exporter.alerting.recording import gpu_count
from exporter.alerting.thresholds import AlertThresholds, Thresholds, duration_seconds

# Why an alert cannot be evaluated by the exporter on its own samples.
SCRAPED_BY_PROMETHEUS = (
    "it is Prometheus's `up`: an exporter cannot observe that it cannot be scraped (a process "
    "that is down evaluates nothing)"
)
NOT_RUNNING = (
    "it is Prometheus's `up` and kube-state-metrics: an exporter that is not running evaluates "
    "nothing"
)
BEFORE_A_RESTART = (
    "it compares with the GPUs reported before a restart, which a restarted exporter no longer "
    "has (while it runs, gpuload drops no GPU: a lost one reads gpu_up 0, and while NVML is down "
    "every GPU is absent, which GPULoadNVMLDown reports)"
)
ACROSS_A_RESTART = "the same: a GPU goes missing only across a restart of the exporter"
# What of an alert the exporter evaluates, where it cannot evaluate all of it.
HELD_BRANCH = (
    "only its condition: the branch that keeps it firing while Prometheus cannot scrape the "
    "exporter reads `up` and `ALERTS`, which a running exporter never sees"
)
ALWAYS_FRESH = (
    "only its `gpuload_gpu_stale` branch: the evaluator runs right after each collection cycle, "
    "so the age of the last collection is always fresh when it looks"
)


def _held(thresholds: Thresholds, settings: AlertThresholds) -> str:
    """'Held for 5 minutes': the alert's `for:`, over the mean of every short window."""
    return f"for {settings.for_} (the mean of every {thresholds.short_window} window)"


def _or_held(
    thresholds: Thresholds, settings: AlertThresholds, condition: str, value: str, keys: str = GPU
) -> str:
    """The condition, or the alert still firing while its exporter cannot be scraped."""
    return f"{condition}\nor\n{held_while_down(thresholds, settings.name, value, keys)}"


def utilization_low(thresholds: Thresholds) -> Alert:
    """A GPU in use that stays mostly idle."""
    names = recording_names(thresholds)
    low = thresholds.alert("GPUUtilizationLow")
    gap = thresholds.gap_tolerance
    condition = (
        f"{bridged(names['avg_short'], gap)} < {literal(low.number('below'))}\n"
        f"and on ({GPU}) {names['in_use']}"
    )
    return Alert.of(
        thresholds,
        low,
        _or_held(thresholds, low, condition, names["avg_short"]),
        summary="A GPU in use is mostly idle",
        description=f"{WHERE} has work on it but its utilization stayed below"
        f" {percent(low.number('below'))} {_held(thresholds, low)};"
        f" {PERCENT} over the last one: it waits on something other than its own compute.",
        value=PERCENT,
        partly_local=HELD_BRANCH,
        reading=names["avg_short"],
    )


def utilization_high(thresholds: Thresholds) -> Alert:
    """A GPU busy above the threshold for the whole `for:`, drawing the power of real work."""
    high = thresholds.alert("GPUUtilizationHigh")
    return Alert.of(
        thresholds,
        high,
        f"{above_for(thresholds)}\nunless on ({GPU}) (\n{indented(hung_power(thresholds))}\n)",
        summary="A GPU runs at full load, with no headroom left",
        description=f"{WHERE} kept its utilization above {percent(high.number('above'))}"
        f" {_held(thresholds, high)} and drew the power of real work; {PERCENT} in its"
        " least busy window: it has no headroom left.",
        value=PERCENT,
        windowed=True,
    )


def job_hung(thresholds: Thresholds) -> Alert:
    """A GPU that runs kernels all the time but draws almost no power."""
    hung = thresholds.alert("GPUJobHung")
    return Alert.of(
        thresholds,
        hung,
        f"{hung_power(thresholds)}\nand on ({GPU}) (\n{indented(above_for(thresholds))}\n)",
        summary="A GPU looks busy but does no work",
        description=f"{WHERE} has run kernels all the time {_held(thresholds, hung)} while"
        f" drawing at most {{{{ $value | humanizePercentage }}}} of its power limit (below"
        f" {percent(hung.number('power_below'))}): kernels wait without computing, the sign of"
        " a hung collective (NCCL) or a deadlock.",
        value=PERCENT + " of the power limit",
        windowed=True,
    )


def data_loader_starved(thresholds: Thresholds) -> Alert:
    """A GPU that finishes each batch and waits for the next one."""
    names = recording_names(thresholds)
    starved = thresholds.alert("GPUDataLoaderStarved")
    gap = thresholds.gap_tolerance
    condition = starved_condition(
        thresholds, bridged(names["avg_short"], gap), bridged(names["idle_short"], gap)
    )
    return Alert.of(
        thresholds,
        starved,
        _or_held(thresholds, starved, condition, names["avg_short"]),
        summary="A GPU keeps waiting for its input",
        description=f"{WHERE} stayed below {percent(starved.number('average_below'))}"
        " utilization and sat fully idle, no kernel running, more than"
        f" {percent(starved.number('idle_above'))} of the time {_held(thresholds, starved)};"
        f" {PERCENT} utilization over the last one: it finishes each batch and waits for the"
        " next one, the input pipeline does not keep up.",
        value=PERCENT,
        partly_local=HELD_BRANCH,
    )


def memory_bandwidth_bound(thresholds: Thresholds) -> Alert:
    """A GPU whose memory interface is busy while its compute pipes are not."""
    names = recording_names(thresholds)
    bound = thresholds.alert("GPUMemoryBandwidthBound")
    return Alert.of(
        thresholds,
        bound,
        f"{names['dram_active']} > {literal(bound.number('dram_active_above'))}\n"
        f"and on ({GPU}) {names['pipes']} < {literal(bound.number('compute_pipes_below'))}\n"
        f"{unless_vanished(thresholds.window)}",
        summary="A GPU is limited by memory bandwidth",
        description=f"{WHERE} kept its memory interface active"
        f" {{{{ $value | humanizePercentage }}}} of the time over the last {thresholds.window}"
        " while its busiest compute pipe stayed below"
        f" {percent(bound.number('compute_pipes_below'))}: the work is bound by memory bandwidth.",
        value=PERCENT + " DRAM active",
    )


def memory_nearly_full(thresholds: Thresholds) -> Alert:
    """A GPU or MIG instance with nearly all of its memory in use."""
    names = recording_names(thresholds)
    full = thresholds.alert("GPUMemoryNearlyFull")
    return Alert.of(
        thresholds,
        full,
        f"{names['memory_used']} > {literal(full.number('used_above'))}\n"
        "or\n"
        "gpu_mig_memory_used_bytes / gpu_mig_memory_total_bytes"
        f" > {literal(full.number('used_above'))}",
        summary="A GPU's memory is nearly full",
        description=f"{WHERE}{MIG_INSTANCE} has {{{{ $value | humanizePercentage }}}} of its"
        f" memory in use (above {percent(full.number('used_above'))}): the next allocation peak"
        " may run out of memory.",
        value=PERCENT + " used",
    )


def load_imbalance(thresholds: Thresholds) -> Alert:
    """The in-use GPUs of one node far apart in utilization."""
    names = recording_names(thresholds)
    imbalance = thresholds.alert("GPULoadImbalance")
    in_use_avg = f"{names['avg']} and on ({GPU}) {names['in_use']}"
    return Alert.of(
        thresholds,
        imbalance,
        f"max by ({NODE}) ({in_use_avg})\n"
        f"- min by ({NODE}) ({in_use_avg})\n"
        f"> {literal(imbalance.number('spread_above'))}",
        summary="GPUs of one node are unevenly loaded",
        description=f"The in-use GPUs on {INSTANCE} differ by"
        f" {{{{ $value | humanizePercentage }}}} in {thresholds.window} average utilization"
        f" (more than {points(imbalance.number('spread_above'))} points between the busiest"
        " and the idlest): uneven batches or a straggler.",
        value=PERCENT + " spread",
    )


def idle_allocated(thresholds: Thresholds) -> Alert:
    """A GPU or MIG instance allocated to a pod that does not use it."""
    names = recording_names(thresholds)
    idle = thresholds.alert("GPUIdleAllocated")
    gap, below = thresholds.gap_tolerance, literal(idle.number("below"))
    # The pods holding a whole GPU and a MIG instance; a failed scrape must not restart the wait.
    whole_pods = bridged('gpu_pod_info{mig_instance=""}', gap)
    mig_pods = bridged('gpu_pod_info{mig_instance!=""}', gap)
    return Alert.of(
        thresholds,
        idle,
        # gpu_pod_info on the left: a time-sliced GPU has several pods, one alert each. A
        # whole GPU is judged by its utilization, a MIG instance by its SM activity.
        f"{whole_pods}\n"
        f"* on ({GPU}) group_left ()\n"
        f"({names['avg']} < {below})\n"
        "or\n"
        f"{mig_pods}\n"
        f"* on ({GPU}, mig_instance) group_left ()\n"
        f"({names['mig_sm_active']} < {below})",
        summary="A GPU allocated to a pod sits idle",
        description=f"{WHERE}{MIG_INSTANCE} is allocated to pod"
        " {{ $labels.namespace }}/{{ $labels.pod }} (container {{ $labels.container }}) but"
        f" was busy {{{{ $value | humanizePercentage }}}} of the last {thresholds.window}, below"
        f" {percent(idle.number('below'))}: the pod holds a GPU it does not use.",
        value=PERCENT,
    )


def mig_utilization_low(thresholds: Thresholds) -> Alert:
    """A MIG instance that holds memory but whose SMs stay mostly idle."""
    names = recording_names(thresholds)
    low = thresholds.alert("GPUMIGUtilizationLow")
    below = thresholds.alert("GPUUtilizationLow").number("below")
    gap, floor = thresholds.gap_tolerance, thresholds.in_use_memory_floor_bytes
    mig = f"{GPU}, mig_instance"
    condition = (
        f"{bridged(names['mig_sm_active_short'], gap)} < {literal(below)}\n"
        f"and on ({mig}) {bridged('gpu_mig_memory_used_bytes', gap)} > {floor}"
    )
    return Alert.of(
        thresholds,
        low,
        _or_held(thresholds, low, condition, names["mig_sm_active_short"], mig),
        summary="A MIG instance in use is mostly idle",
        description=f"{WHERE}{MIG_INSTANCE} holds memory but its SMs stayed busy less than"
        f" {percent(below)} of the time {_held(thresholds, low)}; {PERCENT} over the last one.",
        value=PERCENT + " SM active",
        partly_local=HELD_BRANCH,
    )


def count_dropped(thresholds: Thresholds) -> Alert:
    """A node that reports fewer GPUs than it had."""
    dropped = thresholds.alert("GPUCountDropped")
    lookback = dropped.duration("lookback")
    count = recording_names(thresholds)["gpu_count"]
    return Alert.of(
        thresholds,
        dropped,
        f"max_over_time({count}[{lookback}]) - {count} > 0",
        summary="A node reports fewer GPUs than it had",
        description=f'gpuload on {INSTANCE} reports {{{{ $value | printf "%.0f" }}}} GPU(s)'
        f" fewer than at its most in the last {lookback}: the driver no longer sees them.",
        value=f"{COUNT} missing",
        not_local=BEFORE_A_RESTART,
    )


def vanished(thresholds: Thresholds) -> Alert:
    """A GPU an exporter that is still up no longer reports."""
    gone = thresholds.alert("GPUVanished")
    lookback = gone.duration("lookback")
    exporter_up = f'up{{job=~"{thresholds.exporter_job_regex}"}} == 1'
    return Alert.of(
        thresholds,
        gone,
        f"last_over_time(gpu_up[{lookback}])\n"
        "unless on (instance, job, uuid) gpu_up\n"
        # A lost GPU read after a restart has no UUID: GPUFellOffBus names it.
        "unless on (instance, job, gpu) gpu_up == 0\n"
        # While NVML is down every GPU's series are absent: GPULoadNVMLDown says so.
        "unless on (instance, job) gpuload_nvml_up == 0\n"
        f"and on (instance, job) {exporter_up}",
        summary="A GPU is no longer reported",
        description=f"{WHERE} was reported in the last {lookback} and is no longer, while"
        " gpuload there is up: the driver no longer enumerates it.",
        value="no longer reported",
        not_local=ACROSS_A_RESTART,
    )


def exporter_down(thresholds: Thresholds) -> Alert:
    """A gpuload target Prometheus cannot scrape."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPULoadExporterDown"),
        f'up{{job=~"{thresholds.exporter_job_regex}"}} == 0',
        summary="gpuload cannot be scraped",
        description=f"Prometheus cannot scrape gpuload on {INSTANCE} (job {{{{ $labels.job }}}}):"
        " the GPUs there are not monitored.",
        value="up 0",
        not_local=SCRAPED_BY_PROMETHEUS,
    )


def exporter_absent(thresholds: Thresholds) -> Alert:
    """No gpuload target at all, or none on a node that advertises GPUs."""
    job = f'job=~"{thresholds.exporter_job_regex}"'
    return Alert.of(
        thresholds,
        thresholds.alert("GPULoadExporterAbsent"),
        f"absent(up{{{job}}})\n"
        "or\n"
        # kube-state-metrics: a node that advertises GPUs, with no gpuload target on it.
        'group by (node) (kube_node_status_capacity{resource="nvidia_com_gpu"} > 0)\n'
        f"unless on (node) group by (node) (up{{{job}}})",
        summary="gpuload is not running where GPUs are",
        description="{{ if $labels.node }}Node {{ $labels.node }} has GPUs but no gpuload target:"
        "{{ else }}Prometheus has no gpuload target at all:{{ end }}"
        " its GPUs are not monitored (no pod of the DaemonSet, or no scrape config finds it).",
        value="no target",
        not_local=NOT_RUNNING,
    )


def collector_failing(thresholds: Thresholds) -> Alert:
    """A collector of gpuload that keeps failing while NVML is up."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPULoadCollectorFailing"),
        # With NVML down every collector fails; GPULoadNVMLDown says so once.
        "gpuload_collector_success == 0\nunless on (instance, job) gpuload_nvml_up == 0",
        summary="A gpuload collector keeps failing",
        description="The {{ $labels.collector }} collector of gpuload on"
        f" {INSTANCE} fails: its metrics are missing or stale.",
        value="{{ $labels.collector }} failing",
    )


def pod_resources_down(thresholds: Thresholds) -> Alert:
    """The exporter without the kubelet's pod-resources socket."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPULoadPodResourcesDown"),
        "gpuload_kubernetes_pod_resources_up == 0",
        summary="gpuload cannot tell which pod holds which GPU",
        description=f"gpuload on {INSTANCE} cannot use the kubelet's pod-resources socket"
        " (missing, not permitted, or the kubelet does not answer): gpu_pod_info is gone; the"
        " log names the path and the cause.",
        value="pod_resources_up 0",
    )


def nvml_down(thresholds: Thresholds) -> Alert:
    """The exporter without a working NVIDIA driver."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPULoadNVMLDown"),
        "gpuload_nvml_up == 0",
        summary="gpuload cannot use the NVIDIA driver",
        description=f"gpuload on {INSTANCE} cannot initialise NVML: the NVIDIA driver or its"
        " library is missing or broken, so no GPU there is monitored.",
        value="nvml_up 0",
    )


def stale(thresholds: Thresholds) -> Alert:
    """The exporter serving readings of a GPU whose NVML calls hang, or an old collection."""
    settings = thresholds.alert("GPULoadStale")
    max_age = duration_seconds(settings.duration("max_age"))
    return Alert.of(
        thresholds,
        settings,
        "gpuload_gpu_stale == 1\n"
        "or\n"
        f"time() - gpuload_last_collection_timestamp_seconds > {max_age}",
        summary="gpuload serves stale data",
        description="{{ if $labels.gpu }}"
        f"{WHERE} has NVML calls that do not return: its readings are stale."
        "{{ else }}"
        f"gpuload on {INSTANCE} last finished a collection"
        " {{ $value | humanizeDuration }} ago."
        "{{ end }}",
        value="{{ if $labels.gpu }}stale{{ else }}{{ $value | humanizeDuration }} old{{ end }}",
        partly_local=ALWAYS_FRESH,
    )


# Each group's alerts, in the order Prometheus evaluates them.
UTILIZATION: tuple[AlertDefinition, ...] = (
    utilization_low,
    utilization_high,
    job_hung,
    data_loader_starved,
    memory_bandwidth_bound,
    memory_nearly_full,
    load_imbalance,
    idle_allocated,
    mig_utilization_low,
)
INVENTORY: tuple[AlertDefinition, ...] = (count_dropped, vanished)
EXPORTER: tuple[AlertDefinition, ...] = (
    exporter_down,
    exporter_absent,
    collector_failing,
    pod_resources_down,
    nvml_down,
    stale,
)


def alert_groups(thresholds: Thresholds) -> tuple[Group, ...]:
    """The alert groups, in the order of their rule file.

    The inventory group holds the GPUs that went missing: fewer than a node had, or one no
    longer reported. It is evaluated once a minute: its ranges span hours, and a GPU that has
    gone stays gone, so a minute's delay costs nothing. It is not evaluated locally: a restarted
    exporter no longer has the GPUs it reported before, and cannot see whether it is scraped.
    """

    def built(definitions: tuple[AlertDefinition, ...]) -> tuple[Alert, ...]:
        return tuple(define(thresholds) for define in definitions)

    return (
        Group("gpuload.utilization", built(UTILIZATION)),
        Group("gpuload.health", built(HEALTH)),
        Group("gpuload.inventory", (gpu_count(thresholds), *built(INVENTORY)), interval="1m"),
        Group("gpuload.exporter", built(EXPORTER)),
    )
