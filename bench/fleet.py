"""``python -m bench.fleet``: a real Prometheus scraping a simulated fleet of GPUs, and its cost.

A few ``gpuload serve --simulate`` exporters (8 GPUs each) run on 127.0.0.1; Prometheus scrapes
each of them under many node identities, one target per fake node with its own ``instance`` and
``node`` labels, until the fleet has the GPUs asked for. The shipped recording and alerting rules
are loaded. After the run, Prometheus's own figures are read from its ``/metrics`` (never scraped
into its TSDB, so the measurement adds no series) and every panel of the fleet dashboard is
queried as Grafana would query it for the whole fleet. Method and columns: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import fleet_history, fleet_panels, report
from bench.fleet_panels import TimeRange
from bench.fleet_report import FleetResult, PanelTiming, RangeTimings, section
from bench.node import ROOT, free_port
from exporter.alerting.thresholds import duration_seconds
from exporter.sim.scenario import load_scenario
from tools import RULES_DIR

# Four kinds of node, so the dashboard's states all have GPUs: busy with NVLink traffic, training
# with dips, starved by its data loader (underutilized), and idle.
SCENARIOS = ("h100-nvlink", "training", "data-starved", "idle")
JOB = "gpuload"
NODE_PORT = 19400  # the fake nodes' instance is NAME:19400, gpuload's default port
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Settings:
    """What to run: the fleet's size, for how long, how often Prometheus scrapes."""

    gpus: int = 1024
    minutes: float = 7.0
    scenarios: tuple[str, ...] = SCENARIOS
    scrape_interval: int = 15  # seconds; also the rules' evaluation interval
    repeat: int = 5  # times each panel is queried
    history: int = 6 * 3600  # seconds filled in before the run; 0: none


@dataclass(frozen=True)
class FakeNode:
    """A node of the fleet: a name, and the exporter whose GPUs it shows."""

    name: str
    exporter: int  # index into the exporters

    @property
    def instance(self) -> str:
        """The ``instance`` label Prometheus gives its series."""
        return f"{self.name}:{NODE_PORT}"


@dataclass
class Reading:
    """Prometheus's own figures at one moment, from its ``/metrics``."""

    at: float
    head_series: float
    rss_bytes: float
    appended_samples: float
    cpu_seconds: float
    # rule group -> (time of its last evaluation, its duration in seconds)
    rule_groups: dict[str, tuple[float, float]]
    rules: dict[str, float]  # rule group -> rules in it
    missed: float  # rule group iterations missed so far, all groups
    lowest_timestamp: float  # unix seconds of the oldest sample, head or blocks


class Prometheus:
    """A real Prometheus on 127.0.0.1, its data in a temporary folder."""

    def __init__(self, binary: str, config: dict[str, Any], folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        self.data = folder / "data"
        config_file = folder / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        self._log = folder / "prometheus.log"
        self._command = [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.data}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.process = self._start()
        self.started = time.monotonic()
        self.started_at = time.time()  # no sample of the fleet is older

    def _start(self) -> subprocess.Popen[bytes]:
        with self._log.open("ab") as log:
            return subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)

    def restart(self) -> None:
        """Stop and start again on the same data, to read the blocks put there.

        A running Prometheus looks for new blocks once a minute; a starting one reads them all.
        """
        self.stop()
        self.process = self._start()
        self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for ``/-/ready``; an error with the log's tail if it exits or never gets there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        """The last lines Prometheus logged."""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-20:])

    def api(self, path: str, params: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
        """Ask the HTTP API; (seconds until the whole answer is read, its data).

        Queries are POSTed, as Grafana does; without parameters it is a GET.
        """
        body = urllib.parse.urlencode(params).encode() if params else None
        started = time.perf_counter()
        with urllib.request.urlopen(self.url + path, data=body, timeout=120) as answer:
            text = answer.read()
        seconds = time.perf_counter() - started
        decoded: dict[str, Any] = json.loads(text)
        if decoded.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {decoded.get('error')}")
        return seconds, decoded["data"]

    def results(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result list."""
        _, data = self.api("/api/v1/query", {"query": expr})
        return list(data["result"])

    def value(self, expr: str) -> float:
        """An instant query's single value; NaN when it returns nothing."""
        result = self.results(expr)
        return float(result[0]["value"][1]) if result else math.nan

    def reading(self) -> Reading:
        """Prometheus's own figures now, from its ``/metrics`` (not from its TSDB)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        values: dict[str, float] = {}
        last_evaluation: dict[str, float] = {}
        last_duration: dict[str, float] = {}
        rules: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                group = _group_name(sample.labels.get("rule_group", ""))
                if sample.name == "prometheus_rule_group_last_evaluation_timestamp_seconds":
                    last_evaluation[group] = sample.value
                elif sample.name == "prometheus_rule_group_last_duration_seconds":
                    last_duration[group] = sample.value
                elif sample.name == "prometheus_rule_group_rules":
                    rules[group] = sample.value
                else:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return Reading(
            at=time.monotonic(),
            head_series=values.get("prometheus_tsdb_head_series", math.nan),
            rss_bytes=values.get("process_resident_memory_bytes", math.nan),
            appended_samples=values.get("prometheus_tsdb_head_samples_appended_total", math.nan),
            cpu_seconds=values.get("process_cpu_seconds_total", math.nan),
            rule_groups={
                group: (last_evaluation[group], last_duration.get(group, math.nan))
                for group in last_evaluation
            },
            rules=rules,
            missed=values.get("prometheus_rule_group_iterations_missed_total", 0.0),
            lowest_timestamp=values.get("prometheus_tsdb_lowest_timestamp_seconds", math.inf),
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Exporter:
    """``gpuload serve --simulate SCENARIO`` on 127.0.0.1 with its default settings."""

    def __init__(self, scenario: str, folder: Path) -> None:
        self.scenario = scenario
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._log = folder / f"gpuload-{scenario}-{self.port}.log"
        env = dict(os.environ)
        # This checkout's package, whatever `pip install -e` points at.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "exporter", "serve", "--simulate", scenario]
        argv += ["--web.listen-address", self.address, "--log.level", "warning"]
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until ``/metrics`` serves GPU series."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gpuload ({self.scenario}) exited:\n{self._tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=5) as answer:
                    if b"\ngpu_up" in answer.read():
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"gpuload ({self.scenario}) not ready:\n{self._tail()}")

    def _tail(self) -> str:
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-20:])

    def cpu_seconds(self) -> float:
        """CPU time of the daemon and any process it started."""
        return sum(_cpu_seconds(pid) for pid in _process_tree(self.process.pid))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def plan(settings: Settings) -> tuple[list[str], list[FakeNode]]:
    """The exporters to start (a scenario each) and the fake nodes, enough for ``gpus`` GPUs.

    Nodes go to the exporters in turn; an exporter no node would use is not started.
    """
    per_node = [len(load_scenario(name).gpus) for name in settings.scenarios]
    nodes: list[FakeNode] = []
    gpus = 0
    while gpus < settings.gpus:
        exporter = len(nodes) % len(per_node)
        nodes.append(FakeNode(f"gpu-node-{len(nodes) + 1:04d}", exporter))
        gpus += per_node[exporter]
    used = sorted({node.exporter for node in nodes})
    scenarios = [settings.scenarios[index] for index in used]
    renumbered = {old: new for new, old in enumerate(used)}
    return scenarios, [FakeNode(node.name, renumbered[node.exporter]) for node in nodes]


def prometheus_config(settings: Settings, addresses: list[str], nodes: list[FakeNode]) -> Any:
    """One job; a target per fake node, all pointing at its exporter.

    Prometheus keeps one target per distinct label set of a job, so the same address under a
    different ``instance`` and ``node`` is another target, scraped on its own.
    """
    interval = f"{settings.scrape_interval}s"
    timeout = f"{max(1, settings.scrape_interval * 2 // 3)}s"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": timeout,
            "evaluation_interval": interval,
        },
        "rule_files": [str(path) for path in rule_files()],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [
                    {
                        "targets": [addresses[node.exporter]],
                        "labels": {"instance": node.instance, "node": node.name},
                    }
                    for node in nodes
                ],
            }
        ],
    }


def rule_files() -> list[Path]:
    """The shipped Prometheus rule files (alert_rules/*.rules.yml; the rest are not rules)."""
    return sorted(RULES_DIR.glob("*.rules.yml"))


def check_rules(promtool: str) -> None:
    """``promtool check rules`` on the rule files: a bad file fails here, not in the log."""
    done = subprocess.run(
        [promtool, "check", "rules", *map(str, rule_files())],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"promtool check rules failed:\n{done.stdout}{done.stderr}")


def run(settings: Settings, *, progress: bool = True) -> FleetResult:
    """Start the fleet and Prometheus, run for ``settings.minutes``, measure, stop everything."""
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not binary or not promtool:
        raise RuntimeError("needs prometheus and promtool on PATH (Debian: apt install prometheus)")
    check_rules(promtool)
    scenarios, nodes = plan(settings)
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-")))
        exporters = [Exporter(scenario, folder) for scenario in scenarios]
        for exporter in exporters:
            stack.callback(exporter.stop)
        for exporter in exporters:
            exporter.wait_ready()
        config = prometheus_config(settings, [e.address for e in exporters], nodes)
        prometheus = Prometheus(binary, config, folder)
        stack.callback(prometheus.stop)
        prometheus.wait_ready()
        _say(progress, f"{len(nodes)} nodes on {len(exporters)} exporters; Prometheus is up")
        with _cpu_window(exporters) as cpu:
            readings = _watch(prometheus, settings, progress)
        result = _result(settings, prometheus, scenarios, nodes, readings, cpu)
        board = fleet_panels.dashboard()
        run_range = TimeRange.of(
            min(result.seconds, fleet_panels.default_range_seconds(board)),
            settings.scrape_interval,
        )
        _say(progress, f"querying the fleet dashboard over {run_range.describe()} ...")
        result.timings.append(
            RangeTimings(run_range, False, time_panels(prometheus, board, run_range, settings))
        )
        if settings.history:
            result.timings.append(_with_history(prometheus, board, settings, promtool, progress))
        return result


def _with_history(
    prometheus: Prometheus,
    board: dict[str, Any],
    settings: Settings,
    promtool: str,
    progress: bool,
) -> RangeTimings:
    """Fill in the hours before the run, then time the panels over them."""
    history = TimeRange.of(settings.history, settings.scrape_interval)
    _say(progress, f"filling in {history.describe().split(' at ')[0]} of history ...")
    blocks = fleet_history.fill(
        prometheus.results,
        fleet_panels.families(fleet_panels.panels(board)),
        start=prometheus.started_at,
        seconds=settings.history,
        step=settings.scrape_interval,
        promtool=promtool,
        folder=prometheus.folder,
        data=prometheus.data,
    )
    prometheus.restart()
    first = prometheus.started_at - settings.history
    fleet_history.wait_loaded(
        lambda: prometheus.reading().lowest_timestamp <= first + settings.scrape_interval / 2,
        blocks,
    )
    _say(progress, f"querying the fleet dashboard over {history.describe()} ...")
    return RangeTimings(history, True, time_panels(prometheus, board, history, settings))


def _watch(prometheus: Prometheus, settings: Settings, progress: bool) -> list[Reading]:
    """Read Prometheus's figures once per scrape interval until the run's time is up."""
    end = prometheus.started + settings.minutes * 60
    readings = []
    next_report = time.monotonic() + 60
    while True:
        readings.append(prometheus.reading())
        if prometheus.process.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{prometheus.log_tail()}")
        now = time.monotonic()
        if progress and now >= next_report:
            last = readings[-1]
            print(
                f"  {(now - prometheus.started) / 60:.1f} min: "
                f"{last.head_series:.0f} head series, RSS {last.rss_bytes / 2**20:.0f} MiB",
                flush=True,
            )
            next_report += 60
        if now >= end:
            return readings
        time.sleep(min(settings.scrape_interval, max(0.0, end - now)))


@dataclass
class _CpuWindow:
    """CPU seconds the exporters and the whole machine used during the run."""

    exporters: float = 0.0
    machine: float = 0.0
    seconds: float = 0.0


@contextmanager
def _cpu_window(exporters: list[Exporter]) -> Iterator[_CpuWindow]:
    window = _CpuWindow()
    started = time.monotonic()
    exporters_before = sum(e.cpu_seconds() for e in exporters)
    machine_before = _machine_busy_seconds()
    yield window
    window.seconds = time.monotonic() - started
    window.exporters = sum(e.cpu_seconds() for e in exporters) - exporters_before
    window.machine = _machine_busy_seconds() - machine_before


def _result(
    settings: Settings,
    prometheus: Prometheus,
    scenarios: list[str],
    nodes: list[FakeNode],
    readings: list[Reading],
    cpu: _CpuWindow,
) -> FleetResult:
    """The live fleet's figures, read at the end of the run; the panels' timings come after."""
    first, last = _steady(readings, settings), readings[-1]
    elapsed = last.at - first.at
    job = f'job="{JOB}"'
    per_minute = 60 / cpu.seconds if cpu.seconds else math.nan
    prometheus_cpu = (last.cpu_seconds - readings[0].cpu_seconds) / (last.at - readings[0].at)
    return FleetResult(
        scenarios=scenarios,
        scrape_interval=settings.scrape_interval,
        repeat=settings.repeat,
        nodes=len(nodes),
        seconds=last.at - prometheus.started,
        gpus=int(_zero(prometheus.value("count(gpu_up)"))),
        targets_up=int(_zero(prometheus.value(f"count(up{{{job}}} == 1)"))),
        head_series=last.head_series,
        scraped_series=prometheus.value(f"sum(scrape_samples_post_metric_relabeling{{{job}}})"),
        recorded_series=_zero(prometheus.value('count({__name__=~"(gpu|node):.+"})')),
        alert_series=_zero(prometheus.value("count(ALERTS)")),
        rss_bytes=last.rss_bytes,
        peak_rss_bytes=max(reading.rss_bytes for reading in readings),
        samples_per_second=(last.appended_samples - first.appended_samples) / elapsed
        if elapsed
        else math.nan,
        prometheus_cpu_per_minute=prometheus_cpu * 60,
        exporters_cpu_per_minute=cpu.exporters * per_minute,
        machine_cpu_per_minute=cpu.machine * per_minute,
        scrape_seconds=(
            prometheus.value(f"quantile(0.5, scrape_duration_seconds{{{job}}})"),
            prometheus.value(f"max(scrape_duration_seconds{{{job}}})"),
        ),
        rule_groups=_evaluations(readings, first.at),
        rules=last.rules,
        missed=last.missed,
        timings=[],
        load_average=" ".join(Path("/proc/loadavg").read_text().split()[:3]),
        prometheus_version=_version(prometheus),
    )


def _steady(readings: list[Reading], settings: Settings) -> Reading:
    """The first reading past the warm-up (every target scraped a few times), for rates."""
    warm = min(60.0, settings.minutes * 60 / 3)
    start = readings[0].at
    return next((r for r in readings if r.at - start >= warm), readings[0])


def _evaluations(readings: list[Reading], since: float) -> dict[str, list[float]]:
    """Each rule group's evaluation durations seen after ``since``, each evaluation once."""
    seen: dict[str, dict[float, float]] = {}
    for reading in readings:
        if reading.at < since:
            continue
        for group, (evaluated, duration) in reading.rule_groups.items():
            if evaluated > 0:
                seen.setdefault(group, {})[evaluated] = duration
    return {group: list(durations.values()) for group, durations in sorted(seen.items())}


def time_panels(
    prometheus: Prometheus, board: dict[str, Any], time_range: TimeRange, settings: Settings
) -> list[PanelTiming]:
    """Query every panel ``settings.repeat`` times, in turns; its targets one after the other."""
    variables = fleet_panels.all_values(board)
    timings = [PanelTiming(panel) for panel in fleet_panels.panels(board)]
    for turn in range(settings.repeat):
        for timing in timings:
            seconds, samples, series = 0.0, 0, 0
            for target in timing.panel.targets:
                expr = fleet_panels.expand(target.expr, variables, time_range)
                took, data = prometheus.api(*_request(expr, target.instant, time_range))
                seconds += took
                samples += int(
                    data.get("stats", {}).get("samples", {}).get("totalQueryableSamples", 0)
                )
                series += len(data["result"])
            timing.seconds.append(seconds)
            if turn == 0:
                timing.samples, timing.series = samples, series
    return timings


def _request(expr: str, instant: bool, time_range: TimeRange) -> tuple[str, dict[str, str]]:
    """The API path and parameters Grafana sends for a target, over the range ending now."""
    step = time_range.interval
    end = math.floor(time.time() / step) * step  # Grafana aligns the range to the step
    if instant:
        return "/api/v1/query", {"query": expr, "time": str(end), "stats": "all"}
    params = {
        "query": expr,
        "start": str(end - time_range.seconds),
        "end": str(end),
        "step": str(step),
        "stats": "all",
    }
    return "/api/v1/query_range", params


def _version(prometheus: Prometheus) -> str:
    try:
        _, data = prometheus.api("/api/v1/status/buildinfo")
    except (OSError, RuntimeError):
        return "?"
    return str(data.get("version", "?"))


def _group_name(label: str) -> str:
    """``/path/to/file.rules.yml;gpuload.health`` -> ``gpuload.health``."""
    return label.rpartition(";")[2]


def _zero(value: float) -> float:
    """Nothing returned (NaN) is a count of zero."""
    return 0.0 if math.isnan(value) else value


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, flush=True)


def _process_tree(pid: int) -> list[int]:
    pids, index = [pid], 0
    while index < len(pids):
        for children in Path(f"/proc/{pids[index]}/task").glob("*/children"):
            pids += [int(child) for child in _read(children).split()]
        index += 1
    return pids


def _cpu_seconds(pid: int) -> float:
    fields = _read(Path(f"/proc/{pid}/stat")).rpartition(")")[2].split()
    # utime and stime, fields 14 and 15 of proc(5), counted after the command's parenthesis.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS if fields else 0.0


def _machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent on anything but idle and I/O wait since boot."""
    fields = [int(value) for value in _read(Path("/proc/stat")).splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    # guest time is counted in user time already
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument("--gpus", type=int, default=1024, help="fleet size (default 1024)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=7.0,
        # The rules record a window's (5m) rates once a whole window is scraped: the panels are
        # timed on two minutes of a fleet whose states are all known.
        help="how long Prometheus runs (default 7)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"the exporters' scenarios, comma-separated (default {','.join(SCENARIOS)})",
    )
    parser.add_argument(
        "--scrape-interval", type=int, default=15, help="seconds, also for the rules (default 15)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="queries per panel (default 5)")
    parser.add_argument(
        "--history",
        help="history filled in before the run for the panels' range queries, e.g. 6h, or 0"
        " for none (default: the dashboard's default range)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="16 GPUs, 30 s, 5 s scrapes, 10 min of history: a smoke run",
    )
    parser.add_argument("--no-write", action="store_true", help="do not rewrite RESULTS.md")
    return parser.parse_args()


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings the flags ask for; ``--quick`` sets those it names."""
    if args.history is None:
        history = (
            600 if args.quick else fleet_panels.default_range_seconds(fleet_panels.dashboard())
        )
    else:
        history = 0 if args.history.strip("0") == "" else duration_seconds(args.history)
    return Settings(
        gpus=16 if args.quick else args.gpus,
        minutes=0.5 if args.quick else args.minutes,
        scenarios=tuple(name for name in args.scenarios.split(",") if name),
        scrape_interval=5 if args.quick else args.scrape_interval,
        repeat=2 if args.quick else args.repeat,
        history=history,
    )


def main() -> int:
    """Run, print the tables, write the Fleet section of RESULTS.md."""
    args = _arguments()
    result = run(settings_of(args))
    text = section(result, " ".join(sys.argv[1:]))
    print()
    print(text)
    if not args.no_write:
        report.write_section(report.FLEET_HEADING, text)
        print(f"wrote the Fleet section of {report.RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
