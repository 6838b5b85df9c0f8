"""Microsoft Teams through a Workflows webhook: one Adaptive Card (version 1.4).

The body is ``{"type": "message", "attachments": [{"contentType":
"application/vnd.microsoft.card.adaptive", "content": <card>}]}``. Teams takes
about 28 KB per message: alerts that do not fit are counted, not sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.relay.payload import Notification
from exporter.relay.targets.base import OutboundRequest, Target, json_body, register
from exporter.relay.templates import (
    MARKDOWN,
    AlertView,
    alert_text,
    digest_line,
    digest_title,
    title,
    truncate,
    view,
)

CARD_BYTES = 27_000
TEXT_LIMIT = 4000


def _text_block(text: str, **style: Any) -> dict[str, Any]:
    # Adaptive Cards' markdown needs a blank line for a line break.
    return {
        "type": "TextBlock",
        "text": truncate(text, TEXT_LIMIT).replace("\n", "\n\n"),
        "wrap": True,
        **style,
    }


def _alert_blocks(alert: AlertView) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [
        {
            "type": "Container",
            "separator": True,
            "items": [_text_block(alert_text(alert, MARKDOWN))],
        }
    ]
    return blocks


def message(body: list[dict[str, Any]], actions: list[dict[str, Any]]) -> dict[str, Any]:
    """The Workflows message around a card."""
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "msteams": {"width": "Full"},
        "body": body,
    }
    if actions:
        card["actions"] = actions
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


def _fit(
    head: list[dict[str, Any]],
    parts: Sequence[list[dict[str, Any]]],
    dropped: int,
    actions: list[dict[str, Any]],
) -> bytes:
    count = len(parts)
    while True:
        body = list(head)
        for part in parts[:count]:
            body.extend(part)
        missing = dropped + len(parts) - count
        if missing:
            body.append(_text_block(f"… and {missing} more not shown", isSubtle=True))
        encoded = json_body(message(body, actions))
        if len(encoded) <= CARD_BYTES or count == 0:
            return encoded
        count -= 1


@register
class Teams(Target):
    """A Teams channel's Workflows webhook."""

    kind = "teams"
    min_interval = 1.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """An Adaptive Card for one notification, or a digest."""
        if len(notifications) > 1:
            head = [_text_block(digest_title(notifications), weight="Bolder", size="Medium")]
            parts = [
                [_text_block(digest_line(n, self.settings, MARKDOWN), separator=True)]
                for n in notifications
            ]
            return self._post(_fit(head, parts, 0, []))
        notification = notifications[0]
        firing = notification.status == "firing"
        head = [
            _text_block(
                title(notification),
                weight="Bolder",
                size="Medium",
                color="Attention" if firing else "Good",
            )
        ]
        custom = self.user_text(notification)
        if custom is not None:
            return self._post(_fit(head, [[_text_block(custom)]], 0, []))
        views = [view(alert, self.settings) for alert in notification.alerts]
        actions = []
        if len(views) == 1:
            for label, url in (
                ("Runbook", views[0].runbook_url),
                ("Grafana", views[0].grafana_url),
            ):
                if url:
                    actions.append({"type": "Action.OpenUrl", "title": label, "url": url})
        parts = [_alert_blocks(v) for v in views]
        return self._post(_fit(head, parts, notification.truncated_alerts, actions))

    def _post(self, body: bytes) -> OutboundRequest:
        return OutboundRequest(self.url, body, {"Content-Type": "application/json"})
