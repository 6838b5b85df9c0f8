"""`gpuload report --relay-config FILE --target NAME`: one message through the relay's targets.

A report of many lines (no Prometheus needed: its lines are built directly) goes to real HTTP
servers on 127.0.0.1 standing in for Slack, Discord and a webhook, through the relay's own target
code and configuration file: each message keeps to its service's limits and ends what it cut
with "and N more"; a target that refuses it is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay_helpers import FakeTarget, write_config

from exporter.relay.targets import discord, slack
from exporter.report import command
from exporter.report.ledger import Line, Prices, Report
from exporter.report.period import parse

NOW = dt.datetime(2026, 12, 8, 6, 0, tzinfo=dt.timezone.utc)


def many_lines(count: int) -> Report:
    lines = []
    for index in range(count):
        line = Line(
            {
                "namespace": f"team-{index:03d}",
                "owner_kind": "Deployment",
                "owner_name": f"serve-{index}",
            }
        )
        line.states["underutilized"] = 168.0
        line.used_states["underutilized"] = float(index)
        line.models["NVIDIA H100 80GB HBM3"] = 168.0
        line.cost = 168.0 * 2.5
        lines.append(line)
    lines.sort(key=lambda line: -line.idle)
    return Report(
        period=parse(now=NOW, last_week=True),
        by="owner",
        lines=tuple(lines),
        coverage=0.998,
        coverages={"gpu-node-7:19400": 0.998},
        first_data=0.0,
        prices=Prices({"H100": 2.5}),
    )


@pytest.fixture
def receiver() -> Iterator[FakeTarget]:
    target = FakeTarget()
    yield target
    target.close()


def options(config: Path, target: str) -> argparse.Namespace:
    return argparse.Namespace(
        relay_config=str(config), target=target, output="table", min_coverage=0.95
    )


def configure(folder: Path, url: str) -> Path:
    return write_config(
        folder,
        {
            "targets": {
                "chat": {"type": "slack", "url": url},
                "gamers": {"type": "discord", "url": url},
                "hook": {"type": "webhook", "url": url},
            },
            "route": {"targets": ["hook"]},
        },
    )


def test_slack_gets_one_message_within_its_limits_ending_and_n_more(
    tmp_path: Path, receiver: FakeTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    config = configure(tmp_path, receiver.url)
    code = command.emit(many_lines(80), options(config, "chat"), "http://prometheus")
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out == "sent to chat (slack): HTTP 200 delivered\n"
    (request,) = receiver.requests
    blocks = request.json()["blocks"]
    assert len(blocks) <= slack.BLOCK_LIMIT
    texts = [block["text"]["text"] for block in blocks if "text" in block]
    assert sum(len(text) for text in texts) <= slack.MESSAGE_LIMIT
    assert all(len(text) <= slack.TEXT_LIMIT for text in texts)
    text = json.dumps(blocks, ensure_ascii=False)
    # The most idle first: serve-0 used nothing.
    assert "team-000 Deployment/serve-0: 168.0 idle GPU-hours of 168.0 allocated (0% used)" in text
    shown = text.count("idle GPU-hours of")
    assert shown < 80
    assert f"and {80 - shown} more" in text


def test_discord_keeps_to_ten_embeds(
    tmp_path: Path, receiver: FakeTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    config = configure(tmp_path, receiver.url)
    assert command.emit(many_lines(30), options(config, "gamers"), "http://prometheus") == 0
    body = receiver.requests[0].json()
    assert len(body["embeds"]) <= discord.EMBED_LIMIT
    assert "and 21 more" in json.dumps(body, ensure_ascii=False)


def test_a_webhook_gets_every_line_as_an_alert_ranked(
    tmp_path: Path, receiver: FakeTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    config = configure(tmp_path, receiver.url)
    assert command.emit(many_lines(5), options(config, "hook"), "http://prometheus") == 0
    alerts = receiver.requests[0].json()["alerts"]
    assert [a["labels"]["rank"] for a in alerts] == ["1", "2", "3", "4", "5"]
    assert alerts[0]["labels"]["owner_name"] == "serve-0"
    assert alerts[0]["annotations"]["description"].startswith(
        "GPU-hours 2026-11-30 00:00 to 2026-12-07 00:00 (UTC), coverage 99.8%"
    )


def test_a_target_that_refuses_the_message_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusing = FakeTarget(lambda _request: (400, {}, b"invalid_blocks"))
    try:
        config = configure(tmp_path, refusing.url)
        code = command.emit(many_lines(3), options(config, "chat"), "http://prometheus")
    finally:
        refusing.close()
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith("gpuload report: target chat (slack) refused the report: ")
    assert "invalid_blocks" in err
    assert err.count("\n") == 1
    code = command.emit(many_lines(3), options(config, "nobody"), "http://prometheus")
    _, err = capsys.readouterr()
    assert code == 2
    assert err == (
        f"gpuload report: --target 'nobody': no such target in {config} (chat, gamers, hook)\n"
    )
