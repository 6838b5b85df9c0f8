"""Timelines of simulated exporters, as Prometheus scrapes them, run through promtool.

An :class:`Exporter` is one node's gpuload with one GPU (and more where a case needs them): a
counter of busy seconds that lags its scrape by up to 1 s, a failed scrape that leaves staleness
markers and `up 0`, a restart whose counters start again at 0, gauges that change at given
times. :func:`run_promtool` turns exporters and expectations into a `promtool test rules` file
against the shipped rule files; every expectation is a PromQL expression over `ALERTS` evaluated
at the end, with a known answer (when an alert first fired, that it never fired, ...).
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from exporter.alerting import thresholds
from exporter.alerting.rules import group_names
from tools import RULES_DIR

RULE_FILES = [
    str(RULES_DIR / "gpuload-recording.rules.yml"),
    str(RULES_DIR / "gpuload-alerts.rules.yml"),
]
POWER_LIMIT = 700.0
MEMORY_USED = 40 * 2**30
# Where a case's evaluations end (seconds); every expectation is evaluated there.
END = 20 * 60


def constant(value: float) -> Callable[[float], float]:
    return lambda t: value


def steps(*pieces: tuple[float, float]) -> Callable[[float], float]:
    """A value by time: ``steps((0, 0.9), (120, 0.25))`` is 90% from 0 s and 25% from 120 s."""

    def value(t: float) -> float:
        current = pieces[0][1]
        for start, level in pieces:
            if t >= start:
                current = level
        return current

    return value


# A gauge's value at a time, or None where the exporter does not export it then.
Gauge = Callable[[float], "float | None"]


@dataclass
class Exporter:
    """One node's gpuload, as Prometheus scrapes it.

    Its GPU 0 (uuid ``GPU-<name>``) has a counter of busy seconds at ``utilization`` and of fully
    idle seconds at ``idle`` (fractions of each second), and reports ``power`` watts, ``processes``
    and memory used while it has processes. ``gauges`` adds series by their name and labels
    (``gpu_up{gpu="1",uuid="GPU-n-1"}``; the target labels are added), ``counters`` counters of
    seconds by the fraction of each second they count. ``down``: intervals
    (start, end) in which every scrape fails. ``restarts``: times the process started again (its
    counters count from there). ``vanishes``: when GPU 0 leaves the exporter's scrapes (the
    driver no longer lists it), which go on answering.
    """

    name: str
    utilization: Callable[[float], float] = field(default=lambda t: 0.5)
    idle: Callable[[float], float] = field(default=lambda t: 0.0)
    power: Callable[[float], float] = field(default=lambda t: 560.0)
    processes: Callable[[float], float] = field(default=lambda t: 1.0)
    gauges: dict[str, Gauge] = field(default_factory=dict)
    counters: dict[str, Callable[[float], float]] = field(default_factory=dict)
    down: Sequence[tuple[float, float]] = ()
    restarts: Sequence[float] = ()
    vanishes: float | None = None

    @property
    def instance(self) -> str:
        return f"{self.name}:19400"

    def gpu(self, name: str, gpu: int = 0, **labels: str) -> str:
        """A series of one of its GPUs, as a key of ``gauges``."""
        uuid = f"GPU-{self.name}" + (f"-{gpu}" if gpu else "")
        pairs = {"gpu": str(gpu), "uuid": uuid, **labels}
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"

    def scraped(self, t: float) -> bool:
        return not any(start <= t < end for start, end in self.down)

    def listed(self, series: str, t: float) -> bool:
        """Whether a scrape at ``t`` has ``series``: all but GPU 0's once it vanished."""
        gone = self.vanishes is not None and t >= self.vanishes
        return not (gone and f'uuid="GPU-{self.name}"' in series)

    def started(self, t: float) -> float:
        return max([0.0, *(r for r in self.restarts if r <= t)])


def integral(rate: Callable[[float], float], start: float, end: float) -> float:
    """The seconds counted from ``start`` to ``end`` at ``rate`` (quarter-second steps)."""
    total, t = 0.0, start
    while t < end:
        dt = min(0.25, end - t)
        total += rate(t) * dt
        t += dt
    return total


def _with_target(series: str, exporter: Exporter) -> str:
    target = f'instance="{exporter.instance}",job="gpuload"'
    if series.endswith("}"):
        inner = series[series.index("{") + 1 : -1]
        return f"{series[: series.index('{')]}{{{target}{',' if inner else ''}{inner}}}"
    return f"{series}{{{target}}}"


def series_of(exporter: Exporter, interval: int, seed: int, end: int) -> list[dict[str, str]]:
    """Promtool input series of one exporter, every ``interval`` seconds from 0 to ``end``."""
    noise = random.Random(f"{exporter.name}/{interval}/{seed}")
    gauges: dict[str, Gauge] = {
        exporter.gpu("gpu_power_usage_watts"): exporter.power,
        exporter.gpu("gpu_power_limit_watts"): lambda t: POWER_LIMIT,
        exporter.gpu("gpu_processes"): exporter.processes,
        exporter.gpu("gpu_memory_used_bytes"): (
            lambda t: float(MEMORY_USED) if exporter.processes(t) else 0.0
        ),
        **exporter.gauges,
    }
    counters = {
        exporter.gpu("gpu_utilization_seconds_total"): exporter.utilization,
        exporter.gpu("gpu_idle_seconds_total"): exporter.idle,
        **exporter.counters,
    }
    collected = "gpuload_last_collection_timestamp_seconds"
    values: dict[str, list[str]] = {name: [] for name in [*gauges, *counters, collected]}
    up: list[str] = []
    # Whether each series was exported at the previous scrape: a scrape that fails, or no longer
    # has a series, leaves one staleness marker, then nothing.
    exported = dict.fromkeys(values, False)

    def add(name: str, value: float | None) -> None:
        if value is None:
            values[name].append("stale" if exported[name] else "_")
        else:
            values[name].append(repr(round(value, 4)))
        exported[name] = value is not None

    for step in range(end // interval + 1):
        t = float(step * interval)
        if not exporter.scraped(t):
            up.append("0")
            for name in values:
                add(name, None)
            continue
        up.append("1")
        # The counters were last collected up to a second before the scrape.
        start = exporter.started(t)
        counted = max(start, t - noise.uniform(0.0, 1.0))
        for name, rate in counters.items():
            add(name, integral(rate, start, counted) if exporter.listed(name, t) else None)
        for name, gauge in gauges.items():
            add(name, gauge(t) if exporter.listed(name, t) else None)
        add(collected, counted)
    result = [
        {"series": _with_target(name, exporter), "values": " ".join(points)}
        for name, points in values.items()
    ]
    result.append({"series": _with_target("up", exporter), "values": " ".join(up)})
    return result


def alerts(name: str, exporter: Exporter, state: str = "firing") -> str:
    return f'ALERTS{{alertname=~"{name}",alertstate="{state}",instance="{exporter.instance}"}}'


def first_fired(name: str, exporter: Exporter, interval: int, end: int = END) -> str:
    """When ``name`` first fired for the exporter: the earliest timestamp of its ALERTS sample."""
    return f"min_over_time(timestamp({alerts(name, exporter)})[{end}s:{interval}s])"


def last_fired(name: str, exporter: Exporter, interval: int, end: int = END) -> str:
    """When ``name`` last fired for the exporter."""
    return f"max_over_time(timestamp({alerts(name, exporter)})[{end}s:{interval}s])"


@dataclass(frozen=True)
class Expect:
    """A PromQL expression evaluated at END and the series it must give (each valued 1)."""

    what: str
    expr: str
    ones: tuple[dict[str, str], ...] = ()


def fires_between(
    name: str,
    exporter: Exporter,
    low: float,
    high: float,
    interval: int,
    end: int = END,
    labels: dict[str, str] | None = None,
) -> Expect:
    """``name`` first fires on the exporter between ``low`` and ``high`` seconds."""
    when = first_fired(name, exporter, interval, end)
    return Expect(
        f"{name} on {exporter.name} first fires between {low:g} s and {high:g} s",
        f"({when} >= bool {low}) * ({when} <= bool {high})",
        (labels if labels is not None else alert_labels(name, exporter),),
    )


def fires_with(
    name: str,
    exporter: Exporter,
    twin: Exporter,
    interval: int,
    late: float = 0,
    twin_alert: str | None = None,
) -> Expect:
    """``exporter`` fires ``name`` no later than ``twin`` fires ``twin_alert``, plus ``late``.

    ``twin_alert`` is the same alert by default.
    """
    other = twin_alert or name
    mine, theirs = first_fired(name, exporter, interval), first_fired(other, twin, interval)
    return Expect(
        f"{name} on {exporter.name} fires when {other} on {twin.name} does (+{late:g} s at most)",
        f"({mine} - on () group_left () {theirs}) <= bool {late}",
        (alert_labels(name, exporter),),
    )


def never(name: str, exporter: Exporter, state: str = "firing", end: int = END) -> Expect:
    return Expect(
        f"{name} never {state} on {exporter.name}",
        f"count_over_time({alerts(name, exporter, state)}[{end}s])",
    )


def at_every_evaluation(
    what: str, condition: str, start: float, interval: int, end: float = END
) -> Expect:
    """``condition`` (a vector without labels) holds at every evaluation from start to end."""
    count = int((end - start) // interval) + 1
    return Expect(
        what,
        f"count_over_time(({condition})[{int(end - start)}s:{interval}s]) == bool {count}",
        ({},),
    )


def alert_labels(name: str, exporter: Exporter) -> dict[str, str]:
    severity = thresholds.load().alert(name).severity
    return {
        "alertname": name,
        "alertstate": "firing",
        "severity": severity,
        "instance": exporter.instance,
        "job": "gpuload",
        "gpu": "0",
        "uuid": f"GPU-{exporter.name}",
    }


def promtool_file(
    exporters: Sequence[Exporter], expects: Sequence[Expect], interval: int, seed: int, end: int
) -> dict:
    tests = []
    for expect in expects:
        samples = []
        for labels in expect.ones:
            inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
            samples.append({"labels": f"{{{inner}}}", "value": 1})
        # A PromQL comment names the expectation in promtool's report of a failure.
        expr = f"# {expect.what}\n{expect.expr}"
        tests.append({"expr": expr, "eval_time": f"{end}s", "exp_samples": samples})
    return {
        "rule_files": RULE_FILES,
        "evaluation_interval": f"{interval}s",
        # Recording rules first, as one evaluation step of a real Prometheus sees them settled
        # (promtool would otherwise pick an order at random).
        "group_eval_order": group_names(thresholds.load()),
        "tests": [
            {
                "name": f"timelines at {interval}s",
                "interval": f"{interval}s",
                "input_series": [
                    s for exporter in exporters for s in series_of(exporter, interval, seed, end)
                ],
                "promql_expr_test": tests,
            }
        ],
    }


def run_promtool(
    tmp_path: Path,
    exporters: Sequence[Exporter],
    expects: Sequence[Expect],
    interval: int,
    seed: int = 0,
    end: int = END,
) -> None:
    """Run the exporters' timelines through promtool; fail naming each unmet expectation."""
    path = tmp_path / f"timelines-{interval}s.test.yml"
    path.write_text(yaml.safe_dump(promtool_file(exporters, expects, interval, seed, end)))
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        output = result.stdout + result.stderr
        failed = [e.what for e in expects if f"# {e.what}" in output]
        pytest.fail("promtool: " + "; ".join(failed or ["see output"]) + "\n" + output[-6000:])
