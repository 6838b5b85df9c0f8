"""Discord webhooks: a short ``content`` line and one embed per alert, within Discord's limits.

Limits: content 2000 characters, 10 embeds, embed title 256 and description
4096, 6000 characters over all embeds, counted here in UTF-16 code units (an
emoji is two). Over them Discord answers 400 (code 50035), as it does for an
embed ``url`` that is not a valid URL: the message is cut to fit first, and the
runbook URL goes in ``url`` only when it is a plain http(s) URL. Alert text is
escaped with backslashes; ``allowed_mentions`` keeps ``@everyone`` silent. 429
carries ``retry_after``; other 4xx (404 unknown webhook) are final.
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
    DISCORD,
    AlertView,
    alert_text,
    alertmanager_url,
    digest_text,
    digest_title,
    safe_url,
    title,
    view,
)

# https://discord.com/developers/docs/resources/message#embed-object-embed-limits and
# https://discord.com/developers/docs/resources/webhook#execute-webhook (content 2000, 10 embeds)
CONTENT_LIMIT = 2000
EMBED_LIMIT = 10
TITLE_LIMIT = 256
DESCRIPTION_LIMIT = 4096
TOTAL_LIMIT = 6000
RED, GREEN = 0xE01E5A, 0x2EB67D


def embed_characters(embeds: Sequence[Mapping[str, Any]]) -> int:
    """Characters Discord counts against its 6000 limit (titles, descriptions, fields, footers)."""
    size = DISCORD.size
    total = 0
    for embed in embeds:
        total += size(embed.get("title", "")) + size(embed.get("description", ""))
        total += size(embed.get("footer", {}).get("text", ""))
        total += sum(size(f["name"]) + size(f["value"]) for f in embed.get("fields", []))
    return total


def _embed(alert: AlertView, budget: int) -> dict[str, Any]:
    text = alert_text(alert, DISCORD)
    headline, _, rest = text.partition("\n")
    embed_title = DISCORD.cut(headline.removeprefix("**").removesuffix("**"), TITLE_LIMIT)
    room = min(DESCRIPTION_LIMIT, budget - DISCORD.size(embed_title))
    embed: dict[str, Any] = {
        "title": embed_title,
        "description": DISCORD.cut(rest, max(room, 20)),
        "color": RED if alert.status == "firing" else GREEN,
    }
    url = safe_url(alert.runbook_url)
    if url:
        embed["url"] = url
    return embed


@register
class Discord(Target):
    """A Discord channel webhook."""

    kind = "discord"
    min_interval = 2.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A message with embeds for one notification, or a digest."""
        more_url = alertmanager_url(notifications[0])
        if len(notifications) > 1:
            content = DISCORD.escape(digest_title(notifications))
            text = digest_text(notifications, self.settings, DISCORD, DESCRIPTION_LIMIT)
            embeds = [{"description": text, "color": RED}]
            return self._post(content, embeds)
        notification = notifications[0]
        content = DISCORD.escape(title(notification))
        custom = self.user_text(notification)
        if custom is not None:
            return self._post(content, [{"description": DISCORD.cut(custom, DESCRIPTION_LIMIT)}])
        alerts = notification.alerts
        missing = notification.truncated_alerts + max(len(alerts) - EMBED_LIMIT, 0)
        shown = alerts[: EMBED_LIMIT - 1] if missing else alerts
        missing = notification.truncated_alerts + len(alerts) - len(shown)
        note: dict[str, Any] | None = (
            {"description": DISCORD.more(missing, more_url)} if missing else None
        )
        room = TOTAL_LIMIT - (embed_characters([note]) if note else 0)
        budget = room // max(len(shown), 1)
        embeds = [_embed(view(alert, self.settings), budget) for alert in shown]
        if note:
            embeds.append(note)
        return self._post(content, embeds)

    def _post(self, content: str, embeds: list[dict[str, Any]]) -> OutboundRequest:
        while embed_characters(embeds) > TOTAL_LIMIT and len(embeds) > 1:
            embeds.pop(-2 if "title" not in embeds[-1] else -1)
        document = {
            "content": DISCORD.cut(content, CONTENT_LIMIT),
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
