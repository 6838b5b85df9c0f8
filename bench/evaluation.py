"""``python -m bench.evaluation``: local alerting's CPU per cycle on a node that has run a while.

The exporter benchmark measures daemons a few seconds old, whose history holds a few samples per
series; a node that has run for five minutes holds the rules' whole window, and each evaluation
reads all of it. This takes an 8 x H100 snapshot from the simulator, feeds it to the local
evaluator at one cycle per (simulated) second until the history is full, then times cycles with
the rules evaluated every cycle (`alerting.evaluation_interval: 1s`) and every 15 s (the
default), in alternating rounds, and prints the median CPU per cycle of each.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.node import BENCH
from exporter import sim
from exporter.alerting import states, thresholds
from exporter.alerting.evaluator import Evaluator
from exporter.alerting.history import Sample, snapshot_samples
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.config import ALERTING

SCENARIO = BENCH / "scenarios" / "h100x8.yaml"
# Every cycle, and the daemon's default.
INTERVALS = (1.0, ALERTING.defaults()["alerting.evaluation_interval"])


def node_samples(cycles: int) -> list[list[Sample]]:
    """The samples the evaluator keeps from `cycles` consecutive simulated cycles."""
    sim.install(SCENARIO)
    collection = Collection(
        dict.fromkeys(REGISTRY, True),
        timeout=5.0,
        options={},
        slow_interval=10.0,
    )
    evaluator = _evaluator(1.0)
    try:
        snapshots = [collection.run_cycle() for _ in range(cycles)]
    finally:
        collection.close()
        sim.uninstall()
    return [list(snapshot_samples(s, evaluator.history.keep)) for s in snapshots]


def _evaluator(interval: float) -> Evaluator:
    return Evaluator(
        thresholds.load(),
        instance="node:19400",
        also_keep=states.FAMILIES,
        interval=interval,
    )


def run(rounds: int = 5, cycles: int = 60, warm: float = 400) -> dict[float, list[float]]:
    """CPU ms per cycle of each interval, one figure per round."""
    samples = node_samples(5)
    evaluators = {interval: _evaluator(interval) for interval in INTERVALS}
    clock = 1_000_000.0
    for step in range(int(warm)):  # fill the history: the rules' 5-minute window and more
        for evaluator in evaluators.values():
            evaluator.observe(samples[step % len(samples)], clock + step)
    clock += warm
    figures: dict[float, list[float]] = {interval: [] for interval in INTERVALS}
    for round_ in range(rounds):
        order = INTERVALS if round_ % 2 == 0 else INTERVALS[::-1]
        for interval in order:
            evaluator = evaluators[interval]
            started = time.process_time()
            for step in range(cycles):
                evaluator.observe(samples[step % len(samples)], clock + step)
            figures[interval].append(1000 * (time.process_time() - started) / cycles)
        clock += cycles
    return figures


def table(figures: dict[float, list[float]]) -> str:
    """The figures as a markdown table, with the ratio of the medians under it."""
    lines = [
        "| evaluation interval | local alerting CPU ms per 1 s cycle, median | each round |",
        "|---|---|---|",
    ]
    for interval, values in figures.items():
        rounds = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {interval:g} s | {statistics.median(values):.2f} | {rounds} |")
    every, default = (statistics.median(figures[i]) for i in INTERVALS)
    lines += ["", f"Every cycle / every {INTERVALS[1]:g} s: {every / default:.1f}x."]
    return "\n".join(lines)


def main() -> int:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.evaluation", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=60, help="simulated 1 s cycles per round")
    parser.add_argument("--warm", type=float, default=400, help="seconds of history first")
    args = parser.parse_args()
    print(table(run(args.rounds, args.cycles, args.warm)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
