"""The printed tables and bench/RESULTS.md."""

from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench.node import BENCH, peer_version

RESULTS = BENCH / "RESULTS.md"
OPTIMIZATIONS = BENCH / "OPTIMIZATIONS.md"
# Written by `python -m bench.fleet` (bench/fleet.py); `python -m bench` keeps it as it is.
FLEET_HEADING = "## Fleet"
# Written by `python -m bench.servers` (bench/servers.py); kept by `python -m bench`.
SERVERS_HEADING = "## HTTP servers"


@dataclass
class Row:
    """One exporter on one node."""

    node: str
    exporter: str
    values: dict[str, float]


# (key, heading, format); the ratio row divides gpuload's value by nvitop-exporter's.
COLUMNS = (
    ("cold_ms", "cold scrape ms", "{:.2f}"),
    ("p50_1", "p50 1s ms", "{:.2f}"),
    ("p99_1", "p99 1s ms", "{:.2f}"),
    ("p50_10", "p50 10s ms", "{:.2f}"),
    ("p99_10", "p99 10s ms", "{:.2f}"),
    ("p99_spread", "p99 spread ms", "{:.2f}"),
    ("cpu_per_minute", "CPU s/min", "{:.2f}"),
    ("cpu_ms_per_cycle", "CPU ms/cycle", "{:.1f}"),
    ("own_cpu_ms_per_cycle", "CPU ms/cycle w/o sim", "{:.1f}"),
    ("sim_share", "sim %CPU", "{:.0%}"),
    ("rss_mb", "RSS MB", "{:.1f}"),
    ("pss_mb", "PSS MB", "{:.1f}"),
    ("series", "series", "{:.0f}"),
    ("bytes", "bytes", "{:.0f}"),
    ("gzip_bytes", "gzip B", "{:.0f}"),
    ("calls_per_cycle", "NVML calls/cycle", "{:.0f}"),
    ("cycles_per_minute", "cycles/min", "{:.0f}"),
    ("cycle_ms", "cycle ms", "{:.0f}"),
    ("nvml_ms_per_gpu", "NVML ms/GPU", "{:.1f}"),
)


def _cell(value: float | None, form: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return form.format(value)


def _ratio(mine: float | None, theirs: float | None) -> str:
    if mine is None or theirs is None or math.isnan(mine) or math.isnan(theirs) or not theirs:
        return "-"
    return f"{mine / theirs:.3g}x"


def table(rows: list[Row]) -> str:
    """A Markdown table (readable as printed): each row, and gpuload/nvitop after each node."""
    head = ["node", "exporter", *(heading for _, heading, _ in COLUMNS)]
    lines = [head]
    for index, row in enumerate(rows):
        lines.append(
            [row.node, row.exporter, *(_cell(row.values.get(k), f) for k, _, f in COLUMNS)]
        )
        last_of_node = index + 1 == len(rows) or rows[index + 1].node != row.node
        if not last_of_node:
            continue
        ours = next((r for r in rows if r.node == row.node and r.exporter == "gpuload"), None)
        theirs = next((r for r in rows if r.node == row.node and r.exporter == "nvitop"), None)
        if ours and theirs:
            lines.append(
                [
                    row.node,
                    "gpuload/nvitop",
                    *(_ratio(ours.values.get(k), theirs.values.get(k)) for k, _, _ in COLUMNS),
                ]
            )
    return markdown(lines)


def relay_table(rows: list[dict[str, str]]) -> str:
    """The relay benchmark's table."""
    if not rows:
        return ""
    head = list(rows[0])
    return markdown([head, *([row[k] for k in head] for row in rows)])


def markdown(lines: list[list[str]]) -> str:
    """A Markdown table of ``lines`` (the first is the heading), columns padded to align."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    rendered = [
        "| "
        + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        + " |"
        for line in lines
    ]
    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([rendered[0], rule, *rendered[1:]])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _memory() -> str:
    try:
        total = Path("/proc/meminfo").read_text().split()[1]
        return f"{int(total) / 2**20:.1f} GiB"
    except (OSError, IndexError, ValueError):
        return "?"


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(BENCH), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "?"


def host() -> str:
    """The commit and the machine the numbers came from."""
    return (
        f"commit {_commit()}; "
        f"{platform.node()}: {_cpu_model()}, {os.cpu_count()} CPUs, {_memory()} memory, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def machine() -> str:
    """Where the numbers came from, with the exporters' versions."""
    return (
        f"{host()}; "
        f"gpuload {metadata.version('gpuload')}, prometheus_client "
        f"{metadata.version('prometheus_client')}, nvitop-exporter "
        f"{peer_version('nvitop-exporter')}"
    )


def write_results(
    table_text: str,
    relay_text: str,
    evaluation_text: str,
    rows: list[Row],
    relay_rows: list[dict[str, str]],
    seconds: float,
    arguments: str,
) -> None:
    """Rewrite bench/RESULTS.md from this run, with the optimization log appended."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = f"python -m bench {arguments}".strip()
    parts = [
        "# Benchmark results",
        "",
        f"Generated by `{command}` on {now} in {seconds:.0f} s. Do not edit: run it again.",
        "",
        f"Machine: {machine()}.",
        "",
        "Columns and method: bench/README.md. Scrape latency is per request on a fresh "
        "connection from a plain-socket client with Prometheus's headers (OpenMetrics "
        "preferred, gzip), 200 back-to-back "
        "scrapes from 1 scraper and 30 from each of 10 concurrent scrapers (processes), and 400 "
        "spread at random over the collection cycles; CPU is the user+system time of the daemon "
        "and the processes it starts, over a window without scrapes; `w/o sim` leaves out the "
        "simulated NVML's own CPU time, which it measures per call; `sim %CPU` is the share "
        "of the daemon's GIL-holding samples (py-spy) spent inside the simulated NVML; "
        "`NVML ms/GPU` is one GPU's NVML time per cycle under the latency model.",
        "",
        "## Exporters",
        "",
        table_text,
        "",
    ]
    if relay_text:
        parts += ["## Relay", "", relay_text, ""]
    if evaluation_text:
        parts += [
            "## Local alerting on a full window",
            "",
            "`python -m bench.evaluation`: an 8 x H100 node's samples fed to the local "
            "evaluator at one cycle per simulated second until the history holds the rules' "
            "5-minute window, then timed with the rules evaluated every cycle and every 15 s "
            "(`alerting.evaluation_interval`, the default), in alternating rounds of 60 cycles. "
            "The exporter table's daemons are a few seconds old: their history is short, and "
            "this cost is not in their CPU column.",
            "",
            evaluation_text,
            "",
        ]
    # The sections other commands write (bench.fleet, bench.servers) are kept.
    for heading in (SERVERS_HEADING, FLEET_HEADING):
        kept = _section(RESULTS.read_text(), heading) if RESULTS.exists() else ""
        if kept:
            parts += [kept.rstrip(), ""]
    if OPTIMIZATIONS.exists():
        parts += [OPTIMIZATIONS.read_text().rstrip(), ""]
    RESULTS.write_text("\n".join(parts))


def _bounds(lines: list[str], heading: str) -> tuple[int, int] | None:
    """Where the section under ``heading`` starts and ends (the next ``## `` heading)."""
    if heading not in lines:
        return None
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return start, end


def _section(text: str, heading: str) -> str:
    """The section of ``text`` under ``heading``; "" if there is none."""
    lines = text.splitlines()
    bounds = _bounds(lines, heading)
    return "\n".join(lines[slice(*bounds)]).rstrip() + "\n" if bounds else ""


def write_section(heading: str, section: str, path: Path = RESULTS) -> None:
    """Put ``section`` in bench/RESULTS.md in place of the one under ``heading``.

    A new section goes before the optimization log, after the other benchmarks' sections.
    """
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines()
    bounds = _bounds(lines, heading)
    if bounds:
        start, end = bounds
        del lines[start:end]
    else:
        log = next((i for i, line in enumerate(lines) if line.startswith("## Optimizations")), None)
        start = len(lines) if log is None else log
    lines[start:start] = [*section.rstrip().splitlines(), ""]
    path.write_text("\n".join(lines).rstrip() + "\n")
