"""The status page's verdicts are the states the shipped rules recorded, read from one evaluation.

Each test runs a scenario in-process on its own clock (:class:`simnode.SimulatedNode`): minutes of
a scenario take seconds, and every run reads the same samples at the same times.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from simnode import SimulatedNode
from status_page_helpers import cards

from exporter.alerting import rules
from exporter.alerting.evaluator import Evaluated, warm_up_seconds
from exporter.server.status import StatusPage, alert_document, page

# Seconds into a scenario once every rule's window is whole (the warm-up is 6 minutes).
SETTLED = 420
# Seconds into a scenario well inside the warm-up.
WARMING = 30
MEAN = "(5-min mean)"
NOW = "(now)"


@contextmanager
def node_at(scenario: str, seconds: float) -> Iterator[SimulatedNode]:
    """A simulated node that has run ``seconds`` into ``scenario``."""
    node = SimulatedNode(scenario)
    try:
        node.run_until(seconds)
        yield node
    finally:
        node.close()


def _evaluated(node: SimulatedNode) -> Evaluated:
    evaluated = node.alerting.evaluator.evaluated
    assert evaluated is not None, "no evaluation yet"
    return evaluated


def _recorded_by_gpu(node: SimulatedNode, role: str) -> dict[str, tuple[dict[str, str], float]]:
    """GPU -> (labels, value) of the recorded series of ``role`` at the last evaluation."""
    name = rules.recording_names(node.thresholds)[role]
    found = {}
    for labels, value in _evaluated(node).recorded.get(name, {}).items():
        label = dict(labels)
        found[label["gpu"]] = (label, value)
    return found


def _html(node: SimulatedNode) -> str:
    return page(node.status.status(), "/metrics")


def _text(html: str) -> str:
    """What a person reads of some HTML."""
    return re.sub(r"<[^>]+>", "", html)


def test_a_hung_collective_is_named_on_every_card() -> None:
    with node_at("hung-collective", SETTLED) as node:
        status = node.status.status()
    assert len(status["gpus"]) == 8
    for gpu in status["gpus"]:
        verdict = gpu["verdict"]
        assert "hung" in [b["bottleneck"] for b in verdict["bottlenecks"]], verdict
        hung = [a for a in gpu["alerts"] if a["alertname"] == "GPUJobHung"]
        assert hung and hung[0]["state"] in ("pending", "firing"), gpu["alerts"]
        assert verdict["attention"] == "warning" and gpu["severity"] == "warning"
        assert "healthy" not in verdict["summary"].lower(), verdict["summary"]
        assert verdict["label"] == "Hung", verdict
        assert verdict["runbook_url"].endswith("#gpujobhung")


@pytest.mark.parametrize(
    "scenario", ["training", "data-starved", "h100-mig", "fell-off-bus", "a100-mig"]
)
def test_each_verdict_is_the_state_the_rules_recorded(scenario: str) -> None:
    with node_at(scenario, SETTLED) as node:
        status = node.status.status()
        recorded_states = _recorded_by_gpu(node, "state")
        busy = _recorded_by_gpu(node, "busy")
        alerts = _evaluated(node).alerts
    assert status["rules"]["warming_up"] is False
    assert {str(gpu["index"]) for gpu in status["gpus"]} == set(recorded_states)
    for gpu in status["gpus"]:
        key = str(gpu["index"])
        verdict = gpu["verdict"]
        assert verdict["state"] == recorded_states[key][0]["state"], (key, verdict)
        # The label is the state, or the first finding of a GPU that needs a person.
        if verdict["healthy"]:
            assert verdict["label"] == verdict["state"].capitalize()
        else:
            finding = next((b for b in verdict["bottlenecks"] if b["finding"]), None)
            if finding is not None and verdict["state"] != "lost":
                assert verdict["label"].lower() == finding["bottleneck"].replace("_", "-")
        assert verdict["busy_5m"] == (busy[key][1] if key in busy else None), (key, verdict)
        # Its alerts are the evaluation's on this GPU, not another read's.
        on_gpu = [alert_document(a) for a in alerts if a.labels.get("gpu") == key]
        assert sorted(gpu["alerts"], key=repr) == sorted(on_gpu, key=repr)
        assert gpu["severity"] == verdict["attention"], gpu


def test_a_mig_gpu_busy_above_the_low_threshold_is_never_called_idle() -> None:
    node = SimulatedNode("h100-mig")
    try:
        below = node.thresholds.alert("GPUUtilizationLow").number("below")
        judged = 0
        for minute in range(9):
            node.run_until(minute * 60)
            for gpu in node.status.status()["gpus"]:
                busy = gpu["verdict"]["busy_5m"]
                if busy is not None and busy >= below:
                    judged += 1
                    assert gpu["verdict"]["label"] != "Idle", (minute, gpu["verdict"])
                    assert gpu["verdict"]["state"] != "idle", (minute, gpu["verdict"])
    finally:
        node.close()
    assert judged, "no GPU had a busy mean above the threshold"


def test_evidence_gives_means_and_bars_give_readings_now() -> None:
    with node_at("data-starved", SETTLED) as node:
        status = node.status.status()
        html = page(status, "/metrics")
    for gpu in status["gpus"]:
        verdict = gpu["verdict"]
        names = {a["alertname"] for a in gpu["alerts"]}
        assert verdict["evidence"], verdict
        assert verdict["evidence"][0] == f"busy {verdict['busy_5m'] * 100:.0f}% {MEAN}"
        for line in verdict["evidence"]:
            named = line.split(":")[0].split(" (")[0] in names
            # A class's value says what it is, with its window ("utilization, 5-min mean").
            windowed = line.endswith(MEAN) or line.endswith(" 5-min mean)")
            assert windowed or named, line
        assert verdict["runbook_url"], verdict
        assert all(bar["name"].endswith(NOW) for bar in gpu["bars"]), gpu["bars"]
    shown = cards(html)
    assert len(shown) == 8
    for card in shown:
        bars = re.findall(r'data-bar="([^"]*)"', card.html)
        assert bars and all(bar.endswith(NOW) for bar in bars), bars
        assert "input-starved" in _text(card.html)


def test_bars_of_mig_instances_are_readings_now() -> None:
    with node_at("h100-mig", SETTLED) as node:
        status = node.status.status()
        html = page(status, "/metrics")
    instances = [m for gpu in status["gpus"] for m in gpu["mig"]]
    assert instances
    assert all(bar["name"].endswith(NOW) for m in instances for bar in m["bars"])
    assert all(m["sm_active_text"].endswith(MEAN) for m in instances), instances
    bars = re.findall(r'data-bar="([^"]*)"', html)
    assert "3g.40gb #1 (now)" in bars and "SM active (now)" in bars


def test_the_page_says_it_is_warming_up_until_the_windows_are_whole() -> None:
    node = SimulatedNode("training")
    try:
        node.run_until(WARMING)
        early = node.status.status()
        early_html = page(early, "/metrics")
        node.run_until(SETTLED)
        late = node.status.status()
        late_html = page(late, "/metrics")
        warm_up = warm_up_seconds(node.thresholds)
    finally:
        node.close()
    assert early["rules"]["warming_up"] is True
    assert early["rules"]["warm_up_seconds"] == warm_up
    assert early["rules"]["seen_seconds"] == WARMING
    for gpu in early["gpus"]:
        verdict = gpu["verdict"]
        assert verdict["label"] == "Warming up", verdict
        assert verdict["state"] in rules.STATES, verdict  # the recorded state is still given
        assert f"need {warm_up / 60:.0f} min of samples, {WARMING} s so far" in verdict["summary"]
    assert 'id="warming-up"' in early_html and "Warming up" in _text(early_html)
    assert late["rules"]["warming_up"] is False
    assert all(gpu["verdict"]["label"] != "Warming up" for gpu in late["gpus"])
    assert 'id="warming-up"' not in late_html and "Warming up" not in late_html


@pytest.mark.parametrize(("scenario", "gpm"), [("h100-mig", True), ("a100-mig", False)])
def test_mig_rows_say_no_gpm_only_where_there_is_none(scenario: str, gpm: bool) -> None:
    with node_at(scenario, WARMING) as node:
        status = node.status.status()
        html = page(status, "/metrics")
    mig_gpus = [gpu for gpu in status["gpus"] if gpu["mig"]]
    assert mig_gpus
    shown = {card.gpu: card.html for card in cards(html)}
    for gpu in mig_gpus:
        text = _text(shown[gpu["index"]])
        if gpm:
            assert "no GPM" not in text and "n/a" not in text.split("MIG instances")[1], text
            assert "SM activity warming up" in text
        else:
            assert "SM activity n/a (no GPM)" in text
            assert "warming up" not in text.split("MIG instances")[1]


def test_a_gpu_that_falls_off_the_bus_keeps_a_name_and_uuid_on_its_card() -> None:
    node = SimulatedNode("fell-off-bus")
    try:
        for minute in range(8):
            node.run_until(minute * 60)
            status = node.status.status()
            assert len(status["gpus"]) == 8, minute
            for gpu in status["gpus"]:
                assert gpu["name"] and gpu["uuid"], (minute, gpu)
            html = page(status, "/metrics")
            assert "<small></small>" not in html and '<p class="uuid"> &middot;' not in html
        lost = status["gpus"][3]
    finally:
        node.close()
    assert lost["state"] == "lost" and lost["verdict"]["state"] == "lost"
    assert lost["verdict"]["label"] == "Lost" and lost["severity"] == "fault"


def test_without_local_alerting_no_card_has_a_verdict() -> None:
    with node_at("fell-off-bus", 90) as node:
        bare = StatusPage(lambda: node.snapshot, "/metrics", None, 15.0, hostname="node")
        status: dict[str, Any] = bare.status()
    assert status["rules"] is None
    for gpu in status["gpus"]:
        assert gpu["verdict"]["state"] == "unknown" and gpu["verdict"]["label"] == "Unknown"
        assert gpu["severity"] == ("fault" if gpu["state"] == "lost" else "unknown"), gpu
        assert gpu["alerts"] == []
