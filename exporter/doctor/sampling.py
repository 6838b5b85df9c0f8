"""Gathering the doctor's samples into a local evaluator: from NVML or the simulator, or Prometheus.

Locally the doctor runs the exporter's own collection cycle (every collector, GPUs in parallel)
at the collection interval and hands each snapshot to an :class:`Evaluator` of the shipped rules,
as `gpuload serve` does; nothing is served. On the simulated NVML the cycles run on the
scenario's clock (:class:`ScenarioClock`): minutes of a scenario are sampled without waiting
them out. From Prometheus it reads the raw samples of the window that ends now for one
``instance`` in a single range query and replays them, scrape by scrape, into the evaluator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.alerting.evaluator import Evaluator
from exporter.alerting.from_prometheus import SamplingError
from exporter.alerting.history import Labels, snapshot_samples
from exporter.collection import Collection
from exporter.collectors import REGISTRY

# The collection timeout on a scenario's clock. A cycle's wall time there tells of this machine's
# load, not of the simulated node: waited out long, so that the readings never depend on it.
SCENARIO_TIMEOUT_SECONDS = 60.0

# Called after each collection with (seconds elapsed, seconds in all, GPUs seen).
Progress = Callable[[float, float, int], None]


class ScenarioClock:
    """Unix time that moves only when told to: a simulated node's minutes, sampled at once.

    It stands for ``time.time`` in the simulator and the collection, and for ``time.sleep``
    between cycles, so the readings, their timestamps and the rules' windows all follow it.
    """

    def __init__(self, start: float) -> None:
        self.now = start
        # Called after each move: the simulator's `settle_events`, so that the cycle at the new
        # time counts the events of that time however late a busy machine runs their thread.
        self.settle: Callable[[], None] | None = None

    def __call__(self) -> float:
        """The time now."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """Move the clock on instead of waiting."""
        self.now += max(0.0, seconds)
        if self.settle is not None:
            self.settle()


@dataclass
class Sampled:
    """What the doctor sampled: the GPUs as NVML named them, and how long it sampled."""

    # GPU index -> (name, UUID) as the last collection read them ("" where it could not).
    identities: dict[str, tuple[str, str]] = field(default_factory=dict)
    seconds: float = 0.0


def sample_local(
    evaluator: Evaluator,
    duration: float,
    interval: float,
    progress: Progress | None = None,
    clock: ScenarioClock | None = None,
) -> Sampled:
    """Collect for ``duration`` seconds into ``evaluator``; on ``clock`` when simulating.

    Raises:
        SamplingError: NVML could not be initialised.
    """
    now: Callable[[], float] = clock or time.time
    sleep = clock.sleep if clock is not None else time.sleep
    collection = Collection(
        {name: spec.enabled_by_default for name, spec in REGISTRY.items()},
        timeout=max(0.1, interval * 0.8) if clock is None else SCENARIO_TIMEOUT_SECONDS,
        options={name: dict(spec.options) for name, spec in REGISTRY.items()},
        wall_clock=now,
        clock=now if clock is not None else time.monotonic,
    )
    sampled = Sampled()
    started = now()
    try:
        while True:
            snapshot = collection.run_cycle()
            if not snapshot.nvml_up:
                raise SamplingError(
                    "NVML is not available: install the NVIDIA driver (libnvidia-ml.so.1), "
                    "or try gpuload doctor --simulate SCENARIO"
                )
            sampled.identities = {str(g.index): (g.name, g.uuid) for g in snapshot.gpus}
            evaluator.observe(
                snapshot_samples(snapshot, evaluator.history.keep), snapshot.completed_at
            )
            elapsed = now() - started
            sampled.seconds = elapsed
            if progress is not None:
                progress(min(elapsed, duration), duration, len(snapshot.gpus))
            if elapsed >= duration:
                break
            # The next cycle on the interval's beat, the last one at the duration's end.
            wait = interval - (now() - started) % interval
            sleep(max(0.0, min(wait, duration - (now() - started))))
    finally:
        collection.close()
    last = evaluator.evaluated
    if last is None or last.at < sampled_until(evaluator):
        # What the samples say at the end, not at the evaluation before it.
        evaluator.evaluate(sampled_until(evaluator))
    return sampled


def sampled_until(evaluator: Evaluator) -> float:
    """The time of the last samples the evaluator took."""
    assert evaluator.history.now is not None
    return evaluator.history.now


def identities_of(
    series: dict[str, dict[Labels, list[tuple[float, float]]]],
) -> dict[str, tuple[str, str]]:
    """GPU index -> (name, UUID): each the newest a ``gpu_info`` or ``gpu_up`` series carries.

    Taken one label at a time: a GPU lost before a restarted exporter could read it has a
    ``gpu_up 0`` without ``uuid`` and no ``gpu_info``, its earlier series both.
    """
    newest: dict[tuple[str, str], tuple[float, str]] = {}
    gpus: set[str] = set()
    for name in ("gpu_up", "gpu_info"):
        for labels, points in series.get(name, {}).items():
            label = dict(labels)
            gpu = label.get("gpu")
            if gpu is None or "mig_instance" in label or not points:
                continue
            gpus.add(gpu)
            for key in ("name", "uuid"):
                value = label.get(key)
                known = newest.get((gpu, key))
                if value and (known is None or points[-1][0] >= known[0]):
                    newest[(gpu, key)] = (points[-1][0], value)
    return {
        gpu: (newest.get((gpu, "name"), (0.0, ""))[1], newest.get((gpu, "uuid"), (0.0, ""))[1])
        for gpu in gpus
    }
