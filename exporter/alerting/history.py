"""A short, bounded in-memory history of the exporter's own samples.

The local evaluator needs what Prometheus would hold: the latest value of every series, a
window of samples for ``rate()`` of the counters of seconds and ``avg_over_time`` of the clock
events, an hour of the XID and ECC counters for ``increase()``. The doctor and the status page
read the last seconds of every series. Each series keeps samples for its family's horizon only,
at most ``POINTS`` of them: when samples come faster than ``horizon / POINTS`` apart the newest
replaces the previous one, so memory stays bounded whatever the collection interval. A history
built with ``keep`` holds only those metric names (what its readers ask for: most of a node's
series, NVLink's per link for one, are never read here) and refuses to answer for any other, so
that a reader asking for a name it did not declare fails at once instead of seeing nothing.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from exporter.snapshot import Snapshot

# A series' labels as sorted (name, value) pairs; the metric name is kept apart.
Labels = tuple[tuple[str, str], ...]
Point = tuple[float, float]
# A point as saved: None for a staleness marker.
SavedPoint = tuple[float, float | None]

POINTS = 360
# The marker of a series that went missing (Prometheus's staleness marker): an instant selector
# finds nothing after it, a range skips it. Compared by identity: a NaN reading is a value.
STALE = float("nan")


def _time(point: Point) -> float:
    return point[0]


class Sample(NamedTuple):
    """One value of one series at one time."""

    name: str
    labels: Labels
    value: float


# The same series' label sets come back every cycle: their sorted pairs are kept, up to a bound.
_SORTED_LABELS: dict[tuple[tuple[str, str], ...], Labels] = {}
SORTED_LABELS_KEPT = 10_000


def labels_of(mapping: Mapping[str, str]) -> Labels:
    """Sorted label pairs, without empty values (Prometheus drops empty labels)."""
    return sorted_labels(tuple(mapping.items()))


def sorted_labels(pairs: tuple[tuple[str, str], ...]) -> Labels:
    """`labels_of` for (name, value) pairs in the order the family declares its labels."""
    labels = _SORTED_LABELS.get(pairs)
    if labels is None:
        if len(_SORTED_LABELS) >= SORTED_LABELS_KEPT:
            _SORTED_LABELS.clear()
        labels = _SORTED_LABELS[pairs] = tuple(sorted(p for p in pairs if p[1] != ""))
    return labels


def snapshot_samples(snapshot: Snapshot, names: frozenset[str] | None = None) -> Iterator[Sample]:
    """The samples of a collection snapshot, as its ``families`` hold them.

    With ``names``, only the samples of those metric names (a counter's ``_total`` included).
    Read from the snapshot's series: this builds no prometheus_client families.
    """
    for name, pairs, value in snapshot.series(names):
        yield Sample(name, sorted_labels(pairs), float(value))


class History:
    """Samples per series, each kept for its family's horizon (seconds)."""

    def __init__(
        self, horizon: Callable[[str], float], keep: Collection[str] | None = None
    ) -> None:
        self._horizon = horizon
        # The metric names held; None: every name.
        self.keep = None if keep is None else frozenset(keep)
        self._series: dict[str, dict[Labels, deque[Point]]] = {}
        self._spacing: dict[str, float] = {}
        self.now: float | None = None
        self.started: float | None = None
        # The collection thread adds while request threads (the status page) read.
        self._lock = threading.Lock()
        self._pruned_at: float | None = None
        # The series that may hold a staleness marker: the others are copied without a look.
        self._marked: set[tuple[str, Labels]] = set()

    def add(
        self, samples: Iterable[Sample], at: float, gone: Iterable[tuple[str, Labels]] = ()
    ) -> None:
        """Record one collection's samples at time ``at``; forget what is past its horizon.

        ``gone`` are series that were there before and are no longer: each gets a staleness
        marker at ``at``, as Prometheus writes one for a series a scrape or a rule stops giving.
        """
        samples = list(samples)  # drawn before the lock: a generator may read this history
        with self._lock:
            for name, labels in gone:
                points = self._series.get(name, {}).get(labels)
                if points and points[-1][1] is not STALE and points[-1][0] < at:
                    points.append((at, STALE))
                    self._marked.add((name, labels))
            self._add(samples, at)

    def _add(self, samples: list[Sample], at: float) -> None:
        self.now = at
        if self.started is None:
            self.started = at
        for sample in samples:
            if self.keep is not None and sample.name not in self.keep:
                continue
            family = self._series.setdefault(sample.name, {})
            points = family.get(sample.labels)
            if points is None:
                points = family[sample.labels] = deque()
            spacing = self._spacing.get(sample.name)
            if spacing is None:
                spacing = self._spacing[sample.name] = self._horizon(sample.name) / POINTS
            if (
                len(points) >= 2
                and points[-1][0] - points[-2][0] < spacing
                and points[-1][1] is not STALE
                and points[-2][1] is not STALE
            ):
                points[-1] = (at, sample.value)
            else:
                points.append((at, sample.value))
        if self._pruned_at is not None and at <= self._pruned_at:
            return  # a second add at the same time (the recorded series): pruned already
        self._pruned_at = at
        for name in list(self._series):
            family = self._series[name]
            oldest = at - self._horizon(name)
            for labels in list(family):
                points = family[labels]
                while points and points[0][0] < oldest:
                    points.popleft()
                if not points:
                    del family[labels]
                    self._marked.discard((name, labels))
            if not family:
                del self._series[name]

    def latest(self, name: str) -> dict[Labels, float]:
        """The series of ``name`` present in the latest collection, with their values."""
        self._check(name)
        with self._lock:
            return {
                labels: points[-1][1]
                for labels, points in self._series.get(name, {}).items()
                if points[-1][0] == self.now and points[-1][1] is not STALE
            }

    def at(self, name: str, time: float, lookback: float) -> dict[Labels, float]:
        """An instant selector at ``time``: each series' last sample within the lookback.

        None for a series whose last sample by then is a staleness marker.
        """
        self._check(name)
        found = {}
        with self._lock:
            for labels, points in self._series.get(name, {}).items():
                for when, value in reversed(points):
                    if when <= time:
                        if when >= time - lookback and value is not STALE:
                            found[labels] = value
                        break
        return found

    def points(self, name: str, start: float, end: float) -> dict[Labels, list[Point]]:
        """Every series of ``name`` with its samples in [start, end] (as Prometheus selects)."""
        self._check(name)
        found = {}
        with self._lock:
            for labels, points in self._series.get(name, {}).items():
                if not points:
                    continue
                if start <= points[0][0] and points[-1][0] <= end:
                    inside = list(points)  # all of it, the usual case: copied without a loop
                else:
                    every = list(points)
                    first = bisect_left(every, start, key=_time)
                    inside = every[first : bisect_right(every, end, lo=first, key=_time)]
                if (name, labels) in self._marked:
                    if any(p[1] is STALE for p in points):
                        inside = [p for p in inside if p[1] is not STALE]
                    else:
                        self._marked.discard((name, labels))  # its markers are past the horizon
                if inside:
                    found[labels] = inside
        return found

    def series(self) -> list[tuple[str, Labels, list[Point]]]:
        """Every series held, with its samples (staleness markers included): what a save writes."""
        with self._lock:
            return [
                (name, labels, list(points))
                for name, family in self._series.items()
                for labels, points in family.items()
            ]

    def restore(self, series: Iterable[tuple[str, Labels, list[SavedPoint]]]) -> int:
        """Take back saved series into an empty history, as if they had been collected.

        ``started`` becomes the oldest sample's time: the rules' means cover what was saved.
        A point whose value is None is a staleness marker. Returns the series taken back.
        """
        count = 0
        with self._lock:
            if self._series:
                raise ValueError("a history takes back saved series only before its first sample")
            for name, labels, points in series:
                if self.keep is not None and name not in self.keep:
                    continue
                kept = deque((at, STALE if value is None else value) for at, value in points)
                if not kept:
                    continue
                self._series.setdefault(name, {})[labels] = kept
                if any(value is STALE for _at, value in kept):
                    self._marked.add((name, labels))
                oldest, newest = kept[0][0], kept[-1][0]
                self.started = oldest if self.started is None else min(self.started, oldest)
                self.now = newest if self.now is None else max(self.now, newest)
                count += 1
        return count

    def names(self) -> set[str]:
        """The metric names held."""
        with self._lock:
            return set(self._series)

    def _check(self, name: str) -> None:
        if self.keep is not None and name not in self.keep:
            raise KeyError(f"this history does not keep {name}: add it to its reader's FAMILIES")
