"""Delivering local alerts through the relay's durable queue, targets and routes, in-process.

Each evaluation's changes become Alertmanager-style notifications (webhook payload version 4),
one per alert and status, grouped by all of the alert's labels: each alert, one GPU's, is an
incident of its own, so one GPU's resolve never closes an incident (PagerDuty's dedup_key is the
group key) that another GPU's alert still holds. Every relay target formats them exactly as it
formats Alertmanager's. They are routed per alert by the relay's routes,
committed to its SQLite queue (one row per target, deduplicated by the same key) and sent by the
relay's delivery workers, with their backoff, rate limits, digests and dead letters.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from exporter.alerting.evaluator import Alert
from exporter.alerting.history import Labels
from exporter.relay import payload
from exporter.relay.config import RelayConfig
from exporter.relay.engine import Engine
from exporter.relay.routes import targets_for

log = logging.getLogger(__name__)

RECEIVER = "gpuload-local"
# A local alert's identity: its rule's name and its series.
Key = tuple[str, Labels]
_ZERO_TIME = "0001-01-01T00:00:00Z"


def _timestamp(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fingerprint(labels: dict[str, str]) -> str:
    """A stable identity of an alert's labels (Alertmanager's is a hash of them too)."""
    text = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def group_key(labels: dict[str, str]) -> str:
    """Alertmanager's group key of a group by every label: ``{}:{alertname="X", gpu="3", ...}``."""
    pairs = ", ".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))
    return f"{{}}:{{{pairs}}}"


def notifications(alerts: Iterable[Alert], external_url: str) -> list[dict[str, Any]]:
    """Alertmanager webhook payloads for alerts that fired, resolved or repeat: one per alert."""
    documents = []
    for alert in sorted(alerts, key=lambda a: (a.name, sorted(a.labels.items()), a.state)):
        labels = dict(alert.labels)
        documents.append(
            {
                "version": "4",
                "groupKey": group_key(labels),
                "truncatedAlerts": 0,
                "receiver": RECEIVER,
                "status": alert.state,
                "alerts": [_alert(alert, external_url)],
                "groupLabels": labels,
                "commonLabels": labels,
                "commonAnnotations": dict(alert.annotations),
                "externalURL": external_url,
            }
        )
    return documents


def _alert(alert: Alert, external_url: str) -> dict[str, Any]:
    labels = dict(alert.labels)
    # Like Prometheus, startsAt is when the alert started firing, not when it became pending.
    starts = alert.firing_since if alert.firing_since is not None else alert.active_since
    return {
        "status": alert.state,
        "labels": labels,
        "annotations": dict(alert.annotations),
        "startsAt": _timestamp(starts),
        "endsAt": _timestamp(alert.resolved_at) if alert.resolved_at else _ZERO_TIME,
        "generatorURL": external_url,
        "fingerprint": fingerprint(labels),
    }


class AlertStore:
    """The pending and firing local alerts, and when each was last notified, in SQLite."""

    _SCHEMA = (
        "CREATE TABLE IF NOT EXISTS local_alerts ("
        " name TEXT NOT NULL, series TEXT NOT NULL, alert TEXT NOT NULL,"
        " notified_at REAL, PRIMARY KEY (name, series))"
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=10)
        with self._db:
            self._db.execute(self._SCHEMA)

    def load(self) -> tuple[list[tuple[Labels, Alert]], dict[Key, float]]:
        """The alerts of the last save, and when each firing one was last notified."""
        alerts, notified = [], {}
        for name, series_text, alert_text, notified_at in self._db.execute(
            "SELECT name, series, alert, notified_at FROM local_alerts"
        ):
            series = tuple((str(k), str(v)) for k, v in json.loads(series_text))
            fields = json.loads(alert_text)
            alerts.append((series, Alert(**fields)))
            if notified_at is not None:
                notified[(name, series)] = float(notified_at)
        return alerts, notified

    def save(self, active: Iterable[tuple[Labels, Alert]], notified: dict[Key, float]) -> bool:
        """Replace the saved alerts with ``active``; False (and a warning) if it cannot."""
        rows = [
            (
                alert.name,
                json.dumps(series),
                json.dumps(
                    {
                        "name": alert.name,
                        "labels": dict(alert.labels),
                        "annotations": dict(alert.annotations),
                        "value": alert.value,
                        "active_since": alert.active_since,
                        "firing_since": alert.firing_since,
                        "kept_since": alert.kept_since,
                    }
                ),
                notified.get((alert.name, series)),
            )
            for series, alert in active
        ]
        try:
            with self._db:
                self._db.execute("DELETE FROM local_alerts")
                self._db.executemany("INSERT INTO local_alerts VALUES (?, ?, ?, ?)", rows)
        except sqlite3.Error as error:
            log.warning("local alerting: cannot keep the alerts in %s: %s", self.path, error)
            return False
        return True

    def close(self) -> None:
        """Close the database."""
        self._db.close()


class Notifier:
    """The relay's engine (its queue and a delivery worker per target), inside the exporter."""

    def __init__(self, config: RelayConfig, external_url: str) -> None:
        self._config = config
        self._external_url = external_url
        self.engine = Engine(config)
        self.queue = self.engine.queue

    def start(self) -> None:
        """Start the delivery workers (they also deliver what an earlier run left queued)."""
        self.engine.start()

    def stop(self) -> None:
        """Stop the workers within a second; what is queued stays for the next start."""
        self.engine.stop()

    def send(self, alerts: Iterable[Alert], now: float | None = None) -> int:
        """Queue notifications for alerts that fired or resolved; how many rows were committed."""
        rows = []
        for document in notifications(alerts, self._external_url):
            notification = payload.parse(json.dumps(document))
            chosen: dict[str, list[int]] = {}
            for index, alert in enumerate(notification.alerts):
                for target in targets_for(self._config.route, alert.labels):
                    chosen.setdefault(target, []).append(index)
            for target, indexes in chosen.items():
                subset = notification.subset(indexes)
                rows.append((target, subset.dedup_key(), subset.to_json()))
        if not rows:
            return 0
        at = time.time() if now is None else now
        try:
            results = self.queue.enqueue(rows, at, self._config.queue.max_age)
        except sqlite3.Error as error:
            log.error("cannot queue local alert notifications in %s: %s", self.queue.path, error)
            return 0
        for target, queued in results:
            if queued:
                self.engine.wake(target)
        return sum(1 for _target, queued in results if queued)
