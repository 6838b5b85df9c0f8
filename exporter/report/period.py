"""The period a report covers: half-open ``[start, end)``, in a time zone (UTC unless named).

``--since 7d`` ends now; ``--from``/``--to`` take RFC 3339 times or dates (a date is 00:00 of
that day in the report's time zone); ``--last-week`` is the last whole week, Monday 00:00 to
Monday 00:00. Every bad value is a :class:`PeriodError` whose text names the flag, the value
and what was expected.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from exporter.alerting.thresholds import duration_seconds

UTC = dt.timezone.utc


class PeriodError(ValueError):
    """A malformed period or time zone, in one line."""


@dataclass(frozen=True)
class Period:
    """``[start, end)`` and the time zone the report shows its times in."""

    start: dt.datetime
    end: dt.datetime
    zone: dt.tzinfo

    @property
    def seconds(self) -> float:
        """The period's length."""
        return (self.end - self.start).total_seconds()

    def words(self) -> str:
        """``2026-11-30 00:00 to 2026-12-07 00:00 (UTC)``: the period in its time zone."""
        start, end = self.start.astimezone(self.zone), self.end.astimezone(self.zone)
        return f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} ({self.zone})"


def zone(name: str | None) -> dt.tzinfo:
    """The named IANA time zone; UTC when none is named."""
    if not name or name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise PeriodError(
            f"--tz {name!r}: not a time zone; expected an IANA name such as UTC or Europe/Berlin"
        ) from error


def moment(flag: str, text: str, tz: dt.tzinfo) -> dt.datetime:
    """An RFC 3339 time, or a date (00:00 of it in ``tz``)."""
    value = text.strip()
    try:
        if len(value) == 10:
            day = dt.date.fromisoformat(value)
            return dt.datetime.combine(day, dt.time(), tzinfo=tz)
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as error:
        raise PeriodError(
            f"{flag} {text!r}: expected an RFC 3339 time (2026-11-30T00:00:00Z) or a date "
            "(2026-11-30)"
        ) from error
    if parsed.tzinfo is None:
        raise PeriodError(
            f"{flag} {text!r}: an RFC 3339 time needs its offset (Z or +01:00); "
            "or give a date, read in --tz"
        )
    return parsed


def week_start(when: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """Monday 00:00 of the week ``when`` falls in, in ``tz``."""
    local = when.astimezone(tz)
    monday = local.date() - dt.timedelta(days=local.weekday())
    return dt.datetime.combine(monday, dt.time(), tzinfo=tz)


def parse(
    *,
    now: dt.datetime,
    since: str | None = None,
    start: str | None = None,
    end: str | None = None,
    last_week: bool = False,
    tz: str | None = None,
) -> Period:
    """The period the flags name, read in time zone ``tz``."""
    where = zone(tz)
    if sum(bool(x) for x in (since, start, last_week)) != 1:
        raise PeriodError("give one of --since DURATION, --from TIME, --last-week")
    if last_week:
        if end:
            raise PeriodError("--to: --last-week ends on the last Monday itself")
        stop = week_start(now, where)
        return Period(stop - dt.timedelta(days=7), stop, where)
    stop = now if not end else moment("--to", end, where)
    if since:
        try:
            length = duration_seconds(since)
        except ValueError as error:
            raise PeriodError(
                f"--since {since!r}: expected a duration like 7d, 24h or 90m"
            ) from error
        if length <= 0:
            raise PeriodError(f"--since {since!r}: expected a duration above zero, like 7d")
        begin = stop - dt.timedelta(seconds=length)
    else:
        begin = moment("--from", start or "", where)
    if begin >= stop:
        raise PeriodError(
            f"the period is empty: --from {begin:%Y-%m-%dT%H:%M:%S%z} is not before its end"
        )
    return Period(begin.astimezone(UTC), stop.astimezone(UTC), where)
