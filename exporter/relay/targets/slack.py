"""Slack incoming webhooks: Block Kit, within Slack's limits.

A header block (plain text, 150 characters), one mrkdwn section per alert
(3000 characters each) and at most 50 blocks; ``text`` is the notification
fallback. Whatever does not fit is cut with a note, never refused. Slack allows
about one message per second per webhook and answers 429 with Retry-After.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.relay.payload import Notification
from exporter.relay.targets.base import OutboundRequest, Target, json_body, register
from exporter.relay.templates import (
    SLACK,
    alert_text,
    digest_line,
    digest_title,
    title,
    truncate,
    view,
)

HEADER_LIMIT = 150
TEXT_LIMIT = 3000
BLOCK_LIMIT = 50


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, TEXT_LIMIT)}}


def _header(text: str) -> dict[str, Any]:
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": truncate(text, HEADER_LIMIT), "emoji": True},
    }


def _blocks(headline: str, sections: Sequence[str], dropped: int) -> list[dict[str, Any]]:
    room = BLOCK_LIMIT - 1
    blocks = [_header(headline)]
    if len(sections) > room:
        dropped += len(sections) - (room - 1)
        sections = sections[: room - 1]
    blocks.extend(_section(text) for text in sections)
    if dropped:
        blocks.append(_section(f"_… and {dropped} more not shown_"))
    return blocks


def _chunks(text: str) -> list[str]:
    return [text[i : i + TEXT_LIMIT] for i in range(0, len(text), TEXT_LIMIT)] or [""]


@register
class Slack(Target):
    """A Slack incoming webhook."""

    kind = "slack"
    min_interval = 1.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """Block Kit message for one notification, or a digest."""
        if len(notifications) > 1:
            headline = digest_title(notifications)
            sections = [digest_line(n, self.settings, SLACK) for n in notifications]
            blocks = _blocks(headline, sections, 0)
        else:
            notification = notifications[0]
            headline = title(notification)
            custom = self.user_text(notification)
            if custom is not None:
                blocks = _blocks(headline, _chunks(custom), 0)
            else:
                sections = [
                    alert_text(view(alert, self.settings), SLACK) for alert in notification.alerts
                ]
                blocks = _blocks(headline, sections, notification.truncated_alerts)
        document = {"text": truncate(headline, TEXT_LIMIT), "blocks": blocks}
        return OutboundRequest(self.url, json_body(document), {"Content-Type": "application/json"})
