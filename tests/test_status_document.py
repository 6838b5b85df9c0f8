"""The typed status document holds its invariants on every shipped scenario, and the page says it.

Each scenario runs once in-process on its own clock (:class:`simnode.SimulatedNode`), read at 1,
3, 6 and 10 minutes: inside the rules' warm-up, at its end and well past it. It collects every
30 s and evaluates every minute, a quarter of the default work, so that the 17 scenarios stay
within the suite's budget; the invariants hold whatever the intervals.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from simnode import SimulatedNode
from status_page_helpers import cards, summary

from exporter.alerting import states
from exporter.doctor import command, xids
from exporter.doctor.node import summarize
from exporter.server import document
from exporter.server.status import page
from exporter.sim.scenario import scenario_names

MINUTES = (1, 3, 6, 10)
# Next steps that pull in opposite directions: no GPU's advice may hold both of a pair.
OPPOSITES = [
    (r"smaller (micro-)?batch", r"larger batch|increase the batch size|more sequences per step"),
    (r"lower (the )?power limit", r"raise (the )?power limit"),
    (r"lower (the )?clocks?", r"raise (the )?clocks?"),
    (r"fewer (data-?loader )?workers", r"more (data-?loader )?workers"),
    (r"\bnothing\b", r"\bdrain\b"),
]
DOCS = Path(__file__).parent.parent / "docs" / "status.md"
# Every object of the document -> its TypedDict.
OBJECTS: dict[str, Any] = {
    "document": document.Document,
    "rules": document.Rules,
    "gpu": document.Gpu,
    "bar": document.Bar,
    "clock_event": document.ClockEvent,
    "verdict": document.Verdict,
    "bottleneck": document.Bottleneck,
    "alert": document.Alert,
    "mig_instance": document.MigInstance,
    "summary": document.Summary,
    "alert_counts": document.AlertCounts,
}


def _keys(typed: Any) -> tuple[set[str], set[str]]:
    """(required, optional) keys of a TypedDict."""
    return set(typed.__required_keys__), set(typed.__optional_keys__)


def _has_keys(kind: str, found: dict[str, Any], where: str) -> None:
    required, optional = _keys(OBJECTS[kind])
    keys = set(found)
    assert required <= keys <= required | optional, (where, kind, keys ^ required)


def _check_shape(status: dict[str, Any], where: str) -> None:
    _has_keys("document", status, where)
    if status["rules"] is not None:
        _has_keys("rules", status["rules"], where)
    _has_keys("summary", status["summary"], where)
    for counts in status["summary"]["by_severity"].values():
        _has_keys("alert_counts", counts, where)
    alerts = list(status["alerts"])
    for gpu in status["gpus"]:
        _has_keys("gpu", gpu, where)
        _has_keys("verdict", gpu["verdict"], where)
        for bottleneck in gpu["verdict"]["bottlenecks"]:
            _has_keys("bottleneck", bottleneck, where)
        bars = list(gpu["bars"])
        for instance in gpu["mig"]:
            _has_keys("mig_instance", instance, where)
            bars += instance["bars"]
        for bar in bars:
            _has_keys("bar", bar, where)
        for event in gpu["clock_events"]:
            _has_keys("clock_event", event, where)
        alerts += gpu["alerts"]
    for alert in alerts:
        _has_keys("alert", alert, where)
    # The deprecated keys still say what their new keys say.
    for gpu in status["gpus"]:
        assert gpu["state"] == gpu["collection"], where
        assert gpu["verdict"]["state"] == gpu["verdict"]["activity"], where
    assert all(alert["state"] == alert["phase"] for alert in alerts), where


def _check_counts(status: dict[str, Any], where: str) -> None:
    gpus = status["gpus"]
    alerts = [*status["alerts"], *(a for g in gpus for a in g["alerts"])]
    counts = status["summary"]

    def severity(alert: dict[str, Any]) -> str:
        return alert["severity"] if alert["severity"] in ("critical", "warning") else "info"

    expected = {
        "gpus": len(gpus),
        "lost": sum(g["collection"] == "lost" for g in gpus),
        "stale": sum(g["collection"] == "stale" for g in gpus),
        "faults": sum(g["severity"] == "fault" for g in gpus),
        "warnings": sum(g["severity"] == "warning" for g in gpus),
        "firing": sum(a["phase"] == "firing" and severity(a) != "info" for a in alerts),
        "pending": sum(a["phase"] == "pending" and severity(a) != "info" for a in alerts),
        "info": sum(severity(a) == "info" for a in alerts),
    }
    assert {key: counts[key] for key in expected} == expected, where
    for name, by_phase in counts["by_severity"].items():
        for phase, count in by_phase.items():
            found = sum(severity(a) == name and a["phase"] == phase for a in alerts)
            assert count == found, (where, name, phase)


def _check_levels(node: SimulatedNode, status: dict[str, Any], where: str) -> None:
    alerts = node.thresholds.alert
    below = alerts("GPUUtilizationLow").number("below")
    for gpu in status["gpus"]:
        verdict = gpu["verdict"]
        assert verdict["healthy"] is (verdict["attention"] == "ok"), (where, verdict)
        for alert in gpu["alerts"]:
            assert alert["level"] == document.severity_level(alert["severity"]), (where, alert)
        critical = any(
            a["severity"] == "critical" and a["phase"] == "firing" for a in gpu["alerts"]
        )
        if critical:
            assert verdict["label"] != "Warming up", (where, gpu["index"], verdict)
            assert gpu["severity"] == "fault", (where, gpu["index"])
        bars = {bar["name"].split(" (")[0]: bar for bar in gpu["bars"]}
        util = bars["Utilization"]["ratio"]
        if util is not None and util >= below:
            assert verdict["activity"] != "idle", (where, gpu["index"], util, verdict)
        # Each bar past its alert's threshold has that alert's level, and only then.
        _check_bar(bars["Utilization"], alerts("GPUUtilizationHigh"), "above", where)
        _check_bar(bars["Memory"], alerts("GPUMemoryNearlyFull"), "used_above", where)
        if "DRAM bandwidth" in bars:
            bandwidth = alerts("GPUMemoryBandwidthBound")
            _check_bar(bars["DRAM bandwidth"], bandwidth, "dram_active_above", where)
        for bar in [*gpu["bars"], *(b for m in gpu["mig"] for b in m["bars"])]:
            assert bar["level"] in document.LEVELS, (where, bar)
        # A chip coloured for a person belongs to a GPU that needs one.
        if gpu["xid_level"] in ("warn", "crit"):
            assert gpu["severity"] in ("warning", "fault"), (where, gpu["index"], gpu["xids"])


def _check_bar(bar: dict[str, Any], alert: Any, key: str, where: str) -> None:
    past = bar["ratio"] is not None and bar["ratio"] > alert.number(key)
    expected = document.severity_level(alert.severity) if past else "ok"
    assert bar["level"] == expected, (where, bar)


def _check_page(status: dict[str, Any], where: str) -> None:
    """The page shows what the document says, and every colour on it comes from a level."""
    html = page(status, "/metrics")
    shown = {card.gpu: card for card in cards(html)}
    assert set(shown) == {gpu["index"] for gpu in status["gpus"]}, where
    for gpu in status["gpus"]:
        card = shown[gpu["index"]]
        assert card.severity == gpu["severity"], where
        assert card.verdict == gpu["verdict"]["activity"], where
        assert f"<strong>{gpu['verdict']['label']}</strong>" in card.html, where
        bars = dict(re.findall(r'data-bar="([^"]*)" data-level="([^"]*)"', card.html))
        for bar in gpu["bars"] if gpu["collection"] != "lost" else []:
            assert bars[bar["name"]] == bar["level"], (where, bar)
        for alert in gpu["alerts"]:
            assert f'class="{alert["phase"]} {alert["level"]}" data-alert' in card.html, where
    counts = {k: v for k, v in status["summary"].items() if isinstance(v, int)}
    assert summary(html) == counts, where
    levels = set(re.findall(r'class="(?:bar|chip) ([a-z]+)"', html))
    assert levels <= set(document.LEVELS), (where, levels)


@pytest.mark.parametrize("scenario", scenario_names())
def test_the_document_holds_its_invariants_from_the_first_minute(scenario: str) -> None:
    node = SimulatedNode(scenario, interval=30.0, evaluation_interval=60.0)
    try:
        for minute in MINUTES:
            node.run_until(minute * 60)
            status = node.status.status()
            where = f"{scenario} at {minute} min"
            _check_shape(status, where)
            _check_counts(status, where)
            _check_levels(node, status, where)
            _check_page(status, where)
        _check_doctor(node, f"{scenario} at {MINUTES[-1]} min")
    finally:
        node.close()


def _check_doctor(node: SimulatedNode, where: str) -> None:
    """The doctor's report: next steps for every group that needs a look, none contradicting."""
    evaluator = node.alerting.evaluator
    gpus = node.snapshot.gpus if node.snapshot else ()
    identities = {str(gpu.index): (gpu.name, gpu.uuid) for gpu in gpus}
    verdicts = states.read(evaluator.evaluated, node.thresholds, identities)
    assert verdicts is not None, where
    report = summarize(
        "node", list(verdicts.gpus.values()), xids.reported(evaluator.history, node.thresholds)
    )
    text = command.text(report, verdicts, "sim", 600.0, command.exit_code(verdicts))
    blocks = re.split(r"\n(?=\S)", text)
    for group in report.groups:
        block = next(b for b in blocks if b.startswith(f"{group.label}:"))
        steps = [line.split("next: ", 1)[1] for line in block.splitlines() if "next: " in line]
        if states.needs_a_look(group.verdicts[0].attention) and group.verdicts[0].state != "lost":
            assert steps, (where, block)
        advice = " ".join(steps).lower()
        for one, other in OPPOSITES:
            both = re.search(one, advice) and re.search(other, advice)
            assert not both, (where, group.label, one, other, steps)


def test_the_docs_list_every_key_of_the_document() -> None:
    text = DOCS.read_text()
    for kind, typed in OBJECTS.items():
        section = re.search(rf"^### `{kind}`\n(.*?)(?=^### |\Z)", text, re.S | re.M)
        assert section, f"docs/status.md has no section for {kind}"
        listed = set(re.findall(r"^\| `([a-z_0-9]+)` \|", section.group(1), re.M))
        required, optional = _keys(typed)
        assert listed == required | optional, (kind, listed ^ (required | optional))
