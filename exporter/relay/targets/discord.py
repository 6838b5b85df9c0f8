"""Discord webhooks: a short ``content`` line and one embed per alert, within Discord's limits.

Limits: content 2000 characters, 10 embeds, embed title 256 and description
4096, 6000 characters over all embeds. Over them Discord answers 400 (code
50035), so the message is cut to fit first. 429 carries ``retry_after``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.relay.payload import Notification
from exporter.relay.targets.base import (
    OutboundRequest,
    Outcome,
    Target,
    json_body,
    outcome_by_status,
    parse_retry_after,
    register,
)
from exporter.relay.templates import (
    MARKDOWN,
    AlertView,
    alert_text,
    digest_text,
    digest_title,
    title,
    truncate,
    view,
)

CONTENT_LIMIT = 2000
EMBED_LIMIT = 10
TITLE_LIMIT = 256
DESCRIPTION_LIMIT = 4096
TOTAL_LIMIT = 6000
RED, GREEN = 0xE01E5A, 0x2EB67D


def embed_characters(embeds: Sequence[Mapping[str, Any]]) -> int:
    """Characters Discord counts against its 6000 limit (titles, descriptions, fields, footers)."""
    total = 0
    for embed in embeds:
        total += len(embed.get("title", "")) + len(embed.get("description", ""))
        total += len(embed.get("footer", {}).get("text", ""))
        total += sum(len(f["name"]) + len(f["value"]) for f in embed.get("fields", []))
    return total


def _embed(alert: AlertView, budget: int) -> dict[str, Any]:
    text = alert_text(alert, MARKDOWN)
    headline, _, rest = text.partition("\n")
    embed: dict[str, Any] = {
        "title": truncate(headline.strip("*"), TITLE_LIMIT),
        "description": truncate(rest, max(min(DESCRIPTION_LIMIT, budget - TITLE_LIMIT), 20)),
        "color": RED if alert.status == "firing" else GREEN,
    }
    if alert.runbook_url:
        embed["url"] = alert.runbook_url
    return embed


@register
class Discord(Target):
    """A Discord channel webhook."""

    kind = "discord"
    min_interval = 2.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A message with embeds for one notification, or a digest."""
        if len(notifications) > 1:
            content = digest_title(notifications)
            text = digest_text(notifications, self.settings, MARKDOWN, DESCRIPTION_LIMIT)
            embeds = [{"description": text, "color": RED}]
            return self._post(content, embeds)
        notification = notifications[0]
        content = title(notification)
        custom = self.user_text(notification)
        if custom is not None:
            return self._post(content, [{"description": truncate(custom, DESCRIPTION_LIMIT)}])
        views = [view(alert, self.settings) for alert in notification.alerts]
        shown = views[:EMBED_LIMIT]
        dropped = len(views) - len(shown) + notification.truncated_alerts
        if dropped:
            shown = shown[: EMBED_LIMIT - 1]
            dropped = len(views) - len(shown) + notification.truncated_alerts
        budget = (TOTAL_LIMIT - 200) // max(len(shown), 1)
        embeds = [_embed(v, budget) for v in shown]
        if dropped:
            embeds.append({"description": f"… and {dropped} more not shown"})
        return self._post(content, embeds)

    def _post(self, content: str, embeds: list[dict[str, Any]]) -> OutboundRequest:
        while embed_characters(embeds) > TOTAL_LIMIT and len(embeds) > 1:
            embeds.pop(-2 if "title" not in embeds[-1] else -1)
        document = {
            "content": truncate(content, CONTENT_LIMIT),
            "embeds": embeds,
            "allowed_mentions": {"parse": []},
        }
        return OutboundRequest(self.url, json_body(document), {"Content-Type": "application/json"})

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """Discord's 429 says how long to wait in its JSON as well as in Retry-After."""
        verdict = outcome_by_status(status, headers, body)
        if status == 429 and verdict.retry_after is None:
            try:
                seconds = json.loads(body).get("retry_after")
            except (ValueError, AttributeError):
                seconds = None
            if isinstance(seconds, int | float):
                return Outcome(False, True, verdict.reason, parse_retry_after(str(seconds)))
        return verdict
