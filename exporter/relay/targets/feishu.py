"""Feishu / Lark custom bots: an interactive card, signed in the body.

Signing: ``timestamp`` (seconds, a string) and ``sign`` in the JSON body, where
sign = base64(HMAC-SHA256(key=timestamp, a newline, secret; message="")), not
URL-encoded; this differs from DingTalk's, and confusing the two is the usual
cause of error 19021. Limits: 5 messages a second and 100 a minute per bot
(error 11232), 20 KB per body, counted here as the bytes of the JSON body.
Errors come as HTTP 200 with a non-zero ``code``: 9499 is "Bad Request" (a body
the bot cannot take) and final, like the signature and keyword errors (19021,
19022, 19024); 11232 and the platform's 99991400 are rate limits and retried.
Alert text in ``lark_md`` is neutralised so that ``<at id=all></at>`` in an
annotation mentions no one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.relay.payload import Notification
from exporter.relay.target_config import Secret, option
from exporter.relay.targets.base import (
    OutboundRequest,
    Outcome,
    Target,
    json_body,
    json_errcode_outcome,
    register,
)
from exporter.relay.templates import (
    ROBOT,
    digest_text,
    digest_title,
    notification_text,
    title,
)

# "The request body must not exceed 20 KB", 100 messages a minute and 5 a second (11232):
# https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot . The card's text gets
# what the rest of the body leaves (2,000 bytes of the 20,000), counted as JSON bytes.
TEXT_BYTES = 18_000
# 99991400 with x-ogw-ratelimit-reset (seconds): https://open.feishu.cn/document/server-docs/
# api-call-guide/frequency-control . 9499 (Bad Request) is not among them: it is final.
RATE_LIMITED = {11232: 60.0, 99991400: 60.0}
RESET_HEADER = "x-ogw-ratelimit-reset"


def sign(secret: str, timestamp: int) -> str:
    """Feishu's signature: the HMAC of an empty message keyed with timestamp and secret."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


@dataclass(frozen=True)
class FeishuOptions:
    """What a Feishu or Lark bot takes besides the shared settings."""

    secret: Secret | None = option(
        secret=True, help="the bot's signature secret: messages are signed in the body"
    )


@register
class Feishu(Target):
    """A Feishu or Lark custom bot."""

    kind = "feishu"
    options_type = FeishuOptions
    options: FeishuOptions
    min_interval = 0.6

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """An interactive card, red while firing and green once resolved."""
        if len(notifications) > 1:
            headline = digest_title(notifications)
            text = digest_text(notifications, self.settings, ROBOT, TEXT_BYTES)
            color = "orange"
        else:
            notification = notifications[0]
            headline = title(notification)
            custom = self.user_text(notification)
            text = (
                custom
                if custom is not None
                else notification_text(notification, self.settings, ROBOT, TEXT_BYTES)
            )
            color = "red" if notification.status == "firing" else "green"
        document: dict[str, Any] = {}
        if self.options.secret is not None:
            stamp = int(now)
            document["timestamp"] = str(stamp)
            document["sign"] = sign(self.options.secret.value, stamp)
        document["msg_type"] = "interactive"
        document["card"] = {
            "config": {"wide_screen_mode": True},
            "header": {
                "title": {"tag": "plain_text", "content": headline[:200]},
                "template": color,
            },
            "elements": [
                {
                    "tag": "div",
                    "text": {"tag": "lark_md", "content": ROBOT.cut(text, TEXT_BYTES)},
                }
            ],
        }
        return OutboundRequest(self.url, json_body(document), {"Content-Type": "application/json"})

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """Code 0 is delivered; the rate limits are retried; any other code is final."""
        return json_errcode_outcome(
            status,
            headers,
            body,
            code_fields=("code", "StatusCode"),
            retry_codes=RATE_LIMITED,
            retry_after_header=RESET_HEADER,
        )
