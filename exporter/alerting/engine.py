"""Evaluating the rules' PromQL on the exporter's own history, as Prometheus 2.x does.

:mod:`exporter.alerting.promql` parses an expression; :func:`evaluate` gives its value at one
time over a :class:`~exporter.alerting.history.History`. The semantics are Prometheus's, step for
step where a float could round otherwise (``rate()``'s extrapolation, ``avg``'s running mean):
an instant selector takes each series' last sample within the 5-minute lookback unless the series
went stale since; a range selector its samples in ``[t - range, t]``; arithmetic drops the metric
name; a filtering comparison keeps the vector's value; ``and``/``or``/``unless`` match on every
label but the name unless ``on``/``ignoring`` say otherwise; one-to-one and many-to-one matching
refuse duplicates as Prometheus does (the rule then gives nothing this evaluation). Agreement with
``promtool test rules`` is tested on generated series (tests/test_rule_engine.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from itertools import pairwise
from operator import itemgetter

from exporter.alerting.history import History, Labels, Point
from exporter.alerting.promql import (
    COMPARISONS,
    Aggregation,
    Binary,
    Call,
    Expr,
    Negation,
    Number,
    Selector,
    selectors,
)

# Prometheus's lookback for an instant selector.
LOOKBACK_SECONDS = 300.0
NAME = "__name__"

Vector = dict[Labels, float]
Value = float | Vector


class EvaluationError(ValueError):
    """The expression has no value here (a many-to-many match, as Prometheus refuses)."""


def evaluate(expr: Expr, history: History, now: float) -> Value:
    """The value of ``expr`` at ``now``: a number or a vector of labelled values."""
    return Evaluation(history, now).value(expr)


def vector(value: Value) -> Vector:
    """A rule's result as a vector (a bare number has no series)."""
    if isinstance(value, dict):
        return value
    raise EvaluationError("a rule's expression must give a vector, not a number")


def without_name(labels: Labels) -> Labels:
    """The labels without the metric name."""
    return tuple(pair for pair in labels if pair[0] != NAME)


def name_of(labels: Labels) -> str:
    """The metric name in ``labels`` (empty when dropped)."""
    return next((value for key, value in labels if key == NAME), "")


def _named(name: str, labels: Labels) -> Labels:
    return tuple(sorted(((NAME, name), *labels)))


def _project(labels: Labels, on: bool, names: tuple[str, ...]) -> Labels:
    if on:
        return tuple(pair for pair in labels if pair[0] in names)
    return tuple(pair for pair in labels if pair[0] not in names and pair[0] != NAME)


class Evaluation:
    """One evaluation step at ``now``: its rules share what they select from the history."""

    def __init__(self, history: History, now: float) -> None:
        self.history = history
        self.now = now
        # By metric name: what this step has selected of it, by time or by (start, end).
        self._instant: dict[str, dict[float, dict[Labels, float]]] = {}
        self._ranges: dict[str, dict[tuple[float, float], dict[Labels, list[Point]]]] = {}

    def forget(self, name: str) -> None:
        """Select ``name`` afresh: a rule of this step has just recorded it."""
        self._instant.pop(name, None)
        self._ranges.pop(name, None)

    def value(self, expr: Expr) -> Value:
        """The value of ``expr`` at this step's time."""
        if isinstance(expr, Number):
            return expr.value
        if isinstance(expr, Selector):
            if expr.range is not None:
                raise EvaluationError("a range selector outside a function")
            return self.instant(expr)
        if isinstance(expr, Call):
            return self.call(expr)
        if isinstance(expr, Aggregation):
            return self.aggregate(expr)
        if isinstance(expr, Negation):
            inner = self.value(expr.expr)
            if isinstance(inner, dict):
                return {without_name(k): -v for k, v in inner.items()}
            return -inner
        return self.binary(expr)

    # Selectors.

    def _names(self, selector: Selector) -> list[str]:
        if selector.name is not None:
            return [selector.name]
        matchers = [m for m in selector.matchers if m.label == NAME]
        return sorted(n for n in self.history.names() if all(m.matches(n) for m in matchers))

    def _selected(self, selector: Selector, labels: Labels) -> bool:
        found = dict(labels)
        return all(m.matches(found.get(m.label, "")) for m in selector.matchers if m.label != NAME)

    def instant(self, selector: Selector) -> Vector:
        """An instant selector: each series' last sample within the lookback."""
        at = self.now - selector.offset
        result: Vector = {}
        for name in self._names(selector):
            selected = self._instant.setdefault(name, {})
            found = selected.get(at)
            if found is None:
                found = selected[at] = self.history.at(name, at, LOOKBACK_SECONDS)
            for labels, value in found.items():
                if self._selected(selector, labels):
                    result[_named(name, labels)] = value
        return result

    def ranged(self, selector: Selector) -> list[tuple[str, Labels, list[Point]]]:
        """A range selector: each series' samples in the range, by name."""
        assert selector.range is not None
        end = self.now - selector.offset
        found = []
        for name in self._names(selector):
            window = (end - selector.range, end)
            chosen = self._ranges.setdefault(name, {})
            selected = chosen.get(window)
            if selected is None:
                selected = chosen[window] = self.history.points(name, *window)
            for labels, points in selected.items():
                if self._selected(selector, labels):
                    found.append((name, labels, points))
        return found

    # Functions.

    def call(self, call: Call) -> Value:
        """A function's value."""
        if call.function == "time":
            return self.now
        if call.function == "absent":
            inner = vector(self.value(call.args[0]))
            if inner:
                return {}
            arg = call.args[0]
            labels: Labels = ()
            if isinstance(arg, Selector):
                equal = (m for m in arg.matchers if m.op == "=" and m.label != NAME)
                labels = tuple(sorted((m.label, m.value) for m in equal))
            return {labels: 1.0}
        selector = call.args[0]
        assert isinstance(selector, Selector) and selector.range is not None
        end = self.now - selector.offset
        start = end - selector.range
        over = _OVER_TIME.get(call.function)
        result: Vector = {}
        for name, labels, points in self.ranged(selector):
            if call.function in ("rate", "increase"):
                value = _extrapolated(points, start, end, per_second=call.function == "rate")
                if value is None:
                    continue
            elif call.function == "resets":
                value = float(sum(1 for a, b in pairwise(points) if b[1] < a[1]))
            else:
                assert over is not None
                value = over(list(map(itemgetter(1), points)))
            # Prometheus 2.x keeps the metric name through last_over_time() alone.
            key = _named(name, labels) if call.function == "last_over_time" else labels
            result[key] = value
        return result

    # Aggregations.

    def aggregate(self, aggregation: Aggregation) -> Vector:
        """An aggregation of a vector by group."""
        inner = vector(self.value(aggregation.expr))
        groups: dict[Labels, list[float]] = {}
        for labels in sorted(inner):
            if aggregation.without:
                key = _project(labels, False, aggregation.labels)
            else:
                key = _project(labels, True, aggregation.labels)
            groups.setdefault(key, []).append(inner[labels])
        pick = _AGGREGATE[aggregation.op]
        return {key: pick(values) for key, values in groups.items()}

    # Binary operators.

    def binary(self, expr: Binary) -> Value:
        """A binary operator between numbers and vectors."""
        lhs, rhs = self.value(expr.lhs), self.value(expr.rhs)
        op = expr.op
        if not isinstance(lhs, dict) and not isinstance(rhs, dict):
            if op in COMPARISONS:
                return 1.0 if _compare(op, lhs, rhs) else 0.0
            return _arithmetic(op, lhs, rhs)
        if isinstance(lhs, dict) and isinstance(rhs, dict):
            if op in ("and", "or", "unless"):
                return _set_operation(expr, lhs, rhs)
            return _vector_binary(expr, lhs, rhs)
        if op in ("and", "or", "unless"):
            raise EvaluationError(f"{op} needs a vector on each side")
        return _scalar_binary(expr, lhs, rhs)


def _stays_infinite(mean: float, value: float) -> bool:
    """Whether an infinite running mean stays: unless the opposite infinity or a NaN comes."""
    if not math.isinf(mean):
        return False
    if math.isinf(value):
        return (mean > 0) == (value > 0)
    return not math.isnan(value)


def _mean(values: list[float]) -> float:
    """``avg``'s running mean, as Prometheus 2.x aggregates (it rounds unlike sum / count)."""
    mean, count = 0.0, 0.0
    for value in values:
        count += 1
        if _stays_infinite(mean, value):
            continue
        mean += value / count - mean / count
    return mean


def _mean_over_time(values: list[float]) -> float:
    """``avg_over_time``: the running mean with Kahan-Neumaier compensation, as Prometheus 2.42."""
    if values[0] == min(values) == max(values):
        return values[0]  # what the running mean gives exactly, without the loop (most 0/1 gauges)
    mean, count, compensation = 0.0, 0.0, 0.0
    for value in values:
        count += 1
        if _stays_infinite(mean, value):
            continue
        increment = value / count - mean / count
        total = mean + increment
        if abs(mean) >= abs(increment):
            compensation += (mean - total) + increment
        else:
            compensation += (increment - total) + mean
        mean = total
    return mean if math.isinf(mean) else mean + compensation


def _max(values: list[float]) -> float:
    best = values[0]
    for value in values[1:]:
        if best < value or math.isnan(best):
            best = value
    return best


def _min(values: list[float]) -> float:
    best = values[0]
    for value in values[1:]:
        if best > value or math.isnan(best):
            best = value
    return best


def _sum(values: list[float]) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


_OVER_TIME: dict[str, Callable[[list[float]], float]] = {
    "last_over_time": lambda values: values[-1],
    "max_over_time": _max,
    "min_over_time": _min,
    "avg_over_time": _mean_over_time,
}
_AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "sum": _sum,
    "max": _max,
    "min": _min,
    "avg": _mean,
    "count": lambda values: float(len(values)),
    "group": lambda values: 1.0,
}


def _arithmetic(op: str, a: float, b: float) -> float:
    try:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        if op == "%":
            return math.fmod(a, b)
        if op == "^":
            return math.pow(a, b)
    except ZeroDivisionError:
        if op == "/" and a != 0 and not math.isnan(a):
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return math.nan
    except (ValueError, OverflowError):
        if op == "^" and abs(a) > 1:
            return math.inf
        return math.nan
    raise EvaluationError(f"unknown operator {op}")


def _compare(op: str, a: float, b: float) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a >= b


def _scalar_binary(expr: Binary, lhs: Value, rhs: Value) -> Vector:
    """A vector and a number: element by element; a comparison keeps the vector's value."""
    swapped = not isinstance(lhs, dict)
    elements = rhs if swapped else lhs
    number = lhs if swapped else rhs
    assert isinstance(elements, dict) and not isinstance(number, dict)
    comparison = expr.op in COMPARISONS
    result: Vector = {}
    for labels, value in elements.items():
        a, b = (number, value) if swapped else (value, number)
        if comparison:
            keep = _compare(expr.op, a, b)
            if expr.return_bool:
                result[without_name(labels)] = 1.0 if keep else 0.0
            elif keep:
                result[labels] = value
        else:
            result[without_name(labels)] = _arithmetic(expr.op, a, b)
    return result


def _signature(labels: Labels, matching: tuple[bool, tuple[str, ...]] | None) -> Labels:
    if matching is None:
        return without_name(labels)
    return _project(labels, matching[0], matching[1])


def _set_operation(expr: Binary, lhs: Vector, rhs: Vector) -> Vector:
    right = {_signature(labels, expr.matching) for labels in rhs}
    if expr.op == "and":
        return {k: v for k, v in lhs.items() if _signature(k, expr.matching) in right}
    if expr.op == "unless":
        return {k: v for k, v in lhs.items() if _signature(k, expr.matching) not in right}
    left = {_signature(labels, expr.matching) for labels in lhs}
    result = dict(lhs)
    for labels, value in rhs.items():
        if _signature(labels, expr.matching) not in left:
            result[labels] = value
    return result


def _vector_binary(expr: Binary, lhs: Vector, rhs: Vector) -> Vector:
    """Arithmetic or a comparison between two vectors, with Prometheus's vector matching."""
    if not lhs or not rhs:
        return {}
    many, one = (rhs, lhs) if expr.group == "right" else (lhs, rhs)
    ones: dict[Labels, tuple[Labels, float]] = {}
    for labels, value in one.items():
        signature = _signature(labels, expr.matching)
        if signature in ones:
            side = "left" if expr.group == "right" else "right"
            raise EvaluationError(f"duplicate series on the {side} side for {dict(signature)}")
        ones[signature] = (labels, value)
    comparison = expr.op in COMPARISONS
    result: Vector = {}
    matched: set[Labels] = set()
    for labels, value in many.items():
        signature = _signature(labels, expr.matching)
        found = ones.get(signature)
        if found is None:
            continue
        other_labels, other = found
        a, b = (other, value) if expr.group == "right" else (value, other)
        if comparison:
            keep = _compare(expr.op, a, b)
            if not keep and not expr.return_bool:
                continue
            out = (1.0 if keep else 0.0) if expr.return_bool else a
        else:
            out = _arithmetic(expr.op, a, b)
        metric = _result_labels(expr, labels, other_labels, drop_name=not comparison)
        if expr.return_bool:
            metric = without_name(metric)
        if expr.group is None:
            if signature in matched:
                raise EvaluationError(f"multiple matches on the left side for {dict(signature)}")
            matched.add(signature)
        elif metric in result:
            raise EvaluationError(f"grouping labels do not make {dict(metric)} unique")
        result[metric] = out
    return result


def _result_labels(expr: Binary, labels: Labels, one: Labels, drop_name: bool) -> Labels:
    found = dict(labels)
    if drop_name:
        found.pop(NAME, None)
    if expr.group is None and expr.matching is not None:
        on, names = expr.matching
        found = (
            {k: v for k, v in found.items() if k in names}
            if on
            else {k: v for k, v in found.items() if k not in names}
        )
    other = dict(one)
    for name in expr.include:
        if other.get(name, ""):
            found[name] = other[name]
        else:
            found.pop(name, None)
    return tuple(sorted(found.items()))


def _extrapolated(points: list[Point], start: float, end: float, per_second: bool) -> float | None:
    """Prometheus 2.x's ``extrapolatedRate``, step for step, so that it rounds alike.

    A value below the previous one is a counter reset (the previous value is added back). The
    increase from the first to the last sample is extrapolated to each end of the range where a
    sample is within 1.1 average intervals of it, else by half an interval, and never to before
    the counter would have been zero. Prometheus scales by one factor (``rate()`` divides it by
    the range first): 285 * (1 / 300) is 0.9500000000000001, not 285 / 300.
    """
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    result = last_v - first_v
    previous = 0.0
    for _t, value in points:
        if value < previous:
            result += previous
        previous = value
    to_start, to_end = first_t - start, end - last_t
    sampled = last_t - first_t
    average = sampled / (len(points) - 1)
    if result > 0 and first_v >= 0:
        to_start = min(to_start, sampled * (first_v / result))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = interval / sampled
    if per_second:
        factor /= end - start
    return result * factor


def names_read(exprs: Iterable[Expr], known: Iterable[str]) -> set[str]:
    """The metric names a set of expressions reads; a ``__name__`` regex among ``known``."""
    names: set[str] = set()
    known = list(known)
    for expr in exprs:
        for selector in selectors(expr):
            if selector.name is not None:
                names.add(selector.name)
            else:
                matchers = [m for m in selector.matchers if m.label == NAME]
                names.update(n for n in known if all(m.matches(n) for m in matchers))
    return names
