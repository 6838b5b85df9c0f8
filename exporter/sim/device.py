"""One simulated GPU: its identity and its readings at any elapsed time.

:class:`SimulatedGpu` turns a scenario's :class:`~exporter.sim.scenario.GpuSpec` into the numbers
the C functions report, in NVML's own units where those are natural (bytes, degrees C, MHz) and in
SI units otherwise (watts, joules, bytes per second); the library converts at the boundary.
All methods are pure functions of (scenario, seed, elapsed), so the object is shared by threads.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from exporter.sim.curves import NOISE_BUCKETS_PER_SECOND, Timeline, stable_int, unit_noise
from exporter.sim.scenario import CLOCK_EVENT_REASONS, GpuSpec

# Handles are fake pointers: a recognisable base plus a stride per GPU index, never dereferenced.
HANDLE_BASE = 0x6E7600000000
HANDLE_STRIDE = 0x100

# Samples are taken at this rate and kept in a ring buffer of this many, like the driver does.
SAMPLES_PER_SECOND = 6
SAMPLE_BUFFER = 120

_FRACTIONS = {
    "utilization",
    "memory_utilization",
    "encoder_utilization",
    "decoder_utilization",
    "fan",
}


@dataclass(frozen=True)
class RunningProcess:
    """A process on a GPU at one moment."""

    pid: int
    name: str
    memory: int
    kind: str


class SimulatedGpu:
    """The readings of one GPU as a function of elapsed scenario time."""

    def __init__(self, spec: GpuSpec, seed: int, driver_uptime: float, reloads: tuple[float, ...]):
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
        self._driver_uptime = driver_uptime
        self._reloads = reloads

    def lacks(self, feature: str) -> bool:
        """Whether this GPU lacks an optional feature (see scenario.FEATURES)."""
        return feature in self.spec.lacks

    def clean(self, metric: str, t: float) -> float:
        """The noise-free value of ``metric`` at elapsed time ``t``."""
        phase, local = self.timeline.locate(t)
        return phase.specs[metric].clean(local)

    def value(self, metric: str, t: float) -> float:
        """The reading of ``metric`` at ``t``: curve plus deterministic noise, within range."""
        phase, local = self.timeline.locate(t)
        spec = phase.specs[metric]
        value = spec.clean(local)
        if spec.noise:
            bucket = math.floor(max(0.0, t) * NOISE_BUCKETS_PER_SECOND)
            value += spec.noise * unit_noise(self.seed, self.index, metric, bucket)
        return self._clamp(metric, value)

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
        """The processes of ``kind`` ("compute" or "graphics") running at ``t``."""
        phase, _ = self.timeline.locate(t)
        running = []
        for number, process in enumerate(phase.processes):
            if process.kind != kind:
                continue
            base = process.pid or 1000 + stable_int(self.seed, "pid", number, process.name) % 400000
            for k in range(process.count):
                pid = base + self.index * process.count + k
                running.append(RunningProcess(pid, process.name, int(process.memory), kind))
        return running

    def memory(self, t: float) -> tuple[int, int, int, int]:
        """(total, reserved, used, free) in bytes, ``used`` excluding the reserved part."""
        total, reserved = self.model.memory_total, self.model.memory_reserved
        used = int(self.value("memory_used", t))
        return total, reserved, used, total - reserved - used

    def sample_indices(self, t: float) -> range:
        """Indices ``k`` of the samples still buffered at ``t``; sample ``k`` is taken at k/6 s."""
        newest = math.floor(max(0.0, t) * SAMPLES_PER_SECOND)
        return range(max(0, newest - SAMPLE_BUFFER + 1), newest + 1)


def _uuid(seed: int, index: int) -> str:
    digest = hashlib.blake2b(f"{seed}:uuid:{index}".encode(), digest_size=16).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
