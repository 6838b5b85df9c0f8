"""Running `gpuload doctor`: sample, evaluate the shipped rules, print; the exit code says what.

The doctor judges nothing itself. It feeds what it samples to the local evaluator of the rule
files rendered from ``alert_rules/thresholds.yaml`` and prints each GPU's recorded state, its
bottleneck classes and its pending and firing alerts at the end (:mod:`exporter.alerting.states`),
as `gpuload serve`'s status page and a Prometheus with the same rules show them. The rules' means
span 5 minutes, so the doctor samples the rules' warm-up by default; on the simulated NVML that
takes a moment, as it runs on the scenario's clock.

Exit codes: 0 every GPU healthy, 1 at least one GPU needs a person (a pending or firing alert
above info, a bottleneck class with such an alert, a lost GPU), 2 nothing could be measured (no
NVML, Prometheus unreachable, no GPU, or no GPU's load measurable yet).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from exporter.alerting import rules, states
from exporter.alerting import thresholds as thresholds_file
from exporter.alerting.evaluator import Alert, Evaluator, warm_up_seconds
from exporter.alerting.from_prometheus import SamplingError, replay, sample_prometheus
from exporter.config import ALERTING
from exporter.doctor import runbooks, xids
from exporter.doctor.node import Group, Node, summarize
from exporter.doctor.sampling import ScenarioClock, identities_of, sample_local

HEALTHY, FINDINGS, UNMEASURED = 0, 1, 2
# Seconds between progress lines when stderr is not a terminal.
PROGRESS_EVERY = 5.0


@dataclass(frozen=True)
class Options:
    """What `gpuload doctor` was asked to do."""

    # Seconds to sample; None: the rules' warm-up (their windows whole).
    duration: float | None = None
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
    file, a CI job) a whole line is written at the start, every ``every`` seconds of wall time
    (the simulator's minutes pass faster) and at the end.
    """

    def __init__(
        self,
        stream: TextIO,
        every: float = PROGRESS_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._terminal = stream.isatty()
        self._every = every
        self._clock = clock
        self._next: float | None = None
        self._shown = False

    def __call__(self, elapsed: float, total: float, gpus: int) -> None:
        """Show the progress after a collection."""
        line = f"sampling {gpus} GPU{'' if gpus == 1 else 's'}: {int(elapsed)} s of {total:g} s"
        now = self._clock()
        if self._terminal:
            self._stream.write(f"\r{line}\x1b[K")
        elif self._next is None or now >= self._next or elapsed >= total:
            self._stream.write(line + "\n")
            self._next = now + self._every
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
    """Sample, evaluate and print; return the exit code."""
    try:
        thresholds = thresholds_file.load()
    except thresholds_file.ThresholdsError as error:
        print(
            f"gpuload doctor: {error} (it is alert_rules/thresholds.yaml of the repository)",
            file=err,
        )
        return UNMEASURED
    duration = options.duration if options.duration is not None else warm_up_seconds(thresholds)
    node_name = options.instance or socket.gethostname()
    evaluator = Evaluator(
        thresholds,
        instance=node_name,
        also_keep=states.FAMILIES,
        # Evaluated as often as `gpuload serve` evaluates them (and Prometheus, by default).
        interval=ALERTING.defaults()["alerting.evaluation_interval"],
    )
    progress = Progress(err)
    try:
        if options.prometheus:
            series = sample_prometheus(options.prometheus, options.instance or "", duration)
            replay(evaluator, series)
            identities = identities_of(series)
            source = f"Prometheus {options.prometheus}, instance {options.instance}"
        else:
            clock = None
            if options.simulate:
                from exporter import sim

                # The scenario's first `duration` seconds, on its own clock, from its epoch
                # (by default: so that they end now).
                epoch = options.sim_epoch
                clock = ScenarioClock(time.time() - duration if epoch is None else epoch)
                library = sim.install(
                    options.simulate, epoch=clock.now, clock=clock, seed=options.sim_seed
                )
                clock.settle = library.settle_events
                source = f"the simulated NVML (scenario {options.simulate})"
            else:
                source = "NVML"
            sampled = sample_local(evaluator, duration, options.interval, progress, clock)
            identities = sampled.identities
    except SamplingError as error:
        progress.clear()
        print(f"gpuload doctor: {error}", file=err)
        return UNMEASURED
    finally:
        if options.simulate and not options.prometheus:
            from exporter import sim

            sim.uninstall()
    progress.clear()
    verdicts = states.read(evaluator.evaluated, thresholds, identities)
    if verdicts is None:
        print("gpuload doctor: no samples to evaluate", file=err)
        return UNMEASURED
    reported = xids.reported(evaluator.history, thresholds)
    node = summarize(node_name, list(verdicts.gpus.values()), reported)
    code = exit_code(verdicts)
    if options.json:
        document = {
            "source": source,
            "duration_seconds": duration,
            "exit_code": code,
            "rules": verdicts.to_json(),
            "node": node.to_json(),
            "alerts": [_alert_json(alert) for alert in verdicts.node_alerts],
            "groups": [group.to_json() for group in node.groups],
            "gpus": [
                {
                    **verdict.to_json(),
                    "alerts": [_alert_json(alert) for alert in verdict.alerts],
                    "xids": [xid.to_json(gpu) for xid in reported.get(gpu, [])],
                }
                for gpu, verdict in verdicts.gpus.items()
            ],
        }
        print(json.dumps(document, indent=2), file=out)
    else:
        print(text(node, verdicts, source, duration, code), file=out)
    return code


def exit_code(verdicts: states.Verdicts) -> int:
    """FINDINGS if a GPU needs a person, else UNMEASURED if no GPU's load was judged."""
    gpus = list(verdicts.gpus.values())
    if any(states.needs_a_look(verdict.attention) for verdict in gpus):
        return FINDINGS
    if any(states.needs_a_person(alert) for alert in verdicts.node_alerts):
        return FINDINGS
    if not gpus or all(verdict.attention == "unknown" for verdict in gpus):
        return UNMEASURED
    return HEALTHY


def _alert_json(alert: Alert) -> dict[str, object]:
    """An alert as the status page gives it, with the first steps of its runbook."""
    return {**states.alert_json(alert), "next_steps": runbooks.steps(alert.name)}


def text(node: Node, verdicts: states.Verdicts, source: str, duration: float, code: int) -> str:
    """The report for people: the node's verdict first, then one block per group of GPUs."""
    lines = [node.verdict()]
    for group in node.groups:
        for gpu, found in group.xids.items():
            lines.extend(f"  {xid.text(gpu)}" for xid in found)
    lines.append(f"sampled {states.span_words(duration)} from {source}")
    if verdicts.warming_up:
        need = states.span_words(verdicts.warm_up_seconds)
        lines.append(
            f"warming up: the rules' means need {need} of samples "
            f"and have {states.span_words(verdicts.seen_seconds)}; the load of a GPU in use is "
            f"unmeasured until then (--duration {verdicts.warm_up_seconds:g}s)"
        )
    else:
        lines.append(f"states and figures: the rules' {verdicts.mean_words}s at the end")
    for alert in verdicts.node_alerts:
        lines.append(f"{alert.name} {alert.state}: {alert.annotations.get('summary', '')}")
    lines.append("")
    for group in node.groups:
        lines += _group(group, verdicts.mean_words)
        lines.append("")
    verdict = {
        HEALTHY: "healthy: nothing to do",
        FINDINGS: "findings above: see the next steps",
        UNMEASURED: "could not measure: see above",
    }[code]
    lines.append(f"result: {verdict} (exit {code})")
    return "\n".join(lines)


def _pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f}%"


def _group(group: Group, mean: str) -> list[str]:
    first = group.verdicts[0]
    count = len(group.verdicts)
    model = f"{count} x {first.name}" if count > 1 else f"{first.name}, {first.uuid}"
    busy = group.merged([[f"busy {_pct(v.busy)} ({mean})"] for v in group.verdicts])[0]
    load = f"{first.state}, {busy}"
    if first.state == "lost":
        load = f"lost, no readings ({first.attention})"
    elif states.needs_a_look(first.attention):
        load = f"{first.headline()} ({first.attention}); load {load}"
    reported = [xid for found in group.xids.values() for xid in found]
    if reported and not states.needs_a_look(first.attention) and first.state != "lost":
        codes = ", ".join(sorted({str(xid.code) for xid in reported}, key=int))
        load = f"{load}; reported XID {codes}"
    lines = [f"{group.label}: {load}  ({model})"]
    body: list[str] = []
    # An XID no alert pages on is the application's, as a rule: its meaning and what to do.
    for code, xid in sorted({xid.code: xid for xid in reported if not xid.critical}.items()):
        body.append(f"  XID {code}: {xid.meaning or 'see the XID catalog'}")
        if xid.action:
            body.append(f"    next: {xid.action[0].upper()}{xid.action[1:]}.")
    for position, bottleneck in enumerate(first.bottlenecks):
        if bottleneck.name == "none":
            continue
        values = group.merged([[_pct(v.bottlenecks[position].value)] for v in group.verdicts])[0]
        words = states.BOTTLENECK_WORDS.get(bottleneck.name, bottleneck.name)
        body.append(f"  bottleneck {words} ({values}: {bottleneck.measure})")
    advised: set[str] = set()
    for position, alert in enumerate(first.alerts):
        if "mig_instance" in alert.labels:
            continue
        values = group.merged(
            [
                [a.annotations.get("value", f"{a.value:g}")]
                for a in (v.alerts[position] for v in group.verdicts)
            ]
        )[0]
        body.append(
            f"  {alert.name} {alert.state} ({alert.labels.get('severity', '')}, value {values}): "
            f"{alert.annotations.get('summary', '')}"
        )
        if states.needs_a_person(alert):
            body += _advice(alert.name, alert.annotations.get("runbook_url", ""), advised)
    # A finding is advised even before its alert fires. A class whose pending or firing alert
    # is info only explains performance: advised only where nothing worse needs a person, so
    # that its advice never pulls against a real problem's.
    pending_or_firing = {alert.name for alert in first.alerts}
    worse = first.worst() is not None
    for bottleneck in first.bottlenecks:
        alertname = rules.BOTTLENECK_ALERTS.get(bottleneck.name)
        explains = not worse and alertname in pending_or_firing
        if alertname is not None and (bottleneck.finding or explains):
            body += _advice(alertname, bottleneck.runbook_url, advised)
    # An underutilized GPU with no alert yet is advised as GPUUtilizationLow would be.
    if first.state == "underutilized" and not advised:
        alertname = rules.BOTTLENECK_ALERTS["underutilized"] or ""
        body += _advice(alertname, "", advised)
    summary = first.summary()
    # The summary stands alone only where no line below says it already.
    if not any(summary in line for line in body):
        lines.append(f"  {summary}")
    lines += body
    if first.instances:
        lines.append("  MIG instances:")
    for position, instance in enumerate(first.instances):
        active = group.merged([[_pct(v.instances[position].sm_active)] for v in group.verdicts])[0]
        alerts = ", ".join(f"{a.name} {a.state}" for a in instance.alerts) or "no alert"
        lines.append(
            f"    instance {instance.instance} ({instance.profile}): "
            f"SM active {active} ({mean}); {alerts}"
        )
        for alert in instance.alerts:
            if states.needs_a_person(alert):
                url = alert.annotations.get("runbook_url", "")
                lines += _advice(alert.name, url, advised, indent="      ")
    return lines


def _advice(alertname: str, runbook_url: str, advised: set[str], indent: str = "    ") -> list[str]:
    """An alert's next steps and runbook, once per GPU group (XIDs 64 and 95 are one alert)."""
    if alertname in advised:
        return []
    advised.add(alertname)
    lines = [f"{indent}next: {step}" for step in runbooks.steps(alertname)]
    if runbook_url:
        lines.append(f"{indent}runbook: {runbook_url}")
    return lines
