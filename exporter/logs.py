"""Log setup: one line per event, as text or JSON."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    """One JSON object per line with time, level, logger and message."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as a single JSON line."""
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class RepeatFilter(logging.Filter):
    """Let a message through once per `interval` seconds.

    APScheduler warns on every cycle it skips because the previous one still runs; on a
    starved CPU that would be a line per second. gpuload_collection_duration_seconds shows
    the slow cycles; the log needs to say it only now and then.
    """

    def __init__(self, interval: float = 600.0) -> None:
        super().__init__()
        self._interval = interval
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True for the first record of its kind in each interval."""
        key = str(record.msg)
        last = self._last.get(key)
        if last is not None and record.created - last < self._interval:
            return False
        self._last[key] = record.created
        return True


def setup(level: str, fmt: str) -> None:
    """Send the root logger's records to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # APScheduler logs every job run at info; only its problems matter here.
    scheduler = logging.getLogger("apscheduler")
    scheduler.setLevel(logging.WARNING)
    if not any(isinstance(f, RepeatFilter) for f in scheduler.filters):
        scheduler.addFilter(RepeatFilter())
