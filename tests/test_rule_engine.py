"""The rule engine against Prometheus: generated series, the same alerts, states and timings.

The local evaluator evaluates the shipped rule files with gpuload's own PromQL engine. Here each
generated case (tests/rule_cases.py: GPUs moving between behaviours on both sides of every
threshold, faults, failed scrapes, restarts) runs through the local evaluator, and what it gives
at every minute (the firing alerts with their labels and rendered annotations, the recorded
states ``gpu:gpu_state:5m`` and ``gpu:gpu_bottleneck:class5m`` with their exact values) is
written as the expectations of a ``promtool test rules`` file over the same series. promtool
evaluates the same rule files and must agree on all of it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import promtool_test_rules

from exporter.alerting import thresholds
from exporter.alerting.evaluator import Evaluator, local_rules
from exporter.alerting.history import Sample
from tests import rule_cases
from tools.vectors import INSTANCE, JOB, Case, Check, Expected, to_promtool

CASES = 120
SHARDS = 6
promtool = shutil.which("promtool")
pytestmark = [
    pytest.mark.skipif(promtool is None, reason="promtool (Prometheus) not installed"),
    pytest.mark.differential,
]


def _exporter_labels(labels: dict[str, str], rule_labels: dict[str, str]) -> dict[str, str]:
    dropped = {"instance", "job", "alertname", *rule_labels}
    return {k: v for k, v in labels.items() if k not in dropped}


def run_case(seed: int, loaded: thresholds.Thresholds) -> tuple[Case, list[dict[str, Any]]]:
    """The case with the local evaluator's alerts as its checks, and its state expectations."""
    series, description = rule_cases.case(seed)
    rules = {rule.name: rule for rule in local_rules(loaded)}
    evaluator = Evaluator(loaded, instance=INSTANCE, job=JOB)
    checks, states = [], []
    for step in range(rule_cases.STEPS):
        at = step * rule_cases.STEP
        samples = [
            Sample(s.name, s.labels, float(value))
            for s in series
            for value in [s.values[step]]
            if isinstance(value, float)
        ]
        evaluator.observe(samples, at)
        if step % 4:
            continue
        firing = tuple(
            Expected(
                alert.name,
                _exporter_labels(dict(alert.labels), dict(rules[alert.name].labels)),
                alert.value,
            )
            for alert in evaluator.firing()
        )
        checks.append(Check(at, firing))
        evaluated = evaluator.evaluated
        assert evaluated is not None and evaluated.at == at
        # The states and the means they were judged on, as the doctor and status page read them.
        for name, samples_now in evaluated.recorded.items():
            states.append(
                {
                    "expr": name,
                    "eval_time": f"{int(at)}s",
                    "exp_samples": [
                        {"labels": _series_text(name, labels), "value": value}
                        for labels, value in sorted(samples_now.items())
                    ],
                }
            )
    case = Case(f"seed {seed}: {description}", rule_cases.STEP, tuple(rules), series, tuple(checks))
    return case, states


def _series_text(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}"


@pytest.mark.parametrize("shard", range(SHARDS))
def test_promtool_gives_the_local_alerts_and_states_on_generated_series(
    shard: int, tmp_path: Path
) -> None:
    loaded = thresholds.load()
    cases, states = [], []
    for seed in range(shard, CASES, SHARDS):
        case, expected_states = run_case(seed, loaded)
        cases.append(case)
        states.append(expected_states)
    document = to_promtool(cases, loaded)
    for test, expressions in zip(document["tests"], states, strict=True):
        test["promql_expr_test"] = expressions
    fired = {e.alertname for case in cases for check in case.checks for e in check.firing}
    promtool_test_rules(tmp_path / "generated.test.yml", document)
    # The cases reach the alerts they are built for (a shard that fires nothing proves little).
    assert len(fired) >= 8, sorted(fired)


def test_the_generated_cases_fire_every_alert_that_can_fire_locally() -> None:
    """Across all shards, every local alert but the 30-minute GPUIdleAllocated fires somewhere."""
    loaded = thresholds.load()
    fired: set[str] = set()
    for seed in range(0, CASES, 2):
        case, _ = run_case(seed, loaded)
        fired |= {e.alertname for check in case.checks for e in check.firing}
    wanted = {rule.name for rule in local_rules(loaded)} - {"GPUIdleAllocated"}
    assert wanted - fired == set()
