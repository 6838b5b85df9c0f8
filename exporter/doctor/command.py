"""Running `gpuload doctor`: sample, diagnose, print; the exit code says what was found.

Exit codes: 0 every GPU healthy (idle, busy or compute-bound), 1 at least one finding,
2 nothing could be measured (no NVML, Prometheus unreachable, no GPU).
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from typing import TextIO

from exporter.alerting import thresholds as thresholds_file
from exporter.doctor.node import Group, Node, merge, summarize
from exporter.doctor.sampling import SamplingError, sample_local, sample_prometheus
from exporter.doctor.verdicts import Finding, InstanceReport, diagnose, instance_text

HEALTHY, FINDINGS, UNMEASURED = 0, 1, 2
# Seconds between progress lines when stderr is not a terminal.
PROGRESS_EVERY = 5.0


@dataclass(frozen=True)
class Options:
    """What `gpuload doctor` was asked to do."""

    duration: float = 30.0
    interval: float = 1.0
    simulate: str | None = None
    sim_epoch: float | None = None
    sim_seed: int | None = None
    prometheus: str | None = None
    instance: str | None = None
    json: bool = False


class Progress:
    """Where the sampling is, on stderr, so that stdout holds only the report.

    On a terminal one line is rewritten in place after each collection; otherwise (a pipe, a log
    file, a CI job) a whole line is written at the start, every ``every`` seconds and at the end.
    """

    def __init__(self, stream: TextIO, every: float = PROGRESS_EVERY) -> None:
        self._stream = stream
        self._terminal = stream.isatty()
        self._every = every
        self._next = 0.0
        self._shown = False

    def __call__(self, elapsed: float, total: float, gpus: int) -> None:
        """Show the progress after a collection."""
        line = f"sampling {gpus} GPU{'' if gpus == 1 else 's'}: {int(elapsed)} s of {total:g} s"
        if self._terminal:
            self._stream.write(f"\r{line}\x1b[K")
        elif elapsed >= self._next or elapsed >= total:
            self._stream.write(line + "\n")
            while self._next <= elapsed:
                self._next += self._every
        else:
            return
        self._shown = True
        self._stream.flush()

    def clear(self) -> None:
        """End the progress line before anything else is written."""
        if self._terminal and self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
        self._shown = False


def run(options: Options, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Sample, diagnose and print; return the exit code."""
    try:
        thresholds = thresholds_file.load()
    except thresholds_file.ThresholdsError as error:
        print(
            f"gpuload doctor: {error} (it is alert_rules/thresholds.yaml of the repository)",
            file=err,
        )
        return UNMEASURED
    progress = Progress(err)
    try:
        if options.prometheus:
            window = sample_prometheus(options.prometheus, options.instance or "", options.duration)
            source = f"Prometheus {options.prometheus}, instance {options.instance}"
        else:
            if options.simulate:
                from exporter import sim

                sim.install(options.simulate, epoch=options.sim_epoch, seed=options.sim_seed)
                source = f"the simulated NVML (scenario {options.simulate})"
            else:
                source = "NVML"
            window, _count = sample_local(options.duration, options.interval, progress)
    except SamplingError as error:
        progress.clear()
        print(f"gpuload doctor: {error}", file=err)
        return UNMEASURED
    finally:
        if options.simulate and not options.prometheus:
            from exporter import sim

            sim.uninstall()
    progress.clear()
    reports = diagnose(window, thresholds)
    node = summarize(options.instance or socket.gethostname(), reports)
    measured = [r for r in reports if r.state != "unknown"]
    code = FINDINGS if any(not r.healthy for r in reports) else HEALTHY
    if not measured:
        code = UNMEASURED
    if options.json:
        document = {
            "source": source,
            "duration_seconds": options.duration,
            "exit_code": code,
            "node": node.to_json(),
            "groups": [group.to_json() for group in node.groups],
            "gpus": [report.to_json() for report in reports],
        }
        print(json.dumps(document, indent=2), file=out)
    else:
        print(text(node, source, options.duration, code), file=out)
    return code


def text(node: Node, source: str, duration: float, code: int) -> str:
    """The report for people: the node's verdict first, then one block per group of GPUs."""
    lines = [node.verdict()]
    lines.extend(f"  {xid}" for xid in node.xids())
    lines += [f"sampled {duration:g} s from {source}", ""]
    for group in node.groups:
        lines += _group(group)
        lines.append("")
    verdict = {
        HEALTHY: "healthy: nothing to do",
        FINDINGS: "findings above: see the next steps",
        UNMEASURED: "could not measure: see what was not measured above",
    }[code]
    lines.append(f"result: {verdict} (exit {code})")
    return "\n".join(lines)


def _group(group: Group) -> list[str]:
    first = group.reports[0]
    count = len(group.reports)
    model = f"{count} x {first.name}" if count > 1 else f"{first.name}, {first.uuid}"
    lines = [f"{group.label}: {first.state}  ({model})"]
    for position, finding in enumerate(first.findings):
        prefix = "  " if position == 0 else f"  also {finding.state}: "
        lines.append(f"{prefix}{finding.summary}")
        lines.extend(f"    - {line}" for line in group.evidence(position))
        lines += _steps(finding, "    ")
    lines.extend(f"  not measured: {item.text()}" for item in first.unmeasured)
    for report in group.reports:
        lines.extend(
            f"  {xid.text(report.gpu)}" + (f"; {xid.action}" if xid.action else "")
            for xid in report.xids
        )
    if first.instances:
        lines.append("  MIG instances:")
    for position, instance in enumerate(first.instances):
        lines += _instance(group, position, instance)
    return lines


def _instance(group: Group, position: int, instance: InstanceReport) -> list[str]:
    alike = [instance_text(report.instances[position].figures) for report in group.reports]
    finding = instance.findings[0]
    lines = [
        f"    instance {instance.instance} ({instance.profile}): {instance.state}, {merge(alike)}"
    ]
    if not instance.healthy:
        lines.append(f"      {finding.summary}")
        lines += _steps(finding, "      ")
    return lines


def _steps(finding: Finding, indent: str) -> list[str]:
    lines = []
    if finding.steps:
        lines.append(f"{indent}next steps:")
        lines.extend(f"{indent}  * {step}" for step in finding.steps)
    if finding.runbook and finding.state not in ("idle", "busy"):
        lines.append(f"{indent}runbook: {finding.runbook}")
    return lines
