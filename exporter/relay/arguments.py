"""The arguments of `gpuload relay` and `gpuload relay queue`, for the one command line.

Apart from the relay's configuration and work (`exporter.relay.cli`), so that building the
command line, which every `gpuload` command does, does not import them.
"""

from __future__ import annotations

import argparse
from typing import Any

from exporter.relay.settings import SETTINGS


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="YAML configuration file (see docs/relay.md)",
    )
    SETTINGS.add_flags(parser, ["queue.path"])


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
    SETTINGS.add_flags(relay, [key for key in SETTINGS.by_key if key != "queue.path"])
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
    test = commands.add_parser(
        "test",
        help="send a test message to one target and print the service's answer",
        description="Sends one test message (a firing alert of severity info; PagerDuty's "
        "incident is resolved again at once) to TARGET and prints the answer in one line: the "
        "HTTP status and whether it is delivered, retried or final. Exit status 0 when "
        "delivered, 1 when refused or unanswered. A Teams Workflows webhook answers 202 and "
        "runs its flow afterwards: delivery to the channel cannot be confirmed.",
    )
    _common(test)
    test.add_argument("target", help="a target name from the config file's targets")
