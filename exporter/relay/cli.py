"""`gpuload relay` and `gpuload relay queue`: parsed arguments to configuration, then the work."""

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
from exporter.relay.arguments import FLAGS


def run(args: argparse.Namespace) -> int:
    """Run `gpuload relay` or `gpuload relay queue ...`."""
    flags = {key: value for key, value in vars(args).items() if key in FLAGS}
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
