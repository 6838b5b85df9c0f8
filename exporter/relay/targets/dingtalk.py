"""DingTalk group robots: markdown, signed with the robot's secret.

Signing: ``timestamp`` (milliseconds) and ``sign`` as query parameters, where
sign = URL-encoded base64(HMAC-SHA256(key=secret, message=timestamp, a newline,
secret)). Limits: 20 messages a minute per robot (over it: error 130101 and a
10-minute block), 20000 bytes per body, counted here as the bytes of the JSON
body. Errors come as HTTP 200 with a non-zero ``errcode``: 130101 and -1
(system busy) are retried, others (310000 bad signature, 300001 bad token) are
final. Alert text is neutralised so that links, images and HTML in annotations
stay text; only ``at_mobiles`` and ``at_all`` mention anyone.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

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
    alert_parts,
    alertmanager_url,
    digest_parts,
    digest_title,
    join_within,
    title,
)
from exporter.settings import parse_bool

# 20 messages a minute, then a 10-minute block (130101):
# https://open.dingtalk.com/document/orgapp/custom-robot-access ; 20000 bytes per body.
TEXT_BYTES = 18_000
RATE_LIMITED = {130101: 600.0, -1: 30.0}


def sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk's signature, URL-encoded for the query string."""
    message = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return quote_plus(base64.b64encode(digest).decode())


def parse_mobiles(value: Any) -> tuple[str, ...]:
    """A list of mobile numbers, written as strings or numbers."""
    if not isinstance(value, list) or not all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    ):
        raise ValueError("expected a list of mobile numbers")
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class DingTalkOptions:
    """What a DingTalk robot takes besides the shared settings."""

    secret: Secret | None = option(
        secret=True, help="the robot's signing secret (its 加签 setting): requests are signed"
    )
    at_mobiles: tuple[str, ...] = option(
        parse_mobiles, default=(), help="mobile numbers of the group members to mention"
    )
    at_all: bool = option(parse_bool, default=False, help="mention everyone in the group")


@register
class DingTalk(Target):
    """A DingTalk custom robot."""

    kind = "dingtalk"
    options_type = DingTalkOptions
    options: DingTalkOptions
    min_interval = 3.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A markdown message, signed in the URL when the robot has a secret."""
        more_url = alertmanager_url(notifications[0])
        if len(notifications) > 1:
            headline = digest_title(notifications)
            parts, dropped = digest_parts(notifications, self.settings, ROBOT), 0
        else:
            headline = title(notifications[0])
            custom = self.user_text(notifications[0])
            if custom is not None:
                parts, dropped = [custom], 0
            else:
                parts = alert_parts(notifications[0], self.settings, ROBOT)
                dropped = notifications[0].truncated_alerts
        mentions = " ".join(f"@{mobile}" for mobile in self.options.at_mobiles)
        head = f"### {ROBOT.escape(headline)}\n\n"
        tail = f"\n\n{mentions}" if mentions else ""
        room = TEXT_BYTES - ROBOT.size(head) - ROBOT.size(tail)
        # DingTalk's markdown needs a blank line for a line break.
        parts = [part.replace("\n", "\n\n") for part in parts]
        body = head + join_within(parts, "\n\n", room, dropped, ROBOT, more_url) + tail
        document = {
            "msgtype": "markdown",
            "markdown": {"title": headline[:100], "text": body},
            "at": {"atMobiles": list(self.options.at_mobiles), "isAtAll": self.options.at_all},
        }
        url = self.url
        if self.options.secret is not None:
            stamp = int(now * 1000)
            separator = "&" if "?" in url else "?"
            url = f"{url}{separator}timestamp={stamp}&sign={sign(self.options.secret.value, stamp)}"
        return OutboundRequest(url, json_body(document), {"Content-Type": "application/json"})

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """Errcode 0 is delivered; 130101 (too many messages) and -1 (busy) are retried."""
        return json_errcode_outcome(
            status, headers, body, code_fields=("errcode",), retry_codes=RATE_LIMITED
        )
