"""Value curves of the simulated GPUs: patterns over time, deterministic noise, phase timelines.

A scenario describes each metric as a :class:`ValueSpec` (a constant or a periodic pattern plus
optional noise) inside load phases. Everything here is a pure function of its inputs, so a
simulated reading depends only on (scenario, seed, elapsed seconds). Counters such as energy are
computed from the exact integral of the noise-free curve, so they stay consistent with the
instantaneous readings without stepping through time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Noise changes six times a second, the rate at which NVML refreshes utilization samples.
NOISE_BUCKETS_PER_SECOND = 6


@dataclass(frozen=True)
class ValueSpec:
    """One metric's value over a phase's local time.

    Patterns (``x`` is the time since the phase started):

    - ``constant``: ``low`` (== ``high``).
    - ``sawtooth``: rises linearly from ``low`` to ``high`` over each ``period``, then drops.
    - ``square``: ``high`` for the first ``duty`` fraction of each period, ``low`` for the rest.
    - ``sine``: ``low + (high - low) * (1 + sin(2 pi x / period)) / 2``, starting at the middle.
    - ``ramp``: from ``low`` (start) to ``high`` (end) over ``period``, then holds ``high``; ``low``
      may exceed ``high`` for a falling ramp.

    ``noise`` is the half-width of a uniform deterministic jitter added on top; ``unit`` is empty
    for absolute values or ``"fraction"`` for a value relative to a per-GPU scale (memory total,
    power limit) until it is resolved with :meth:`scaled`.
    """

    pattern: str
    low: float
    high: float
    period: float = 1.0
    duty: float = 0.5
    noise: float = 0.0
    unit: str = ""

    @classmethod
    def constant(cls, value: float, noise: float = 0.0, unit: str = "") -> ValueSpec:
        """Return a constant spec."""
        return cls("constant", value, value, noise=noise, unit=unit)

    def scaled(self, factor: float, offset: float = 0.0) -> ValueSpec:
        """Return the affine image ``factor * value + offset`` as an absolute spec."""
        return dataclasses.replace(
            self,
            low=self.low * factor + offset,
            high=self.high * factor + offset,
            noise=abs(self.noise * factor),
            unit="",
        )

    def clean(self, x: float) -> float:
        """Return the noise-free value at local time ``x`` (seconds, >= 0)."""
        span = self.high - self.low
        if self.pattern == "constant":
            return self.low
        if self.pattern == "ramp":
            return self.low + span * min(1.0, max(0.0, x) / self.period)
        u = (x % self.period) / self.period
        if self.pattern == "sawtooth":
            return self.low + span * u
        if self.pattern == "square":
            return self.high if u < self.duty else self.low
        return self.low + span * (1.0 + math.sin(2.0 * math.pi * u)) / 2.0

    def integral(self, x: float) -> float:
        """Return the exact integral of :meth:`clean` over ``[0, x]``."""
        if self.pattern == "constant":
            return self.low * x
        if self.pattern == "ramp":
            rising = min(x, self.period)
            area = self.low * rising + (self.high - self.low) * rising * rising / (2 * self.period)
            return area + self.high * max(0.0, x - self.period)
        cycles = math.floor(x / self.period)
        return cycles * self._partial(self.period) + self._partial(x - cycles * self.period)

    def _partial(self, x: float) -> float:
        """Integral over ``[0, x]`` for ``0 <= x <= period`` of a periodic pattern."""
        span = self.high - self.low
        if self.pattern == "sawtooth":
            return self.low * x + span * x * x / (2 * self.period)
        if self.pattern == "square":
            edge = self.duty * self.period
            return self.high * min(x, edge) + self.low * max(0.0, x - edge)
        omega = 2.0 * math.pi / self.period
        return (self.low + span / 2) * x + span / 2 * (1.0 - math.cos(omega * x)) / omega


def unit_noise(seed: int, gpu: int, metric: str, bucket: int) -> float:
    """Return a stable pseudo-random number in [-1, 1] for one noise bucket.

    blake2b rather than ``hash()``: Python randomizes string hashes per process, and two processes
    started with the same seed and epoch must see the same values.
    """
    key = f"{seed}:{gpu}:{metric}:{bucket}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / float(2**64 - 1) * 2.0 - 1.0


def stable_int(*parts: object) -> int:
    """Return a stable 64-bit integer derived from ``parts`` (identities such as UUIDs, PIDs)."""
    key = ":".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Process:
    """A process using a GPU during a phase; ``memory`` is in bytes once resolved."""

    name: str
    memory: float
    count: int = 1
    kind: str = "compute"
    pid: int | None = None
    memory_unit: str = ""
    weight: float = 1.0  # its share of the GPU's utilization, relative to the others'


@dataclass(frozen=True)
class Phase:
    """A stretch of time with fixed value specs for each metric."""

    name: str
    duration: float
    specs: Mapping[str, ValueSpec]
    clock_event_reasons: int | None = None
    processes: tuple[Process, ...] = ()


class Timeline:
    """Places elapsed time into a sequence of phases, looping or holding the last phase."""

    def __init__(self, phases: Sequence[Phase], loop: bool) -> None:
        self.phases = tuple(phases)
        self.loop = loop
        self.starts: list[float] = []
        start = 0.0
        for phase in self.phases:
            self.starts.append(start)
            start += phase.duration
        self.cycle = start

    def locate(self, t: float) -> tuple[Phase, float]:
        """Return the phase active at elapsed time ``t`` and the time since it began."""
        t = max(0.0, t)
        if self.loop:
            t %= self.cycle
        for phase, start in zip(self.phases, self.starts, strict=True):
            if t < start + phase.duration:
                return phase, t - start
        return self.phases[-1], t - self.starts[-1]

    def integral(self, metric: str, t: float) -> float:
        """Return the integral of the noise-free ``metric`` curve over ``[0, t]``.

        Before zero the first value extends backwards, so the integral is defined for any ``t``.
        """
        if t <= 0:
            return self.phases[0].specs[metric].clean(0.0) * t
        total = 0.0
        if self.loop:
            cycles = math.floor(t / self.cycle)
            if cycles:
                total += cycles * self._span_integral(metric, self.cycle)
                t -= cycles * self.cycle
        return total + self._span_integral(metric, t)

    def _span_integral(self, metric: str, t: float) -> float:
        """Integral over ``[0, t]`` without wrapping around (``t`` within one pass)."""
        total = 0.0
        last = len(self.phases) - 1
        for i, (phase, start) in enumerate(zip(self.phases, self.starts, strict=True)):
            if t <= start:
                break
            local = t - start if i == last else min(t - start, phase.duration)
            total += phase.specs[metric].integral(local)
        return total
