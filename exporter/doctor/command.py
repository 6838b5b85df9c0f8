"""Running `gpuload doctor`: sample, diagnose, print; the exit code says what was found.

Exit codes: 0 every GPU healthy (idle, busy or compute-bound), 1 at least one finding,
2 nothing could be measured (no NVML, Prometheus unreachable, no GPU).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TextIO

from exporter.alerting import thresholds as thresholds_file
from exporter.doctor.sampling import SamplingError, sample_local, sample_prometheus
from exporter.doctor.verdicts import Report, diagnose

HEALTHY, FINDINGS, UNMEASURED = 0, 1, 2


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


class _Progress:
    """A one-line progress indicator on a terminal; silent when stderr is not one."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._shown = stream.isatty()

    def __call__(self, elapsed: float, total: float) -> None:
        if not self._shown:
            return
        width = 30
        done = int(width * elapsed / total) if total else width
        bar = "#" * done + "." * (width - done)
        self._stream.write(f"\rsampling the GPUs [{bar}] {elapsed:4.0f}/{total:.0f} s")
        self._stream.flush()

    def clear(self) -> None:
        if self._shown:
            self._stream.write("\r" + " " * 60 + "\r")
            self._stream.flush()


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
    progress = _Progress(err)
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
    measured = [r for r in reports if r.state != "unknown"]
    code = FINDINGS if any(not r.healthy for r in reports) else HEALTHY
    if not measured:
        code = UNMEASURED
    if options.json:
        document = {
            "source": source,
            "duration_seconds": options.duration,
            "exit_code": code,
            "gpus": [report.to_json() for report in reports],
        }
        print(json.dumps(document, indent=2), file=out)
    else:
        print(_text(reports, source, options.duration, code), file=out)
    return code


def _text(reports: list[Report], source: str, duration: float, code: int) -> str:
    lines = [f"gpuload doctor: {len(reports)} GPU(s), {duration:g} s from {source}", ""]
    for report in reports:
        lines.append(f"GPU {report.gpu}  {report.name}  {report.uuid}")
        lines.append(f"  state: {report.state}")
        for finding in report.findings:
            prefix = "  " if finding is report.findings[0] else "  also "
            lines.append(f"{prefix}{finding.state}: {finding.summary}")
            lines.extend(f"    - {line}" for line in finding.evidence)
            if finding.steps:
                lines.append("    next steps:")
                lines.extend(f"      * {step}" for step in finding.steps)
            if finding.runbook and report.state not in ("idle", "busy"):
                lines.append(f"    runbook: {finding.runbook}")
        lines.append("")
    verdict = {
        HEALTHY: "healthy: nothing to do",
        FINDINGS: "findings above: see the next steps",
        UNMEASURED: "could not measure",
    }[code]
    lines.append(f"result: {verdict} (exit {code})")
    return "\n".join(lines)
