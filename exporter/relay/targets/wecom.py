"""WeCom (WeChat Work) group robots: markdown within 4096 bytes of UTF-8.

No signing: the robot's key is in its URL. Limit: 20 messages a minute per
robot (error 45009). Errors come as HTTP 200 with a non-zero ``errcode``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

CONTENT_BYTES = 4096
RATE_LIMITED = {45009: 60.0}


@register
class WeCom(Target):
    """A WeCom group robot."""

    kind = "wecom"
    min_interval = 3.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A markdown message cut to the byte limit."""
        if len(notifications) > 1:
            headline = digest_title(notifications)
            text = digest_text(notifications, self.settings, MARKDOWN, CONTENT_BYTES)
        else:
            headline = title(notifications[0])
            custom = self.user_text(notifications[0])
            text = (
                custom
                if custom is not None
                else notification_text(notifications[0], self.settings, MARKDOWN, CONTENT_BYTES)
            )
        content = truncate_bytes(f"### {headline}\n{text}", CONTENT_BYTES)
        document = {"msgtype": "markdown", "markdown": {"content": content}}
        return OutboundRequest(self.url, json_body(document), {"Content-Type": "application/json"})

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """HTTP 200 with errcode 0 is delivered; 45009 (too many messages) is retried."""
        return json_errcode_outcome(
            status, headers, body, code_fields=("errcode",), retry_codes=RATE_LIMITED
        )
