"""Slack incoming webhooks: Block Kit, within Slack's limits.

A header block (plain text, 150 characters), one mrkdwn section per alert
(3000 characters each) and at most 50 blocks; ``text`` is the notification
fallback. Besides, Slack refuses a message whose blocks hold more than about
13,200 characters in all (``msg_blocks_too_long``), so the whole message is
kept to 12,000. Whatever does not fit is counted in a last section linking to
Alertmanager, never sent to be refused. Sizes are counted in UTF-16 code units,
after escaping. Slack allows about one message per second per webhook and
answers 429 with Retry-After; its 4xx answers (``invalid_blocks``,
``no_service``, ``channel_is_archived``...) are final.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.relay.payload import Notification
from exporter.relay.targets.base import OutboundRequest, Target, json_body, register
from exporter.relay.templates import (
    SLACK,
    TRUNCATED,
    UTF16,
    alert_parts,
    alertmanager_url,
    digest_parts,
    digest_title,
    fit,
    prefix_within,
    title,
)

# https://api.slack.com/reference/block-kit/blocks: 50 blocks per message, a header's text
# 150 characters, a section's text 3000.
HEADER_LIMIT = 150
TEXT_LIMIT = 3000
BLOCK_LIMIT = 50
# Undocumented, observed: msg_blocks_too_long past 13,172 to 13,297 characters of block text,
# https://github.com/slackapi/bolt-js/issues/2509. Kept well under it.
MESSAGE_LIMIT = 12_000
# Incoming webhooks answer errors as HTTP status and a short body:
# https://api.slack.com/messaging/webhooks#handling_errors (400 invalid_payload/invalid_blocks,
# 403 action_prohibited, 404 channel_not_found/no_service, 410 channel_is_archived: final;
# 429 rate limited with Retry-After, 5xx: retried), which outcome_by_status reads as such.


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _header(text: str) -> dict[str, Any]:
    cut = text if len(text) <= HEADER_LIMIT else text[: HEADER_LIMIT - 1] + "…"
    return {"type": "header", "text": {"type": "plain_text", "text": cut, "emoji": True}}


def blocks(
    headline: str, parts: Sequence[str], dropped: int, more_url: str
) -> list[dict[str, Any]]:
    """The header and as many sections as Slack takes, then one saying how many were left out."""
    header = _header(headline)
    sections = [SLACK.cut(part, TEXT_LIMIT) for part in parts]
    note = SLACK.size(SLACK.more(len(sections) + dropped, more_url))
    budget = MESSAGE_LIMIT - SLACK.size(header["text"]["text"])
    # Room among the 50 blocks for the header, and for the note when one is needed.
    most = BLOCK_LIMIT - 1 if len(sections) < BLOCK_LIMIT and not dropped else BLOCK_LIMIT - 2
    beyond = max(len(sections) - most, 0)
    sizes = [SLACK.size(text) for text in sections[:most]]
    count = fit(sizes, budget, note, dropped=dropped + beyond)
    missing = len(sections) - count + dropped
    shown = [header, *(_section(text) for text in sections[:count])]
    if missing:
        shown.append(_section(SLACK.more(missing, more_url)))
    return shown


@register
class Slack(Target):
    """A Slack incoming webhook."""

    kind = "slack"
    min_interval = 1.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """Block Kit message for one notification, or a digest."""
        more_url = alertmanager_url(notifications[0])
        if len(notifications) > 1:
            headline = digest_title(notifications)
            parts = digest_parts(notifications, self.settings, SLACK)
            dropped = 0
        else:
            notification = notifications[0]
            headline = title(notification)
            custom = self.user_text(notification)
            if custom is not None:
                parts, dropped = _chunks(custom), 0
            else:
                parts = alert_parts(notification, self.settings, SLACK)
                dropped = notification.truncated_alerts
        document = {
            # The fallback text is mrkdwn too: the alert name in it is escaped.
            "text": SLACK.cut(SLACK.escape(headline), TEXT_LIMIT),
            "blocks": blocks(headline, parts, dropped, more_url),
        }
        return OutboundRequest(self.url, json_body(document), {"Content-Type": "application/json"})


def _chunks(text: str) -> list[str]:
    """A template's text in sections, each cut where Slack's escapes and links stay whole."""
    chunks = []
    while text:
        chunk = SLACK.cut(text, TEXT_LIMIT)
        if chunk == text:
            chunks.append(text)
            break
        keep = len(chunk) - len(TRUNCATED)
        if keep <= 0:
            # An opener with no end in sight: cut between characters rather than loop.
            keep = max(prefix_within(text, TEXT_LIMIT, UTF16), 1)
        chunks.append(text[:keep])
        text = text[keep:]
    return chunks or [""]
