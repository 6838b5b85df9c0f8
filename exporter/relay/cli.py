"""`gpuload relay` and `gpuload relay queue`: arguments to configuration, then the work."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sqlite3
import sys
import time
from typing import Any

from exporter.relay import config

# Command-line flag -> configuration key path.
_FLAGS = {
    "web.listen_address": (
        f"address to listen on, host:port or :port (default :{config.DEFAULT_PORT})"
    ),
    "web.path": "path Alertmanager posts to (default /alerts)",
    "web.config_file": "web config file in the exporter-toolkit format: TLS and basic auth",
    "queue.path": "the SQLite queue file (default gpuload-relay.db)",
    "log.level": "debug, info, warning or error (default info)",
    "log.format": "text or json (default text)",
}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="YAML configuration file (see docs/relay.md)",
    )
    parser.add_argument(
        "--queue.path",
        dest="queue.path",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=_FLAGS["queue.path"],
    )


def add_parser(subparsers: Any) -> None:
    """Register `relay` and its `queue` subcommand."""
    relay = subparsers.add_parser(
        "relay",
        help="relay Alertmanager notifications to Slack, PagerDuty, Teams, chat robots, webhooks",
        description="Accept Alertmanager webhook notifications, queue them durably and deliver "
        "them to the configured targets. Settings come from flags > GPULOAD_RELAY_* "
        "environment variables > the config file > defaults.",
    )
    _common(relay)
    for key, text in _FLAGS.items():
        if key != "queue.path":
            relay.add_argument(
                config.flag_name(key),
                dest=key,
                metavar="VALUE",
                default=argparse.SUPPRESS,
                help=text,
            )
    commands = relay.add_subparsers(dest="relay_command")
    queue = commands.add_parser(
        "queue",
        help="list, retry or drop queued notifications and dead letters",
        description="Works on the queue file while the relay runs.",
    )
    actions = queue.add_subparsers(dest="queue_action", required=True)
    listing = actions.add_parser("list", help="list queued notifications (--dead: dead letters)")
    retry = actions.add_parser("retry", help="deliver a notification now (--dead: a dead letter)")
    drop = actions.add_parser("drop", help="delete a notification (--dead: a dead letter)")
    for action in (listing, retry, drop):
        _common(action)
        action.add_argument("--dead", action="store_true", help="work on the dead letters")
    listing.add_argument("--json", action="store_true", help="print JSON")
    for action in (retry, drop):
        action.add_argument("id", type=int, help="the ID shown by `gpuload relay queue list`")


def run(args: argparse.Namespace) -> int:
    """Run `gpuload relay` or `gpuload relay queue ...`."""
    flags = {key: value for key, value in vars(args).items() if key in _FLAGS}
    file = getattr(args, "config", None)
    try:
        if args.relay_command == "queue":
            # The queue commands need only the file's path, not the targets' secrets.
            return _queue(args, config.queue_path(file=file, environ=os.environ, flags=flags))
        settings = config.load(file=file, environ=os.environ, flags=flags)
    except config.ConfigError as error:
        print(f"gpuload relay: {error}", file=sys.stderr)
        return 2

    from exporter import logs
    from exporter.relay.daemon import serve

    logs.setup(settings.log.level, settings.log.format)
    return serve(settings)


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
