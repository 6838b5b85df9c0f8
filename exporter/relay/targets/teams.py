"""Microsoft Teams through a Workflows webhook: one Adaptive Card (version 1.4).

The body is ``{"type": "message", "attachments": [{"contentType":
"application/vnd.microsoft.card.adaptive", "content": <card>}]}``. Teams takes
28 KB per message: alerts that do not fit are counted and linked to
Alertmanager, not sent. Each part of the card is encoded once and the card is
spliced together, so the cost is linear in the alerts.

A Workflows webhook answers 202 Accepted and runs the flow afterwards: a card
the flow cannot post, or a flow that was turned off, is never reported back.
The relay counts 202 as delivered and says that it is unconfirmed. The
retired Office 365 connector URLs (``*.webhook.office.com/webhookb2/...``) are
warned about at start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from exporter.relay.payload import Notification
from exporter.relay.targets.base import (
    OutboundRequest,
    Outcome,
    Target,
    json_body,
    outcome_by_status,
    register,
)
from exporter.relay.templates import (
    TEAMS,
    alert_parts,
    alertmanager_url,
    digest_parts,
    digest_title,
    fit,
    grafana_link,
    safe_url,
    title,
)

# "The message size limit is 28 KB": https://learn.microsoft.com/en-us/microsoftteams/platform/
# webhooks-and-connectors/how-to/add-incoming-webhook (a 413 beyond it, a 429 past four
# requests a second). The card is kept a little under it.
CARD_BYTES = 27_000
TEXT_LIMIT = 4000
UNCONFIRMED = (
    "accepted (HTTP 202): a Teams Workflows webhook runs its flow afterwards, so delivery to "
    "the channel cannot be confirmed"
)
_PLACEHOLDER = "gpuload-card-body"


def _text_block(text: str, **style: Any) -> dict[str, Any]:
    # Adaptive Cards' markdown needs a blank line for a line break.
    return {
        "type": "TextBlock",
        "text": TEAMS.cut(text, TEXT_LIMIT).replace("\n", "\n\n"),
        "wrap": True,
        **style,
    }


def _alert_block(text: str) -> dict[str, Any]:
    return {"type": "Container", "separator": True, "items": [_text_block(text)]}


def message(body: list[Any], actions: list[dict[str, Any]]) -> dict[str, Any]:
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


def card(
    head: list[dict[str, Any]],
    parts: Sequence[dict[str, Any]],
    dropped: int,
    actions: list[dict[str, Any]],
    more_url: str,
) -> bytes:
    """The encoded message with as many parts as fit in CARD_BYTES, then a note for the rest."""
    frame = json_body(message([_PLACEHOLDER], actions))
    placeholder = json_body([_PLACEHOLDER])
    encoded_head = [json_body(item) for item in head]
    encoded = [json_body(part) for part in parts]
    note = json_body(_note(len(parts) + dropped, more_url))
    # The frame without its placeholder, the head's items and the commas between items.
    fixed = len(frame) - len(placeholder) + 2 + sum(len(item) + 1 for item in encoded_head)
    count = fit([len(item) for item in encoded], CARD_BYTES - fixed, len(note), 1, dropped=dropped)
    items = [*encoded_head, *encoded[:count]]
    missing = len(parts) - count + dropped
    if missing:
        items.append(json_body(_note(missing, more_url)))
    return frame.replace(placeholder, b"[" + b",".join(items) + b"]", 1)


def _note(count: int, url: str) -> dict[str, Any]:
    return _text_block(TEAMS.more(count, url), isSubtle=True)


@register
class Teams(Target):
    """A Teams channel's Workflows webhook."""

    kind = "teams"
    min_interval = 1.0

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """An Adaptive Card for one notification, or a digest."""
        more_url = alertmanager_url(notifications[0])
        if len(notifications) > 1:
            head = [
                _text_block(
                    TEAMS.escape(digest_title(notifications)), weight="Bolder", size="Medium"
                )
            ]
            parts = [
                _text_block(text, separator=True)
                for text in digest_parts(notifications, self.settings, TEAMS)
            ]
            return self._post(card(head, parts, 0, [], more_url))
        notification = notifications[0]
        firing = notification.status == "firing"
        head = [
            _text_block(
                TEAMS.escape(title(notification)),
                weight="Bolder",
                size="Medium",
                color="Attention" if firing else "Good",
            )
        ]
        custom = self.user_text(notification)
        if custom is not None:
            return self._post(card(head, [_text_block(custom)], 0, [], more_url))
        actions = []
        if len(notification.alerts) == 1:
            annotations = notification.alerts[0].annotations
            for label, url in (
                ("Runbook", annotations.get("runbook_url", "")),
                ("Grafana", grafana_link(notification.alerts[0].labels, self.settings)),
            ):
                if safe_url(url):
                    actions.append({"type": "Action.OpenUrl", "title": label, "url": url})
        parts = [_alert_block(text) for text in alert_parts(notification, self.settings, TEAMS)]
        body = card(head, parts, notification.truncated_alerts, actions, more_url)
        return self._post(body)

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """202 is accepted, not confirmed; 400 and 413 are final; 429 and 5xx are retried."""
        if status == 202:
            return Outcome(True, False, UNCONFIRMED, confirmed=False)
        return outcome_by_status(status, headers, body)

    def _post(self, body: bytes) -> OutboundRequest:
        return OutboundRequest(self.url, body, {"Content-Type": "application/json"})


def retired_connector(url: str) -> bool:
    """Whether `url` is an Office 365 connector webhook, which Microsoft retired.

    https://devblogs.microsoft.com/microsoft365dev/retirement-of-office-365-connectors-within-microsoft-teams/
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host.endswith("webhook.office.com") and parts.path.startswith("/webhookb2/"):
        return True
    return host == "outlook.office.com" and parts.path.startswith("/webhook/")
