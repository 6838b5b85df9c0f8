"""The local evaluator's history on disk: written periodically and on stop, read back at start.

A restarted daemon judges from the history it had instead of warming up for the rules' whole
window again. The file is one gzip-compressed JSON document::

    {"format": "gpuload-history/1", "saved_at": 1800000420.0,
     "uuids": ["GPU-...", ...],
     "series": [["gpu_utilization_ratio", [["gpu", "0"], ["uuid", "GPU-..."]],
                 [[1800000120.0, 0.97], ...]], ...]}

where a point's value is null for a staleness marker. It is taken back only when it was saved
within the rules' ``gap_tolerance`` (the longest gap the rules bridge) and from the same GPUs, by
UUID; anything else (no file, a damaged one, another format, other GPUs, too old) is a cold start
and one log line, never a failed start.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from exporter.alerting.history import STALE, History, Labels, SavedPoint

log = logging.getLogger(__name__)

FORMAT = "gpuload-history/1"
Series = list[tuple[str, Labels, list[SavedPoint]]]


def save(history: History, path: Path, uuids: Collection[str], now: float) -> None:
    """Write ``history`` to ``path`` atomically (a new file renamed over the old one)."""
    series = [
        [name, [list(pair) for pair in labels], [[at, None if v is STALE else v] for at, v in pts]]
        for name, labels, pts in history.series()
    ]
    document = {"format": FORMAT, "saved_at": now, "uuids": sorted(uuids), "series": series}
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    with gzip.open(part, "wt", encoding="utf-8", compresslevel=1) as stream:
        json.dump(document, stream, separators=(",", ":"))
    os.replace(part, path)


def load(path: Path, uuids: Collection[str], now: float, max_age: float) -> Series | None:
    """The saved series, or None (a cold start, logged once) when the file cannot be used."""
    why = _refusal(path, uuids, now, max_age)
    if isinstance(why, str):
        log.info("history %s not taken back, a cold start: %s", path, why)
        return None
    return why


def _refusal(path: Path, uuids: Collection[str], now: float, max_age: float) -> Series | str:
    """The saved series, or why they cannot be taken back."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as stream:
            document = json.load(stream)
    except FileNotFoundError:
        return "no file"
    except (OSError, EOFError, ValueError) as error:
        return f"unreadable ({error}); expected a gzip-compressed JSON document"
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return f"not a {FORMAT} document"
    saved_at = document.get("saved_at")
    if not isinstance(saved_at, (int, float)):
        return "no saved_at time"
    age = now - saved_at
    if not 0 <= age <= max_age:
        return f"saved {age:.0f} s ago; expected at most {max_age:.0f} s (the rules' gap_tolerance)"
    if sorted(document.get("uuids") or []) != sorted(uuids):
        return "saved from other GPUs (their UUIDs differ)"
    try:
        return [_series(entry) for entry in document.get("series", [])]
    except (TypeError, ValueError) as error:
        return f"a damaged series ({error})"


def _series(entry: Any) -> tuple[str, Labels, list[SavedPoint]]:
    name, labels, points = entry
    if not isinstance(name, str):
        raise ValueError(f"series name {name!r}")
    pairs = tuple(sorted((str(key), str(value)) for key, value in labels))
    return name, pairs, [(float(at), None if v is None else float(v)) for at, v in points]


class Keeper:
    """Takes a history back at the first collection, and writes it periodically and on stop."""

    def __init__(self, path: Path, max_age: float, interval: float) -> None:
        self.path = path
        # The oldest a file may be to be taken back: the rules' gap_tolerance.
        self.max_age = max_age
        # Seconds between saves.
        self.interval = interval
        self.uuids: tuple[str, ...] | None = None
        self.saved_at: float | None = None
        self._failing = False

    def start(self, history: History, uuids: Collection[str], now: float) -> int:
        """Take the saved history back into the empty ``history``; the series taken back."""
        self.uuids = tuple(sorted(uuids))
        self.saved_at = now
        series = load(self.path, self.uuids, now, self.max_age)
        if series is None:
            return 0
        count = history.restore(series)
        log.info("history %s taken back: %d series, from the same GPUs", self.path, count)
        return count

    def tick(self, history: History, now: float) -> None:
        """Save when the interval has passed since the last save."""
        if self.saved_at is not None and now - self.saved_at < self.interval:
            return
        self.save(history, now)

    def save(self, history: History, now: float) -> None:
        """Save now; a failure is logged when it starts and when it ends, never raised."""
        if self.uuids is None:
            return  # nothing collected yet: an older file stays as it is
        self.saved_at = now
        try:
            save(history, self.path, self.uuids, now)
        except OSError as error:
            if not self._failing:
                log.warning("history %s cannot be written: %s", self.path, error)
            self._failing = True
            return
        if self._failing:
            log.info("history %s written again", self.path)
        self._failing = False
