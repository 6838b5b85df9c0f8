"""Shared alert test vectors: series in, alerts out, for Prometheus and the local evaluator alike.

A vector file in ``alert_rules/vectors/`` holds cases. Each case gives input series in promtool's
expanding notation (``0.29x20``, ``0+1x10``, ``stale``; ``_`` only before a series' first value,
because Prometheus looks back over a later gap and the exporter does not), the alerts it is
about, and checks: at a time, which of those alerts fire, with which labels and value. Every
series and expected alert also gets ``instance="n1:19400"`` and ``job="gpuload"``, the target
labels Prometheus would add; ``severity`` and ``alertname`` come from the rule. A case without
``gpuload_last_collection_timestamp_seconds`` gets one, the time of every step, as an exporter
exports it with every scrape.

:func:`to_promtool` turns a file into a ``promtool test rules`` file against the shipped rule
files, with the expected annotations rendered from the rule's templates and the expected value;
:func:`run_local` feeds the same series through :class:`~exporter.alerting.evaluator.Evaluator`
and returns every disagreement. A test runs both, so Prometheus, the local evaluator and the
vectors must all agree.

``python -m tools.vectors --out DIR`` writes the promtool files for a look by hand.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from exporter.alerting import templates
from exporter.alerting.evaluator import Evaluator, local_rules
from exporter.alerting.history import Labels, Sample
from exporter.alerting.rules import COLLECTED_AT, group_names
from exporter.alerting.thresholds import Thresholds, duration_seconds, load
from tools import RULES_DIR

VECTORS_DIR = RULES_DIR / "vectors"
INSTANCE = "n1:19400"
JOB = "gpuload"
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_EXPANDING = re.compile(r"^(-?[0-9.e+]+?)(?:([+-])([0-9.e+]+))?x(\d+)$")
STALE = "stale"


class VectorError(ValueError):
    """A vector file is malformed; the message names the file and the case."""


@dataclass(frozen=True)
class Series:
    """One input series: its name, labels and one value (or None, or STALE) per step."""

    name: str
    labels: Labels
    values: tuple[float | str | None, ...]

    def text(self) -> str:
        """The series in PromQL notation, with the target labels."""
        pairs = (*self.labels, ("instance", INSTANCE), ("job", JOB))
        inner = ",".join(f'{k}="{v}"' for k, v in pairs)
        return f"{self.name}{{{inner}}}"


@dataclass(frozen=True)
class Expected:
    """An alert expected to fire: its name, its labels besides the rule's, and its value."""

    alertname: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Check:
    """At ``at`` seconds, exactly these alerts of the case's alerts fire."""

    at: float
    firing: tuple[Expected, ...]


@dataclass(frozen=True)
class Case:
    """One scenario of a vector file."""

    name: str
    interval: float
    alerts: tuple[str, ...]
    series: tuple[Series, ...]
    checks: tuple[Check, ...]


def parse_series(text: str) -> tuple[str, Labels]:
    """``name{a="b"}`` -> (name, sorted labels)."""
    match = _SERIES.match(text.strip())
    if not match:
        raise ValueError(f"not a series: {text!r}")
    name, inner = match.group(1), match.group(2) or ""
    labels = dict(_LABEL.findall(inner))
    return name, tuple(sorted(labels.items()))


def expand(values: str) -> list[float | str | None]:
    """Expand promtool's notation: ``1 2 3``, ``0.3x4``, ``0+1x3``, ``_``, ``_x3``, ``stale``."""
    out: list[float | str | None] = []
    for token in str(values).split():
        if token == STALE:
            out.append(STALE)
        elif token == "_":
            out.append(None)
        elif token.startswith("_x"):
            out.extend([None] * int(token[2:]))
        else:
            match = _EXPANDING.match(token)
            if match is None:
                out.append(float(token))
                continue
            start, sign, step, count = match.groups()
            delta = float(step or 0) * (-1 if sign == "-" else 1)
            # Added step by step as promtool does, so both see the same floats: a rate at a
            # threshold must compare alike.
            value = float(start)
            for _ in range(int(count) + 1):
                out.append(value)
                value += delta
    return out


def load_case(entry: Mapping[str, Any], where: str) -> Case:
    """Validate one case of a vector file."""
    try:
        interval = float(duration_seconds(str(entry["interval"])))
        alerts = tuple(entry["alerts"])
        series = []
        for item in entry["series"]:
            name, labels = parse_series(item["series"])
            values = tuple(expand(item["values"]))
            first = next((i for i, v in enumerate(values) if v is not None), len(values))
            if any(v is None for v in values[first:]):
                raise VectorError(
                    f"{where}: {item['series']}: `_` after a value (write `stale`: the exporter "
                    "has no lookback over a gap)"
                )
            series.append(Series(name, labels, values))
        checks = []
        for check in entry["checks"]:
            at = float(duration_seconds(str(check["at"])))
            firing = tuple(
                Expected(e["alertname"], dict(e.get("labels", {})), float(e["value"]))
                for e in check.get("firing") or []
            )
            unknown = {e.alertname for e in firing} - set(alerts)
            if unknown:
                raise VectorError(f"{where}: expects {sorted(unknown)}, not in its alerts")
            checks.append(Check(at, firing))
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, VectorError):
            raise
        raise VectorError(f"{where}: {error}") from error
    if not any(item.name == COLLECTED_AT for item in series):
        # The exporter's time of collection, every step, as every gpuload exports it: the short
        # means divide by it.
        steps = max((len(item.values) for item in series), default=0)
        series.append(Series(COLLECTED_AT, (), tuple(step * interval for step in range(steps))))
    return Case(str(entry.get("name", where)), interval, alerts, tuple(series), tuple(checks))


def load_file(path: Path) -> list[Case]:
    """The cases of one vector file."""
    # Every scalar as a string, as promtool reads values: YAML 1.1 would read `0x20` as hex 32.
    document = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    return [
        load_case(entry, f"{path.name} case {i} ({entry.get('name', '?')})")
        for i, entry in enumerate(document["cases"])
    ]


def vector_files() -> list[Path]:
    """The shipped vector files."""
    return sorted(VECTORS_DIR.glob("*.yml"))


def expected_alert(
    expected: Expected, rules: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, str]]:
    """The full labels and rendered annotations an expected alert must have."""
    rule = rules[expected.alertname]
    labels = {
        **expected.labels,
        "instance": INSTANCE,
        "job": JOB,
        **rule.labels,
        "alertname": expected.alertname,
    }
    annotations = {
        name: templates.render(text, labels, expected.value)
        for name, text in rule.annotations.items()
    }
    return labels, annotations


def _promtool_value(value: float | str | None) -> str:
    if value is None:
        return "_"
    if value == STALE:
        return STALE
    return repr(float(value))


def to_promtool(cases: Sequence[Case], thresholds: Thresholds) -> dict[str, Any]:
    """A ``promtool test rules`` document for the cases, against the shipped rule files."""
    rules = {rule.name: rule for rule in local_rules(thresholds)}
    groups = []
    for case in cases:
        interval = f"{int(case.interval)}s"
        tests = []
        for check in case.checks:
            for name in case.alerts:
                exp_alerts = []
                for expected in check.firing:
                    if expected.alertname != name:
                        continue
                    labels, annotations = expected_alert(expected, rules)
                    labels.pop("alertname")
                    exp_alerts.append({"exp_labels": labels, "exp_annotations": annotations})
                tests.append(
                    {"eval_time": f"{int(check.at)}s", "alertname": name, "exp_alerts": exp_alerts}
                )
        groups.append(
            {
                "interval": interval,
                "name": case.name,
                "input_series": [
                    {
                        "series": series.text(),
                        "values": " ".join(_promtool_value(v) for v in series.values),
                    }
                    for series in case.series
                ],
                "alert_rule_test": tests,
            }
        )
    return {
        "rule_files": [str(RULES_DIR / name) for name in _rule_files()],
        "evaluation_interval": groups_interval(cases),
        "group_eval_order": group_names(thresholds),
        "tests": groups,
    }


def groups_interval(cases: Sequence[Case]) -> str:
    """The evaluation interval of a file: every case of a file shares its series interval."""
    intervals = {case.interval for case in cases}
    if len(intervals) != 1:
        raise VectorError("every case of a vector file must use the same interval")
    return f"{int(intervals.pop())}s"


def _rule_files() -> list[str]:
    return ["gpuload-recording.rules.yml", "gpuload-alerts.rules.yml"]


def run_local(case: Case, thresholds: Thresholds) -> list[str]:
    """Feed a case's series through the local evaluator; return each disagreement as text."""
    evaluator = Evaluator(thresholds, instance=INSTANCE, job=JOB)
    rules = {rule.name: rule for rule in local_rules(thresholds)}
    steps = max(len(series.values) for series in case.series)
    checks = {round(check.at / case.interval): check for check in case.checks}
    problems = []
    for step in range(max(steps, max(checks, default=0) + 1)):
        at = step * case.interval
        samples = [
            Sample(series.name, series.labels, float(value))
            for series in case.series
            if step < len(series.values)
            for value in [series.values[step]]
            if isinstance(value, float)
        ]
        evaluator.observe(samples, at)
        check = checks.get(step)
        if check is not None:
            problems.extend(_compare(case, check, evaluator, rules))
    return problems


def _compare(case: Case, check: Check, evaluator: Evaluator, rules: Mapping[str, Any]) -> list[str]:
    actual = {
        tuple(sorted(alert.labels.items())): alert
        for alert in evaluator.firing()
        if alert.name in case.alerts
    }
    problems = []
    for expected in check.firing:
        labels, annotations = expected_alert(expected, rules)
        key = tuple(sorted(labels.items()))
        alert = actual.pop(key, None)
        where = f"{case.name} at {int(check.at)}s: {expected.alertname} {expected.labels}"
        if alert is None:
            problems.append(f"{where}: expected to fire, does not")
            continue
        if not math.isclose(alert.value, expected.value, rel_tol=1e-6, abs_tol=1e-9):
            problems.append(f"{where}: value {alert.value!r}, expected {expected.value!r}")
        if dict(alert.annotations) != annotations:
            problems.append(f"{where}: annotations {dict(alert.annotations)} != {annotations}")
    for alert in actual.values():
        problems.append(
            f"{case.name} at {int(check.at)}s: {alert.name} {dict(alert.labels)} fires unexpectedly"
        )
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Write the promtool files of the shipped vectors into ``--out``; check them locally."""
    parser = argparse.ArgumentParser(prog="python -m tools.vectors", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for the promtool files")
    args = parser.parse_args(argv)
    thresholds = load()
    args.out.mkdir(parents=True, exist_ok=True)
    status = 0
    for path in vector_files():
        cases = load_file(path)
        target = args.out / path.name.replace(".yml", ".test.yml")
        target.write_text(yaml.safe_dump(to_promtool(cases, thresholds), sort_keys=False))
        print(f"{target}: promtool test rules {target}")
        for case in cases:
            for problem in run_local(case, thresholds):
                print(f"local evaluator: {problem}", file=sys.stderr)
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
