"""The report's numbers: GPU-hours per namespace and owner (or team), by state, and their cost.

Each number is a sum over the period of the accounting rules' series
(:mod:`exporter.alerting.accounting`): ``sum_over_time()`` of GPU-equivalents, one sample per
evaluation, times the rules' interval. A minute without a sample adds nothing: a gap lowers the
coverage, it never adds hours.

- **allocated**: the GPU-hours held, in every state;
- **used**: the GPU-hours used, ``hung`` left out (a hung job's use is reported apart);
- **unmeasured**: the hours held in states whose use cannot be measured (``unmeasured``,
  ``lost``): neither used nor idle;
- **idle**: allocated less unmeasured less used;
- **efficiency**: used over allocated less unmeasured;
- **cost**: allocated GPU-hours of each GPU model (``gpu_info``'s ``name``) times its price.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.alerting import accounting
from exporter.alerting.expressions import GPU
from exporter.report.period import Period
from exporter.report.source import Source

HOURS_PER_SAMPLE = accounting.INTERVAL_SECONDS / 3600
# The labels each kind of report line is keyed by.
BY = {
    "owner": ("namespace", "owner_kind", "owner_name"),
    "namespace": ("namespace",),
    "team": ("team",),
}
# The states whose use NVML cannot measure: held, neither used nor idle.
UNMEASURED = ("unmeasured", "lost")
UNALLOCATED = "unallocated"


class PriceError(ValueError):
    """A GPU model with no price, and no default price."""


@dataclass(frozen=True)
class Prices:
    """Price per GPU-hour by GPU model: an exact name, else the longest key the name contains.

    ``default`` prices every other model; without it such a model is a :class:`PriceError`.
    No prices at all: the report has no cost.
    """

    models: Mapping[str, float] = field(default_factory=dict)
    default: float | None = None
    currency: str = "USD"

    @property
    def given(self) -> bool:
        """Whether any price was set."""
        return bool(self.models) or self.default is not None

    def of(self, model: str) -> float:
        """The price of one GPU-hour of ``model``."""
        if model in self.models:
            return self.models[model]
        matches = [key for key in self.models if key.lower() in model.lower()]
        if matches:
            return self.models[max(matches, key=len)]
        if self.default is None:
            shown = model or "(no gpu_info)"
            raise PriceError(
                f"no price for GPU model {shown!r}: give --price '{model or 'MODEL'}=PRICE' "
                "or --default-price"
            )
        return self.default


@dataclass
class Line:
    """One line of the report: a namespace and owner (or team), or what no pod holds."""

    key: dict[str, str]
    # GPU-hours held, by state.
    states: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # GPU-hours used, by state (hung apart).
    used_states: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # GPU-hours held, by GPU model.
    models: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cost: float | None = None

    @property
    def allocated(self) -> float:
        """GPU-hours held, in every state."""
        return sum(self.states.values())

    @property
    def used(self) -> float:
        """GPU-hours used, hung left out."""
        return sum(v for state, v in self.used_states.items() if state != accounting.HUNG)

    @property
    def hung_used(self) -> float:
        """GPU-hours a hung GPU was busy: not use."""
        return self.used_states.get(accounting.HUNG, 0.0)

    @property
    def unmeasured(self) -> float:
        """GPU-hours held in states whose use cannot be measured."""
        return sum(self.states.get(state, 0.0) for state in UNMEASURED)

    @property
    def idle(self) -> float:
        """GPU-hours held and measured but not used."""
        return max(0.0, self.allocated - self.unmeasured - self.used)

    @property
    def efficiency(self) -> float | None:
        """Used over held-and-measured; None where nothing was measured."""
        measured = self.allocated - self.unmeasured
        return self.used / measured if measured > 0 else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            **self.key,
            "allocated_gpu_hours": self.allocated,
            "used_gpu_hours": self.used,
            "idle_gpu_hours": self.idle,
            "unmeasured_gpu_hours": self.unmeasured,
            "hung_used_gpu_hours": self.hung_used,
            "efficiency": self.efficiency,
            "cost": self.cost,
            "hours_by_state": dict(sorted(self.states.items())),
            "gpu_hours_by_model": dict(sorted(self.models.items())),
        }


@dataclass(frozen=True)
class Report:
    """Every line of a period, the most idle GPU-hours first, with the data's coverage."""

    period: Period
    by: str
    lines: tuple[Line, ...]
    # The share of the period's minutes with data, averaged over the exporters.
    coverage: float
    # Per exporter (``instance``): its share.
    coverages: Mapping[str, float]
    # Unix time of the first minute with data in the period.
    first_data: float
    prices: Prices

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "from": self.period.start.astimezone(self.period.zone).isoformat(),
            "to": self.period.end.astimezone(self.period.zone).isoformat(),
            "time_zone": str(self.period.zone),
            "by": self.by,
            "coverage": self.coverage,
            "coverage_by_instance": dict(sorted(self.coverages.items())),
            "currency": self.prices.currency if self.prices.given else None,
            "lines": [line.to_json() for line in self.lines],
        }


def window(period: Period) -> tuple[str, float]:
    """The range selector of ``[start, end)`` and the time to evaluate it at.

    Evaluated 1 ms before the end, over the period's length in milliseconds: a sample exactly at
    the end belongs to the next period.
    """
    milliseconds = round(period.seconds * 1000)
    return f"{milliseconds}ms", period.end.timestamp() - 0.001


def _model(w: str) -> str:
    """Each GPU's model over ``w``: gpu_info's ``name``."""
    return f"max by ({GPU}, name) (last_over_time(gpu_info[{w}]))"


def hours_query(series: str, keys: tuple[str, ...], w: str) -> str:
    """GPU-time of ``series`` over ``w`` by ``keys``, ``state`` and GPU model, in samples."""
    by = ", ".join((*keys, "state"))
    model, total = _model(w), f"sum_over_time({series}[{w}])"
    return (
        f"sum by ({by}, name) ({total} * on ({GPU}) group_left (name) {model})\n"
        f"or\nsum by ({by}) ({total} unless on ({GPU}) {model})"
    )


def minutes_query(w: str) -> str:
    """The minutes with accounting data per exporter: one per evaluation, none in a gap."""
    step = accounting.INTERVAL_SECONDS
    present = (
        f"count by (instance, job) (\n"
        f"  last_over_time({accounting.ALLOCATED}[{step - 1}s])\n"
        f"  or last_over_time({accounting.UNALLOCATED}[{step - 1}s])\n"
        ")"
    )
    return f"count_over_time(({present})[{w}:{step}s])"


def first_query(w: str) -> str:
    """The first minute with accounting data within ``w``."""
    step = accounting.INTERVAL_SECONDS
    present = (
        f"count(last_over_time({accounting.UNALLOCATED}[{step - 1}s])"
        f" or last_over_time({accounting.ALLOCATED}[{step - 1}s]))"
    )
    return f"min_over_time(timestamp({present})[{w}:{step}s])"


def build(source: Source, period: Period, by: str, prices: Prices) -> Report:
    """Query ``source`` for ``period`` and sum it into lines.

    Raises:
        SourceError: the query API failed.
        PriceError: a GPU model has no price.
    """
    w, at = window(period)
    keys = BY[by]
    lines: dict[tuple[str, ...], Line] = {}

    def line(key: tuple[str, ...], names: tuple[str, ...]) -> Line:
        if key not in lines:
            lines[key] = Line(dict(zip(names, key, strict=True)))
        return lines[key]

    for series, used in ((accounting.ALLOCATED, False), (accounting.USED, True)):
        for labels, value in source.query(hours_query(series, keys, w), at):
            entry = line(tuple(labels.get(k, "") for k in keys), keys)
            _add(entry, labels, value, used)
    for series, used in ((accounting.UNALLOCATED, False), (accounting.UNALLOCATED_USED, True)):
        for labels, value in source.query(hours_query(series, (), w), at):
            _add(line((UNALLOCATED,), ("line",)), labels, value, used)
    samples = source.query(minutes_query(w), at)
    minutes = period.seconds / accounting.INTERVAL_SECONDS
    coverages = {labels.get("instance", ""): min(1.0, value / minutes) for labels, value in samples}
    coverage = sum(coverages.values()) / len(coverages) if coverages else 0.0
    first = source.query(first_query(w), at)
    if prices.given:
        for entry in lines.values():
            entry.cost = sum(hours * prices.of(model) for model, hours in entry.models.items())
    ranked = sorted(lines.values(), key=lambda e: (-e.idle, -e.allocated, tuple(e.key.values())))
    return Report(
        period=period,
        by=by,
        lines=tuple(ranked),
        coverage=coverage,
        coverages=coverages,
        first_data=first[0][1] if first else 0.0,
        prices=prices,
    )


def _add(entry: Line, labels: Mapping[str, str], samples: float, used: bool) -> None:
    hours = samples * HOURS_PER_SAMPLE
    state = labels.get("state", "")
    if used:
        entry.used_states[state] += hours
    else:
        entry.states[state] += hours
        entry.models[labels.get("name", "")] += hours


def panel_queries(keys: tuple[str, ...], w: str) -> dict[str, str]:
    """GPU-hours allocated, used and idle over ``w`` by ``keys``: the report's, in one query each.

    The "GPU efficiency" dashboard reads these with ``w`` its time range; they sum the same
    samples as :func:`build`, without the split by GPU model that prices need.
    """
    by = ", ".join(keys)
    unmeasured = "|".join(UNMEASURED)

    def hours(series: str, matcher: str = "") -> str:
        return f"sum by ({by}) (sum_over_time({series}{matcher}[{w}])) * {HOURS_PER_SAMPLE:.12g}"

    allocated = hours(accounting.ALLOCATED)
    used = hours(accounting.USED, f'{{state!="{accounting.HUNG}"}}')
    measured = hours(accounting.ALLOCATED, f'{{state!~"{unmeasured}"}}')
    return {
        "allocated": allocated,
        "used": used,
        "idle": f"clamp_min(\n  {measured}\n  - ({used} or {measured} * 0),\n  0\n)",
    }


def idle_pods_query(w: str) -> str:
    """Hours each pod held a GPU the rules called idle or underutilized, over ``w``."""
    return (
        "sum by (namespace, pod) (\n"
        f'  count_over_time({accounting.ALLOCATED}{{state=~"idle|underutilized"}}[{w}])\n'
        f") * {HOURS_PER_SAMPLE:.12g}"
    )
