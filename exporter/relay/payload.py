"""Alertmanager's webhook payload (version 4): parsed and checked, or refused with a reason.

Only the fields the relay relies on are checked; unknown fields (``routeLabels``,
``notification_reason`` in newer releases) are kept as received. Every string
must be valid Unicode: JSON lets half of a UTF-16 surrogate pair stand alone as
an escape, but no UTF-8 text (the queue's, a target's) can hold it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The annotation in which gpuload's own alerting gives a resolved alert's value at resolution
# (Alertmanager's resolved alerts carry only the annotations of their last firing evaluation).
RESOLVED_VALUE = "resolved_value"

STATUSES = ("firing", "resolved")

# A surrogate's escape: only a body holding one can decode to a string with a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


class PayloadError(ValueError):
    """The body is not an Alertmanager webhook payload; the message is one line."""


@dataclass(frozen=True)
class Alert:
    """One alert of a notification."""

    status: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: str
    ends_at: str
    generator_url: str
    fingerprint: str


@dataclass(frozen=True)
class Notification:
    """One Alertmanager notification: a group of alerts sent to one receiver."""

    receiver: str
    status: str
    group_key: str
    alerts: tuple[Alert, ...]
    group_labels: Mapping[str, str]
    common_labels: Mapping[str, str]
    common_annotations: Mapping[str, str]
    external_url: str
    truncated_alerts: int
    document: Mapping[str, Any]

    def dedup_key(self) -> str:
        """The same for Alertmanager's re-sends of this group, status and set of alerts.

        Each alert's own status is part of it: a group that stays firing while one of
        its alerts resolves is a new notification.
        """
        alerts = sorted((a.fingerprint, a.starts_at, a.status) for a in self.alerts)
        text = json.dumps([self.group_key, self.status, alerts], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def subset(self, indexes: Sequence[int]) -> Notification:
        """The same notification limited to the alerts at `indexes` (those routed to a target)."""
        if len(indexes) == len(self.alerts):
            return self
        alerts = tuple(self.alerts[i] for i in indexes)
        status = "firing" if any(a.status == "firing" for a in alerts) else "resolved"
        raw_alerts = self.document["alerts"]
        document = {**self.document, "alerts": [raw_alerts[i] for i in indexes], "status": status}
        return Notification(
            receiver=self.receiver,
            status=status,
            group_key=self.group_key,
            alerts=alerts,
            group_labels=self.group_labels,
            common_labels=self.common_labels,
            common_annotations=self.common_annotations,
            external_url=self.external_url,
            truncated_alerts=self.truncated_alerts,
            document=document,
        )

    def to_json(self) -> str:
        """The Alertmanager JSON document, as received (limited to this notification's alerts)."""
        return json.dumps(self.document, separators=(",", ":"), ensure_ascii=False)


def parse(body: bytes | str) -> Notification:
    """Parse and check a webhook body.

    Raises:
        PayloadError: with a one-line reason for the HTTP 400 answer.
    """
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise PayloadError(f"not JSON: {reason}") from None
    if not isinstance(document, dict):
        raise PayloadError("not an Alertmanager webhook payload: expected a JSON object")
    _check_unicode(body, document)
    if str(document.get("version")) != "4":
        raise PayloadError(
            f"not an Alertmanager webhook payload version 4: version is "
            f"{_shown(document.get('version'))}"
        )
    raw_alerts = document.get("alerts")
    if not isinstance(raw_alerts, list) or not raw_alerts:
        raise PayloadError("alerts: expected a non-empty list")
    alerts = tuple(_alert(raw, f"alerts[{i}]") for i, raw in enumerate(raw_alerts))
    truncated = document.get("truncatedAlerts", 0)
    if isinstance(truncated, bool) or not isinstance(truncated, int) or truncated < 0:
        raise PayloadError("truncatedAlerts: expected a count")
    return Notification(
        receiver=_string(document, "receiver", "", required=True),
        status=_status(document, ""),
        group_key=_string(document, "groupKey", "", required=True),
        alerts=alerts,
        group_labels=_labels(document, "groupLabels", ""),
        common_labels=_labels(document, "commonLabels", ""),
        common_annotations=_labels(document, "commonAnnotations", ""),
        external_url=_string(document, "externalURL", ""),
        truncated_alerts=truncated,
        document=document,
    )


def _check_unicode(body: bytes | str, document: dict[str, Any]) -> None:
    """Refuse a document with a lone surrogate (half of a UTF-16 pair) in any string."""
    if isinstance(body, bytes):
        suspect = _SURROGATE_ESCAPE.search(body) is not None
    else:
        suspect = _SURROGATE.search(body) is not None
    if not suspect:
        return
    try:
        json.dumps(document, ensure_ascii=False).encode()
    except UnicodeEncodeError as error:
        code = ord(error.object[error.start])
        raise PayloadError(
            f"not valid Unicode: a string holds a lone surrogate (\\u{code:04x}); "
            "send UTF-8 text or escape whole surrogate pairs"
        ) from None


def _alert(raw: Any, path: str) -> Alert:
    if not isinstance(raw, dict):
        raise PayloadError(f"{path}: expected an object")
    labels = _labels(raw, "labels", path)
    fingerprint = _string(raw, "fingerprint", path)
    if not fingerprint:
        # Alertmanager always sends one; a hand-made payload gets one from its labels.
        text = json.dumps(sorted(labels.items()))
        fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
    return Alert(
        status=_status(raw, path),
        labels=labels,
        annotations=_labels(raw, "annotations", path),
        starts_at=_string(raw, "startsAt", path, required=True),
        ends_at=_string(raw, "endsAt", path),
        generator_url=_string(raw, "generatorURL", path),
        fingerprint=fingerprint,
    )


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _string(raw: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str:
    value = raw.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        expected = "a string" if value is not None else "a string (it is missing)"
        raise PayloadError(f"{_where(path, key)}: expected {expected}")
    return value


def _status(raw: Mapping[str, Any], path: str) -> str:
    value = raw.get("status")
    if value not in STATUSES:
        raise PayloadError(f"{_where(path, 'status')}: expected firing or resolved")
    return str(value)


def _labels(raw: Mapping[str, Any], key: str, path: str) -> Mapping[str, str]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PayloadError(f"{_where(path, key)}: expected an object of strings")
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if value is not None else "missing"
    return text if len(text) <= 20 else text[:20] + "..."
