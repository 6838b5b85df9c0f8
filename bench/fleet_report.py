"""What ``python -m bench.fleet`` measured, its tables and its section of bench/RESULTS.md."""

from __future__ import annotations

import datetime
import math
import os
from dataclasses import dataclass, field

from bench import load, report
from bench.fleet_panels import Panel, TimeRange

# Series Prometheus adds per target: up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling, scrape_series_added.
SCRAPE_SERIES_PER_TARGET = 5
SLOW_PANEL_SECONDS = 1.0


@dataclass
class PanelTiming:
    """One panel's queries over one time range, timed several times."""

    panel: Panel
    seconds: list[float] = field(default_factory=list)  # per turn, its queries one after another
    samples: int = 0  # samples the queries read (Prometheus's totalQueryableSamples)
    series: int = 0  # series the queries returned


@dataclass
class RangeTimings:
    """Every panel timed over one time range."""

    time_range: TimeRange
    history: bool  # the range reaches into the filled-in history
    panels: list[PanelTiming]


@dataclass
class FleetResult:
    """Everything one run measured."""

    scenarios: list[str]  # one exporter each
    scrape_interval: int
    repeat: int
    nodes: int
    seconds: float  # from Prometheus's start to the last reading
    gpus: int  # count(gpu_up) at the end
    targets_up: int
    head_series: float
    scraped_series: float
    recorded_series: float
    alert_series: float
    rss_bytes: float
    peak_rss_bytes: float
    samples_per_second: float
    prometheus_cpu_per_minute: float
    exporters_cpu_per_minute: float
    machine_cpu_per_minute: float
    scrape_seconds: tuple[float, float]  # median, max of scrape_duration_seconds
    rule_groups: dict[str, list[float]]  # group -> its evaluations' durations after the warm-up
    rules: dict[str, float]  # group -> rules in it
    missed: float
    timings: list[RangeTimings]
    load_average: str
    prometheus_version: str


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def summary_table(result: FleetResult) -> str:
    """What the fleet costs Prometheus: series, memory, ingestion, CPU."""
    per_gpu = 1 / result.gpus if result.gpus else math.nan
    mib = 2**20
    targets = SCRAPE_SERIES_PER_TARGET * result.nodes
    median, worst = result.scrape_seconds
    rows = [
        ("GPUs (count(gpu_up))", f"{result.gpus:,}"),
        (
            "nodes: targets up / targets",
            f"{result.targets_up} / {result.nodes}, on {len(result.scenarios)} exporters",
        ),
        (
            "run",
            f"{result.seconds / 60:.1f} min, scrapes and rule evaluations every"
            f" {result.scrape_interval} s",
        ),
        ("head series", f"{result.head_series:,.0f}"),
        ("head series per GPU", f"{result.head_series * per_gpu:.1f}"),
        ("- scraped from gpuload, per GPU", f"{result.scraped_series * per_gpu:.1f}"),
        (
            "- recorded by the rules (gpu:*, node:*), per GPU",
            f"{result.recorded_series * per_gpu:.1f}",
        ),
        ("- ALERTS, per GPU", f"{result.alert_series * per_gpu:.2f}"),
        ("- Prometheus's own per target (up, scrape_*), per GPU", f"{targets * per_gpu:.2f}"),
        ("Prometheus RSS", f"{result.rss_bytes / mib:,.0f} MiB"),
        ("Prometheus RSS per 1,000 GPUs", f"{result.rss_bytes * 1000 * per_gpu / mib:,.0f} MiB"),
        ("Prometheus RSS, highest reading", f"{result.peak_rss_bytes / mib:,.0f} MiB"),
        ("samples ingested per second", f"{result.samples_per_second:,.0f}"),
        ("samples ingested per second per GPU", f"{result.samples_per_second * per_gpu:.1f}"),
        ("Prometheus CPU", f"{result.prometheus_cpu_per_minute:.1f} s/min"),
        ("the exporters' CPU, together", f"{result.exporters_cpu_per_minute:.1f} s/min"),
        (
            "machine CPU busy (everything, other users' too)",
            f"{result.machine_cpu_per_minute:.1f} s/min of {60 * (os.cpu_count() or 1)}",
        ),
        ("scrape duration, median / max", f"{_ms(median)} / {_ms(worst)} ms"),
        ("rule group iterations missed", f"{result.missed:.0f}"),
        ("load average at the end (1, 5, 15 min)", result.load_average),
    ]
    return report.markdown([["measure", "value"], *([name, value] for name, value in rows)])


def rules_table(result: FleetResult) -> str:
    """Each rule group's evaluation time after the warm-up."""
    lines = [["rule group", "rules", "evaluations", "median ms", "max ms", "last ms"]]
    for group, durations in result.rule_groups.items():
        lines.append(
            [
                group,
                f"{result.rules.get(group, math.nan):.0f}",
                str(len(durations)),
                _ms(load.median(durations)) if durations else "-",
                _ms(max(durations)) if durations else "-",
                _ms(durations[-1]) if durations else "-",
            ]
        )
    return report.markdown(lines)


def panels_table(result: FleetResult) -> str:
    """Each fleet-dashboard panel's query time for the whole fleet, over each range timed."""
    head = ["panel", "queries", "exporter families read as scraped"]
    for timings in result.timings:
        span = timings.time_range.describe().split(" at ")[0]
        head += [
            f"{span}: series",
            f"{span}: samples read",
            f"{span}: median ms",
            f"{span}: max ms",
        ]
    head.append("over 1 s")
    lines = [head]
    for index, panel in enumerate(timing.panel for timing in result.timings[0].panels):
        kinds = ["instant" if t.instant else "range" for t in panel.targets]
        line = [
            panel.title,
            ", ".join(f"{kinds.count(kind)} {kind}" for kind in dict.fromkeys(kinds)),
            ", ".join(panel.raw_families()) or "-",
        ]
        for timings in result.timings:
            timing = timings.panels[index]
            line += [
                f"{timing.series:,}",
                f"{timing.samples:,}",
                _ms(load.median(timing.seconds)),
                _ms(max(timing.seconds)),
            ]
        line.append("**yes**" if panel.title in slow_panels(result) else "no")
        lines.append(line)
    return report.markdown(lines)


def slow_panels(result: FleetResult) -> list[str]:
    """The panels that took over a second in any turn, over any range."""
    slow = {
        timing.panel.title
        for timings in result.timings
        for timing in timings.panels
        if max(timing.seconds) > SLOW_PANEL_SECONDS
    }
    return [timing.panel.title for timing in result.timings[0].panels if timing.panel.title in slow]


def section(result: FleetResult, arguments: str) -> str:
    """The ``## Fleet`` section of bench/RESULTS.md."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = f"python -m bench.fleet {arguments}".strip()
    slow = slow_panels(result)
    ranges = " and ".join(
        timings.time_range.describe()
        + (" with the hours before the run filled in" if timings.history else " (the run)")
        for timings in result.timings
    )
    return "\n".join(
        [
            report.FLEET_HEADING,
            "",
            f"Generated by `{command}` on {now}. Do not edit: run it again.",
            "",
            f"Machine: {report.host()}; Prometheus {result.prometheus_version}.",
            "",
            f"A real Prometheus scraping {result.gpus:,} simulated GPUs every"
            f" {result.scrape_interval} s, with the shipped recording and alerting rules evaluated"
            f" as often: {result.nodes} fake nodes, each a target of its own (`instance` and"
            f" `node` labels), served by {len(result.scenarios)} `gpuload serve --simulate`"
            f" exporters with their default settings ({', '.join(result.scenarios)}). Prometheus's"
            " figures come from its own `/metrics`. The exporters and Prometheus share the"
            " machine's CPUs with whatever else runs there: the machine CPU row says how busy it"
            f" was. RSS is that of a Prometheus {result.seconds / 60:.0f} minutes old: `--minutes`"
            " shows where it settles. Method: bench/README.md.",
            "",
            summary_table(result),
            "",
            rules_table(result),
            "",
            f"The fleet dashboard's panels for the whole fleet (every variable at All), each"
            f" {result.repeat} times, as Grafana sends their queries, over {ranges}. A panel's"
            " time is its queries' wall times one after the other (Grafana sends them at once)."
            " The history repeats each series' own samples from the run back in time; only the"
            " families the panels read have it, in blocks.",
            "",
            panels_table(result),
            "",
            "Panels over 1 s: " + (", ".join(slow) if slow else "none") + ".",
            "",
        ]
    )
