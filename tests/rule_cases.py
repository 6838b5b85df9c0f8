"""Generated input series for the differential test of the rule engine against promtool.

Each case is one node with one to three GPUs over ``MINUTES`` minutes, scraped every ``STEP``
seconds. Every GPU goes through random segments of behaviour chosen to sit on either side of the
thresholds (idle, underutilized, input-starved, busy, saturated, hung, MIG), and the node gets
random faults (temperatures, throttling, XIDs, ECC, remaps, a lost GPU, NVML or a collector
down), failed scrapes (every series stale for a while) and exporter restarts (every counter
starts again at 0). The seeds are fixed: a failure names its case, and runs again the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.alerting.history import Labels
from exporter.alerting.rules import COLLECTED_AT
from tools.vectors import STALE, Series

STEP = 15.0
MINUTES = 16
STEPS = int(MINUTES * 60 / STEP) + 1
GIB = 2**30
LIMIT = 700.0
Span = tuple[float, float]
# (utilization, fully idle fraction, power ratio, in use) ranges of each behaviour.
BEHAVIOURS: dict[str, tuple[Span, Span, Span, bool]] = {
    "idle": ((0.0, 0.0), (1.0, 1.0), (0.08, 0.12), False),
    "idle-held": ((0.0, 0.04), (0.9, 1.0), (0.08, 0.15), True),
    "low": ((0.05, 0.32), (0.0, 0.15), (0.2, 0.4), True),
    "starved": ((0.2, 0.62), (0.15, 0.6), (0.3, 0.6), True),
    "busy": ((0.5, 0.94), (0.0, 0.1), (0.4, 0.9), True),
    "memory-bound": ((0.6, 0.9), (0.0, 0.05), (0.5, 0.8), True),
    "saturated": ((0.93, 1.0), (0.0, 0.02), (0.6, 1.0), True),
    "hung": ((0.94, 1.0), (0.0, 0.02), (0.1, 0.3), True),
}


@dataclass
class _Track:
    """One series being built, step by step."""

    name: str
    labels: Labels
    values: list[float | str | None] = field(default_factory=lambda: [None] * STEPS)


class Node:
    """The series of one node, built by time."""

    def __init__(self) -> None:
        self.tracks: dict[tuple[str, Labels], _Track] = {}

    def set(self, step: int, name: str, labels: dict[str, str], value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = _Track(name, key[1])
        track.values[step] = float(value)

    def series(self, down: set[int]) -> tuple[Series, ...]:
        """Every series, stale at each step whose scrape failed."""
        out = []
        for track in self.tracks.values():
            values = list(track.values)
            for step in down:
                if step < STEPS and values[step] is not None:
                    values[step] = STALE
            # promtool's `_` after a value would look back over it; the exporter has no lookback.
            seen = False
            for step, value in enumerate(values):
                if value is None and seen:
                    values[step] = STALE
                seen = seen or value is not None
            out.append(Series(track.name, track.labels, tuple(values)))
        return tuple(out)


def _segments(rng: random.Random, choices: list[str]) -> list[tuple[int, str]]:
    """(first step, behaviour) pieces over the case."""
    pieces, step = [], 0
    while step < STEPS:
        pieces.append((step, rng.choice(choices)))
        step += rng.randint(8, 40)
    return pieces


def _at(pieces: list[tuple[int, str]], step: int) -> str:
    current = pieces[0][1]
    for first, behaviour in pieces:
        if first <= step:
            current = behaviour
    return current


def _gauge(
    rng: random.Random, low: float, high: float, p: float, longest: int = 40
) -> Callable[[int], float]:
    """A gauge that is ``low`` with a fault window of ``high`` with probability ``p``."""
    if rng.random() >= p:
        return lambda step: low
    start = rng.randint(0, STEPS - 1 if longest < STEPS else STEPS // 4)
    end = start + rng.randint(2, longest)
    return lambda step: high if start <= step < end else low


def case(seed: int) -> tuple[tuple[Series, ...], str]:
    """The series of case ``seed`` and a one-line description of it."""
    rng = random.Random(seed)
    node = Node()
    gpus = rng.randint(1, 3)
    restart = rng.randint(10, STEPS - 10) if rng.random() < 0.25 else None
    down: set[int] = set()
    if rng.random() < 0.35:
        start = rng.randint(4, STEPS - 4)
        down = set(range(start, start + rng.choice([1, 2, 4, 8, 12, 16])))
    if restart is not None:
        down |= set(range(restart - rng.randint(1, 6), restart))
    nvml = _gauge(rng, 1, 0, 0.1, longest=STEPS)
    collector = _gauge(rng, 1, 0, 0.12, longest=STEPS)
    pods = _gauge(rng, 1, 0, 0.25, longest=STEPS)
    described = [f"{gpus} GPU(s)", f"restart at {restart}" if restart else "", f"down {len(down)}"]
    counters: dict[tuple[str, Labels], float] = {}

    def count(step: int, name: str, labels: dict[str, str], per_second: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        if restart is not None and step == restart:
            counters[key] = 0.0
        value = counters.get(key, 0.0 if restart is not None and step >= restart else 1000.0)
        value += per_second * STEP
        counters[key] = value
        node.set(step, name, labels, value)

    for index in range(gpus):
        gpu = {"gpu": str(index), "uuid": f"GPU-{seed}-{index}"}
        mig = rng.random() < 0.15
        pieces = _segments(rng, list(BEHAVIOURS))
        if rng.random() < 0.25:
            # One behaviour all along: what the alerts with a long `for:` need.
            pieces = [(0, rng.choice(["memory-bound", "hung", "starved", "low"]))]
        gpm = rng.random() < 0.6
        lost = _gauge(rng, 1, 0, 0.06)
        temperature = _gauge(rng, 60, rng.choice([80, 86, 88]), 0.2)
        memory_temperature = _gauge(rng, 70, 87, 0.1)
        throttle = {
            reason: _gauge(rng, 0, 1, 0.12)
            for reason in ("sw_thermal", "hw_slowdown", "sw_power_cap", "gpu_idle")
        }
        generation = _gauge(rng, 4, 3, 0.12)
        xid = rng.choice(["79", "13", "154", "48"]) if rng.random() < 0.15 else None
        xid_at = rng.randint(0, STEPS - 1)
        ecc_at = rng.randint(0, STEPS - 1) if rng.random() < 0.08 else None
        remap = _gauge(rng, 0, 1, 0.06)
        remap_failed = _gauge(rng, 0, 1, 0.04)
        stale = _gauge(rng, 0, 1, 0.06, longest=STEPS)
        pod = rng.random() < 0.3
        nvlink_down = _gauge(rng, 0, 1, 0.06)
        full = _gauge(rng, 0.5, 0.97, 0.1)
        described.append(f"gpu {index}: {'mig ' if mig else ''}{[b for _, b in pieces]}")
        for step in range(STEPS):
            if step in down:
                continue
            behaviour = BEHAVIOURS[_at(pieces, step)]
            (u_lo, u_hi), (i_lo, i_hi), (p_lo, p_hi), in_use = behaviour
            busy = rng.uniform(u_lo, u_hi)
            idle = min(1.0 - busy, rng.uniform(i_lo, i_hi))
            node.set(step, "gpu_up", gpu, lost(step))
            if lost(step) == 0:
                continue
            node.set(step, "gpu_processes", gpu, float(rng.randint(1, 3)) if in_use else 0.0)
            total = 80 * GIB
            used = (full(step) if in_use else 0.002) * total
            node.set(step, "gpu_memory_used_bytes", gpu, used)
            node.set(step, "gpu_memory_total_bytes", gpu, float(total))
            node.set(step, "gpu_power_usage_watts", gpu, rng.uniform(p_lo, p_hi) * LIMIT)
            node.set(step, "gpu_power_limit_watts", gpu, LIMIT)
            node.set(step, "gpu_mig_mode_enabled", gpu, 1.0 if mig else 0.0)
            if mig:
                for instance, profile in (("1", "3g.40gb"), ("2", "4g.40gb")):
                    labels = {**gpu, "mig_instance": instance, "mig_profile": profile}
                    node.set(
                        step, "gpu_mig_memory_used_bytes", labels, (2 * GIB if in_use else 0.0)
                    )
                    node.set(step, "gpu_mig_memory_total_bytes", labels, 40.0 * GIB)
                    count(step, "gpu_mig_sm_active_seconds_total", labels, busy * 0.8)
                    node.set(
                        step,
                        "gpu_mig_multiprocessors",
                        {**labels, "mig_compute_instance": "0"},
                        float(42 if instance == "1" else 56),
                    )
            else:
                count(step, "gpu_utilization_seconds_total", gpu, busy)
                count(step, "gpu_idle_seconds_total", gpu, idle)
            if gpm and not mig:
                bound = _at(pieces, step) == "memory-bound"
                dram = rng.uniform(0.65, 0.9) if bound else busy * 0.3
                count(step, "gpu_dram_active_seconds_total", gpu, dram)
                count(step, "gpu_sm_active_seconds_total", gpu, busy * 0.9)
                for pipe, share in (("tensor", 0.15), ("fp16", 0.1), ("fp32", 0.22), ("fp64", 0)):
                    count(step, f"gpu_{pipe}_active_seconds_total", gpu, busy * share)
            node.set(step, "gpu_temperature_celsius", {**gpu, "sensor": "gpu"}, temperature(step))
            node.set(
                step,
                "gpu_temperature_celsius",
                {**gpu, "sensor": "memory"},
                memory_temperature(step),
            )
            if index != 1:
                node.set(step, "gpu_temperature_slowdown_threshold_celsius", gpu, 90.0)
            for reason, active in throttle.items():
                node.set(step, "gpu_clock_event_active", {**gpu, "reason": reason}, active(step))
            node.set(step, "gpu_pcie_link_generation", gpu, generation(step))
            node.set(step, "gpu_pcie_link_max_generation", gpu, 4.0)
            node.set(step, "gpu_pcie_link_width", gpu, 16.0)
            node.set(step, "gpu_pcie_link_max_width", gpu, 16.0)
            count(step, "gpu_pcie_receive_bytes_total", gpu, rng.uniform(1e9, 2.8e10))
            count(step, "gpu_pcie_transmit_bytes_total", gpu, rng.uniform(1e8, 1e9))
            node.set(step, "gpu_nvlink_link_down", {**gpu, "link": "3"}, nvlink_down(step))
            if xid is not None:
                node.set(
                    step,
                    "gpu_xid_errors_total",
                    {**gpu, "xid": xid},
                    0.0 if step < xid_at else 1.0,
                )
            node.set(
                step,
                "gpu_ecc_errors_total",
                {**gpu, "type": "uncorrected", "counter": "volatile"},
                1.0 if ecc_at is not None and step >= ecc_at else 0.0,
            )
            node.set(step, "gpu_row_remap_pending", gpu, remap(step))
            node.set(step, "gpu_row_remap_failed", gpu, remap_failed(step))
            node.set(step, "gpuload_gpu_stale", gpu, stale(step))
            if pod:
                pod_labels = {**gpu, "namespace": "ml", "pod": f"train-{index}", "container": "c"}
                node.set(step, "gpu_pod_info", pod_labels, 1.0)
    for step in range(STEPS):
        if step in down:
            continue
        node.set(step, COLLECTED_AT, {}, step * STEP)
        node.set(step, "gpuload_nvml_up", {}, nvml(step))
        node.set(step, "gpuload_collector_success", {"collector": "power"}, collector(step))
        node.set(step, "gpuload_kubernetes_pod_resources_up", {}, pods(step))
    return node.series(down), "; ".join(d for d in described if d)
