"""What a message says: alert views for on-call, text helpers within limits, user templates.

Every target shows the same facts (firing/resolved, severity, GPU, node, value,
summary, description, runbook and Grafana links); this module extracts them
once. User templates run in Jinja2's sandbox: they can read the notification
but not reach Python internals, files or the network.
"""

from __future__ import annotations

import functools
import json
import re
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from exporter.relay.payload import RESOLVED_VALUE, Alert, Notification

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


# The order of severities from the worst, for a digest's headline (PagerDuty's four, then
# Prometheus's usual `info`, which is among them).
SEVERITY_ORDER = ("critical", "error", "warning", "info")


def _node(labels: Mapping[str, str]) -> str:
    return labels.get("node") or labels.get("instance", "")


def _gpus(alerts: Sequence[Alert]) -> set[tuple[str, str]]:
    """The GPUs the alerts are about, as (node, GPU index); node-level alerts name none."""
    return {(_node(a.labels), a.labels["gpu"]) for a in alerts if a.labels.get("gpu")}


def where_brief(alerts: Sequence[Alert]) -> str:
    """Where the alerts happened, short enough for a preview.

    ``GPU 3 on node-7``, ``2 GPUs on node-7``, ``5 GPUs on 2 nodes``, or the node alone for
    node-level alerts.
    """
    gpus = _gpus(alerts)
    nodes = {_node(a.labels) for a in alerts} - {""}
    if len(gpus) == 1:
        ((node, gpu),) = gpus
        return f"GPU {gpu} on {node}" if node else f"GPU {gpu}"
    on = (
        f" on {next(iter(nodes))}"
        if len(nodes) == 1
        else f" on {len(nodes)} nodes"
        if nodes
        else ""
    )
    if gpus:
        return f"{len(gpus)} GPUs{on}"
    return on.removeprefix(" on ")


def title(notification: Notification) -> str:
    """``[FIRING:2] GPUTemperatureHigh (critical) · GPU 3 on node-7``: Alertmanager's title.

    It is the preview of every target's message (Slack's ``text``, the first line of a push
    notification), so it names the alert, the node and the GPU, not only the alert.
    """
    firing = sum(1 for alert in notification.alerts if alert.status == "firing")
    status = f"FIRING:{firing}" if notification.status == "firing" else "RESOLVED"
    severity = notification.common_labels.get("severity")
    suffix = f" ({severity})" if severity else ""
    where = where_brief(notification.alerts)
    return f"[{status}] {alert_name(notification)}{suffix}" + (f" · {where}" if where else "")


def worst(alerts: Sequence[Alert]) -> Alert | None:
    """The alert on-call must see first: firing before resolved, then by severity."""

    def rank(alert: Alert) -> tuple[int, int]:
        severity = alert.labels.get("severity", "")
        order = (
            SEVERITY_ORDER.index(severity) if severity in SEVERITY_ORDER else len(SEVERITY_ORDER)
        )
        return (alert.status != "firing", order)

    return min(alerts, key=rank, default=None)


def digest_title(notifications: Sequence[Notification]) -> str:
    """The headline of a digest: its worst alert and where, then how many GPUs and notifications.

    ``Alert digest: GPUFellOffBus (critical) · GPU 3 on node-7 · 4 GPUs · 8 notifications
    (6 firing, 2 resolved)``: the preview names what to look at first, and how wide it is
    before the counts a short title (DingTalk's 100 characters) may cut.
    """
    alerts = [alert for n in notifications for alert in n.alerts]
    firing = sum(1 for n in notifications if n.status == "firing")
    resolved = len(notifications) - firing
    count = f"{len(notifications)} notifications ({firing} firing, {resolved} resolved)"
    gpus = len(_gpus(alerts))
    width = f"{gpus} GPU{'s' if gpus > 1 else ''}" if gpus else ""
    first = worst(alerts)
    if first is None:
        return f"Alert digest: {count}"
    severity = first.labels.get("severity")
    name = first.labels.get("alertname", "alert") + (f" ({severity})" if severity else "")
    if first.status != "firing":
        name += " resolved"
    where = where_brief([first])
    return " · ".join(part for part in (f"Alert digest: {name}", where, width, count) if part)


# How services count a message's size: characters (code points), UTF-16 code units (Slack,
# Discord and Teams run on JavaScript: an emoji counts twice), bytes of UTF-8 (WeCom), or bytes
# of UTF-8 once written as a JSON string (robots whose limit is on the whole body).
CHARS, UTF16, UTF8, JSON_UTF8 = "chars", "utf16", "utf8", "json_utf8"
# Not allowed in a URL put into a link: whitespace, control characters and markup that would
# end the link or start another (Slack's <url|text>, markdown's [text](url), HTML tags).
_UNSAFE_URL = re.compile(r"[\s\x00-\x1f\x7f<>|\[\]()\"'`{}\\^]")
# A zero-width space: breaks a tag or link opener apart without changing what the reader sees.
ZWSP = "\u200b"


def measure(text: str, unit: str) -> int:
    """The size of `text` as a service counts it."""
    if unit == CHARS:
        return len(text)
    if unit == UTF16:
        return len(text) if text.isascii() else len(text.encode("utf-16-le", "surrogatepass")) // 2
    if unit == UTF8:
        return len(text) if text.isascii() else len(text.encode())
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


def _json_cost(char: str) -> int:
    if char in '"\\\n\r\t\b\f':
        return 2
    if char < " ":
        return 6
    return len(char.encode())


def prefix_within(text: str, room: int, unit: str) -> int:
    """The length of the longest prefix of `text` of size at most `room` (whole characters)."""
    if room <= 0:
        return 0
    if unit == CHARS or (text.isascii() and unit != JSON_UTF8):
        return min(room, len(text))
    if unit == UTF16:
        # A pair cut in half does not decode and is dropped: never half an emoji.
        head = text.encode("utf-16-le", "surrogatepass")[: room * 2]
        return len(head.decode("utf-16-le", errors="ignore"))
    if unit == UTF8:
        return len(text.encode()[:room].decode(errors="ignore"))
    used = 0
    for index, char in enumerate(text):
        used += _json_cost(char)
        if used > room:
            return index
    return len(text)


def safe_url(url: str) -> str:
    """`url` when it is an http(s) URL safe to put in a link; otherwise the empty string.

    A URL with spaces or markup characters would end the link early and let the rest be read as
    markup (a Slack ``<!channel>``), and services that check link fields (Discord's embed URL)
    refuse the whole message for it: such a URL is left out.
    """
    if not url or len(url) > 2048 or _UNSAFE_URL.search(url):
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return ""
    return url


def alertmanager_url(notification: Notification) -> str:
    """Alertmanager's page of the receiver's alerts, where every alert of the group is shown."""
    if not notification.external_url:
        return ""
    base = notification.external_url.rstrip("/")
    return safe_url(f"{base}/#/alerts?receiver={quote(notification.receiver, safe='')}")


@dataclass(frozen=True)
class Flavor:
    """A target's markup: how it writes bold text and links, escapes alert text, counts size.

    ``escapes`` maps each reserved character to what stands for it. Slack documents HTML
    entities for &, < and >; Discord documents backslash escapes. Where a service documents
    no escape (Teams' Adaptive Card text, DingTalk, WeCom and Feishu's lark_md), a zero-width
    space after ``<`` and ``]`` breaks tags (``<at id=all>``, ``<@userid>``, ``<font>``) and
    links (``[text](url)``, images) apart without changing what the reader sees.
    """

    bold_open: str
    bold_close: str
    escapes: Mapping[str, str]
    slack_links: bool = False
    unit: str = CHARS

    def escape(self, text: str) -> str:
        """Text from the alert, shown as written in this markup."""
        return text.translate(_table(tuple(self.escapes.items())))

    def bold(self, text: str) -> str:
        """Text in bold."""
        return f"{self.bold_open}{text}{self.bold_close}" if text else ""

    def link(self, text: str, url: str) -> str:
        """A link, or nothing without a valid URL."""
        url = safe_url(url)
        if not url:
            return ""
        return f"<{url}|{text}>" if self.slack_links else f"[{text}]({url})"

    def size(self, text: str) -> int:
        """The size of `text` as this target's service counts it."""
        return measure(text, self.unit)

    def more(self, count: int, url: str) -> str:
        """The note for alerts left out, with a link to where they all are."""
        link = self.link("see all in Alertmanager", url)
        return f"… and {count} more not shown" + (f" · {link}" if link else "")

    def cut(self, text: str, limit: int) -> str:
        r"""`text` within `limit`, ending with a note when cut.

        The cut falls between whole characters, never inside an escape (``&amp;``, ``\*``)
        and never inside one of our links, so what remains renders as it would have.
        """
        if self.size(text) <= limit:
            return text
        room = limit - self.size(TRUNCATED)
        if room <= 0:
            return text[: prefix_within(text, limit, self.unit)]
        end = self._boundary(text, prefix_within(text, room, self.unit))
        return text[:end] + TRUNCATED

    def _boundary(self, text: str, end: int) -> int:
        if "&" in self.escapes:
            entity = text.rfind("&", max(end - 8, 0), end)
            if entity >= 0 and ";" not in text[entity:end]:
                end = entity
        backslashes = len(text[:end]) - len(text[:end].rstrip("\\"))
        if "\\" in self.escapes and backslashes % 2:
            end -= 1
        opener, closer = ("<", ">") if self.slack_links else ("[", ")")
        start = text.rfind(opener, 0, end)
        if start >= 0 and self._ours(text, start) and closer not in text[start:end]:
            end = start
        return end

    def _ours(self, text: str, index: int) -> bool:
        """Whether the link opener at `index` is our markup rather than escaped alert text."""
        if self.slack_links:
            return True  # alert text never holds a raw <
        if text[index + 1 : index + 2] == ZWSP:
            return False
        preceding = len(text[:index]) - len(text[:index].rstrip("\\"))
        return preceding % 2 == 0


@functools.lru_cache(maxsize=16)
def _table(escapes: tuple[tuple[str, str], ...]) -> dict[int, str]:
    return {ord(char): replacement for char, replacement in escapes}


# https://api.slack.com/reference/surfaces/formatting#escaping: &, < and > as HTML entities;
# links are <url|text>, so a | or > in a URL would end it early (see safe_url).
SLACK = Flavor("*", "*", {"&": "&amp;", "<": "&lt;", ">": "&gt;"}, slack_links=True, unit=UTF16)
# Discord's markdown takes a backslash before any markup character.
DISCORD = Flavor("**", "**", {c: "\\" + c for c in "\\*_~`|[]<>#"}, unit=UTF16)
NEUTRAL = {"<": "<" + ZWSP, "]": "]" + ZWSP}
TEAMS = Flavor("**", "**", NEUTRAL, unit=UTF16)
ROBOT = Flavor("**", "**", NEUTRAL, unit=JSON_UTF8)


def alert_text(alert: AlertView, flavor: Flavor) -> str:
    """The lines describing one alert, in the target's markup."""
    state = "FIRING" if alert.status == "firing" else "RESOLVED"
    esc = flavor.escape
    headline = " · ".join(esc(part) for part in (state, alert.severity, alert.name) if part)
    lines = [flavor.bold(headline)]
    if alert.summary:
        lines.append(f"{flavor.bold('Summary:')} {esc(truncate(alert.summary, SUMMARY_LIMIT))}")
    facts = [esc(alert.where), esc(value_text(alert))]
    if any(facts):
        lines.append(" · ".join(fact for fact in facts if fact))
    since = f"since {alert.starts_at}" if alert.starts_at else ""
    if alert.ends_at:
        since = f"{since}, resolved {alert.ends_at}" if since else f"resolved {alert.ends_at}"
    if since:
        lines.append(esc(since[0].upper() + since[1:]))
    if alert.description:
        # Cut here (before escaping, so no escape is split) so that the links after it survive
        # the target's own limit.
        lines.append(esc(truncate(alert.description, DESCRIPTION_LIMIT)))
    links = [
        flavor.link("Runbook", alert.runbook_url),
        flavor.link("Grafana", alert.grafana_url),
        flavor.link("Source", alert.generator_url),
    ]
    if any(links):
        lines.append(" · ".join(link for link in links if link))
    return "\n".join(lines)


def value_text(alert: AlertView) -> str:
    """``value 97%`` while firing; ``value was 97%`` once resolved.

    Alertmanager's resolved alerts carry the annotations of their last firing evaluation, so
    the value of a resolved alert is what it was while firing, never what it is now. gpuload's
    own alerting says the value at resolution in ``resolved_value``, when it has one.
    """
    if alert.status == "firing":
        return f"value {alert.value}" if alert.value else ""
    now = alert.annotations.get(RESOLVED_VALUE, "")
    was = f"was {alert.value}" if alert.value else ""
    if now:
        return f"value {now} at resolution" + (f", {was}" if was else "")
    return f"value {was}" if was else ""


def alert_parts(notification: Notification, settings: MessageSettings, flavor: Flavor) -> list[str]:
    """One text per alert of the notification, in the target's markup."""
    return [alert_text(view(alert, settings), flavor) for alert in notification.alerts]


def notification_text(
    notification: Notification, settings: MessageSettings, flavor: Flavor, limit: int
) -> str:
    """Every alert of a notification, within `limit`, saying how many were left out."""
    parts = alert_parts(notification, settings, flavor)
    return join_within(
        parts, "\n\n", limit, notification.truncated_alerts, flavor, alertmanager_url(notification)
    )


def digest_line(notification: Notification, settings: MessageSettings, flavor: Flavor) -> str:
    """One line per notification of a digest, and one per alert under it."""
    esc = flavor.escape
    lines = [flavor.bold(esc(title(notification)))]
    for alert in notification.alerts:
        v = view(alert, settings)
        facts = [esc(v.summary or v.name), esc(v.where), esc(value_text(v))]
        link = flavor.link("Runbook", v.runbook_url)
        lines.append("• " + " · ".join(f for f in [*facts, link] if f))
    return "\n".join(lines)


def digest_parts(
    notifications: Sequence[Notification], settings: MessageSettings, flavor: Flavor
) -> list[str]:
    """One part per notification of a digest, each cut to a share of the digest's room."""
    return [digest_line(n, settings, flavor) for n in notifications]


def digest_text(
    notifications: Sequence[Notification], settings: MessageSettings, flavor: Flavor, limit: int
) -> str:
    """A digest body within `limit`."""
    parts = digest_parts(notifications, settings, flavor)
    url = alertmanager_url(notifications[0]) if notifications else ""
    return join_within(parts, "\n\n", limit, 0, flavor, url)


def fit(sizes: Sequence[int], budget: int, note: int, gap: int = 0, *, dropped: int = 0) -> int:
    """How many leading parts fit in `budget` with `gap` between them.

    When some are left out (or `dropped` already were), room for the note of size `note` (and
    its gap) is kept. One pass over the sizes: linear in the number of parts.
    """
    total = len(sizes)
    used = 0
    count = 0
    for index, size in enumerate(sizes):
        used += size + (gap if index else 0)
        rest = total - index - 1 + dropped
        if used + (note + gap if rest else 0) > budget:
            break
        count = index + 1
    return count


def join_within(
    parts: Sequence[str],
    separator: str,
    limit: int,
    dropped: int,
    flavor: Flavor,
    more_url: str = "",
) -> str:
    """Join as many parts as fit in `limit` (as `flavor` counts), then say how many were left out.

    A first part that alone is too long is cut with a note instead of dropped. Each part is
    measured once: the cost is linear in the parts.
    """
    gap = flavor.size(separator)
    note = flavor.size(flavor.more(len(parts) + dropped, more_url))
    count = fit([flavor.size(part) for part in parts], limit, note, gap, dropped=dropped)
    shown = list(parts[:count])
    if not shown and parts:
        left = len(parts) - 1 + dropped
        shown = [flavor.cut(parts[0], limit - (note + gap if left else 0))]
        count = 1
    missing = len(parts) - count + dropped
    if missing:
        shown.append(flavor.more(missing, more_url))
    return separator.join(shown)


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending with a note when cut."""
    if len(text) <= limit:
        return text
    if limit <= len(TRUNCATED):
        return text[: max(limit, 0)]
    return text[: limit - len(TRUNCATED)] + TRUNCATED


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
