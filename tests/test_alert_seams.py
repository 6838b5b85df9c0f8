"""The sustained alerts across what real scrapes do: failed scrapes, restarts, gaps, noisy power.

Each case simulates exporters scraped every 15 s (and again every 30 s) the way a chart-deployed
gpuload is: a counter of busy seconds that lags its scrape by up to 1 s, a failed scrape that
leaves staleness markers and `up 0`, an exporter restart whose counters start again at 0, power
that swings. The case is turned into a `promtool test rules` file against the shipped rule files,
and every expectation is a PromQL expression over `ALERTS` with a known answer: when an alert first
fired (``first_fired``), that it never fired, that exactly one of two fired at every evaluation.

A disturbed exporter is compared with an undisturbed twin in the same stretch: the disturbance
must not restart the wait. The timelines and expectations are tests/alert_timelines.py's.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from alert_timelines import (
    Expect,
    Exporter,
    alert_labels,
    alerts,
    at_every_evaluation,
    constant,
    fires_between,
    fires_with,
    first_fired,
    last_fired,
    never,
    run_promtool,
    steps,
)

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")

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
    busy_gap = Exporter(
        "busygap", steps((0, BUSY), (DROP, LOW), (360, 1.0), (480, LOW)), down=[(360, 480)]
    )
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
    dead = Exporter("dead", low_stretch, down=[(600, 10_000)])
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
            (alert_labels("GPUUtilizationLow", dead),),
        ),
    ]
    run_promtool(tmp_path, [dead], expects, interval)
