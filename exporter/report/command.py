"""`gpuload report`: read the period, query, print; one line on stderr for whatever went wrong."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable

from exporter.report import ledger
from exporter.report.ledger import PriceError, Prices, Report
from exporter.report.period import Period, PeriodError, parse
from exporter.report.render import render
from exporter.report.source import Source, SourceError

WHERE = "gpuload report"


class UsageError(ValueError):
    """A bad flag value, in one line."""


def prices(args: argparse.Namespace) -> Prices:
    """The prices the flags give."""
    models: dict[str, float] = {}
    for item in args.price:
        model, sep, value = item.rpartition("=")
        try:
            if not sep or not model:
                raise ValueError
            models[model] = float(value)
        except ValueError as error:
            raise UsageError(f"--price {item!r}: expected MODEL=PRICE, e.g. 'H100=2.5'") from error
    return Prices(models, args.default_price, args.currency)


def period_of(args: argparse.Namespace, now: dt.datetime) -> Period:
    """The period the flags name."""
    return parse(
        now=now,
        since=args.since,
        start=args.start,
        end=args.end,
        last_week=args.last_week,
        tz=args.tz,
    )


def run(
    args: argparse.Namespace,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
) -> int:
    """Print the report; 0 complete, 1 partial, 2 could not run."""
    try:
        if not 0 <= args.min_coverage <= 1:
            raise UsageError(f"--min-coverage {args.min_coverage}: expected a ratio from 0 to 1")
        if not args.prometheus:
            raise UsageError("--prometheus URL is missing: the query API to read")
        if bool(args.relay_config) != bool(args.target):
            raise UsageError("--relay-config FILE and --target NAME go together")
        period = period_of(args, now())
        report = ledger.build(Source(args.prometheus), period, args.by, prices(args))
    except (UsageError, PeriodError, SourceError, PriceError) as error:
        print(f"{WHERE}: {error}", file=sys.stderr)
        return 2
    return emit(report, args, args.prometheus)


def emit(report: Report, args: argparse.Namespace, url: str) -> int:
    """Print a built report and say whether it is complete."""
    if not report.coverages:
        print(
            f"{WHERE}: no accounting data at {url} for {report.period.words()}: "
            "the period is older than the store's retention, or the gpuload.accounting rules "
            "are not loaded",
            file=sys.stderr,
        )
        return 2
    if args.target:
        from exporter.report.delivery import DeliveryError, send

        try:
            sent = send(report, args.relay_config, args.target, time.time())
        except DeliveryError as error:
            print(f"{WHERE}: {error}", file=sys.stderr)
            return 2
        print(f"sent to {sent.target} ({sent.kind}): HTTP {sent.status} {sent.verdict}")
    else:
        sys.stdout.write(render(report, args.output))
    if report.coverage < args.min_coverage:
        first = dt.datetime.fromtimestamp(report.first_data, dt.timezone.utc).astimezone(
            report.period.zone
        )
        late = report.first_data - report.period.start.timestamp() > 3600
        why = (
            f"; the data begins at {first:%Y-%m-%d %H:%M} (older is past the store's retention, "
            "or the rules were not running)"
            if late
            else ""
        )
        print(
            f"{WHERE}: partial: data covers {report.coverage:.1%} of the period, below "
            f"--min-coverage {args.min_coverage:.0%}{why}",
            file=sys.stderr,
        )
        return 1
    return 0
