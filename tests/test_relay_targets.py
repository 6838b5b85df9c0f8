"""Each target's request against its service's documented format, limits and signing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlsplit

import pytest
from relay_helpers import alert, notification, target_config

from exporter.relay import payload, targets
from exporter.relay.config import Secret
from exporter.relay.targets.discord import embed_characters
from exporter.relay.templates import MessageSettings

SETTINGS = MessageSettings(grafana_url="https://grafana.example.com", timezone="Asia/Shanghai")
NOW = 1_767_000_000.5


def build(kind: str, **options: Any) -> targets.Target:
    options.setdefault("url", Secret("https://hooks.example.com/services/T0/B0/secret"))
    return targets.build(target_config(kind, **options), SETTINGS)


def parsed(document: dict[str, Any]) -> payload.Notification:
    return payload.parse(json.dumps(document))


def one() -> payload.Notification:
    return parsed(notification(alert()))


def huge() -> payload.Notification:
    """A notification far over every service's limits: 120 alerts, long CJK descriptions."""
    alerts = []
    for i in range(120):
        item = alert(gpu=str(i % 8), instance=f"node-{i}:19400")
        item["annotations"]["description"] = "<&> " + "显存温度过高" * 900 + "x" * 3000
        item["annotations"]["summary"] = "S" * 2000
        alerts.append(item)
    document = notification(*alerts)
    document["truncatedAlerts"] = 7
    return parsed(document)


def storm() -> list[payload.Notification]:
    return [
        parsed(notification(alert(instance=f"node-{i}:19400"), group=f"g{i}")) for i in range(40)
    ]


def body_of(target: targets.Target, notifications: list[payload.Notification]) -> Any:
    return json.loads(target.request(notifications, NOW).body)


def test_message_carries_what_on_call_needs() -> None:
    text = json.dumps(body_of(build("slack"), [one()]), ensure_ascii=False)
    for needed in (
        "FIRING",
        "critical",
        "GPUTemperatureHigh",
        "GPU 3 (GPU-0c1d) on node-7:19400",
        "value 91 °C",
        "A GPU is too hot",
        "above its slowdown threshold",
        "https://example.com/runbooks.md#gputemperaturehigh",
        "https://grafana.example.com/d/gpuload-node?var-instance=node-7%3A19400&var-gpu=3",
        # The configured time zone: 03:04:05Z is 11:04:05 in Shanghai.
        "2026-01-02 11:04:05 CST",
    ):
        assert needed in text, needed


def _slack_limits(body: dict[str, Any]) -> None:
    assert isinstance(body["text"], str) and body["text"]
    assert 1 <= len(body["blocks"]) <= 50
    assert body["blocks"][0]["type"] == "header"
    assert body["blocks"][0]["text"]["type"] == "plain_text"
    assert len(body["blocks"][0]["text"]["text"]) <= 150
    for block in body["blocks"][1:]:
        assert block["type"] == "section"
        assert block["text"]["type"] == "mrkdwn"
        assert 0 < len(block["text"]["text"]) <= 3000


def test_slack_block_kit_within_limits_and_says_what_was_cut() -> None:
    slack = build("slack")
    _slack_limits(body_of(slack, [one()]))
    big = body_of(slack, [huge()])
    _slack_limits(big)
    assert "more not shown" in big["blocks"][-1]["text"]["text"]
    # Slack reserves <, > and &: alert text is escaped, links are not.
    assert "&lt;&amp;&gt;" in json.dumps(big, ensure_ascii=False)
    assert "<https://example.com/runbooks.md#gputemperaturehigh|Runbook>" in json.dumps(big)
    digest = body_of(slack, storm())
    _slack_limits(digest)
    assert "40 notifications" in digest["blocks"][0]["text"]["text"]


def test_slack_resolved_says_so() -> None:
    resolved = parsed(notification(alert(status="resolved")))
    body = body_of(build("slack"), [resolved])
    assert body["text"].startswith("[RESOLVED] GPUTemperatureHigh")


def _teams_card(body: dict[str, Any]) -> dict[str, Any]:
    assert body["type"] == "message"
    assert len(body["attachments"]) == 1
    attachment = body["attachments"][0]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    assert tuple(map(int, card["version"].split("."))) >= (1, 4)
    assert all(item["type"] in ("TextBlock", "Container") for item in card["body"])
    return card


def test_teams_adaptive_card_within_size() -> None:
    teams = build("teams")
    card = _teams_card(body_of(teams, [one()]))
    assert [a["title"] for a in card["actions"]] == ["Runbook", "Grafana"]
    assert all(a["type"] == "Action.OpenUrl" for a in card["actions"])
    request = teams.request([huge()], NOW)
    assert len(request.body) <= 28_000
    assert "more not shown" in json.dumps(_teams_card(json.loads(request.body)))
    _teams_card(body_of(teams, storm()))


def test_pagerduty_events_v2_trigger_and_resolve_share_the_dedup_key() -> None:
    pagerduty = build("pagerduty", url=None, routing_key=Secret("R" * 32))
    assert pagerduty.url == "https://events.pagerduty.com/v2/enqueue"
    trigger = body_of(pagerduty, [huge()])
    assert trigger["routing_key"] == "R" * 32
    assert trigger["event_action"] == "trigger"
    assert 0 < len(trigger["dedup_key"]) <= 255
    assert len(trigger["payload"]["summary"]) <= 1024
    assert trigger["payload"]["severity"] in ("critical", "error", "warning", "info")
    assert trigger["payload"]["source"]
    assert len(pagerduty.request([huge()], NOW).body) <= 512 * 1024
    resolved = parsed(notification(*(alert(status="resolved") for _ in range(1))))
    resolve = body_of(pagerduty, [resolved])
    assert resolve["event_action"] == "resolve"
    assert resolve["dedup_key"] == trigger["dedup_key"]
    assert not pagerduty.digests


@pytest.mark.parametrize(
    ("label", "expected"),
    [("critical", "critical"), ("warning", "warning"), ("info", "info"), ("", "warning")],
)
def test_pagerduty_severity_is_one_of_its_four(label: str, expected: str) -> None:
    pagerduty = build("pagerduty", url=None, routing_key=Secret("key"))
    body = body_of(pagerduty, [parsed(notification(alert(severity=label)))])
    assert body["payload"]["severity"] == expected


def _discord_limits(body: dict[str, Any]) -> None:
    assert len(body["content"]) <= 2000
    assert len(body["embeds"]) <= 10
    for embed in body["embeds"]:
        assert len(embed.get("title", "")) <= 256
        assert len(embed.get("description", "")) <= 4096
        assert len(embed.get("fields", [])) <= 25
    assert embed_characters(body["embeds"]) <= 6000


def test_discord_content_and_embeds_within_limits() -> None:
    discord = build("discord")
    _discord_limits(body_of(discord, [one()]))
    big = body_of(discord, [huge()])
    _discord_limits(big)
    assert "more not shown" in big["embeds"][-1]["description"]
    _discord_limits(body_of(discord, storm()))


def test_dingtalk_markdown_signed_in_the_query() -> None:
    secret = "SEC0123456789abcdef"
    dingtalk = build(
        "dingtalk",
        url=Secret("https://oapi.dingtalk.com/robot/send?access_token=abc"),
        secret=Secret(secret),
        at_mobiles=("13800000000",),
    )
    request = dingtalk.request([huge()], NOW)
    query = parse_qs(urlsplit(request.url).query)
    assert query["access_token"] == ["abc"]
    timestamp = query["timestamp"][0]
    assert timestamp == str(int(NOW * 1000))
    # The sign as DingTalk's documentation computes it, then URL-decoded by parse_qs.
    expected = base64.b64encode(
        hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    ).decode()
    assert query["sign"] == [expected]
    raw_sign = urlsplit(request.url).query.split("sign=")[1]
    assert unquote_plus(raw_sign) == expected  # URL-encoded in the URL itself
    body = json.loads(request.body)
    assert body["msgtype"] == "markdown"
    assert body["markdown"]["title"] and body["markdown"]["text"]
    assert body["at"] == {"atMobiles": ["13800000000"], "isAtAll": False}
    assert body["markdown"]["text"].endswith("@13800000000")
    assert len(request.body) <= 20_000


def test_feishu_card_signed_in_the_body() -> None:
    secret = "feishu-secret"
    feishu = build("feishu", secret=Secret(secret))
    request = feishu.request([huge()], NOW)
    body = json.loads(request.body)
    assert body["timestamp"] == str(int(NOW))
    key = f"{body['timestamp']}\n{secret}".encode()
    expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    assert body["sign"] == expected
    assert body["msg_type"] == "interactive"
    assert body["card"]["header"]["template"] == "red"
    assert body["card"]["header"]["title"]["tag"] == "plain_text"
    assert body["card"]["elements"][0]["text"]["tag"] == "lark_md"
    assert len(request.body) <= 20 * 1024
    unsigned = json.loads(build("feishu").request([one()], NOW).body)
    assert "sign" not in unsigned and "timestamp" not in unsigned


def test_wecom_markdown_within_4096_bytes() -> None:
    wecom = build("wecom")
    for notifications in ([one()], [huge()], storm()):
        body = body_of(wecom, notifications)
        assert body["msgtype"] == "markdown"
        content = body["markdown"]["content"]
        assert 0 < len(content.encode("utf-8")) <= 4096


def test_webhook_sends_the_json_as_received_signed() -> None:
    document = notification(alert())
    document["routeLabels"] = {"future": "field"}
    webhook = build("webhook", secret=Secret("s3cret"))
    request = webhook.request([parsed(document)], NOW)
    assert json.loads(request.body) == document
    stamp = int(NOW)
    signed = f"{stamp}.".encode() + request.body
    digest = hmac.new(b"s3cret", signed, hashlib.sha256).hexdigest()
    assert request.headers["X-Gpuload-Signature"] == f"t={stamp},v1={digest}"
    assert request.headers["X-Gpuload-Timestamp"] == str(int(NOW))
    assert request.headers["X-Gpuload-Dedup-Key"] == parsed(document).dedup_key()
    assert "X-Gpuload-Signature" not in build("webhook").request([parsed(document)], NOW).headers


def test_user_template_runs_sandboxed_and_falls_back_when_it_fails() -> None:
    slack = build("slack", template="{{ alerts[0].name }} on {{ alerts[0].where }}: {{ status }}")
    body = body_of(slack, [one()])
    assert (
        body["blocks"][1]["text"]["text"]
        == "GPUTemperatureHigh on GPU 3 (GPU-0c1d) on node-7:19400: firing"
    )
    # Reaching Python internals is refused by the sandbox: the default message goes out instead.
    escape = build("slack", template="{{ alerts.__class__.__mro__[1].__subclasses__() }}")
    fallback = body_of(escape, [one()])
    assert "A GPU is too hot" in json.dumps(fallback)
    assert "subclasses" not in json.dumps(fallback)


def test_webhook_template_renders_the_body() -> None:
    webhook = build(
        "webhook",
        template='{"text": "{{ title }}", "n": {{ alerts | length }}}',
        content_type="application/json",
    )
    request = webhook.request([one()], NOW)
    assert json.loads(request.body) == {
        "text": "[FIRING:1] GPUTemperatureHigh (critical) · GPU 3 on node-7:19400",
        "n": 1,
    }


@pytest.mark.parametrize(
    ("kind", "answer", "delivered", "retried"),
    [
        ("slack", (200, b"ok"), True, False),
        ("slack", (500, b""), False, True),
        ("slack", (404, b"no_service"), False, False),
        ("pagerduty", (202, b'{"status":"success"}'), True, False),
        ("pagerduty", (400, b'{"status":"invalid event"}'), False, False),
        ("pagerduty", (429, b""), False, True),
        ("dingtalk", (200, b'{"errcode":0,"errmsg":"ok"}'), True, False),
        ("dingtalk", (200, b'{"errcode":310000,"errmsg":"sign not match"}'), False, False),
        ("dingtalk", (200, b'{"errcode":130101,"errmsg":"send too fast"}'), False, True),
        ("feishu", (200, b'{"code":0,"msg":"success"}'), True, False),
        ("feishu", (200, b'{"code":19021,"msg":"sign match fail"}'), False, False),
        ("feishu", (200, b'{"code":11232,"msg":"frequency limited"}'), False, True),
        ("wecom", (200, b'{"errcode":45009,"errmsg":"api freq out of limit"}'), False, True),
        ("discord", (429, b'{"retry_after": 1.5}'), False, True),
    ],
)
def test_answers_are_read_as_each_service_reports_errors(
    kind: str, answer: tuple[int, bytes], delivered: bool, retried: bool
) -> None:
    options: dict[str, Any] = {"routing_key": Secret("k")} if kind == "pagerduty" else {}
    outcome = build(kind, **options).outcome(answer[0], {}, answer[1])
    assert (outcome.delivered, outcome.retry) == (delivered, retried)
    if kind == "discord":
        assert outcome.retry_after == 1.5


# Where each target's preview is: the text a notification (a phone's banner, Slack's sidebar)
# shows before the message is opened. The webhook passes the payload on, a preview of nothing.
PREVIEWS = {
    "slack": lambda body: body["text"],
    "teams": lambda body: body["attachments"][0]["content"]["body"][0]["text"],
    "discord": lambda body: body["content"],
    "dingtalk": lambda body: body["markdown"]["title"],
    "feishu": lambda body: body["card"]["header"]["title"]["content"],
    "wecom": lambda body: body["markdown"]["content"].split("\n", 1)[0],
    "pagerduty": lambda body: body["payload"]["summary"],
}


def _preview_target(kind: str) -> targets.Target:
    if kind == "pagerduty":
        return build(kind, routing_key=Secret("r" * 32))
    if kind in ("dingtalk", "feishu"):
        return build(kind, secret=Secret("signing-secret"))
    return build(kind)


@pytest.mark.parametrize("kind", sorted(PREVIEWS))
def test_every_preview_names_the_node_the_gpu_and_the_alert(kind: str) -> None:
    target = _preview_target(kind)
    preview = PREVIEWS[kind](body_of(target, [one()])).replace("\u200b", "")
    assert "GPUTemperatureHigh" in preview
    assert "GPU 3" in preview and "node-7:19400" in preview
    if kind == "pagerduty":
        return  # PagerDuty never digests: each notification is its own event
    # A digest's preview names its worst alert, where, and how many GPUs it holds.
    notifications = [
        parsed(notification(alert("GPUUtilizationLow", severity="warning", gpu="0"), group="a")),
        parsed(notification(alert("GPUFellOffBus", gpu="5"), group="b")),
        parsed(notification(alert("GPUUtilizationLow", severity="warning", gpu="1"), group="c")),
    ]
    digest = PREVIEWS[kind](body_of(target, notifications)).replace("\u200b", "")
    assert "GPUFellOffBus (critical)" in digest and "GPU 5 on node-7:19400" in digest
    assert "· 3 GPUs ·" in digest


def test_a_resolved_alert_s_value_says_what_it_was_or_what_it_is_at_resolution() -> None:
    resolved = alert(status="resolved")
    slack = build("slack")
    text = str(body_of(slack, [parsed(notification(resolved))])["blocks"])
    assert "value was 91 °C" in text and "value 91 °C" not in text
    # gpuload's own alerting reads the value again when the alert resolves.
    resolved["annotations"][payload.RESOLVED_VALUE] = "84 °C"
    text = str(body_of(slack, [parsed(notification(resolved))])["blocks"])
    assert "value 84 °C at resolution, was 91 °C" in text
