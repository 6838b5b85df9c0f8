"""DingTalk group robots: markdown, signed with the robot's secret.

Signing: ``timestamp`` (milliseconds) and ``sign`` as query parameters, where
sign = URL-encoded base64(HMAC-SHA256(key=secret, message=timestamp, a newline,
secret)). Limits: 20 messages a minute per robot (over it: error 130101 and a
10-minute block), 20000 bytes per body. Errors come as HTTP 200 with a non-zero
``errcode``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from urllib.parse import quote_plus

from exporter.relay.payload import Notification
from exporter.relay.targets.base import (
    OutboundRequest,
    Outcome,
    Target,
    json_body,
    json_errcode_outcome,
    register,
)
from exporter.relay.templates import (
    MARKDOWN,
    digest_text,
    digest_title,
    notification_text,
    title,
    truncate_bytes,
)

TEXT_BYTES = 18_000
RATE_LIMITED = {130101: 600.0}


def sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk's signature, URL-encoded for the query string."""
    message = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return quote_plus(base64.b64encode(digest).decode())


@register
class DingTalk(Target):
    """A DingTalk custom robot."""

    kind = "dingtalk"
    secrets = ("url", "secret")
    min_interval = 3.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A markdown message, signed in the URL when the robot has a secret."""
        if len(notifications) > 1:
            headline = digest_title(notifications)
            text = digest_text(notifications, self.settings, MARKDOWN, TEXT_BYTES // 3)
        else:
            headline = title(notifications[0])
            custom = self.user_text(notifications[0])
            text = (
                custom
                if custom is not None
                else notification_text(notifications[0], self.settings, MARKDOWN, TEXT_BYTES // 3)
            )
        mentions = " ".join(f"@{mobile}" for mobile in self.config.at_mobiles)
        body = f"### {headline}\n\n{text}".replace("\n", "\n\n")
        body = truncate_bytes(body, TEXT_BYTES - len(mentions.encode()) - 2)
        if mentions:
            body = f"{body}\n\n{mentions}"
        document = {
            "msgtype": "markdown",
            "markdown": {"title": headline[:100], "text": body},
            "at": {"atMobiles": list(self.config.at_mobiles), "isAtAll": self.config.at_all},
        }
        url = self.url
        if self.config.secret is not None:
            stamp = int(now * 1000)
            separator = "&" if "?" in url else "?"
            url = f"{url}{separator}timestamp={stamp}&sign={sign(self.config.secret.value, stamp)}"
        return OutboundRequest(url, json_body(document), {"Content-Type": "application/json"})

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """HTTP 200 with errcode 0 is delivered; 130101 (too many messages) is retried."""
        return json_errcode_outcome(
            status, headers, body, code_fields=("errcode",), retry_codes=RATE_LIMITED
        )
