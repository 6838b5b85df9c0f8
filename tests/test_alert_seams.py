"""The sustained alerts across what real scrapes do: failed scrapes, restarts, gaps, noisy power.

Each case simulates exporters scraped every 15 s (and again every 30 s) the way a chart-deployed
gpuload is: a counter of busy seconds that lags its scrape by up to 1 s, a failed scrape that
leaves staleness markers and `up 0`, an exporter restart whose counters start again at 0, power
that swings. The case is turned into a `promtool test rules` file against the shipped rule files,
and every expectation is a PromQL expression over `ALERTS` with a known answer: when an alert first
fired (``first_fired``), that it never fired, that exactly one of two fired at every evaluation.

A disturbed exporter is compared with an undisturbed twin in the same stretch: the disturbance
must not restart the wait. docs/runbooks.md's table of firing delays is checked here too: each row
is the first firing of an alert after its condition starts, as these cases measure it.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from exporter.alerting import thresholds
from exporter.alerting.rules import group_names

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")

RULE_FILES = [
    str(thresholds.RULES_DIR / "gpuload-recording.rules.yml"),
    str(thresholds.RULES_DIR / "gpuload-alerts.rules.yml"),
]
RUNBOOKS = Path(__file__).resolve().parents[1] / "docs" / "runbooks.md"
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


@dataclass
class Exporter:
    """One node's gpuload with one GPU, as Prometheus scrapes it.

    ``down``: intervals (start, end) in which every scrape fails. ``restarts``: times the process
    started again (its counters count from there). ``utilization`` and ``idle`` are fractions of
    each second; ``power`` is in watts (``None``: the GPU reports none).
    """

    name: str
    utilization: Callable[[float], float]
    idle: Callable[[float], float] = field(default=lambda t: 0.0)
    power: Callable[[float], float] = field(default=lambda t: 560.0)
    processes: Callable[[float], float] = field(default=lambda t: 1.0)
    down: Sequence[tuple[float, float]] = ()
    restarts: Sequence[float] = ()
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def instance(self) -> str:
        return f"{self.name}:19400"

    def scraped(self, t: float) -> bool:
        return not any(start <= t < end for start, end in self.down)

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


def series_of(exporter: Exporter, interval: int, seed: int) -> list[dict[str, str]]:
    """Promtool input series of one exporter, every ``interval`` seconds from 0 to END."""
    noise = random.Random(f"{exporter.name}/{interval}/{seed}")
    labels = f'instance="{exporter.instance}",job="gpuload",gpu="0",uuid="GPU-{exporter.name}"'
    names = (
        "gpu_utilization_seconds_total",
        "gpu_idle_seconds_total",
        "gpu_power_usage_watts",
        "gpu_power_limit_watts",
        "gpu_processes",
        "gpu_memory_used_bytes",
    )
    values: dict[str, list[str]] = {name: [] for name in names}
    collected: list[str] = []
    up: list[str] = []
    stale = False
    for step in range(END // interval + 1):
        t = float(step * interval)
        if not exporter.scraped(t):
            up.append("0")
            for name in names:
                values[name].append("_" if stale else "stale")
            collected.append("_" if stale else "stale")
            stale = True
            continue
        stale = False
        up.append("1")
        # The counters were last collected up to a second before the scrape.
        counted = max(exporter.started(t), t - noise.uniform(0.0, 1.0))
        start = exporter.started(t)
        sample = {
            "gpu_utilization_seconds_total": integral(exporter.utilization, start, counted),
            "gpu_idle_seconds_total": integral(exporter.idle, start, counted),
            "gpu_power_usage_watts": exporter.power(t),
            "gpu_power_limit_watts": POWER_LIMIT,
            "gpu_processes": exporter.processes(t),
            "gpu_memory_used_bytes": float(MEMORY_USED) if exporter.processes(t) else 0.0,
        }
        for name in names:
            values[name].append(repr(round(sample[name], 4)))
        collected.append(repr(round(counted, 4)))
    result = [{"series": f"{name}{{{labels}}}", "values": " ".join(values[name])} for name in names]
    target = f'instance="{exporter.instance}",job="gpuload"'
    result.append({"series": f"up{{{target}}}", "values": " ".join(up)})
    result.append(
        {
            "series": f"gpuload_last_collection_timestamp_seconds{{{target}}}",
            "values": " ".join(collected),
        }
    )
    return result


def alerts(name: str, exporter: Exporter, state: str = "firing") -> str:
    return f'ALERTS{{alertname=~"{name}",alertstate="{state}",instance="{exporter.instance}"}}'


def first_fired(name: str, exporter: Exporter, interval: int) -> str:
    """When ``name`` first fired for the exporter: the earliest timestamp of its ALERTS sample."""
    return f"min_over_time(timestamp({alerts(name, exporter)})[{END}s:{interval}s])"


def last_fired(name: str, exporter: Exporter, interval: int) -> str:
    """When ``name`` last fired for the exporter."""
    return f"max_over_time(timestamp({alerts(name, exporter)})[{END}s:{interval}s])"


@dataclass(frozen=True)
class Expect:
    """A PromQL expression evaluated at END and the series it must give (each valued 1)."""

    what: str
    expr: str
    ones: tuple[dict[str, str], ...] = ()


def fires_between(name: str, exporter: Exporter, low: float, high: float, interval: int) -> Expect:
    when = first_fired(name, exporter, interval)
    return Expect(
        f"{name} on {exporter.name} first fires between {low:g} s and {high:g} s",
        f"({when} >= bool {low}) * ({when} <= bool {high})",
        (_alert_labels(name, exporter),),
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
        (_alert_labels(name, exporter),),
    )


def never(name: str, exporter: Exporter, state: str = "firing") -> Expect:
    return Expect(
        f"{name} never {state} on {exporter.name}",
        f"count_over_time({alerts(name, exporter, state)}[{END}s])",
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


def _alert_labels(name: str, exporter: Exporter) -> dict[str, str]:
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
    exporters: Sequence[Exporter], expects: Sequence[Expect], interval: int, seed: int
) -> dict:
    tests = []
    for expect in expects:
        samples = []
        for labels in expect.ones:
            inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
            samples.append({"labels": f"{{{inner}}}", "value": 1})
        # A PromQL comment names the expectation in promtool's report of a failure.
        expr = f"# {expect.what}\n{expect.expr}"
        tests.append({"expr": expr, "eval_time": f"{END}s", "exp_samples": samples})
    return {
        "rule_files": RULE_FILES,
        "evaluation_interval": f"{interval}s",
        # Recording rules first, as one evaluation step of a real Prometheus sees them settled
        # (promtool would otherwise pick an order at random).
        "group_eval_order": group_names(thresholds.load()),
        "tests": [
            {
                "name": f"seams at {interval}s",
                "interval": f"{interval}s",
                "input_series": [
                    s for exporter in exporters for s in series_of(exporter, interval, seed)
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
) -> None:
    path = tmp_path / f"seams-{interval}s.test.yml"
    path.write_text(yaml.safe_dump(promtool_file(exporters, expects, interval, seed)))
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        output = result.stdout + result.stderr
        failed = [e.what for e in expects if f"# {e.what}" in output]
        pytest.fail("promtool: " + "; ".join(failed or ["see output"]) + "\n" + output[-6000:])


INTERVALS = pytest.mark.parametrize("interval", [15, 30])


def swinging(low: float, high: float) -> Callable[[float], float]:
    """Power that jumps between ``low`` and ``high`` watts from one reading to the next."""
    return lambda t: low + (high - low) * random.Random(int(t)).random()


BUSY, LOW = 0.9, 0.25
# A low stretch from 2 minutes on, after a busy start.
DROP = 120.0
low_stretch = steps((0, BUSY), (DROP, LOW))


@INTERVALS
def test_one_alert_above_95_percent_whatever_the_power_does(tmp_path: Path, interval: int) -> None:
    """A GPU above 95% raises exactly one of GPUUtilizationHigh and GPUJobHung, by about 6m.

    Power that swings across GPUJobHung's line (150-200 W of 700, around 25%) kept both `for:`
    clocks restarting: no alert in 17 minutes. A job that hangs after running busy moves from
    one alert to the other without a silent evaluation between them. Exactly 95% never fires.
    """
    swing = Exporter("swing", constant(0.99), power=swinging(150, 200))
    hang = Exporter("hang", steps((0, 0.99), (240, 1.0)), power=steps((0, 560), (240, 77)))
    exact = Exporter("exact", constant(0.95))
    either = "GPUUtilizationHigh|GPUJobHung"
    expects = [
        fires_between("GPUUtilizationHigh", swing, 300, 360 + interval, interval),
        never("GPUJobHung", swing),
        fires_between("GPUUtilizationHigh", hang, 300, 360 + interval, interval),
        # Hung from 4m: every 1-minute mean power of a whole window below 25% from about 5m15s.
        fires_between("GPUJobHung", hang, 240 + 300, 240 + 360 + 2 * interval, interval),
        never(either, exact),
        never(either, exact, "pending"),
    ]
    for exporter in (swing, hang):
        expects.append(
            at_every_evaluation(
                f"exactly one of {either} fires on {exporter.name} from 6m{interval}s",
                f"count({alerts(either, exporter)}) == 1",
                360 + interval,
                interval,
            )
        )
    run_promtool(tmp_path, [swing, hang, exact], expects, interval)


@INTERVALS
def test_nothing_shorter_than_five_minutes_fires_a_low_alert(tmp_path: Path, interval: int) -> None:
    """A 4-minute stall fires no low alert; starvation is judged on GPUUtilizationLow's 5 minutes.

    GPUDataLoaderStarved fires when a low GPU in the same stretch fires GPUUtilizationLow, not
    after 5 minutes of 5-minute windows.
    """
    stall = Exporter(
        "stall",
        steps((0, BUSY), (360, 0.0), (600, BUSY)),
        idle=steps((0, 0.02), (360, 1.0), (600, 0.02)),
    )
    starved = Exporter(
        "starved", steps((0, BUSY), (DROP, 0.4)), idle=steps((0, 0.02), (DROP, 0.35))
    )
    low = Exporter("low", low_stretch)
    low_alerts = "GPUUtilizationLow|GPUDataLoaderStarved|GPUMIGUtilizationLow"
    expects = [
        never(low_alerts, stall),
        never("GPUUtilizationLow", starved),
        fires_between("GPUDataLoaderStarved", starved, DROP + 300, DROP + 390, interval),
        fires_between("GPUUtilizationLow", low, DROP + 300, DROP + 390, interval),
        fires_with("GPUDataLoaderStarved", starved, low, interval, interval, "GPUUtilizationLow"),
    ]
    run_promtool(tmp_path, [stall, starved, low], expects, interval)


@INTERVALS
def test_a_failed_scrape_a_restart_or_a_gap_neither_restarts_nor_resolves(
    tmp_path: Path, interval: int
) -> None:
    """A failed scrape, a restart or a 2-minute gap neither restarts a wait nor invents a value.

    In one low stretch, each fires GPUUtilizationLow when the undisturbed twin does (an exporter
    restart starts its counters again at 0). A gap the GPU spent busy breaks the stretch: the
    first scrape after it measures the gap. A busy GPU whose exporter restarts never reads low.
    """
    twin = Exporter("twin", low_stretch)
    failed = Exporter("failed", low_stretch, down=[(300, 301)])
    restart = Exporter("restart", low_stretch, down=[(300, 320)], restarts=[320])
    gap = Exporter("gap", low_stretch, down=[(360, 480)])
    busy_gap = Exporter("busygap", steps((0, BUSY), (DROP, LOW), (360, 1.0), (480, LOW)))
    busy_gap.down = [(360, 480)]
    busy = Exporter("busy", constant(0.975))
    busy_restart = Exporter("busyrestart", constant(0.975), down=[(300, 320)], restarts=[320])
    expects = [
        fires_between("GPUUtilizationLow", twin, DROP + 300, DROP + 390, interval),
        *(
            fires_with("GPUUtilizationLow", exporter, twin, interval, late=interval)
            for exporter in (failed, restart, gap)
        ),
        # Busy through the gap: low again only after it, from 8m.
        fires_between("GPUUtilizationLow", busy_gap, 480 + 300, 480 + 390, interval),
        never("GPUUtilizationLow", busy_restart, "pending"),
        fires_with("GPUUtilizationHigh", busy_restart, busy, interval, late=interval),
    ]
    exporters = [twin, failed, restart, gap, busy_gap, busy, busy_restart]
    run_promtool(tmp_path, exporters, expects, interval)


@INTERVALS
def test_a_dead_exporter_is_never_silent(tmp_path: Path, interval: int) -> None:
    """Its firing alerts keep firing until GPULoadExporterDown fires, and then give way to it."""
    dead = Exporter("dead", low_stretch, down=[(600, END + 1)])
    expects = [
        fires_between("GPUUtilizationLow", dead, DROP + 300, DROP + 390, interval),
        at_every_evaluation(
            "an alert of the dead exporter fires at every evaluation from 9m",
            f"count({alerts('.+', dead)}) >= 1",
            540,
            interval,
        ),
        Expect(
            "GPUUtilizationLow fires until GPULoadExporterDown does, then resolves",
            f"({last_fired('GPUUtilizationLow', dead, interval)}"
            f" - on () group_left () {first_fired('GPULoadExporterDown', dead, interval)})"
            f" >= bool -{interval}"
            f" unless on () {alerts('GPUUtilizationLow', dead)}",
            (_alert_labels("GPUUtilizationLow", dead),),
        ),
    ]
    run_promtool(tmp_path, [dead], expects, interval)
