"""Whole-message limits, escaping, answers and signatures of every target, per the services' docs.

Each target is driven with 1, 24, 64 and 500 alerts and its message checked against the
limit the service documents (the URL is beside each limit in the target's module).
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import FakeTarget, alert, notification, target_config, write_config

from exporter.cli import main
from exporter.relay import payload, targets
from exporter.relay.config import Secret
from exporter.relay.targets.discord import embed_characters
from exporter.relay.templates import MessageSettings

SETTINGS = MessageSettings(grafana_url="https://grafana.example.com")
NOW = 1_767_000_000.0
COUNTS = (1, 24, 64, 500)
EVIL_RUNBOOK = "https://ok.example|Runbook> <!channel> <https://evil.example"


def build(kind: str, **options: Any) -> targets.Target:
    options.setdefault("url", Secret("https://hooks.example.com/services/T0/B0/secret"))
    if kind == "pagerduty":
        options.setdefault("routing_key", Secret("R" * 32))
    return targets.build(target_config(kind, **options), SETTINGS)


def parsed(document: dict[str, Any]) -> payload.Notification:
    return payload.parse(json.dumps(document))


def storm(count: int, **annotations: str) -> payload.Notification:
    """`count` alerts of about 500 characters each, with text that every markup reserves."""
    alerts = []
    for i in range(count):
        item = alert(gpu=str(i % 8), instance=f"node-{i}:19400")
        item["annotations"]["description"] = (
            f"GPU {i % 8} on node-{i} is at 91 °C & rising <fast>, above its slowdown "
            "threshold [see dmesg] for *more* than five minutes; the workload `train.py` "
            "is throttled and jobs_on_this_node will run slower until it cools down. "
            "Check the fans, the airflow and the power limit of the chassis."
        )
        item["annotations"].update(annotations)
        alerts.append(item)
    return parsed(notification(*alerts))


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _slack(body: dict[str, Any], request: bytes) -> str:
    # 50 blocks, header 150, section text 3000:
    # https://api.slack.com/reference/block-kit/blocks ; the whole message's block text is
    # refused past about 13,200 characters (msg_blocks_too_long):
    # https://github.com/slackapi/bolt-js/issues/2509
    blocks = body["blocks"]
    assert 1 <= len(blocks) <= 50
    assert utf16(blocks[0]["text"]["text"]) <= 150
    texts = [block["text"]["text"] for block in blocks]
    assert all(utf16(text) <= 3000 for text in texts[1:])
    assert sum(utf16(text) for text in texts) <= 12_000
    return "\n".join(texts)


def _teams(body: dict[str, Any], request: bytes) -> str:
    # 28 KB per message: https://learn.microsoft.com/en-us/microsoftteams/platform/
    # webhooks-and-connectors/how-to/add-incoming-webhook
    assert len(request) <= 28_000
    card = body["attachments"][0]["content"]
    return json.dumps(card["body"], ensure_ascii=False)


def _discord(body: dict[str, Any], request: bytes) -> str:
    # https://discord.com/developers/docs/resources/message#embed-object-embed-limits
    assert utf16(body["content"]) <= 2000
    assert len(body["embeds"]) <= 10
    for embed in body["embeds"]:
        assert utf16(embed.get("title", "")) <= 256
        assert utf16(embed.get("description", "")) <= 4096
    total = sum(utf16(e.get("title", "")) + utf16(e.get("description", "")) for e in body["embeds"])
    assert total <= 6000 and embed_characters(body["embeds"]) <= 6000
    return "\n".join(e.get("description", "") for e in body["embeds"])


def _pagerduty(body: dict[str, Any], request: bytes) -> str:
    # https://developer.pagerduty.com/docs/events-API-v2/trigger-events (summary 1024 characters)
    # and the Events API v2 overview (512 KB per event)
    assert len(request) <= 512 * 1024
    assert len(body["payload"]["summary"]) <= 1024
    return json.dumps(body, ensure_ascii=False)


def _dingtalk(body: dict[str, Any], request: bytes) -> str:
    # https://open.dingtalk.com/document/orgapp/custom-robot-access (20000 bytes per body)
    assert len(request) <= 20_000
    return str(body["markdown"]["text"])


def _feishu(body: dict[str, Any], request: bytes) -> str:
    # https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot (20 KB per body)
    assert len(request) <= 20_000
    return str(body["card"]["elements"][0]["text"]["content"])


def _wecom(body: dict[str, Any], request: bytes) -> str:
    # https://developer.work.weixin.qq.com/document/path/91770 (markdown content 4096 bytes)
    content = body["markdown"]["content"]
    assert len(content.encode()) <= 4096
    return str(content)


LIMITS: dict[str, Callable[[dict[str, Any], bytes], str]] = {
    "slack": _slack,
    "teams": _teams,
    "discord": _discord,
    "pagerduty": _pagerduty,
    "dingtalk": _dingtalk,
    "feishu": _feishu,
    "wecom": _wecom,
}


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("kind", sorted(LIMITS))
def test_whole_message_stays_within_the_documented_limit(kind: str, count: int) -> None:
    request = build(kind).request([storm(count)], NOW)
    text = LIMITS[kind](json.loads(request.body), request.body)
    if count >= 64 and kind != "pagerduty":
        # Left-out alerts are counted and linked to Alertmanager, where all of them are.
        assert re.search(r"and \d+ more not shown", text), text[-300:]
        assert "http://alertmanager:9093/#/alerts?receiver=relay" in text
    if kind == "pagerduty" and count == 500:
        details = json.loads(request.body)["payload"]["custom_details"]
        assert details["firing"] == 500


@pytest.mark.parametrize("kind", [kind for kind in sorted(LIMITS) if targets.KINDS[kind].digests])
def test_digest_of_a_storm_stays_within_the_limit(kind: str) -> None:
    target = build(kind)
    many = [storm(8) for _ in range(20)]
    request = target.request(many, NOW)
    LIMITS[kind](json.loads(request.body), request.body)


@pytest.mark.parametrize("shift", range(6))
def test_slack_never_cuts_inside_an_entity(shift: int) -> None:
    item = alert()
    item["annotations"]["description"] = "x" * shift + "&<>" * 1000
    body = json.loads(build("slack").request([parsed(notification(item))], NOW).body)
    for block in body["blocks"][1:]:
        text = block["text"]["text"]
        # Every & starts a whole entity: a cut one would show as raw text or break parsing.
        assert not re.search(r"&(?!amp;|lt;|gt;)", text), text[-40:]
        assert utf16(text) <= 3000


def test_characters_are_counted_as_the_services_count_them() -> None:
    # Discord and Slack count UTF-16 code units: an emoji is two, and a pair is never split.
    item = alert()
    item["annotations"]["description"] = "🔥" * 3000
    item["annotations"]["summary"] = "🔥" * 300
    notifications = [parsed(notification(item))]
    _discord(json.loads(build("discord").request(notifications, NOW).body), b"")
    _slack(json.loads(build("slack").request(notifications, NOW).body), b"")
    wecom = json.loads(build("wecom").request(notifications, NOW).body)
    assert len(wecom["markdown"]["content"].encode()) <= 4096


def test_slack_runbook_url_cannot_mention_the_channel() -> None:
    body = build("slack").request([storm(1, runbook_url=EVIL_RUNBOOK)], NOW).body.decode()
    assert "<!channel>" not in body
    assert "evil.example" not in body  # an invalid URL is left out, not sent
    assert "Runbook>" not in body


@pytest.mark.parametrize("kind", ["feishu", "wecom", "dingtalk", "teams", "discord", "slack"])
def test_annotation_text_cannot_mention_everyone_or_make_links(kind: str) -> None:
    notifications = [
        storm(
            2,
            summary="<at id=all></at> <@all> <!channel> <font color=red>x</font>",
            description="click [here](https://evil.example/login) ![pixel](https://evil.example/p)",
        )
    ]
    request = build(kind).request(notifications, NOW)
    text = "\n".join(_strings(json.loads(request.body)))
    live = ["<at id=all>", "<@all>", "<!channel>", "<font"]
    if kind != "slack":  # Slack's mrkdwn has no [text](url) links: there it is plain text
        live += ["](https://evil.example"]
    for markup in live:
        # Discord escapes with a backslash: \<font is text.
        assert not re.search(r"(?<!\\)" + re.escape(markup), text), (kind, markup)


def _strings(document: Any) -> list[str]:
    if isinstance(document, str):
        return [document]
    if isinstance(document, dict):
        return [s for value in document.values() for s in _strings(value)]
    if isinstance(document, list):
        return [s for value in document for s in _strings(value)]
    return []


def test_discord_embed_url_is_only_a_valid_url() -> None:
    discord = build("discord")
    good = json.loads(discord.request([storm(1)], NOW).body)
    assert good["embeds"][0]["url"] == "https://example.com/runbooks.md#gputemperaturehigh"
    for bad in (EVIL_RUNBOOK, "javascript:alert(1)", "not a url", "https://exa mple.com"):
        body = json.loads(discord.request([storm(1, runbook_url=bad)], NOW).body)
        assert "url" not in body["embeds"][0], bad


def _cost(kind: str, count: int) -> float:
    """CPU seconds of this thread to build the message.

    Not the wall clock: on a busy machine that also counts the time other processes held the
    core, and a long build is preempted more often than a short one (the ratio reached 64).
    """
    target = build(kind)
    notifications = [storm(count)]
    best = float("inf")
    for _ in range(3):
        gc.collect()
        started = time.thread_time()
        target.request(notifications, NOW)
        best = min(best, time.thread_time() - started)
    return best


@pytest.mark.parametrize("kind", sorted(LIMITS))
def test_building_a_message_is_linear_in_the_alerts(kind: str) -> None:
    # 20 times the alerts may cost about 20 times as much, never 400 times (quadratic).
    # A generous ratio, not a time: the machine's speed does not matter.
    assert _cost(kind, 4000) < 60 * _cost(kind, 200)


@pytest.mark.parametrize(
    ("answer", "headers", "delivered", "retried", "retry_after"),
    [
        ((200, b'{"code":0,"msg":"success"}'), {}, True, False, None),
        # 9499 is Bad Request for custom bots: sending it again cannot help.
        ((200, b'{"code":9499,"msg":"Bad Request","data":{}}'), {}, False, False, None),
        ((200, b'{"code":11232,"msg":"frequency limited"}'), {}, False, True, 60.0),
        # Older APIs answer 400 with the rate-limit code and say when to come back.
        (
            (400, b'{"code":99991400,"msg":"request trigger frequency limit"}'),
            {"x-ogw-ratelimit-reset": "52"},
            False,
            True,
            52.0,
        ),
        ((200, b'{"code":19021,"msg":"sign match fail"}'), {}, False, False, None),
    ],
)
def test_feishu_answers(
    answer: tuple[int, bytes],
    headers: dict[str, str],
    delivered: bool,
    retried: bool,
    retry_after: float | None,
) -> None:
    outcome = build("feishu").outcome(answer[0], headers, answer[1])
    assert (outcome.delivered, outcome.retry) == (delivered, retried)
    assert outcome.retry_after == retry_after


@pytest.mark.parametrize(
    ("kind", "status", "body", "delivered", "retried"),
    [
        ("slack", 400, b"invalid_blocks", False, False),
        ("slack", 400, b"msg_blocks_too_long", False, False),
        ("slack", 403, b"action_prohibited", False, False),
        ("slack", 410, b"channel_is_archived", False, False),
        ("slack", 429, b"", False, True),
        ("teams", 413, b"", False, False),
        ("teams", 429, b"", False, True),
        ("discord", 400, b'{"code": 50035}', False, False),
        ("discord", 404, b'{"code": 10015}', False, False),
        ("pagerduty", 500, b"", False, True),
        ("wecom", 200, b'{"errcode":40058,"errmsg":"markdown.content exceed max length"}', 0, 0),
        ("wecom", 200, b'{"errcode":93000,"errmsg":"invalid webhook url"}', False, False),
        ("wecom", 200, b'{"errcode":-1,"errmsg":"system busy"}', False, True),
        ("dingtalk", 200, b'{"errcode":-1,"errmsg":"system busy"}', False, True),
    ],
)
def test_answers_are_final_or_retried_as_documented(
    kind: str, status: int, body: bytes, delivered: bool, retried: bool
) -> None:
    outcome = build(kind).outcome(status, {}, body)
    assert (outcome.delivered, outcome.retry) == (bool(delivered), bool(retried))


def test_teams_202_is_delivered_but_not_confirmed() -> None:
    outcome = build("teams").outcome(202, {}, b"")
    assert outcome.delivered
    assert "cannot be confirmed" in outcome.reason


def test_pagerduty_severity_and_time_come_from_firing_alerts() -> None:
    document = notification(
        alert(status="resolved", severity="critical", starts_at="2026-01-02T06:00:00Z"),
        alert(severity="warning", starts_at="2026-01-02T03:04:05.123456789Z", gpu="1"),
        alert(severity="info", starts_at="2026-01-02T05:00:00.5Z", gpu="2"),
        alert(severity="warning", starts_at="2026-01-01T00:00:00Z", gpu="4"),
    )
    body = json.loads(build("pagerduty").request([parsed(document)], NOW).body)
    assert body["payload"]["severity"] == "warning"
    assert body["payload"]["timestamp"] == "2026-01-02T05:00:00.5Z"
    everything_resolved = notification(alert(status="resolved"), status="firing")
    body = json.loads(build("pagerduty").request([parsed(everything_resolved)], NOW).body)
    assert body["payload"]["timestamp"] == "2025-12-29T09:20:00Z"


def _docs_verify() -> Callable[..., bool]:
    """The receiver example of docs/relay.md, run as written."""
    text = (Path(__file__).parent.parent / "docs" / "relay.md").read_text()
    source = re.search(r"```python\n(# verify-gpuload-signature.*?)```", text, re.S)
    assert source, "docs/relay.md lost its receiver example"
    namespace: dict[str, Any] = {}
    exec(compile(source.group(1), "docs/relay.md", "exec"), namespace)
    return namespace["verify"]  # type: ignore[no-any-return]


def test_webhook_signs_timestamp_and_body_and_the_documented_receiver_rejects_replays() -> None:
    webhook = build("webhook", secret=Secret("s3cret"))
    request = webhook.request([storm(1)], NOW)
    header = request.headers["X-Gpuload-Signature"]
    stamp = int(NOW)
    expected = hmac.new(b"s3cret", f"{stamp}.".encode() + request.body, hashlib.sha256)
    assert header == f"t={stamp},v1={expected.hexdigest()}"
    verify = _docs_verify()
    assert verify(b"s3cret", header, request.body, now=NOW + 10)
    # The same request captured and sent again ten minutes later: too old.
    assert not verify(b"s3cret", header, request.body, now=NOW + 600)
    # A fresh timestamp pasted onto the captured body: the signature no longer matches.
    forged = header.replace(f"t={stamp}", f"t={stamp + 600}")
    assert not verify(b"s3cret", forged, request.body, now=NOW + 600)
    assert not verify(b"s3cret", header, request.body + b" ", now=NOW + 10)
    assert not verify(b"other", header, request.body, now=NOW + 10)
    assert not verify(b"s3cret", "sha256=00", request.body, now=NOW + 10)


def _relay_test(
    tmp_path: Path, kind: str, answer: tuple[int, dict[str, str], bytes], name: str = "t"
) -> tuple[int, str, list[Any]]:
    fake = FakeTarget(lambda _request: answer)
    try:
        settings: dict[str, Any] = {"type": kind, "url": fake.url}
        if kind == "pagerduty":
            settings["routing_key"] = "R" * 32
        path = write_config(tmp_path, {"targets": {"t": settings}, "route": {"targets": ["t"]}})
        code = main(["relay", "test", name, "--config", str(path)])
        return code, "", fake.bodies()
    finally:
        fake.close()


def test_relay_test_sends_one_message_and_prints_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, bodies = _relay_test(tmp_path, "slack", (200, {}, b"ok"))
    out = capsys.readouterr().out
    assert code == 0
    assert len(bodies) == 1 and "gpuload relay test" in json.dumps(bodies[0])
    assert out.count("\n") == 1 and "HTTP 200" in out and "delivered" in out


def test_relay_test_refused_exits_1_and_says_it_is_final(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = _relay_test(tmp_path, "slack", (404, {}, b"no_service"))
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("\n") == 1 and "HTTP 404" in out and "final" in out and "no_service" in out


def test_relay_test_of_teams_says_delivery_cannot_be_confirmed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = _relay_test(tmp_path, "teams", (202, {}, b""))
    out = capsys.readouterr().out
    assert code == 0
    assert "HTTP 202" in out and "cannot be confirmed" in out


def test_relay_test_of_an_unknown_target_names_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, bodies = _relay_test(tmp_path, "slack", (200, {}, b"ok"), name="nope")
    assert code == 2 and not bodies
    assert "t" in capsys.readouterr().err
