"""PagerDuty Events API v2: trigger and resolve with a stable dedup_key.

One event per notification (no digests: each group is its own incident). The
dedup_key is the SHA-256 of Alertmanager's group key, so the resolve closes
the incident the trigger opened. ``payload.summary`` is at most 1024
characters; severity is one of critical, error, warning, info, taken from the
firing alerts only; ``timestamp`` is when the latest firing alert started. An
event is at most 512 KB: the alerts' details are encoded once each and as many
as fit are sent, with the count of the others and a link to Alertmanager.
PagerDuty answers 202; 400 is final; 429 and 5xx are retried.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from exporter.relay.payload import Alert, Notification
from exporter.relay.target_config import Secret, option
from exporter.relay.targets.base import (
    OutboundRequest,
    Target,
    json_body,
    parse_http_url,
    register,
)
from exporter.relay.templates import (
    AlertView,
    alert_name,
    alertmanager_url,
    safe_url,
    title,
    truncate,
    view,
)

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
# https://developer.pagerduty.com/docs/events-API-v2/trigger-events : summary 1024 characters,
# dedup_key 255; the overview (response codes and retry logic) gives 512 KB per event, 202
# accepted, 400 invalid (final), 429 throttled and 5xx (retry).
SUMMARY_LIMIT = 1024
SEVERITIES = ("critical", "error", "warning", "info")
BODY_LIMIT = 500_000
_NANOSECONDS = re.compile(r"(\.\d{3})\d+")
_FRACTION = re.compile(r"(\.\d{6})\d+")


def dedup_key(notification: Notification) -> str:
    """The same for every event of one Alertmanager group."""
    return hashlib.sha256(notification.group_key.encode()).hexdigest()


def severity(notification: Notification) -> str:
    """PagerDuty's severity from the firing alerts' `severity` label (the highest one).

    Resolved alerts of the group do not count: a resolved critical alert beside a firing
    warning is a warning.
    """
    firing = [alert for alert in notification.alerts if alert.status == "firing"]
    found = {alert.labels.get("severity", "").lower() for alert in firing}
    for level in SEVERITIES:
        if level in found:
            return level
    return "error" if "page" in found else "warning"


@dataclass(frozen=True)
class PagerDutyOptions:
    """What a PagerDuty integration takes besides the shared settings."""

    routing_key: Secret = option(
        required=True, secret=True, help="the service's Events API v2 integration key"
    )
    # The shared `url` again, optional here: the Events API is the same for every account.
    url: Secret | None = option(
        parse_http_url, secret=True, help=f"the Events API (default {EVENTS_URL})"
    )


@register
class PagerDuty(Target):
    """A PagerDuty service's Events API v2 integration."""

    kind = "pagerduty"
    options_type = PagerDutyOptions
    options: PagerDutyOptions
    min_interval = 0.5
    digests = False

    @property
    def url(self) -> str:
        """The Events API, or the configured URL."""
        return self.options.url.value if self.options.url else EVENTS_URL

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """A trigger while the group fires, a resolve once it is resolved."""
        notification = notifications[0]
        event: dict[str, Any] = {
            "routing_key": self.options.routing_key.value,
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
        details = _details(views)
        event["payload"] = {
            "summary": truncate(summary or title(notification), SUMMARY_LIMIT),
            "source": first.node or "gpuload",
            "severity": severity(notification),
            "timestamp": timestamp(notification, now),
            "component": f"GPU {first.gpu}" if first.gpu else "gpu",
            "group": alert_name(notification),
            "class": alert_name(notification),
            "custom_details": {
                "firing": len([v for v in views if v.status == "firing"]),
                "resolved": len([v for v in views if v.status == "resolved"]),
                "alerts": [],
            },
        }
        links = [
            {"href": url, "text": text}
            for text, url in (("Runbook", first.runbook_url), ("Grafana", first.grafana_url))
            if safe_url(url)
        ]
        more_url = alertmanager_url(notification)
        event["client"] = "gpuload relay"
        if safe_url(notification.external_url):
            event["client_url"] = notification.external_url
        # Encode each alert's details once and keep those that fit: linear in the alerts.
        encoded = [json_body(detail) for detail in details]
        frame = len(json_body({**event, "links": [*links, {"href": more_url, "text": "x" * 40}]}))
        room = BODY_LIMIT - frame - len(',"not_shown":') - 12
        shown = 0
        for item in encoded:
            room -= len(item) + 1
            if room < 0:
                break
            shown += 1
        event["payload"]["custom_details"]["alerts"] = details[:shown]
        missing = len(details) - shown
        if missing:
            event["payload"]["custom_details"]["not_shown"] = missing
            if more_url:
                links.append({"href": more_url, "text": f"{missing} more in Alertmanager"})
        if links:
            event["links"] = links
        return OutboundRequest(self.url, json_body(event), {"Content-Type": "application/json"})

    def _post(self, event: dict[str, Any]) -> OutboundRequest:
        return OutboundRequest(self.url, json_body(event), {"Content-Type": "application/json"})


def timestamp(notification: Notification, now: float) -> str:
    """When the latest firing alert started (as Alertmanager wrote it), or `now` if none fires."""
    latest: tuple[datetime, Alert] | None = None
    for alert in notification.alerts:
        started = _parse(alert.starts_at) if alert.status == "firing" else None
        if started is not None and (latest is None or started > latest[0]):
            latest = (started, alert)
    if latest is None:
        return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return _NANOSECONDS.sub(r"\1", latest[1].starts_at)


def _parse(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(_FRACTION.sub(r"\1", text.replace("Z", "+00:00")))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None and moment.year > 1 else None


def _details(views: Sequence[AlertView]) -> list[dict[str, Any]]:
    return [
        {
            "alert": v.name,
            "where": v.where,
            "value": v.value,
            "summary": v.summary,
            "description": v.description,
            "labels": dict(v.labels),
        }
        for v in views
    ]


def _summary(notification: Notification, summary: str, where: str) -> str:
    name = alert_name(notification)
    head = f"{name}: {summary}" if summary else name
    count = len(notification.alerts)
    more = f" (+{count - 1} more)" if count > 1 else ""
    return f"{head} on {where}{more}" if where else f"{head}{more}"
