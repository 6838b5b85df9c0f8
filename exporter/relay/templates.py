"""What a message says: alert views for on-call, text helpers within limits, user templates.

Every target shows the same facts (firing/resolved, severity, GPU, node, value,
summary, description, runbook and Grafana links); this module extracts them
once. User templates run in Jinja2's sandbox: they can read the notification
but not reach Python internals, files or the network.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from exporter.relay.payload import Alert, Notification

TRUNCATED = "… (truncated)"
SUMMARY_LIMIT = 300
DESCRIPTION_LIMIT = 1500

_ENVIRONMENT = SandboxedEnvironment(
    autoescape=False, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined
)
_FRACTION = re.compile(r"(\.\d{6})\d+")


class TemplateError(ValueError):
    """A user template does not compile or fails to render."""


def compile_template(source: str) -> jinja2.Template:
    """Compile a user template in the sandbox.

    Raises:
        TemplateError: with the line and reason.
    """
    try:
        return _ENVIRONMENT.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(f"line {error.lineno}: {error.message}") from None


@dataclass(frozen=True)
class MessageSettings:
    """What every message needs from the configuration."""

    grafana_url: str | None = None
    grafana_dashboard: str = "gpuload-node"
    timezone: str = "UTC"


@dataclass(frozen=True)
class AlertView:
    """One alert as on-call reads it."""

    name: str
    status: str
    severity: str
    gpu: str
    uuid: str
    node: str
    value: str
    summary: str
    description: str
    runbook_url: str
    grafana_url: str
    generator_url: str
    starts_at: str
    ends_at: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    @property
    def where(self) -> str:
        """``GPU 3 (GPU-…) on node-7``, or as much of it as the labels tell."""
        gpu = f"GPU {self.gpu}" if self.gpu else ""
        if self.uuid:
            gpu = f"{gpu} ({self.uuid})" if gpu else self.uuid
        if self.node:
            return f"{gpu} on {self.node}" if gpu else self.node
        return gpu


def view(alert: Alert, settings: MessageSettings) -> AlertView:
    """The on-call view of an alert."""
    labels, annotations = alert.labels, alert.annotations
    return AlertView(
        name=labels.get("alertname", "alert"),
        status=alert.status,
        severity=labels.get("severity", ""),
        gpu=labels.get("gpu", ""),
        uuid=labels.get("uuid", ""),
        node=labels.get("node") or labels.get("instance", ""),
        value=annotations.get("value", ""),
        summary=annotations.get("summary", ""),
        description=annotations.get("description", ""),
        runbook_url=annotations.get("runbook_url", ""),
        grafana_url=grafana_link(labels, settings),
        generator_url=alert.generator_url,
        starts_at=format_time(alert.starts_at, settings.timezone),
        ends_at="" if alert.status == "firing" else format_time(alert.ends_at, settings.timezone),
        labels=labels,
        annotations=annotations,
    )


def grafana_link(labels: Mapping[str, str], settings: MessageSettings) -> str:
    """The node dashboard for the alert's instance and GPU, when a Grafana URL is configured."""
    if not settings.grafana_url:
        return ""
    query = {}
    instance = labels.get("instance") or labels.get("node")
    if instance:
        query["var-instance"] = instance
    if labels.get("gpu"):
        query["var-gpu"] = labels["gpu"]
    suffix = f"?{urlencode(query)}" if query else ""
    return f"{settings.grafana_url}/d/{settings.grafana_dashboard}{suffix}"


def format_time(text: str, timezone: str) -> str:
    """An RFC 3339 time shown in the configured zone; as received if it does not parse."""
    try:
        moment = datetime.fromisoformat(_FRACTION.sub(r"\1", text.replace("Z", "+00:00")))
    except ValueError:
        return text
    if moment.year <= 1:
        return ""
    if moment.tzinfo is None:
        return text
    return moment.astimezone(zoneinfo.ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def alert_name(notification: Notification) -> str:
    """The alert name of the group, or how many different alerts it holds."""
    name = notification.common_labels.get("alertname") or notification.group_labels.get("alertname")
    if name:
        return name
    names = {alert.labels.get("alertname", "alert") for alert in notification.alerts}
    return names.pop() if len(names) == 1 else f"{len(names)} alerts"


def title(notification: Notification) -> str:
    """``[FIRING:2] GPUTemperatureHigh (critical)``, as Alertmanager's own defaults say it."""
    firing = sum(1 for alert in notification.alerts if alert.status == "firing")
    status = f"FIRING:{firing}" if notification.status == "firing" else "RESOLVED"
    severity = notification.common_labels.get("severity")
    suffix = f" ({severity})" if severity else ""
    return f"[{status}] {alert_name(notification)}{suffix}"


def digest_title(notifications: Sequence[Notification]) -> str:
    """The headline of a digest of several notifications."""
    firing = sum(1 for n in notifications if n.status == "firing")
    resolved = len(notifications) - firing
    return (
        f"Alert digest: {len(notifications)} notifications ({firing} firing, {resolved} resolved)"
    )


@dataclass(frozen=True)
class Flavor:
    """How a target's markup writes bold text and links."""

    bold_open: str
    bold_close: str
    slack_links: bool = False

    def escape(self, text: str) -> str:
        """Text from the alert, safe in this markup (Slack reserves &, < and >)."""
        if not self.slack_links:
            return text
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def bold(self, text: str) -> str:
        """Text in bold."""
        return f"{self.bold_open}{text}{self.bold_close}" if text else ""

    def link(self, text: str, url: str) -> str:
        """A link, or nothing without a URL."""
        if not url:
            return ""
        return f"<{url}|{text}>" if self.slack_links else f"[{text}]({url})"


SLACK = Flavor("*", "*", slack_links=True)
MARKDOWN = Flavor("**", "**")


def alert_text(alert: AlertView, flavor: Flavor) -> str:
    """The lines describing one alert, in the target's markup."""
    state = "FIRING" if alert.status == "firing" else "RESOLVED"
    esc = flavor.escape
    headline = " · ".join(esc(part) for part in (state, alert.severity, alert.name) if part)
    lines = [flavor.bold(headline)]
    if alert.summary:
        lines.append(f"{flavor.bold('Summary:')} {esc(truncate(alert.summary, SUMMARY_LIMIT))}")
    facts = [esc(alert.where), f"value {esc(alert.value)}" if alert.value else ""]
    if any(facts):
        lines.append(" · ".join(fact for fact in facts if fact))
    since = f"since {alert.starts_at}" if alert.starts_at else ""
    if alert.ends_at:
        since = f"{since}, resolved {alert.ends_at}" if since else f"resolved {alert.ends_at}"
    if since:
        lines.append(since[0].upper() + since[1:])
    if alert.description:
        # Cut here so that the links after it survive the target's own limit.
        lines.append(esc(truncate(alert.description, DESCRIPTION_LIMIT)))
    links = [
        flavor.link("Runbook", alert.runbook_url),
        flavor.link("Grafana", alert.grafana_url),
        flavor.link("Source", alert.generator_url),
    ]
    if any(links):
        lines.append(" · ".join(link for link in links if link))
    return "\n".join(lines)


def notification_text(
    notification: Notification, settings: MessageSettings, flavor: Flavor, limit: int
) -> str:
    """Every alert of a notification, within `limit` characters, saying how many were left out."""
    views = [view(alert, settings) for alert in notification.alerts]
    parts = [alert_text(v, flavor) for v in views]
    return join_within(parts, "\n\n", limit, notification.truncated_alerts)


def digest_line(notification: Notification, settings: MessageSettings, flavor: Flavor) -> str:
    """One line per notification of a digest, and one per alert under it."""
    esc = flavor.escape
    lines = [flavor.bold(esc(title(notification)))]
    for alert in notification.alerts:
        v = view(alert, settings)
        facts = [esc(v.summary or v.name), esc(v.where), f"value {esc(v.value)}" if v.value else ""]
        link = flavor.link("Runbook", v.runbook_url)
        lines.append("• " + " · ".join(f for f in [*facts, link] if f))
    return "\n".join(lines)


def digest_text(
    notifications: Sequence[Notification], settings: MessageSettings, flavor: Flavor, limit: int
) -> str:
    """A digest body within `limit` characters."""
    parts = [digest_line(n, settings, flavor) for n in notifications]
    return join_within(parts, "\n\n", limit, 0)


def join_within(parts: Sequence[str], separator: str, limit: int, dropped: int) -> str:
    """Join as many parts as fit in `limit`, then say how many were left out.

    A first part that alone is too long is cut with a note instead of dropped.
    """
    shown: list[str] = []
    used = 0
    reserve = 60
    for index, part in enumerate(parts):
        remaining = len(parts) - index - 1 + dropped
        room = limit - used - (len(separator) if shown else 0) - (reserve if remaining else 0)
        if len(part) > room:
            if not shown:
                shown.append(truncate(part, max(room, limit - reserve)))
                dropped += len(parts) - index - 1
            else:
                dropped += len(parts) - index
            break
        shown.append(part)
        used += len(part) + (len(separator) if len(shown) > 1 else 0)
    text = separator.join(shown)
    if dropped:
        note = f"… and {dropped} more alert{'s' if dropped != 1 else ''} not shown"
        text = truncate(text, limit - len(note) - len(separator)) + separator + note
    return truncate(text, limit)


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending with a note when cut."""
    if len(text) <= limit:
        return text
    if limit <= len(TRUNCATED):
        return text[: max(limit, 0)]
    return text[: limit - len(TRUNCATED)] + TRUNCATED


def truncate_bytes(text: str, limit: int) -> str:
    """`text` cut to at most `limit` bytes of UTF-8, never inside a character."""
    if len(text.encode()) <= limit:
        return text
    note = TRUNCATED.encode()
    cut = text.encode()[: max(limit - len(note), 0)].decode("utf-8", errors="ignore")
    return cut + TRUNCATED


def template_context(notification: Notification, settings: MessageSettings) -> dict[str, Any]:
    """What a user template sees: the notification, its alerts as views, and helpers' results."""
    return {
        "status": notification.status,
        "receiver": notification.receiver,
        "title": title(notification),
        "alert_name": alert_name(notification),
        "alerts": [_template_alert(view(alert, settings)) for alert in notification.alerts],
        "group_labels": dict(notification.group_labels),
        "common_labels": dict(notification.common_labels),
        "common_annotations": dict(notification.common_annotations),
        "external_url": notification.external_url,
        "truncated_alerts": notification.truncated_alerts,
        "group_key": notification.group_key,
        "grafana_url": settings.grafana_url or "",
        "payload": notification.document,
    }


def render(template: jinja2.Template, notification: Notification, settings: MessageSettings) -> str:
    """Render a user template.

    Raises:
        TemplateError: when the template fails (an error, or a sandbox refusal).
    """
    try:
        return template.render(template_context(notification, settings))
    except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as error:
        raise TemplateError(f"{type(error).__name__}: {error}") from None


def _template_alert(alert: AlertView) -> dict[str, Any]:
    return {**asdict(alert), "where": alert.where}
