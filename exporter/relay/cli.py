"""`gpuload relay`, `relay queue` and `relay test`: arguments to configuration, then the work."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exporter.relay import config
from exporter.relay.settings import SETTINGS
from exporter.settings import with_flag_names

if TYPE_CHECKING:
    from exporter.relay.payload import Notification
    from exporter.relay.targets import Outcome, Target

log = logging.getLogger(__name__)
# How long `relay test` waits to connect; the answer gets the target's timeout.
CONNECT_TIMEOUT = 5.0


def run(args: argparse.Namespace) -> int:
    """Run `gpuload relay` or `gpuload relay queue ...`."""
    flags = SETTINGS.flags_given(args)
    file = getattr(args, "config", None)
    try:
        if args.relay_command == "queue":
            # The queue commands need only the file's path, not the targets' secrets.
            return _queue(args, config.queue_path(file=file, environ=os.environ, flags=flags))
        settings = config.load(file=file, environ=os.environ, flags=flags)
    except config.ConfigError as error:
        print(f"gpuload relay: {with_flag_names(str(error), SETTINGS.flag_of)}", file=sys.stderr)
        return 2
    if args.relay_command == "test":
        return _test(settings, args.target)
    if not settings.targets:
        # It would accept every notification and deliver none: Alertmanager believes it sent.
        print(
            "gpuload relay: no targets: the relay would accept every notification and deliver "
            "none; give at least one under `targets` (docs/relay.md, examples/relay-local.yaml)",
            file=sys.stderr,
        )
        return 2

    from exporter import logs
    from exporter.relay.daemon import serve

    logs.setup(settings.log.level, settings.log.format)
    for warning in config.startup_warnings(settings):
        log.warning("%s", warning)
    return serve(settings)


def _test(settings: config.RelayConfig, name: str) -> int:
    """Send one test message to target `name` and print the answer in one line."""
    from exporter.relay import targets
    from exporter.relay.templates import MessageSettings

    if name not in settings.targets:
        known = ", ".join(sorted(settings.targets)) or "none defined"
        print(f"gpuload relay test: no target {name!r} (targets: {known})", file=sys.stderr)
        return 2
    for warning in config.startup_warnings(settings):
        print(f"gpuload relay test: warning: {warning}", file=sys.stderr)
    message = MessageSettings(
        grafana_url=settings.message.grafana_url,
        grafana_dashboard=settings.message.grafana_dashboard,
        timezone=settings.message.timezone,
    )
    target = targets.build(settings.targets[name], message)
    timeout = target.config.timeout or settings.delivery.timeout
    now = time.time()
    status, outcome = send_once(target, [_test_notification(name, now, "firing")], now, timeout)
    line = f"{name} ({target.kind}): {_answer(status, outcome)}"
    if outcome.delivered and target.kind == "pagerduty":
        # Close the test incident the trigger opened, so that no one is paged for it.
        resolved, _ = send_once(target, [_test_notification(name, now, "resolved")], now, timeout)
        line += f"; test incident resolved (HTTP {resolved})"
    print(line)
    return 0 if outcome.delivered else 1


def send_once(
    target: Target, notifications: Sequence[Notification], now: float, timeout: float
) -> tuple[int | None, Outcome]:
    """POST notifications to a target once, without the queue: (HTTP status or None, outcome).

    For a test message (`relay test`) and a report (`gpuload report --target`).
    """
    import requests

    from exporter.relay.targets import Outcome

    request = target.request(notifications, now)
    try:
        response = requests.post(
            request.url,
            data=request.body,
            headers=dict(request.headers),
            timeout=(CONNECT_TIMEOUT, timeout),
            allow_redirects=False,
        )
    except requests.RequestException as error:
        # The exception's text holds the URL, which is a secret for most targets.
        return None, Outcome(False, True, f"{type(error).__name__} (no answer)")
    with response:
        return response.status_code, target.outcome(
            response.status_code, response.headers, response.content
        )


_MEANING = {
    "retry": "retry (the relay would try again later)",
    "final": "final (sending it again cannot help: the notification would be a dead letter)",
}


def _answer(status: int | None, outcome: Outcome) -> str:
    reason = outcome.reason
    if status is not None:
        reason = reason.removeprefix(f"HTTP {status}").lstrip(": ,")
    head = "no answer" if status is None else f"HTTP {status}"
    verdict = _MEANING.get(outcome.verdict, outcome.verdict)
    return f"{head} {verdict}" + (f": {reason}" if reason else "")


def _test_notification(name: str, now: float, status: str) -> Notification:
    from exporter.relay import payload

    started = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    labels = {"alertname": "GpuloadRelayTest", "severity": "info", "target": name}
    document = {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="GpuloadRelayTest",target="{name}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "gpuload-relay-test",
        "groupLabels": {"alertname": "GpuloadRelayTest"},
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "",
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": {
                    "summary": f"gpuload relay test: target {name} delivers",
                    "description": "Sent by `gpuload relay test`; nothing needs doing.",
                },
                "startsAt": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "endsAt": "0001-01-01T00:00:00Z"
                if status == "firing"
                else started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "generatorURL": "",
                "fingerprint": "gpuloadrelaytest",
            }
        ],
    }
    return payload.parse(json.dumps(document))


def _queue(args: argparse.Namespace, path: str) -> int:
    from exporter.relay.queue import DEAD, QUEUED, Queue

    if not os.path.exists(path):
        print(f"gpuload relay queue: {path} does not exist (see queue.path)", file=sys.stderr)
        return 2
    state = DEAD if args.dead else QUEUED
    try:
        queue = Queue(path)
        if args.queue_action == "list":
            _list(queue.entries(state), as_json=args.json)
            return 0
        done = (
            queue.requeue(args.id, state, time.time())
            if args.queue_action == "retry"
            else queue.drop(args.id, state)
        )
    except sqlite3.Error as error:
        print(f"gpuload relay queue: {path}: {error}", file=sys.stderr)
        return 1
    if not done:
        where = "dead letters" if args.dead else "queued notifications (dead letters: add --dead)"
        print(f"gpuload relay queue: no {args.id} among the {where}", file=sys.stderr)
        return 1
    verb = "will be delivered now" if args.queue_action == "retry" else "dropped"
    print(f"{args.id} {verb}")
    return 0


def _list(entries: list[Any], *, as_json: bool) -> None:
    now = time.time()
    rows = []
    for entry in entries:
        try:
            document = json.loads(entry.body)
            summary = f"{document.get('status', '?')} {document.get('groupKey', '')}"
            alerts = len(document.get("alerts", []))
        except (ValueError, AttributeError):
            summary, alerts = "(unreadable)", 0
        rows.append(
            {
                "id": entry.id,
                "target": entry.target,
                "received": datetime.datetime.fromtimestamp(
                    entry.received_at, datetime.timezone.utc
                ).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "age_seconds": round(now - entry.received_at, 1),
                "attempts": entry.attempts,
                "next_attempt_in_seconds": round(max(entry.next_attempt_at - now, 0), 1),
                "alerts": alerts,
                "notification": summary,
                "last_error": entry.last_error,
            }
        )
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    if not rows:
        print("(none)")
        return
    print("ID\tTARGET\tRECEIVED\tATTEMPTS\tALERTS\tNOTIFICATION\tLAST ERROR")
    for row in rows:
        print(
            f"{row['id']}\t{row['target']}\t{row['received']}\t{row['attempts']}\t"
            f"{row['alerts']}\t{row['notification']}\t{row['last_error']}"
        )
