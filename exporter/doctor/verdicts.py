"""From a window of samples to one state per GPU, with the figures that show it.

The states, in the order they win when several apply:

========================  ===============================================================
hardware-fault            the GPU is lost (``gpu_up 0``), reported a critical XID, counted
                          uncorrectable ECC errors, or has a row remap pending or failed
throttled-thermal         a thermal clock event reason active more than GPUThermalThrottling's
                          ``active_above`` of the window
throttled-power           ``hw_power_brake`` likewise, or ``sw_power_cap`` with the SM clock
                          below ``POWER_THROTTLE_CLOCK_RATIO`` of its maximum (a busy GPU at its
                          power limit with its clocks near their maximum is compute-bound)
pcie-bound                a busy GPU on a PCIe link below its capability (GPUPCIeLinkDegraded),
                          or moving more than the bottleneck classes' ``link_busy_above``
                          of its link's bandwidth
memory-bandwidth-bound    GPUMemoryBandwidthBound's DRAM and compute-pipe thresholds (GPM only)
input-starved             in use, averaging below GPUDataLoaderStarved's ``average_below`` and
                          fully idle (no kernel at all) more than its ``idle_above`` of the
                          window; or below GPUUtilizationLow's average
imbalanced                in use and more than GPULoadImbalance's spread below the busiest
                          in-use GPU of the node
compute-bound             in use above ``COMPUTE_BOUND_ABOVE`` (healthy)
busy                      in use, none of the above (healthy)
idle                      not in use (no process, memory under the in-use floor) (healthy)
========================  ===============================================================

The windowed conditions use the window's own samples (30 s by default) rather than the alerts'
5 minutes: the doctor answers "now", the alerts "for a while". Utilization, fully idle time and
GPM activity are the increase of their counters of seconds (``gpu_utilization_seconds_total``,
``gpu_idle_seconds_total``, ``gpu_sm_active_seconds_total``, ...) over the window divided by its
length: every NVML sample in between counts, where a mean of the last-interval ratios would
count only the intervals the readings happened to land on. The clock event reasons have no
counter: their share is the mean of the window's 0/1 readings.

A GPU in MIG mode has no whole-GPU utilization (NVML answers NOT_SUPPORTED), so the states that
need it cannot be judged on the whole GPU. Its MIG instances are judged instead where the GPU has
GPM per instance (Hopper and newer: ``gpu_mig_sm_active_seconds_total`` and the other
``gpu_mig_*_active_seconds_total`` counters) with GPUMIGUtilizationLow's (GPUUtilizationLow's
30%, on SM activity) and GPUMemoryBandwidthBound's thresholds; their memory
(``gpu_mig_memory_used_bytes``) is judged everywhere against GPUMemoryNearlyFull's. What cannot
be measured is said, with the reason, in each report's ``unmeasured``; a GPU whose load cannot be
judged at all is ``unknown``.

Every XID in the window is listed with its meaning from the runbooks' XID table; those in
GPUXidError's list make the GPU a hardware fault, the others (application errors) are shown only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from exporter.alerting import rules
from exporter.alerting.history import Labels, Point
from exporter.alerting.thresholds import Thresholds
from exporter.doctor import runbooks

# The doctor's own thresholds, where no alert has one.
COMPUTE_BOUND_ABOVE = 0.80
POWER_THROTTLE_CLOCK_RATIO = 0.80
# Bytes per second per lane, after encoding, by PCIe generation.
PCIE_LANE_BYTES = {1: 250e6, 2: 500e6, 3: 984.6e6, 4: 1969e6, 5: 3938e6, 6: 7563e6}

# Every metric name the verdicts read (a window that knows its names refuses any other).
FAMILIES = frozenset(
    {
        "gpu_up",
        "gpu_info",
        "gpu_processes",
        "gpu_utilization_seconds_total",
        "gpu_idle_seconds_total",
        "gpu_memory_utilization_seconds_total",
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
        "gpu_clock_event_active",
        "gpu_clock_hertz",
        "gpu_clock_max_hertz",
        "gpu_sm_active_seconds_total",
        "gpu_dram_active_seconds_total",
        *(f"gpu_{pipe}_active_seconds_total" for pipe in rules.COMPUTE_PIPES),
        "gpu_temperature_celsius",
        "gpu_temperature_slowdown_threshold_celsius",
        "gpu_power_usage_watts",
        "gpu_power_limit_watts",
        "gpu_pcie_link_generation",
        "gpu_pcie_link_max_generation",
        "gpu_pcie_link_width",
        "gpu_pcie_link_max_width",
        "gpu_pcie_receive_bytes_total",
        "gpu_pcie_transmit_bytes_total",
        "gpu_xid_errors_total",
        "gpu_ecc_errors_total",
        "gpu_row_remap_pending",
        "gpu_row_remap_failed",
        "gpu_retired_pages_pending",
        "gpu_mig_mode_enabled",
        "gpu_mig_memory_used_bytes",
        "gpu_mig_memory_total_bytes",
        "gpu_mig_sm_active_seconds_total",
        "gpu_mig_dram_active_seconds_total",
        *(f"gpu_mig_{pipe}_active_seconds_total" for pipe in rules.COMPUTE_PIPES),
    }
)

# Why no sample names a GPU: NVML answered GPU_IS_LOST before the exporter could read its name
# and UUID (its gpu_up 0 has no uuid label, and it has no gpu_info).
LOST_BEFORE_READ = "lost before it was read"

HEALTHY = ("compute-bound", "busy", "idle")
ORDER = (
    "hardware-fault",
    "throttled-thermal",
    "throttled-power",
    "pcie-bound",
    "memory-bandwidth-bound",
    "memory-nearly-full",
    "input-starved",
    "imbalanced",
    "compute-bound",
    "busy",
    "idle",
    "unknown",
)

# Next steps of the healthy states that no alert's runbook covers.
BUSY_STEPS = [
    "Nothing to do: it works and nothing above holds it back.",
    "To watch: the job's time per step, and this verdict over a longer window "
    "(gpuload doctor --duration 5m) if the job slows down.",
]
IDLE_STEPS = [
    "Nothing to do if this GPU is meant to be free.",
    "If a job should run here, check that it was given this GPU (CUDA_VISIBLE_DEVICES, the pod's "
    "nvidia.com/gpu request) and that it started.",
]
MIG_WITHOUT_GPM_STEPS = [
    "Each instance's memory is below; its activity needs GPM, which this GPU does not have.",
    "Judge each instance's load from inside its job (its time per step or request latency, or a "
    "profiler such as Nsight Systems).",
]


@dataclass
class Window:
    """Every series of a sampling window: name -> labels -> [(time, value)]."""

    series: dict[str, dict[Labels, list[Point]]]
    start: float
    end: float
    # The names the window was gathered for; None: everything there was.
    names: frozenset[str] | None = None

    def of(self, name: str, gpu: str, **matchers: str) -> list[Point]:
        """The samples of one GPU's series: of several that match, the first read last.

        Several match where a label changed within the window: after an exporter restart, a GPU
        lost before the new exporter could read its UUID; the newest says how the GPU is now.
        """
        self._check(name)
        found: list[Point] = []
        for labels, points in self.series.get(name, {}).items():
            label = dict(labels)
            if label.get("gpu") != gpu or "mig_instance" in label:
                continue
            if not all(label.get(k) == v for k, v in matchers.items()):
                continue
            if not found or (points and points[-1][0] > found[-1][0]):
                found = points
        return found

    def each(self, name: str, gpu: str) -> dict[Labels, list[Point]]:
        """Every series of ``name`` for one GPU."""
        self._check(name)
        return {
            labels: points
            for labels, points in self.series.get(name, {}).items()
            if dict(labels).get("gpu") == gpu
        }

    def instances(self, name: str, gpu: str) -> dict[str, tuple[str, list[Point]]]:
        """One GPU's MIG instances in ``name``: GPU instance id -> (its profile, samples)."""
        self._check(name)
        found = {}
        for labels, points in self.series.get(name, {}).items():
            label = dict(labels)
            if label.get("gpu") == gpu and "mig_instance" in label:
                found[label["mig_instance"]] = (label.get("mig_profile", ""), points)
        return dict(sorted(found.items(), key=lambda item: int(item[0] or 0)))

    def _check(self, name: str) -> None:
        if self.names is not None and name not in self.names:
            raise KeyError(f"this window was not gathered with {name}: add it to FAMILIES")

    def gpus(self) -> dict[str, dict[str, str]]:
        """GPU index -> its identity labels (gpu_info's, else gpu_up's), the latest known.

        The series read last win, gpu_info over gpu_up at the same time; a label they lack is
        taken from earlier series that had it: a GPU lost before a restarted exporter could read
        it has a ``gpu_up 0`` without ``uuid`` and no ``gpu_info``, its earlier series both.
        """
        found: dict[str, dict[str, str]] = {}
        series = [
            (points[-1][0] if points else -math.inf, order, dict(labels))
            for order, name in enumerate(("gpu_up", "gpu_info"))
            for labels, points in self.series.get(name, {}).items()
        ]
        for _last_read, _order, identity in sorted(series, key=lambda item: item[:2]):
            if "gpu" in identity:
                found.setdefault(identity["gpu"], {}).update(identity)
        return dict(sorted(found.items(), key=lambda item: int(item[0])))


@dataclass
class Finding:
    """One problem (or the healthy state) of a GPU, with its evidence and what to do."""

    state: str
    summary: str
    evidence: list[str]
    runbook: str = ""
    steps: list[str] = field(default_factory=list)


def _finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "state": finding.state,
        "summary": finding.summary,
        "evidence": finding.evidence,
        "runbook_url": finding.runbook,
        "next_steps": finding.steps,
    }


@dataclass(frozen=True)
class Xid:
    """XID errors of one code reported on a GPU, with their meaning from the runbooks."""

    code: int
    count: int
    meaning: str
    action: str
    critical: bool

    def text(self, gpu: str) -> str:
        """``XID 79 on GPU 3: GPU has fallen off the bus``."""
        times = f" ({self.count} times)" if self.count > 1 else ""
        return f"XID {self.code} on GPU {gpu}{times}: {self.meaning or 'see the XID catalog'}"

    def to_json(self, gpu: str) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "gpu": int(gpu),
            "xid": self.code,
            "count": self.count,
            "meaning": self.meaning,
            "action": self.action,
            "critical": self.critical,
            "text": self.text(gpu),
        }


@dataclass(frozen=True)
class Unmeasured:
    """Something the doctor could not measure on a GPU, and why."""

    what: str
    why: str

    def text(self) -> str:
        """``whole-GPU utilization: NVML has none in MIG mode``."""
        return f"{self.what}: {self.why}"


@dataclass
class InstanceReport:
    """The doctor's verdict on one MIG GPU instance."""

    instance: str
    profile: str
    state: str
    findings: list[Finding]
    figures: dict[str, float | None]

    @property
    def healthy(self) -> bool:
        """Whether the instance needs nothing done."""
        return self.state in HEALTHY or self.state == "unknown"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "mig_instance": int(self.instance),
            "mig_profile": self.profile,
            "state": self.state,
            "healthy": self.healthy,
            "summary": self.findings[0].summary if self.findings else "",
            "figures": self.figures,
            "findings": [_finding_json(f) for f in self.findings],
        }


@dataclass
class Report:
    """The doctor's verdict on one GPU."""

    gpu: str
    uuid: str
    name: str
    state: str
    findings: list[Finding]
    figures: dict[str, float | None]
    xids: list[Xid] = field(default_factory=list)
    unmeasured: list[Unmeasured] = field(default_factory=list)
    mig_mode: bool = False
    instances: list[InstanceReport] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """Whether the GPU needs nothing done."""
        return self.state in HEALTHY or self.state == "unknown"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "gpu": int(self.gpu),
            "uuid": self.uuid,
            "name": self.name,
            "state": self.state,
            "healthy": self.healthy,
            "summary": self.findings[0].summary if self.findings else "",
            "figures": self.figures,
            "findings": [_finding_json(f) for f in self.findings],
            "xids": [xid.to_json(self.gpu) for xid in self.xids],
            "not_measured": [{"what": u.what, "why": u.why} for u in self.unmeasured],
            "mig_mode": self.mig_mode,
            "mig_instances": [instance.to_json() for instance in self.instances],
        }


def _mean(points: list[Point]) -> float | None:
    return sum(v for _t, v in points) / len(points) if points else None


def _last(points: list[Point]) -> float | None:
    return points[-1][1] if points else None


def _rate(points: list[Point]) -> float | None:
    """A counter's increase per second between its first and last reading.

    A reading below the one before is a reset (the exporter restarted): the counter started
    again from zero, so its new value is all it gained since.
    """
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    increase = sum(
        later - earlier if later >= earlier else later
        for (_t0, earlier), (_t1, later) in pairwise(points)
    )
    return increase / (points[-1][0] - points[0][0])


def _pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f}%"


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.1f} GiB"


def _busy(window: Window, name: str, gpu: str) -> float | None:
    """The mean of a fraction of time over the window, from its counter of seconds.

    The counter's increase over the seconds between its first and last reading: every NVML
    sample (or GPM interval) in between counts, where a mean of the last-interval ratios
    counts only the intervals the window happened to read.
    """
    return _ratio(_rate(window.of(name, gpu)))


def _ratio(rate: float | None) -> float | None:
    """A rate of seconds per second as a fraction of time (at most 1)."""
    return None if rate is None else min(rate, 1.0)


def figures(window: Window, gpu: str) -> dict[str, float | None]:
    """The evidence figures of one GPU over the window."""
    util = window.of("gpu_utilization_seconds_total", gpu)
    events = {
        dict(labels)["reason"]: _mean(points)
        for labels, points in window.each("gpu_clock_event_active", gpu).items()
    }
    pipes = [_busy(window, f"gpu_{pipe}_active_seconds_total", gpu) for pipe in rules.COMPUTE_PIPES]
    known_pipes = [p for p in pipes if p is not None]
    sm_clock = _mean(window.of("gpu_clock_hertz", gpu, clock="sm"))
    sm_max = _last(window.of("gpu_clock_max_hertz", gpu, clock="sm"))
    generation = _last(window.of("gpu_pcie_link_generation", gpu))
    width = _last(window.of("gpu_pcie_link_width", gpu))
    capacity = None
    if generation is not None and width is not None:
        capacity = PCIE_LANE_BYTES.get(int(generation), 0.0) * width or None
    return {
        "up": _last(window.of("gpu_up", gpu)),
        "samples": float(len(util)),
        "utilization_mean": _busy(window, "gpu_utilization_seconds_total", gpu),
        "idle_fraction": _busy(window, "gpu_idle_seconds_total", gpu),
        "memory_used_bytes": _last(window.of("gpu_memory_used_bytes", gpu)),
        "memory_total_bytes": _last(window.of("gpu_memory_total_bytes", gpu)),
        "processes": _last(window.of("gpu_processes", gpu)),
        "memory_utilization_mean": _busy(window, "gpu_memory_utilization_seconds_total", gpu),
        "dram_active_mean": _busy(window, "gpu_dram_active_seconds_total", gpu),
        "sm_active_mean": _busy(window, "gpu_sm_active_seconds_total", gpu),
        "compute_pipe_max_mean": max(known_pipes) if known_pipes else None,
        "thermal_event_ratio": max(
            (events.get(r) or 0.0 for r in ("sw_thermal", "hw_thermal")), default=0.0
        )
        if events
        else None,
        "power_cap_ratio": events.get("sw_power_cap"),
        "power_brake_ratio": events.get("hw_power_brake"),
        "temperature_celsius": _last(window.of("gpu_temperature_celsius", gpu, sensor="gpu")),
        "slowdown_celsius": _last(window.of("gpu_temperature_slowdown_threshold_celsius", gpu)),
        "power_watts": _mean(window.of("gpu_power_usage_watts", gpu)),
        "power_limit_watts": _last(window.of("gpu_power_limit_watts", gpu)),
        "sm_clock_ratio": sm_clock / sm_max if sm_clock and sm_max else None,
        "pcie_generation": generation,
        "pcie_max_generation": _last(window.of("gpu_pcie_link_max_generation", gpu)),
        "pcie_width": width,
        "pcie_max_width": _last(window.of("gpu_pcie_link_max_width", gpu)),
        "pcie_rx_bytes_per_second": _rate(window.of("gpu_pcie_receive_bytes_total", gpu)),
        "pcie_tx_bytes_per_second": _rate(window.of("gpu_pcie_transmit_bytes_total", gpu)),
        "pcie_capacity_bytes_per_second": capacity,
    }


def _in_use(f: Mapping[str, float | None], thresholds: Thresholds) -> bool:
    return bool(
        (f["processes"] or 0) > 0
        or (f["memory_used_bytes"] or 0) > thresholds.in_use_memory_floor_bytes
    )


# XID 154 has its own alert: the driver names the recovery action the GPU needs.
RECOVERY_XID = 154


def xids(window: Window, gpu: str, t: Thresholds) -> list[Xid]:
    """The XIDs a GPU reported (counted since the exporter started), most serious first."""
    critical = set(t.alert("GPUXidError").xids()) | {RECOVERY_XID}
    table = runbooks.xid_table()
    found = []
    for labels, points in window.each("gpu_xid_errors_total", gpu).items():
        code = dict(labels).get("xid", "")
        count = _last(points) or 0
        if not code.isdigit() or count <= 0:
            continue
        meaning, action = table.get(int(code), ("", ""))
        if meaning[1:2].islower():
            meaning = meaning[0].lower() + meaning[1:]
        found.append(Xid(int(code), int(count), meaning, action, int(code) in critical))
    return sorted(found, key=lambda xid: (not xid.critical, xid.code))


def _lost(window: Window, gpu: str) -> str:
    """Since when a GPU reads ``gpu_up 0``: the evidence that it fell off the bus."""
    # Every series of it: across a restart, the one with its UUID and the one without.
    readings = sorted(point for points in window.each("gpu_up", gpu).values() for point in points)
    up = [at for at, value in readings if value != 0]
    if not up:
        return f"gpu_up 0 in all {len(readings)} readings of the window"
    since = sum(at > up[-1] for at, _value in readings)
    return (
        f"gpu_up 1 until {up[-1] - window.start:.0f} s into the window, "
        f"0 in the {since} readings since"
    )


def _hardware(
    window: Window, gpu: str, t: Thresholds, f: Mapping[str, Any], reported: list[Xid]
) -> Finding | None:
    # (alert, the problem, the reading that shows it): the first problem is the finding's
    # summary and its reading the first evidence; the other problems follow as evidence.
    problems: list[tuple[str, str, str]] = []
    if f["up"] == 0:
        summary = "NVML answers GPU is lost: it has fallen off the bus"
        problems.append(("GPUFellOffBus", summary, _lost(window, gpu)))
    for xid in reported:
        if xid.critical:
            alert = "GPURecoveryActionRequired" if xid.code == RECOVERY_XID else "GPUXidError"
            reading = f'gpu_xid_errors_total{{xid="{xid.code}"}} {xid.count}'
            problems.append((alert, xid.text(gpu), reading))
    volatile = _last(window.of("gpu_ecc_errors_total", gpu, type="uncorrected", counter="volatile"))
    if (volatile or 0) > 0:
        reading = f'gpu_ecc_errors_total{{type="uncorrected",counter="volatile"}} {volatile:.0f}'
        summary = f"{volatile:.0f} uncorrectable ECC errors since load"
        problems.append(("GPUECCUncorrectable", summary, reading))
    if _last(window.of("gpu_row_remap_failed", gpu)) == 1:
        summary = "a memory row remap failed"
        problems.append(("GPURowRemapFailed", summary, "gpu_row_remap_failed 1"))
    pending = [
        name
        for name in ("gpu_row_remap_pending", "gpu_retired_pages_pending")
        if _last(window.of(name, gpu)) == 1
    ]
    if pending:
        summary = "a row remap (or page retirement) is pending"
        problems.append(("GPURowRemapPending", summary, f"{pending[0]} 1"))
    if not problems:
        return None
    alert, summary, reading = problems[0]
    return Finding(
        "hardware-fault",
        summary,
        [reading, *(problem for _alert, problem, _reading in problems[1:])],
        t.runbook_url(alert),
        runbooks.steps(alert),
    )


def _finding(t: Thresholds, state: str, alert: str, summary: str, evidence: list[str]) -> Finding:
    return Finding(state, summary, evidence, t.runbook_url(alert), runbooks.steps(alert))


def _throttled(t: Thresholds, f: Mapping[str, Any]) -> list[Finding]:
    found = []
    thermal = f["thermal_event_ratio"]
    clocks = f"SM clock at {_pct(f['sm_clock_ratio'])} of its maximum"
    if thermal is not None and thermal > t.alert("GPUThermalThrottling").number("active_above"):
        temperature = f["temperature_celsius"]
        slowdown = f["slowdown_celsius"]
        found.append(
            _finding(
                t,
                "throttled-thermal",
                "GPUThermalThrottling",
                "clocks cut by thermal slowdown",
                [
                    f"thermal slowdown active {_pct(thermal)} of the window",
                    f"temperature {temperature:.0f} °C (slowdown at {slowdown:.0f} °C)"
                    if temperature is not None and slowdown is not None
                    else "temperature n/a",
                    clocks,
                ],
            )
        )
    active = t.alert("GPUPowerCapped").number("active_above")
    brake = f["power_brake_ratio"] or 0.0
    cap = f["power_cap_ratio"] or 0.0
    clock_ratio = f["sm_clock_ratio"]
    held_down = clock_ratio is not None and clock_ratio < POWER_THROTTLE_CLOCK_RATIO
    if brake > active or (cap > active and held_down):
        reason = "hardware power brake" if brake > active else "power cap"
        found.append(
            _finding(
                t,
                "throttled-power",
                "GPUPowerCapped",
                f"clocks held down by the {reason}",
                [
                    f"{reason} active {_pct(max(brake, cap))} of the window",
                    f"power {f['power_watts'] or 0:.0f} W of {f['power_limit_watts'] or 0:.0f} W",
                    clocks,
                ],
            )
        )
    return found


def _pcie(t: Thresholds, f: Mapping[str, Any]) -> Finding | None:
    generation, max_generation = f["pcie_generation"], f["pcie_max_generation"]
    width, max_width = f["pcie_width"], f["pcie_max_width"]
    busy = (f["utilization_mean"] or 0) > t.alert("GPUPCIeLinkDegraded").number("busy_above")
    link = (
        f"link gen {generation or 0:.0f} x{width or 0:.0f}"
        f" (max gen {max_generation or 0:.0f} x{max_width or 0:.0f})"
    )
    if None not in (generation, max_generation, width, max_width) and busy:
        fraction = 2 ** (generation - max_generation) * width / max_width
        if fraction < 1:
            return _finding(
                t,
                "pcie-bound",
                "GPUPCIeLinkDegraded",
                "a busy GPU on a PCIe link below its capability",
                [link, f"{_pct(fraction)} of the link's full bandwidth"],
            )
    capacity = f["pcie_capacity_bytes_per_second"]
    traffic = max(f["pcie_rx_bytes_per_second"] or 0, f["pcie_tx_bytes_per_second"] or 0)
    if capacity and traffic / capacity > t.bottlenecks.link_busy_above:
        return _finding(
            t,
            "pcie-bound",
            "GPUPCIeLinkDegraded",
            "host transfers fill the PCIe link",
            [link, f"{traffic / 1e9:.1f} GB/s, {_pct(traffic / capacity)} of the link"],
        )
    return None


def _bandwidth(t: Thresholds, f: Mapping[str, Any], activity: str = "") -> Finding | None:
    a = t.alert("GPUMemoryBandwidthBound")
    dram, pipes = f["dram_active_mean"], f["compute_pipe_max_mean"]
    activity = activity or (
        f"utilization {_pct(f.get('utilization_mean'))}, SM active {_pct(f['sm_active_mean'])}"
    )
    if dram is None or pipes is None:
        return None
    if dram > a.number("dram_active_above") and pipes < a.number("compute_pipes_below"):
        return _finding(
            t,
            "memory-bandwidth-bound",
            "GPUMemoryBandwidthBound",
            "busy moving data, not computing",
            [
                f"DRAM bandwidth {_pct(dram)} of peak",
                f"busiest compute pipe {_pct(pipes)}",
                activity,
            ],
        )
    return None


def _starved(t: Thresholds, f: Mapping[str, Any]) -> Finding | None:
    mean, idle = f["utilization_mean"], f["idle_fraction"]
    if mean is None:
        return None
    s = t.alert("GPUDataLoaderStarved")
    evidence = [
        f"utilization mean {_pct(mean)}, fully idle {_pct(idle)} of the time",
        f"{_gib(f['memory_used_bytes'])} held by {f['processes'] or 0:.0f} process(es)",
    ]
    if 0 < mean < s.number("average_below") and (idle or 0.0) > s.number("idle_above"):
        return _finding(
            t,
            "input-starved",
            "GPUDataLoaderStarved",
            "busy in bursts, fully idle in between: waits for its input",
            evidence,
        )
    if mean < t.alert("GPUUtilizationLow").number("below"):
        return _finding(
            t,
            "input-starved",
            "GPUUtilizationLow",
            "in use but mostly idle: waits on something other than its compute",
            evidence,
        )
    return None


def diagnose(window: Window, thresholds: Thresholds) -> list[Report]:
    """One report per GPU seen in the window."""
    reports = []
    stats = {gpu: figures(window, gpu) for gpu in window.gpus()}
    in_use = {gpu: f for gpu, f in stats.items() if _in_use(f, thresholds) and f["up"] != 0}
    busiest = max((f["utilization_mean"] or 0 for f in in_use.values()), default=0.0)
    spread = thresholds.alert("GPULoadImbalance").number("spread_above")
    for gpu, identity in window.gpus().items():
        f = stats[gpu]
        reported = xids(window, gpu, thresholds)
        findings: list[Finding] = _throttled(thresholds, f)
        optional = [_hardware(window, gpu, thresholds, f, reported)]
        if gpu in in_use:
            optional += [_pcie(thresholds, f), _bandwidth(thresholds, f), _starved(thresholds, f)]
        findings += [finding for finding in optional if finding is not None]
        mean = f["utilization_mean"]
        if gpu in in_use and mean is not None and busiest - mean > spread:
            findings.append(
                _finding(
                    thresholds,
                    "imbalanced",
                    "GPULoadImbalance",
                    "well behind the busiest GPU of the node",
                    [f"utilization {_pct(mean)} against {_pct(busiest)} on the busiest in-use GPU"],
                )
            )
        mig = _mig_mode(window, gpu)
        gpm = identity.get("profiling") == "gpm" or bool(
            window.instances("gpu_mig_sm_active_seconds_total", gpu)
        )
        instances = mig_instances(window, gpu, thresholds) if mig and f["up"] != 0 else []
        unmeasured = _unmeasured(identity.get("name", "") or "this GPU", f, mig, gpm, instances)
        # A mean over the window needs two readings of the counters (of gpu_up in MIG mode,
        # where the instances' counters stand in for utilization).
        readings = len(window.of("gpu_up", gpu)) if mig else int(f["samples"] or 0)
        measured = readings >= 2 or f["up"] == 0
        if not findings:
            if mig and f["up"] != 0:
                findings.append(_mig_summary(instances, unmeasured))
            elif measured:
                findings.append(_healthy(thresholds, gpu in in_use, f))
        if not measured:
            findings.append(_unknown(readings, unmeasured))
        findings.sort(key=lambda finding: ORDER.index(finding.state))
        state = findings[0].state if measured else "unknown"
        if not measured:
            findings.insert(0, findings.pop())
        lost = f["up"] == 0
        reports.append(
            Report(
                gpu,
                identity.get("uuid") or unidentified("UUID", lost),
                identity.get("name") or unidentified("name", lost),
                state,
                findings,
                f,
                reported,
                unmeasured,
                mig,
                instances,
            )
        )
    return reports


def unidentified(what: str, lost: bool) -> str:
    """What stands for a GPU's ``what`` (name, UUID) where no sample carries it, and why."""
    return f"{what} unknown: {LOST_BEFORE_READ if lost else 'in no sample of the window'}"


def _mig_mode(window: Window, gpu: str) -> bool:
    enabled = _last(window.of("gpu_mig_mode_enabled", gpu))
    if enabled is not None:
        return enabled == 1
    return bool(window.instances("gpu_mig_memory_used_bytes", gpu))


def _unmeasured(
    name: str,
    f: Mapping[str, Any],
    mig: bool,
    gpm: bool,
    instances: list[InstanceReport],
) -> list[Unmeasured]:
    if f["up"] == 0:
        return [Unmeasured("everything but its state", "NVML answers GPU is lost for every call")]
    if not mig:
        if f["samples"]:
            return []
        return [Unmeasured("utilization", "NVML reports none for this GPU")]
    found = [
        Unmeasured(
            "whole-GPU utilization",
            "NVML has no whole-GPU utilization in MIG mode"
            + ("; judged per MIG instance from GPM instead" if gpm else ""),
        )
    ]
    if not gpm:
        found.append(
            Unmeasured(
                "activity per MIG instance",
                f"the {name} has no GPM (GPU performance monitoring, Hopper and newer); "
                "only each instance's memory is measured",
            )
        )
    if not instances:
        found.append(Unmeasured("MIG instances", "none reported (the mig collector is off?)"))
    return found


def mig_instances(window: Window, gpu: str, t: Thresholds) -> list[InstanceReport]:
    """The verdict on each MIG GPU instance of a GPU."""
    used = window.instances("gpu_mig_memory_used_bytes", gpu)
    total = window.instances("gpu_mig_memory_total_bytes", gpu)
    sm = window.instances("gpu_mig_sm_active_seconds_total", gpu)
    dram = window.instances("gpu_mig_dram_active_seconds_total", gpu)
    pipes = [
        window.instances(f"gpu_mig_{name}_active_seconds_total", gpu)
        for name in rules.COMPUTE_PIPES
    ]
    reports = []
    for instance in sorted({*used, *sm}, key=int):
        profile = (used.get(instance) or sm.get(instance) or ("", []))[0]

        def rate(series: dict[str, tuple[str, list[Point]]], key: str = instance) -> float | None:
            return _ratio(_rate(series[key][1])) if key in series else None

        known_pipes = [r for r in (rate(pipe) for pipe in pipes) if r is not None]
        f: dict[str, float | None] = {
            "memory_used_bytes": _last(used[instance][1]) if instance in used else None,
            "memory_total_bytes": _last(total[instance][1]) if instance in total else None,
            "sm_active_mean": rate(sm),
            "dram_active_mean": rate(dram),
            "compute_pipe_max_mean": max(known_pipes) if known_pipes else None,
        }
        findings = _instance_findings(t, f)
        reports.append(InstanceReport(instance, profile, findings[0].state, findings, f))
    return reports


def _instance_findings(t: Thresholds, f: Mapping[str, Any]) -> list[Finding]:
    used, total, sm = f["memory_used_bytes"], f["memory_total_bytes"], f["sm_active_mean"]
    evidence = [instance_text(f)]
    findings = []
    full = t.alert("GPUMemoryNearlyFull").number("used_above")
    if used is not None and total and used / total > full:
        findings.append(
            _finding(
                t,
                "memory-nearly-full",
                "GPUMemoryNearlyFull",
                f"its memory is {_pct(used / total)} full",
                evidence,
            )
        )
    in_use = (used or 0) > t.in_use_memory_floor_bytes
    if not in_use and not sm:
        findings.append(Finding("idle", "nothing running on it", evidence, steps=IDLE_STEPS))
    elif sm is None:
        findings.append(
            Finding(
                "unknown",
                "in use; its activity is not measurable without GPM",
                evidence,
                steps=MIG_WITHOUT_GPM_STEPS,
            )
        )
    else:
        findings += _instance_load(t, f, evidence)
    findings.sort(key=lambda finding: ORDER.index(finding.state))
    return findings


def instance_text(f: Mapping[str, Any]) -> str:
    """One line of a MIG instance's figures: its activity where measured, its memory always."""
    memory = f"memory {_gib(f['memory_used_bytes'])} of {_gib(f['memory_total_bytes'])}"
    if f["sm_active_mean"] is None:
        return memory
    return f"SM active {_pct(f['sm_active_mean'])}, DRAM {_pct(f['dram_active_mean'])}, {memory}"


def _instance_load(t: Thresholds, f: Mapping[str, Any], evidence: list[str]) -> list[Finding]:
    sm = f["sm_active_mean"]
    bandwidth = _bandwidth(t, f, f"SM active {_pct(sm)}")
    if bandwidth is not None:
        return [bandwidth]
    if sm < t.alert("GPUUtilizationLow").number("below"):
        return [
            _finding(
                t,
                "input-starved",
                "GPUMIGUtilizationLow",
                "in use but its SMs mostly idle: the slice is too big or its work waits",
                evidence,
            )
        ]
    if sm > COMPUTE_BOUND_ABOVE:
        return [_finding(t, "compute-bound", "GPUUtilizationHigh", "busy computing", evidence)]
    return [Finding("busy", "working, nothing holding it back", evidence, steps=BUSY_STEPS)]


def _mig_summary(instances: list[InstanceReport], unmeasured: list[Unmeasured]) -> Finding:
    """The GPU-level finding of a MIG GPU with no whole-GPU problem: its instances' verdict."""
    counts: dict[str, int] = {}
    for instance in instances:
        counts[instance.state] = counts.get(instance.state, 0) + 1
    tally = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=_by_order))
    evidence = [f"{len(instances)} MIG instances: {tally}"]
    judged = [i for i in instances if i.state != "unknown"]
    worst = min(judged, key=lambda i: ORDER.index(i.state), default=None)
    if worst is None or (len(judged) < len(instances) and worst.healthy):
        steps = MIG_WITHOUT_GPM_STEPS if any(i.state == "unknown" for i in instances) else []
        why = "MIG mode without GPM" if steps else "no MIG instance judged"
        return Finding("unknown", f"load not measurable: {why}", evidence, steps=steps)
    first = worst.findings[0]
    summary = f"MIG instance {worst.instance} ({worst.profile}): {first.summary}"
    return Finding(worst.state, summary, evidence, first.runbook, first.steps)


def _by_order(item: tuple[str, int]) -> int:
    return ORDER.index(item[0]) if item[0] in ORDER else len(ORDER)


def _unknown(readings: int, unmeasured: list[Unmeasured]) -> Finding:
    evidence = [f"{readings} reading(s) in the window"]
    if unmeasured:
        return Finding("unknown", f"not measurable: {unmeasured[0].text()}", evidence)
    return Finding(
        "unknown",
        "not measurable: a mean needs two readings",
        evidence,
        steps=["Sample longer (--duration) or more often (--collect.interval)."],
    )


def _healthy(t: Thresholds, in_use: bool, f: Mapping[str, Any]) -> Finding:
    mean = f["utilization_mean"]
    evidence = [
        f"utilization mean {_pct(mean)}",
        f"{_gib(f['memory_used_bytes'])} of {_gib(f['memory_total_bytes'])} used, "
        f"{f['processes'] or 0:.0f} process(es)",
    ]
    if not in_use:
        return Finding("idle", "nothing running on it", evidence, steps=IDLE_STEPS)
    if mean is not None and mean > COMPUTE_BOUND_ABOVE:
        return _finding(
            t, "compute-bound", "GPUUtilizationHigh", "busy computing: healthy", evidence
        )
    return Finding("busy", "working, nothing holding it back", evidence, steps=BUSY_STEPS)
