"""WeCom (WeChat Work) group robots: markdown within 4096 bytes of UTF-8.

No signing: the robot's key is in its URL. Limit: 20 messages a minute per
robot (error 45009, retried, as is -1 "system busy"). Errors come as HTTP 200
with a non-zero ``errcode``; others (40058 content too long, 93000 invalid
webhook URL) are final. Alert text is neutralised so that ``<@userid>`` or
``<font>`` in an annotation stays text.
"""

from __future__ import annotations

import dataclasses
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
    ROBOT,
    UTF8,
    digest_text,
    digest_title,
    notification_text,
    title,
)

# "markdown content, at most 4096 bytes, UTF-8"; 20 messages a minute:
# https://developer.work.weixin.qq.com/document/path/91770
CONTENT_BYTES = 4096
# -1 is "system busy, try again later" among WeCom's global error codes.
RATE_LIMITED = {45009: 60.0, -1: 30.0}
WECOM = dataclasses.replace(ROBOT, unit=UTF8)


@register
class WeCom(Target):
    """A WeCom group robot."""

    kind = "wecom"
    min_interval = 3.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A markdown message cut to the byte limit."""
        if len(notifications) > 1:
            headline = WECOM.escape(digest_title(notifications))
        else:
            headline = WECOM.escape(title(notifications[0]))
        head = f"### {headline}\n"
        room = CONTENT_BYTES - WECOM.size(head)
        if len(notifications) > 1:
            text = digest_text(notifications, self.settings, WECOM, room)
        else:
            custom = self.user_text(notifications[0])
            text = (
                custom
                if custom is not None
                else notification_text(notifications[0], self.settings, WECOM, room)
            )
        content = WECOM.cut(head + text, CONTENT_BYTES)
        document = {"msgtype": "markdown", "markdown": {"content": content}}
        return OutboundRequest(self.url, json_body(document), {"Content-Type": "application/json"})

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """Errcode 0 is delivered; 45009 (too many messages) and -1 (busy) are retried."""
        return json_errcode_outcome(
            status, headers, body, code_fields=("errcode",), retry_codes=RATE_LIMITED
        )
