"""Metrics profiles: how many series each GPU costs a Prometheus.

Every series is a budget item: at 10,000 GPUs, one more series per GPU is 10,000 more in
Prometheus's head. A profile says which families (and, for a few, which series) are exported:

``full``
    Everything the collectors read, for a few nodes being debugged.
``default``
    What a dashboard, an alert or the doctor reads, at most 80 series per GPU (docs/fleet.md).
    Left out: the last interval's GPM ratios (their ``_seconds_total`` counters are what is
    read: `rate()` of them is the exact mean over any window), BAR1 memory, free memory
    (total - used - reserved), reserved memory, the ECC mode and the graphics clock (the SM
    clock's domain on every datacenter GPU): nothing reads them.
``minimal``
    At most 25 series per GPU that still answer "is it busy, is it starved, is it hot, is it
    broken": the utilization, SM and DRAM counters, fully idle time, what holds the GPU,
    temperatures, power and its limit, the clock events that slow a GPU down, XIDs, uncorrected
    ECC errors, failed row remaps, NVLink links down. The node's own families are all kept.

The profile filters what a collection publishes: /metrics, the status page, the doctor and the
local alerts all see the same series. gpuload's own families (``gpuload_*``) and the GPUs'
identity (``gpu_info``, ``gpu_up``) are in every profile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from exporter.collectors.base import REGISTRY, Sample
from exporter.names import GPM_METRICS, PROFILES

_GPM_RATIOS = {
    name for metric in GPM_METRICS for name in (f"gpu_{metric}_ratio", f"gpu_mig_{metric}_ratio")
}
DEFAULT_LEFT_OUT = _GPM_RATIOS | {
    "gpu_bar1_memory_total_bytes",
    "gpu_bar1_memory_used_bytes",
    "gpu_memory_free_bytes",
    "gpu_memory_reserved_bytes",
    "gpu_ecc_mode_enabled",
}
_CLOCKS = frozenset({"gpu_clock_hertz", "gpu_clock_max_hertz"})


def _default(sample: Sample) -> bool:
    if sample.family in _CLOCKS:
        return sample.labels[0] != "graphics"
    return sample.family not in DEFAULT_LEFT_OUT


# The clock events that slow a GPU down; the others (idle, application clocks, sync boost,
# display clocks) explain a low clock that nobody needs to act on.
SLOWDOWN_REASONS = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}
)

# Family -> which of its series the minimal profile keeps (None: all of them). The
# predicate gets the sample's own labels, in the family's label order.
MINIMAL: Mapping[str, Callable[[tuple[str, ...]], bool] | None] = {
    # Is it busy, is it starved (held but idle)?
    "gpu_utilization_seconds_total": None,
    "gpu_memory_utilization_seconds_total": None,
    "gpu_idle_seconds_total": None,
    "gpu_sm_active_seconds_total": None,
    "gpu_dram_active_seconds_total": None,
    "gpu_processes": None,
    "gpu_memory_used_bytes": None,
    "gpu_memory_total_bytes": None,
    "gpu_mig_memory_used_bytes": None,
    "gpu_mig_memory_total_bytes": None,
    "gpu_mig_sm_active_seconds_total": None,
    "gpu_mig_dram_active_seconds_total": None,
    "gpu_pod_info": None,
    "gpu_pod_memory_used_bytes": None,
    "gpu_pod_utilization_seconds_total": None,
    # Is it hot? And is a busy GPU hung (GPUJobHung: its power against its limit)?
    "gpu_temperature_celsius": None,
    "gpu_power_usage_watts": None,
    "gpu_power_limit_watts": None,
    "gpu_clock_event_active": lambda labels: labels[0] in SLOWDOWN_REASONS,
    # Is it broken?
    "gpu_xid_errors_total": None,
    "gpu_ecc_errors_total": lambda labels: "uncorrected" in labels,
    "gpu_row_remap_failed": None,
    "gpu_nvlink_link_down": None,
}


def sample_filter(
    profile: str, also: Callable[[Sample], bool] | None = None
) -> Callable[[Sample], bool] | None:
    """Whether a collector's sample is exported under `profile` (None: every sample is).

    ``also``: samples kept whatever the profile (those `metrics.dcgm_compat` writes its fields
    from, `exporter.server.dcgm.keeps_sources`).
    """
    keep = _profile_filter(profile)
    if keep is None or also is None:
        return keep
    profile_keeps = keep
    return lambda sample: profile_keeps(sample) or also(sample)


def _profile_filter(profile: str) -> Callable[[Sample], bool] | None:
    if profile == "full":
        return None
    if profile == "default":
        return _default
    if profile == "minimal":
        node_families = {
            family.name
            for spec in REGISTRY.values()
            for family in spec.families
            if not family.per_gpu
        }

        def minimal(sample: Sample) -> bool:
            if sample.family not in MINIMAL:
                return sample.family in node_families
            keep = MINIMAL[sample.family]
            return keep is None or keep(sample.labels)

        return minimal
    raise ValueError(f"unknown metrics profile {profile!r}: expected one of {', '.join(PROFILES)}")
