"""PagerDuty Events API v2: trigger and resolve with a stable dedup_key.

One event per notification (no digests: each group is its own incident). The
dedup_key is the SHA-256 of Alertmanager's group key, so the resolve closes
the incident the trigger opened. ``payload.summary`` is at most 1024
characters; severity is one of critical, error, warning, info. PagerDuty
answers 202; 400 is final; 429 and 5xx are retried.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

from exporter.relay.payload import Notification
from exporter.relay.targets.base import OutboundRequest, Target, json_body, register
from exporter.relay.templates import alert_name, title, truncate, view

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SUMMARY_LIMIT = 1024
SEVERITIES = ("critical", "error", "warning", "info")
BODY_LIMIT = 500_000
_NANOSECONDS = re.compile(r"(\.\d{3})\d+")


def dedup_key(notification: Notification) -> str:
    """The same for every event of one Alertmanager group."""
    return hashlib.sha256(notification.group_key.encode()).hexdigest()


def severity(notification: Notification) -> str:
    """PagerDuty's severity from the alerts' `severity` label (the highest firing one)."""
    found = {alert.labels.get("severity", "").lower() for alert in notification.alerts}
    for level in SEVERITIES:
        if level in found:
            return level
    return "error" if "page" in found else "warning"


@register
class PagerDuty(Target):
    """A PagerDuty service's Events API v2 integration."""

    kind = "pagerduty"
    required = ("routing_key",)
    secrets = ("url", "routing_key")
    min_interval = 0.5
    digests = False

    @property
    def url(self) -> str:
        """The Events API, or the configured URL."""
        return self.config.url.value if self.config.url else EVENTS_URL

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A trigger while the group fires, a resolve once it is resolved."""
        notification = notifications[0]
        assert self.config.routing_key is not None
        event: dict[str, Any] = {
            "routing_key": self.config.routing_key.value,
            "dedup_key": dedup_key(notification),
        }
        if notification.status == "resolved":
            event["event_action"] = "resolve"
            return self._post(event)
        event["event_action"] = "trigger"
        views = [view(alert, self.settings) for alert in notification.alerts]
        firing = [v for v in views if v.status == "firing"] or views
        first = firing[0]
        custom = self.user_text(notification)
        summary = custom.strip() if custom else _summary(notification, first.summary, first.where)
        event["payload"] = {
            "summary": truncate(summary or title(notification), SUMMARY_LIMIT),
            "source": first.node or "gpuload",
            "severity": severity(notification),
            "component": f"GPU {first.gpu}" if first.gpu else "gpu",
            "group": alert_name(notification),
            "class": alert_name(notification),
            "custom_details": {
                "firing": len([v for v in views if v.status == "firing"]),
                "resolved": len([v for v in views if v.status == "resolved"]),
                "alerts": [
                    {
                        "alert": v.name,
                        "where": v.where,
                        "value": v.value,
                        "summary": v.summary,
                        "description": v.description,
                        "labels": dict(v.labels),
                    }
                    for v in views
                ],
            },
        }
        if notification.alerts[0].starts_at:
            event["payload"]["timestamp"] = _NANOSECONDS.sub(
                r"\1", notification.alerts[0].starts_at
            )
        links = [{"href": first.runbook_url, "text": "Runbook"}] if first.runbook_url else []
        if first.grafana_url:
            links.append({"href": first.grafana_url, "text": "Grafana"})
        if links:
            event["links"] = links
        event["client"] = "gpuload relay"
        if notification.external_url:
            event["client_url"] = notification.external_url
        body = json_body(event)
        while len(body) > BODY_LIMIT and event["payload"]["custom_details"]["alerts"]:
            event["payload"]["custom_details"]["alerts"].pop()
            event["payload"]["custom_details"]["not_shown"] = len(views) - len(
                event["payload"]["custom_details"]["alerts"]
            )
            body = json_body(event)
        return OutboundRequest(self.url, body, {"Content-Type": "application/json"})

    def _post(self, event: dict[str, Any]) -> OutboundRequest:
        return OutboundRequest(self.url, json_body(event), {"Content-Type": "application/json"})


def _summary(notification: Notification, summary: str, where: str) -> str:
    name = alert_name(notification)
    head = f"{name}: {summary}" if summary else name
    count = len(notification.alerts)
    more = f" (+{count - 1} more)" if count > 1 else ""
    return f"{head} on {where}{more}" if where else f"{head}{more}"
