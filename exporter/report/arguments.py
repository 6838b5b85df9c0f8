"""The arguments of `gpuload report`.

Apart from its work, so that building the command line imports none of it.
"""

from __future__ import annotations

from typing import Any

from exporter.report.render import FORMATS

# Below this share of the period with data the report is partial: exit code 1.
MIN_COVERAGE = 0.95


def add_parser(subparsers: Any) -> None:
    """Register `report`."""
    report = subparsers.add_parser(
        "report",
        help="GPU-hours allocated, used and idle per namespace and owner, and their cost",
        description="Sum the accounting rules' series (gpuload.accounting) over a period from a "
        "Prometheus-compatible API: GPU-hours allocated, used and idle per namespace and owner "
        "(or team), the hours in each state, efficiency, cost, and the share of the period with "
        "data. Ranked by idle GPU-hours. Exit code 0 complete, 1 partial (coverage below "
        "--min-coverage), 2 could not run.",
    )
    report.add_argument(
        "--prometheus",
        metavar="URL",
        help="the query API to read (Prometheus, VictoriaMetrics), e.g. http://prometheus:9090",
    )
    period = report.add_argument_group("period, half-open [from, to)")
    period.add_argument("--since", metavar="DURATION", help="the last DURATION until now: 7d, 24h")
    period.add_argument(
        "--from", dest="start", metavar="TIME", help="RFC 3339 time or date (00:00 in --tz)"
    )
    period.add_argument(
        "--to", dest="end", metavar="TIME", help="RFC 3339 time or date (default: now)"
    )
    period.add_argument(
        "--last-week",
        action="store_true",
        help="the last whole week, Monday 00:00 to Monday 00:00 in --tz",
    )
    period.add_argument("--tz", metavar="ZONE", help="IANA time zone of dates and weeks (UTC)")
    report.add_argument(
        "--by",
        choices=("owner", "namespace", "team"),
        default="owner",
        help="one line per namespace and owner (default), per namespace, or per team",
    )
    report.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=PRICE",
        help="price of one GPU-hour of a GPU model (gpu_info's name, or a part of it: H100); "
        "repeat for each model",
    )
    report.add_argument(
        "--default-price", type=float, metavar="PRICE", help="the price of every other model"
    )
    report.add_argument("--currency", default="USD", help="the prices' currency (USD)")
    report.add_argument(
        "--min-coverage",
        type=float,
        default=MIN_COVERAGE,
        metavar="RATIO",
        help=f"below this share of the period with data the report is partial, exit 1 "
        f"(default {MIN_COVERAGE})",
    )
    report.add_argument(
        "-o", "--output", choices=FORMATS, default="table", help="table (default), csv or json"
    )
    delivery = report.add_argument_group("one message through a relay target instead of stdout")
    delivery.add_argument(
        "--relay-config", metavar="FILE", help="the relay's configuration file (docs/relay.md)"
    )
    delivery.add_argument("--target", metavar="NAME", help="the target of that file to send to")
