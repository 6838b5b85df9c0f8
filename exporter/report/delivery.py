"""A report as one message through the relay's targets: the same target code and configuration.

The report becomes one Alertmanager notification (webhook payload version 4,
https://prometheus.io/docs/alerting/latest/configuration/#webhook_config) whose alerts are its
lines, the most idle GPU-hours first, and goes to one target of a relay configuration file
(docs/relay.md) through that target's own request: each kind keeps to its service's message
limits and ends what it cuts with "… and N more not shown".
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass

from exporter.report.ledger import Report
from exporter.report.render import header, name

ALERTNAME = "GPUIdleHoursReport"


class DeliveryError(RuntimeError):
    """The message could not be sent, or the target refused it; one line."""


@dataclass(frozen=True)
class Sent:
    """A target's answer to the report."""

    target: str
    kind: str
    status: int
    verdict: str


def summary(report: Report, index: int) -> str:
    """One line of the report in words."""
    line = report.lines[index]
    efficiency = "-" if line.efficiency is None else f"{line.efficiency:.0%}"
    cost = "" if line.cost is None else f", cost {line.cost:,.2f} {report.prices.currency}"
    return (
        f"{name(line)}: {line.idle:,.1f} idle GPU-hours of {line.allocated:,.1f} allocated "
        f"({efficiency} used){cost}"
    )


def document(report: Report, now: float) -> dict[str, object]:
    """The report as an Alertmanager webhook payload: one alert per line, ranked."""
    at = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    title = header(report)
    alerts = []
    for index, line in enumerate(report.lines):
        labels = {"alertname": ALERTNAME, "severity": "info", "rank": str(index + 1)}
        labels.update({key: value for key, value in line.key.items() if value})
        alerts.append(
            {
                "status": "firing",
                "labels": labels,
                "annotations": {"summary": summary(report, index), "description": title},
                "startsAt": at,
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": f"{index + 1:016x}",
            }
        )
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{ALERTNAME}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "gpuload-report",
        "groupLabels": {"alertname": ALERTNAME},
        "commonLabels": {"alertname": ALERTNAME, "severity": "info"},
        "commonAnnotations": {"summary": title},
        "externalURL": "",
        "alerts": alerts,
    }


def send(report: Report, config_file: str, target_name: str, now: float) -> Sent:
    """Send the report to ``target_name`` of the relay configuration ``config_file``.

    Raises:
        DeliveryError: the configuration is wrong, the target is unknown, unreachable, or
            refuses the message.
    """
    from exporter.relay import config, payload, targets
    from exporter.relay.cli import send_once
    from exporter.relay.templates import MessageSettings
    from exporter.settings import ConfigError

    try:
        settings = config.load(file=config_file, environ=os.environ)
    except (ConfigError, OSError) as error:
        raise DeliveryError(f"--relay-config {config_file}: {error}") from error
    if target_name not in settings.targets:
        known = ", ".join(sorted(settings.targets)) or "none defined"
        raise DeliveryError(f"--target {target_name!r}: no such target in {config_file} ({known})")
    message = MessageSettings(
        grafana_url=settings.message.grafana_url,
        grafana_dashboard=settings.message.grafana_dashboard,
        timezone=settings.message.timezone,
    )
    target = targets.build(settings.targets[target_name], message)
    notification = payload.parse(json.dumps(document(report, now)))
    timeout = target.config.timeout or settings.delivery.timeout
    where = f"target {target_name} ({target.kind})"
    status, outcome = send_once(target, [notification], now, timeout)
    if status is None:
        raise DeliveryError(f"{where}: {outcome.reason}")
    if not outcome.delivered:
        raise DeliveryError(f"{where} refused the report: {outcome.reason or status}")
    return Sent(target_name, target.kind, status, outcome.verdict)
