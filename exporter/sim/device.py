"""One simulated GPU: its identity and its readings at any elapsed time.

:class:`SimulatedGpu` turns a scenario's :class:`~exporter.sim.model.GpuSpec` into the numbers
the C functions report, in NVML's own units where those are natural (bytes, degrees C, MHz) and in
SI units otherwise (watts, joules, bytes per second); the library converts at the boundary.
:class:`MigDevice` does the same for one MIG instance of a GPU in MIG mode. All methods are pure
functions of (scenario, seed, elapsed) and the GPU's faults, so the objects are shared by threads.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.names import GPM_METRICS
from exporter.sim.curves import (
    NOISE_BUCKETS_PER_SECOND,
    Phase,
    Timeline,
    ValueSpec,
    stable_int,
    unit_noise,
)
from exporter.sim.features import KINDS
from exporter.sim.model import CLOCK_EVENT_REASONS, Fault, GpuSpec, MigInstanceSpec

# Handles are fake pointers: a recognisable base plus a stride per GPU index, never dereferenced.
HANDLE_BASE = 0x6E7600000000
HANDLE_STRIDE = 0x100

# Samples are taken at this rate and kept in a ring buffer of this many, like the driver does.
SAMPLES_PER_SECOND = 6
SAMPLE_BUFFER = 120

_FRACTIONS = {
    "utilization",
    "memory_utilization",
    "fan",
    *GPM_METRICS,  # the GPM activity fractions
    *(metric for metric, kind in KINDS.items() if kind == "fraction"),
}

NOT_IN_MIG = 0xFFFFFFFF  # the GPU/compute instance id of a process outside MIG


@dataclass(frozen=True)
class RunningProcess:
    """A process on a GPU at one moment."""

    pid: int
    name: str
    memory: int
    kind: str
    gpu_instance_id: int = NOT_IN_MIG
    compute_instance_id: int = NOT_IN_MIG
    weight: float = 1.0  # its share of the GPU's utilization, relative to the others'


# A pod's process PID -> the (start, until) of its pod: outside it, NVML does not list the PID.
Lifetimes = Mapping[int, tuple[float, float]]


def _reading(timeline: Timeline, seed: int, key: int, metric: str, t: float) -> float:
    """A metric's curve value at ``t`` plus its deterministic noise (not yet clamped)."""
    phase, local = timeline.locate(t)
    spec: ValueSpec = phase.specs[metric]
    value = spec.clean(local)
    if spec.noise:
        bucket = math.floor(max(0.0, t) * NOISE_BUCKETS_PER_SECOND)
        value += spec.noise * unit_noise(seed, key, metric, bucket)
    return value


def _running(
    phase: Phase,
    seed: int,
    kind: str,
    offset: int,
    instance: int = NOT_IN_MIG,
    compute_instance: int = 0,
    *,
    t: float = 0.0,
    lifetimes: Lifetimes | None = None,
) -> list[RunningProcess]:
    """The processes of ``kind`` in ``phase`` at ``t``; ``offset`` keeps PIDs distinct.

    A process given a ``pid`` has that PID (and the next ones, for a count) on every device it
    runs on, as one process using several GPUs has: a recorded node replays with its PIDs. A PID
    in ``lifetimes`` (a pod's) is listed only while its pod runs.
    """
    running = []
    for number, process in enumerate(phase.processes):
        if process.kind != kind:
            continue
        if process.pid:
            base = process.pid
        else:
            made_up = 1000 + stable_int(seed, "pid", number, process.name) % 400000
            base = made_up + offset * process.count
        for k in range(process.count):
            pid = base + k
            if lifetimes and pid in lifetimes and not _within(lifetimes[pid], t):
                continue
            compute = NOT_IN_MIG if instance == NOT_IN_MIG else compute_instance
            memory = int(process.memory)
            running.append(
                RunningProcess(pid, process.name, memory, kind, instance, compute, process.weight)
            )
    return running


def _within(lifetime: tuple[float, float], t: float) -> bool:
    return lifetime[0] <= t < lifetime[1]


class SimulatedGpu:
    """The readings of one GPU as a function of elapsed scenario time."""

    def __init__(
        self,
        spec: GpuSpec,
        seed: int,
        driver_uptime: float,
        reloads: tuple[float, ...],
        faults: tuple[Fault, ...] = (),
        lifetimes: Lifetimes | None = None,
    ):
        self.spec = spec
        self.model = spec.model
        self.index = spec.index
        self.seed = seed
        self.timeline: Timeline = spec.timeline
        self.handle_address = HANDLE_BASE + (spec.index + 1) * HANDLE_STRIDE
        self.uuid = spec.uuid or _uuid(seed, spec.index)
        self.serial = spec.serial or f"1{stable_int(seed, 'serial', spec.index) % 10**12:012d}"
        self.pci_bus_id = spec.pci_bus_id
        domain, bus, rest = spec.pci_bus_id.split(":")
        self.pci_domain, self.pci_bus = int(domain, 16), int(bus, 16)
        self.pci_device = int(rest.split(".")[0], 16)
        self.lifetimes = lifetimes or {}
        self._driver_uptime = driver_uptime
        self._reloads = reloads
        self._faults = tuple(f for f in faults if f.gpu == spec.index)
        self._link_faults = tuple(f for f in self._faults if f.kind == "nvlink_down")
        # No link listed down and no link fault: every link is up all along (the common case).
        self._links_always_up = not spec.nvlink_down and not self._link_faults
        # The last (metric, time) a link's bytes were computed for, and the bytes.
        self._link_share: tuple[tuple[str, float], float] | None = None
        self.mig = tuple(MigDevice(self, instance) for instance in spec.mig)

    def lacks(self, feature: str) -> bool:
        """Whether this GPU lacks an optional feature (see scenario.FEATURES)."""
        return feature in self.spec.lacks

    def clean(self, metric: str, t: float) -> float:
        """The noise-free value of ``metric`` at elapsed time ``t``."""
        phase, local = self.timeline.locate(t)
        return phase.specs[metric].clean(local)

    def value(self, metric: str, t: float) -> float:
        """The reading of ``metric`` at ``t``: curve plus deterministic noise, within range."""
        return self._clamp(metric, _reading(self.timeline, self.seed, self.index, metric, t))

    def _clamp(self, metric: str, value: float) -> float:
        if metric in _FRACTIONS:
            return min(1.0, max(0.0, value))
        if metric == "memory_used":
            return min(float(self.model.memory_total - self.model.memory_reserved), max(0.0, value))
        return max(0.0, value)

    def average(self, metric: str, t: float, window: float = 1.0) -> float:
        """The exact mean of the noise-free curve over the ``window`` seconds before ``t``."""
        return (self.timeline.integral(metric, t) - self.timeline.integral(metric, t - window)) / (
            window
        )

    def cumulative(self, metric: str, t: float) -> float:
        """The integral of ``metric`` since the driver was loaded (energy, PCIe byte counters).

        A driver reload (the end of a ``driver_not_loaded`` window) restarts the count from zero,
        as the real counters do; before any reload the count starts as if the driver had been
        loaded ``driver.uptime`` seconds before elapsed 0 at the first phase's level.
        """
        loaded = max((r for r in self._reloads if r <= t), default=None)
        if loaded is not None:
            return self.timeline.integral(metric, t) - self.timeline.integral(metric, loaded)
        before = self.clean(metric, 0.0) * self._driver_uptime
        return before + self.timeline.integral(metric, t)

    def pcie_replays(self, t: float) -> int:
        """The PCIe replay counter: the scenario's starting count plus its rate since."""
        return self.spec.pcie_replays + self.counter(self.spec.pcie_replays_per_hour, t)

    def counter(self, per_hour: float, t: float) -> int:
        """A monotonic event counter growing at ``per_hour`` (PCIe replays, ECC errors)."""
        return math.floor(per_hour * max(0.0, t) / 3600.0)

    def clock_event_reasons(self, t: float) -> int:
        """The active clock event reasons: the phase's list, or GpuIdle when nothing runs."""
        phase, _ = self.timeline.locate(t)
        if phase.clock_event_reasons is not None:
            return phase.clock_event_reasons
        return 0 if self.busy(t) else CLOCK_EVENT_REASONS["gpu_idle"]

    def busy(self, t: float) -> bool:
        """Whether the GPU has work: utilization above zero or processes present."""
        phase, _ = self.timeline.locate(t)
        return self.clean("utilization", t) > 0 or bool(phase.processes)

    def processes(self, t: float, kind: str) -> list[RunningProcess]:
        """The processes of ``kind`` ("compute" or "graphics") running at ``t``.

        In MIG mode these are the processes of every instance, with their instance ids.
        """
        if self.mig:
            return [p for instance in self.mig for p in instance.processes(t, kind)]
        phase, _ = self.timeline.locate(t)
        return _running(phase, self.seed, kind, self.index, t=t, lifetimes=self.lifetimes)

    def memory(self, t: float) -> tuple[int, int, int, int]:
        """(total, reserved, used, free) in bytes, ``used`` excluding the reserved part."""
        total, reserved = self.model.memory_total, self.model.memory_reserved
        if self.mig:
            # Once per GPU instance: its compute instances share its memory.
            used = sum(m.memory(t)[2] for m in self.mig if m.compute_instance_id == 0)
        else:
            used = int(self.value("memory_used", t))
        phase, _ = self.timeline.locate(t)
        if "memory_free" in phase.specs:
            return total, reserved, used, int(self.value("memory_free", t))
        return total, reserved, used, total - reserved - used

    def loaded_at(self, t: float) -> float | None:
        """When the driver was last reloaded at or before ``t``; None if not since elapsed 0."""
        return max((r for r in self._reloads if r <= t), default=None)

    # -- NVLink ------------------------------------------------------------------------------

    def link_up(self, link: int, t: float) -> bool:
        """Whether NVLink ``link`` is active at ``t`` (not listed down, no nvlink_down fault)."""
        if link in self.spec.nvlink_down:
            return False
        return not any(f.link == link and f.active(t) for f in self._link_faults)

    def links_up(self, t: float) -> int:
        """How many of the GPU's NVLinks are active at ``t``."""
        if self._links_always_up:
            return self.model.nvlink_links  # asked for every link of every field
        return sum(self.link_up(link, t) for link in range(self.model.nvlink_links))

    def link_bytes(self, metric: str, link: int, t: float) -> float:
        """Bytes ``link`` carried since the driver was loaded (``nvlink_tx`` or ``nvlink_rx``).

        The GPU's traffic is split evenly across the links that are up, so the integral is
        taken piecewise between the moments a link goes down or comes back.
        """
        if self._links_always_up:
            # The same share for each link: computed once per (metric, time).
            key = (metric, t)
            share = self._link_share
            if share is None or share[0] != key:
                share = self._link_share = (key, self._link_bytes(metric, 0, t))
            return share[1]
        return self._link_bytes(metric, link, t)

    def _link_bytes(self, metric: str, link: int, t: float) -> float:
        loaded = self.loaded_at(t)
        start = 0.0 if loaded is None else loaded
        total = 0.0
        if loaded is None and self.link_up(link, 0.0) and self.links_up(0.0):
            total = self.clean(metric, 0.0) * self._driver_uptime / self.links_up(0.0)
        edges = {start, t}
        for fault in self._link_faults:
            edges |= {e for e in (fault.at, fault.until) if start < e < t}
        ordered = sorted(edges)
        for a, b in itertools.pairwise(ordered):
            middle = (a + b) / 2
            up = self.links_up(middle)
            if up and self.link_up(link, middle):
                span = self.timeline.integral(metric, b) - self.timeline.integral(metric, a)
                total += span / up
        return total

    def link_errors(self, link: int, counter: int, t: float) -> int:
        """A monotonic NVLink error counter; links start at different points of the rate."""
        per_hour = self.spec.nvlink_errors_per_hour[counter]
        offset = stable_int(self.seed, "nvlink", self.index, link, counter) % 1000 / 1000
        return math.floor(per_hour * max(0.0, t) / 3600.0 + offset) if per_hour else 0

    # -- memory errors -----------------------------------------------------------------------

    def _ecc_faults(self, t: float) -> list[Fault]:
        return [f for f in self._faults if f.kind == "ecc_uncorrectable" and f.at <= t]

    def ecc_errors(self, uncorrected: bool, aggregate: bool, t: float) -> int:
        """ECC error count: volatile since the driver load, aggregate over the GPU's life.

        The per-hour rate counts from elapsed 0 (or the last driver reload, for the volatile
        counter); the aggregate counter adds what the rate gave over the driver's uptime before.
        ``ecc_uncorrectable`` faults add their count to the uncorrected counters.
        """
        spec = self.spec
        rate = spec.ecc_uncorrected_per_hour if uncorrected else spec.ecc_corrected_per_hour
        loaded = self.loaded_at(t)
        since = 0.0 if aggregate or loaded is None else loaded
        count = self.counter(rate, t - since)
        if aggregate:
            count += self.counter(rate, self._driver_uptime)
        if uncorrected:
            count += sum(
                f.count
                for f in self._ecc_faults(t)
                if aggregate or loaded is None or f.at >= loaded
            )
        return count

    def _reset_since(self, at: float, t: float) -> bool:
        """Whether the driver was reloaded (the GPU reset) after ``at`` and by ``t``."""
        return any(at < r <= t for r in self._reloads)

    def remapped_rows(self, t: float) -> tuple[int, int, bool, bool]:
        """(correctable rows, uncorrectable rows, remap pending, remap failed) at ``t``.

        A pending remap is applied at the next GPU reset (the end of a driver reload).
        """
        rows, pending, failed = 0, False, False
        for fault in self._ecc_faults(t):
            outcome = fault.remap or "pending"
            if outcome == "failed":
                failed = True
                continue
            rows += fault.count
            pending |= outcome == "pending" and not self._reset_since(fault.at, t)
        return 0, rows, pending, failed

    def retired_pages(self, t: float) -> list[tuple[int, float]]:
        """(address, elapsed time) of the pages retired for double-bit errors by ``t``."""
        pages = []
        for number, fault in enumerate(self._ecc_faults(t)):
            for k in range(fault.count):
                frame = stable_int(self.seed, "page", self.index, number, k) % 0x7FFFFF
                pages.append((frame * 0x1000, fault.at))
        return pages

    def retirement_pending(self, t: float) -> bool:
        """Whether retired pages wait for a GPU reset to be blacklisted."""
        return any(not self._reset_since(f.at, t) for f in self._ecc_faults(t))

    def sample_indices(self, t: float) -> range:
        """Indices ``k`` of the samples still buffered at ``t``; sample ``k`` is taken at k/6 s."""
        newest = math.floor(max(0.0, t) * SAMPLES_PER_SECOND)
        return range(max(0, newest - SAMPLE_BUFFER + 1), newest + 1)


def _uuid(seed: int, index: int) -> str:
    digest = hashlib.blake2b(f"{seed}:uuid:{index}".encode(), digest_size=16).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class MigDevice:
    """One MIG device (a compute instance) of a GPU in MIG mode: handle, identity, readings."""

    def __init__(self, parent: SimulatedGpu, spec: MigInstanceSpec) -> None:
        self.parent = parent
        self.spec = spec
        self.slot = spec.slot
        self.gpu_instance_id = spec.gpu_instance_id
        self.compute_instance_id = spec.compute_instance_id
        self.timeline = spec.timeline
        # MIG handles sit inside their parent's handle stride, never on a multiple of it.
        self.handle_address = parent.handle_address + 1 + spec.slot
        self.name = f"{parent.model.name} MIG {spec.name}"
        digest = _uuid(parent.seed, 1000 + parent.index * 8 + spec.slot).removeprefix("GPU-")
        self.uuid = f"MIG-{digest}"
        # The GPU instance's: its compute instances read the same memory and load.
        self._noise_key = 1000 * (parent.index + 1) + spec.first_slot

    def value(self, metric: str, t: float) -> float:
        """The instance's reading of ``metric`` at ``t``."""
        value = _reading(self.timeline, self.parent.seed, self._noise_key, metric, t)
        if metric == "memory_used":
            return min(float(self.spec.memory_total), max(0.0, value))
        return self.parent._clamp(metric, value)

    def processes(self, t: float, kind: str) -> list[RunningProcess]:
        """The processes of ``kind`` in this instance at ``t``."""
        phase, _ = self.timeline.locate(t)
        offset = 64 * (self.parent.index + 1) + 8 * (self.slot + 1)
        return _running(
            phase,
            self.parent.seed,
            kind,
            offset,
            self.gpu_instance_id,
            self.compute_instance_id,
            t=t,
            lifetimes=self.parent.lifetimes,
        )

    def memory(self, t: float) -> tuple[int, int, int, int]:
        """(total, reserved, used, free) of the instance's memory in bytes."""
        total = self.spec.memory_total
        used = int(self.value("memory_used", t))
        return total, 0, used, total - used
