"""Prometheus, the local evaluator, the doctor and the status page name the same GPU states.

For every GPU and MIG instance, the same state and the same alerts, at every minute.

Each shipped scenario runs for ``MINUTES`` simulated minutes on its own clock, collected every
``STEP`` seconds (Prometheus's default scrape interval) by the exporter's collection cycle. What
a scrape of each snapshot gives (the real text exposition, parsed) is the input of
``promtool test rules`` with the shipped rule files: Prometheus's own rule engine, on the series a
Prometheus scraping the node would store. At each minute it must give the states, bottleneck
classes, means and ``ALERTS`` (pending and firing) that:

- the local evaluator recorded at that minute;
- the status page's JSON (``/api/v1/status``) shows for each GPU;
- ``gpuload doctor --json --simulate SCENARIO --duration M`` reports for the scenario's first M
  minutes (its samples are the same: same clock, same seed).

Prometheus's ``ALERTS`` also holds the alerts a running exporter cannot evaluate (``not_local``),
which are left out of the comparison.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import promtool_test_rules
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimulatedNode

from exporter.alerting import rules
from exporter.alerting.evaluator import not_local
from exporter.alerting.history import Labels, labels_of
from exporter.doctor.command import Options, run
from exporter.server.exposition import TEXT, Exposition
from exporter.sim.scenario import scenario_names
from exporter.snapshot import Snapshot
from tools import RULES_DIR

promtool = shutil.which("promtool")
pytestmark = [
    pytest.mark.skipif(promtool is None, reason="promtool (Prometheus) not installed"),
    pytest.mark.differential,
]

STEP = 15.0
MINUTES = 10
INSTANCE, JOB = "node:19400", "gpuload"
# The scenarios start at Unix time 0, as promtool's series do: a timestamp-valued series
# (gpuload_last_collection_timestamp_seconds) then means the same to both.
START = 0.0


def _scraped(snapshot: Snapshot, exposition: Exposition) -> dict[tuple[str, Labels], float]:
    """What a scrape of the snapshot gives: the text exposition, parsed as Prometheus would."""
    text = exposition.encode(snapshot, TEXT).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, "instance": INSTANCE, "job": JOB}
            found[(sample.name, labels_of(labels))] = float(sample.value)
    return found


def _series_text(name: str, labels: Labels) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}"


def _promtool_values(values: list[float | None]) -> str:
    """One value per step: ``_`` before a series appears, ``stale`` where it went away."""
    words, seen = [], False
    for value in values:
        if value is None:
            words.append("stale" if seen and words[-1] != "stale" and words[-1] != "_" else "_")
        else:
            words.append(repr(value))
            seen = True
    return " ".join(words)


def _local_alerts(alerts: Any) -> list[dict[str, Any]]:
    """ALERTS as Prometheus writes them for the local evaluator's pending and firing alerts."""
    return [
        {
            "labels": _series_text(
                "ALERTS",
                labels_of({**dict(alert.labels), "alertstate": alert.state}),
            ),
            "value": 1,
        }
        for alert in alerts
    ]


def _by_gpu(alerts: list[dict[str, Any]]) -> set[tuple[int, str, str, int | None]]:
    return {(a["gpu"], a["alertname"], a["state"], a.get("mig_instance")) for a in alerts}


def _doctor(scenario: str, minutes: int) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    options = Options(
        duration=minutes * 60,
        interval=STEP,
        simulate=scenario,
        sim_epoch=START,
        instance=INSTANCE,
        json=True,
    )
    code = run(options, out=out, err=err)
    document = json.loads(out.getvalue())
    assert document["exit_code"] == code, err.getvalue()
    return document


@pytest.mark.parametrize("scenario", scenario_names())
def test_prometheus_the_local_evaluator_the_doctor_and_the_status_page_agree(
    scenario: str, tmp_path: Path
) -> None:
    steps = int(MINUTES * 60 / STEP)
    exposition = Exposition()
    scrapes: list[dict[tuple[str, Labels], float]] = []
    node = SimulatedNode(
        scenario,
        interval=STEP,
        evaluation_interval=STEP,
        start=START,
        instance=INSTANCE,
        observe=lambda snapshot: scrapes.append(_scraped(snapshot, exposition)),
    )
    names = rules.recording_names(node.thresholds)
    elsewhere = not_local(node.thresholds)
    expressions: list[dict[str, Any]] = []
    local: dict[int, dict[str, Any]] = {}
    try:
        for step in range(steps + 1):
            node.step()
            if step % 4:
                continue
            minute = step // 4
            evaluated = node.alerting.evaluator.evaluated
            assert evaluated is not None and evaluated.at == START + step * STEP
            at = f"{int(step * STEP)}s"
            for name, series in evaluated.recorded.items():
                expressions.append(
                    {
                        "expr": name,
                        "eval_time": at,
                        "exp_samples": [
                            {"labels": _series_text(name, labels), "value": value}
                            for labels, value in sorted(series.items())
                        ],
                    }
                )
            alerts = [a for a in evaluated.alerts if a.name not in elsewhere]
            expressions.append(
                {
                    "expr": f'ALERTS{{alertname!~"{"|".join(elsewhere)}"}}',
                    "eval_time": at,
                    "exp_samples": _local_alerts(alerts),
                }
            )
            states = {
                dict(labels)["gpu"]: dict(labels)["state"]
                for labels in evaluated.recorded[names["state"]]
            }
            status = node.status.status()
            local[minute] = {
                "states": states,
                "alerts": {
                    (
                        int(a.labels["gpu"]),
                        a.name,
                        a.state,
                        int(a.labels["mig_instance"]) if "mig_instance" in a.labels else None,
                    )
                    for a in alerts
                    if "gpu" in a.labels
                },
                "status": status,
            }
    finally:
        node.close()

    # The status page shows, for every GPU, the recorded state and the evaluation's alerts.
    for minute, seen in local.items():
        cards = {str(card["index"]): card for card in seen["status"]["gpus"]}
        # While the rules warm up, a card shows the provisional rules' verdict (shorter windows),
        # labelled so; the rules' own recorded state is compared from then on.
        judged = {
            gpu: card
            for gpu, card in cards.items()
            if not card["verdict"]["label"].endswith("(provisional)")
        }
        recorded = {gpu: seen["states"].get(gpu, "unknown") for gpu in judged}
        # One exception, which the document states: "idle" recorded on a mean that has yet to
        # follow a GPU busy now (at or above the idle threshold) is shown as "unknown".
        below = node.thresholds.alert("GPUUtilizationLow").number("below")
        for gpu, card in judged.items():
            busy_now = card["bars"][0]["ratio"]
            if recorded[gpu] == "idle" and busy_now is not None and busy_now >= below:
                recorded[gpu] = "unknown"
        assert {gpu: card["verdict"]["state"] for gpu, card in judged.items()} == recorded, (
            f"minute {minute}"
        )
        shown = {
            (card["index"], a["alertname"], a["state"], a.get("mig_instance"))
            for card in cards.values()
            for a in card["alerts"]
        }
        assert shown == seen["alerts"], f"minute {minute}"

    # The doctor, sampling the scenario's first minutes itself, names the same.
    for minute in range(1, MINUTES + 1):
        report = _doctor(scenario, minute)
        seen = local[minute]
        doctor_states = {str(gpu["gpu"]): gpu["state"] for gpu in report["gpus"]}
        assert doctor_states == {
            gpu: seen["states"].get(gpu, "unknown") for gpu in doctor_states
        }, f"minute {minute}"
        doctor_alerts = {
            (gpu["gpu"], a["alertname"], a["state"], a.get("mig_instance"))
            for gpu in report["gpus"]
            for a in gpu["alerts"]
        }
        assert doctor_alerts == seen["alerts"], f"minute {minute}"

    # Prometheus's rule engine on the scraped series.
    keys = sorted({key for scrape in scrapes for key in scrape})
    input_series = [
        {
            "series": _series_text(name, labels),
            "values": _promtool_values([scrape.get((name, labels)) for scrape in scrapes]),
        }
        for name, labels in keys
    ]
    input_series.append(
        {
            "series": _series_text("up", labels_of({"instance": INSTANCE, "job": JOB})),
            "values": " ".join("1" for _ in scrapes),
        }
    )
    document = {
        "rule_files": [str(RULES_DIR / name) for name in rules.rule_files(node.thresholds)],
        "evaluation_interval": f"{int(STEP)}s",
        "group_eval_order": rules.group_names(node.thresholds),
        "tests": [
            {
                "interval": f"{int(STEP)}s",
                "name": scenario,
                "input_series": input_series,
                "promql_expr_test": expressions,
            }
        ],
    }
    promtool_test_rules(tmp_path / "scenario.test.yml", document)
