"""A restarted daemon judges from the history it had; a history it cannot use is a cold start.

On the scenario's clock (:class:`simnode.SimulatedNode`): the first daemon saves its history on
stop, the second starts 30 s later on the same GPUs and reads it back at its first collection.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simnode import START, SimulatedNode

from exporter.alerting import history_file

# A cheap scenario (two GPUs) for the files that must not be taken back.
SMALL = "h100-mig"


def _seen(status: dict[str, Any]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """What a person reads of each GPU: its label, its attention and its alerts."""
    return [
        (
            gpu["verdict"]["label"],
            gpu["verdict"]["attention"],
            [(alert["alertname"], alert["phase"]) for alert in gpu["alerts"]],
        )
        for gpu in status["gpus"]
    ]


def test_a_restarted_daemon_shows_the_verdicts_it_had_within_one_cycle(tmp_path: Path) -> None:
    path = tmp_path / "history.json.gz"
    first = SimulatedNode(
        "hung-collective", interval=30.0, evaluation_interval=60.0, history_path=path
    )
    try:
        first.run_until(420)
        before = first.status.status()
        first.alerting.stop()
    finally:
        first.close()
    assert not before["rules"]["warming_up"]
    assert {label for label, _a, _alerts in _seen(before)} == {"Hung"}
    second = SimulatedNode(
        "hung-collective",
        interval=30.0,
        evaluation_interval=60.0,
        history_path=path,
        start=START + 450,
    )
    try:
        second.step()
        after = second.status.status()
    finally:
        second.close()
    assert not after["rules"]["warming_up"], after["rules"]
    assert not any(gpu["verdict"]["provisional"] for gpu in after["gpus"])
    assert _seen(after) == _seen(before)


def test_a_cold_daemon_names_a_hung_collective_provisionally_within_90_s() -> None:
    node = SimulatedNode("hung-collective")
    try:
        node.run_until(30)
        early = node.status.status()
        node.run_until(90)
        status = node.status.status()
    finally:
        node.close()
    # Before the provisional rules' own 1-minute window is whole, nothing is judged.
    assert {gpu["verdict"]["label"] for gpu in early["gpus"]} == {"Warming up"}
    assert status["rules"]["warming_up"] is True
    for gpu in status["gpus"]:
        verdict = gpu["verdict"]
        assert verdict["label"] == "Hung (provisional)", verdict
        assert verdict["provisional"] is True and verdict["attention"] == "warning", verdict
        assert "hung" in [b["bottleneck"] for b in verdict["bottlenecks"]], verdict
        assert "provisional, on 1-min means" in verdict["summary"], verdict


def _document(**changes: Any) -> dict[str, Any]:
    return {
        "format": history_file.FORMAT,
        "saved_at": START - 30,
        "uuids": [],
        "series": [],
        **changes,
    }


def _gzip_json(document: Any) -> bytes:
    return gzip.compress(json.dumps(document).encode())


@pytest.fixture(scope="module")
def small_uuids() -> list[str]:
    """The UUIDs of SMALL's GPUs, as its first collection reads them."""
    node = SimulatedNode(SMALL)
    try:
        return sorted(gpu.uuid for gpu in node.step().gpus)
    finally:
        node.close()


Content = Callable[[list[str]], "bytes | None"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (lambda _u: None, "no file"),
        (lambda _u: b"not gzip at all", "unreadable"),
        (lambda u: _gzip_json(_document(uuids=u))[:20], "unreadable"),
        (lambda _u: _gzip_json({"format": "other"}), "not a gpuload-history/1 document"),
        (
            lambda u: _gzip_json(_document(uuids=u, saved_at=START - 3600)),
            "saved 3600 s ago; expected at most 180 s",
        ),
        (lambda _u: _gzip_json(_document(uuids=["GPU-another"])), "saved from other GPUs"),
        (lambda u: _gzip_json(_document(uuids=u, series=[[1, 2]])), "a damaged series"),
    ],
)
def test_a_history_that_cannot_be_used_is_a_cold_start_and_one_log_line(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    small_uuids: list[str],
    content: Content,
    why: str,
) -> None:
    path = tmp_path / "history.json.gz"
    written = content(small_uuids)
    if written is not None:
        path.write_bytes(written)
    caplog.set_level(logging.INFO, logger=history_file.__name__)
    node = SimulatedNode(SMALL, history_path=path, start=START)
    try:
        node.step()
        status = node.status.status()
    finally:
        node.close()
    lines = [r.getMessage() for r in caplog.records if r.name == history_file.__name__]
    assert len(lines) == 1 and "a cold start" in lines[0] and why in lines[0], lines
    assert status["rules"]["warming_up"] is True
    assert len(status["gpus"]) == len(small_uuids)


def test_a_history_saved_from_this_node_names_its_gpus(tmp_path: Path) -> None:
    path = tmp_path / "history.json.gz"
    node = SimulatedNode(SMALL, history_path=path)
    try:
        node.run_until(60)
        node.alerting.stop()
        uuids = sorted(gpu.uuid for gpu in node.snapshot.gpus) if node.snapshot else []
    finally:
        node.close()
    document = json.loads(gzip.decompress(path.read_bytes()))
    assert document["format"] == history_file.FORMAT and document["uuids"] == uuids
    assert document["saved_at"] == START + 60 and document["series"]
