"""A simulated node in this process, on its scenario's clock: minutes of a scenario in seconds.

The same parts `gpuload serve` wires together (the collection cycle, the local evaluator of the
shipped rules, the status page), with the scenario clock standing for the wall clock, so a test
can look at minute 7 of a scenario without waiting seven minutes, and every run reads the same
samples at the same times.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exporter import sim
from exporter.alerting import states, thresholds
from exporter.alerting.local import LocalAlerting
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.doctor.sampling import SCENARIO_TIMEOUT_SECONDS, ScenarioClock
from exporter.server.status import StatusPage
from exporter.snapshot import Snapshot

# A Unix time the scenarios start at: whole minutes, so "minute N" is a round timestamp.
START = 1_800_000_000.0


class SimulatedNode:
    """Collection, local evaluation and status page of one scenario, stepped by hand."""

    def __init__(
        self,
        scenario: str,
        *,
        interval: float = 15.0,
        evaluation_interval: float = 15.0,
        start: float = START,
        seed: int | None = None,
        instance: str = "node:19400",
        observe: Callable[[Snapshot], None] | None = None,
        history_path: Path | None = None,
    ) -> None:
        self.start = start
        self.clock = ScenarioClock(start)
        self.interval = interval
        self.library = sim.install(scenario, epoch=start, clock=self.clock, seed=seed)
        self.clock.settle = self.library.settle_events
        self.collection = Collection(
            {name: spec.enabled_by_default for name, spec in REGISTRY.items()},
            timeout=SCENARIO_TIMEOUT_SECONDS,
            options={name: dict(spec.options) for name, spec in REGISTRY.items()},
            wall_clock=self.clock,
            clock=self.clock,
        )
        self.thresholds = thresholds.load()
        self.alerting = LocalAlerting(
            self.thresholds,
            instance=instance,
            also_keep=states.FAMILIES,
            evaluation_interval=evaluation_interval,
            now=start,
            history_path=history_path,
        )
        self.snapshot: Snapshot | None = None
        # Called with each snapshot before it is evaluated (a test that records the samples).
        self._observe = observe
        self.status = StatusPage(
            lambda: self.snapshot,
            "/metrics",
            self.alerting,
            interval,
            hostname="node",
            scenario=scenario,
        )

    def step(self) -> Snapshot:
        """One collection cycle at the clock's time, evaluated; then the clock moves on."""
        snapshot = self.collection.run_cycle()
        if self._observe is not None:
            self._observe(snapshot)
        self.alerting.observe(snapshot)
        self.snapshot = snapshot
        self.clock.sleep(self.interval)
        return snapshot

    def run_until(self, seconds: float) -> None:
        """Step until the last cycle ran at ``seconds`` into the scenario or later."""
        while self.snapshot is None or self.snapshot.completed_at < self.start + seconds:
            self.step()

    def close(self) -> None:
        """Stop collecting and uninstall the simulator."""
        self.collection.close()
        sim.uninstall()
