"""A parser for the PromQL that gpuload's rule files are written in.

The local evaluator, the doctor and the status page read the states and alerts from the rendered
rule files, not from a second copy of their conditions; this module turns each rule's ``expr``
into a small tree that :mod:`exporter.alerting.engine` evaluates. It parses the part of PromQL the
rules use (selectors with matchers, ranges and offsets; the range functions, ``time()`` and
``absent()``; the aggregations; arithmetic, comparisons with ``bool``, set operators, vector
matching with ``on``/``ignoring`` and ``group_left``/``group_right``), with PromQL's precedence
and associativity, and refuses anything else with the position and what was expected: a rule file
that uses more fails to load, never evaluates to something else. Whether the evaluation agrees
with Prometheus is proven against ``promtool test rules`` (tests/test_rule_engine.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn

# The functions the engine knows, with their argument kinds ("vector" or "range").
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "rate": ("range",),
    "increase": ("range",),
    "resets": ("range",),
    "last_over_time": ("range",),
    "max_over_time": ("range",),
    "min_over_time": ("range",),
    "avg_over_time": ("range",),
    "time": (),
    "absent": ("vector",),
}
AGGREGATIONS = frozenset({"sum", "max", "min", "avg", "count", "group"})
# Binary operators from the loosest to the tightest; ^ alone is right-associative.
PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    "==": 3,
    "!=": 3,
    "<": 3,
    "<=": 3,
    ">": 3,
    ">=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "^": 6,
}
COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
SET_OPERATORS = frozenset({"and", "or", "unless"})
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+(?![\w.]))
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0[xX][0-9a-fA-F]+|(?:[Ii]nf|NaN)(?![\w:]))
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=(){}\[\],])
    )""",
    re.VERBOSE,
)


class ParseError(ValueError):
    """An expression outside what the engine evaluates; says where and what was expected."""


@dataclass(frozen=True)
class Matcher:
    """``label op "value"``; ``=~`` and ``!~`` are anchored regular expressions."""

    label: str
    op: str
    value: str

    def matches(self, actual: str) -> bool:
        """Whether a label's value (empty when absent) satisfies this matcher."""
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = _regex(self.value).fullmatch(actual) is not None
        return found if self.op == "=~" else not found


_REGEXES: dict[str, re.Pattern[str]] = {}


def _regex(pattern: str) -> re.Pattern[str]:
    compiled = _REGEXES.get(pattern)
    if compiled is None:
        compiled = _REGEXES[pattern] = re.compile(pattern)
    return compiled


@dataclass(frozen=True)
class Number:
    """A number literal."""

    value: float


@dataclass(frozen=True)
class Selector:
    """``name{matchers}`` (``name`` None: chosen by a ``__name__`` matcher), ``[range]``, offset."""

    name: str | None
    matchers: tuple[Matcher, ...]
    range: float | None = None
    offset: float = 0.0


@dataclass(frozen=True)
class Call:
    """A function call."""

    function: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Aggregation:
    """``op by|without (labels) (expr)``; ``without`` False means ``by``."""

    op: str
    expr: Expr
    labels: tuple[str, ...] = ()
    without: bool = True


@dataclass(frozen=True)
class Binary:
    """``lhs op [bool] [on|ignoring (labels)] [group_left|group_right (labels)] rhs``."""

    op: str
    lhs: Expr
    rhs: Expr
    return_bool: bool = False
    # None: no on/ignoring (match on every label but the name); else (on?, labels).
    matching: tuple[bool, tuple[str, ...]] | None = None
    # "left" or "right" for group_left/group_right, with the labels taken from the one side.
    group: str | None = None
    include: tuple[str, ...] = ()


@dataclass(frozen=True)
class Negation:
    """Unary minus."""

    expr: Expr


Expr = Number | Selector | Call | Aggregation | Binary | Negation


def parse(text: str) -> Expr:
    """The tree of one PromQL expression.

    Raises:
        ParseError: outside the supported subset, or not PromQL at all.
    """
    parser = _Parser(text)
    expr = parser.expression(0)
    if parser.peek() is not None:
        parser.fail("the end of the expression")
    return expr


def duration(text: str) -> float:
    """Seconds of a PromQL duration (``90s``, ``5m``, ``1h30m``)."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ParseError(f"{text!r} is not a duration (expected e.g. 30s, 5m, 1h)")
    return float(sum(int(n) * _UNITS[u] for n, u in parts))


def selectors(expr: Expr) -> list[Selector]:
    """Every selector of an expression, in order."""
    if isinstance(expr, Selector):
        return [expr]
    if isinstance(expr, Call):
        return [found for arg in expr.args for found in selectors(arg)]
    if isinstance(expr, Aggregation | Negation):
        return selectors(expr.expr)
    if isinstance(expr, Binary):
        return selectors(expr.lhs) + selectors(expr.rhs)
    return []


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        position = 0
        while position < len(text):
            if text[position:].strip() == "":
                break
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                raise ParseError(f"unexpected character at {position}: {text[position:][:20]!r}")
            kind = match.lastgroup or ""
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            position = match.end()
        self.at = 0

    def peek(self, ahead: int = 0) -> tuple[str, str, int] | None:
        index = self.at + ahead
        return self.tokens[index] if index < len(self.tokens) else None

    def value(self, ahead: int = 0) -> str | None:
        token = self.peek(ahead)
        return None if token is None else token[1]

    def next(self) -> tuple[str, str, int]:
        token = self.peek()
        if token is None:
            self.fail("more")
        self.at += 1
        return token

    def expect(self, text: str) -> None:
        if self.value() != text:
            self.fail(repr(text))
        self.at += 1

    def fail(self, expected: str) -> NoReturn:
        token = self.peek()
        where = "the end" if token is None else f"{token[1]!r} at {token[2]}"
        raise ParseError(f"{self.text!r}: expected {expected}, found {where}")

    def expression(self, floor: int) -> Expr:
        """The operators tighter than ``floor``: equal ones are left to the caller (left-assoc)."""
        lhs = self.unary()
        while True:
            token = self.peek()
            precedence = None if token is None else PRECEDENCE.get(token[1])
            if token is None or token[0] not in ("op", "name") or precedence is None:
                return lhs
            if precedence <= floor:
                return lhs
            self.at += 1
            lhs = self.binary(token[1], lhs, precedence)

    def binary(self, op: str, lhs: Expr, precedence: int) -> Binary:
        return_bool = False
        if self.value() == "bool":
            if op not in COMPARISONS:
                self.fail("no bool (only a comparison takes one)")
            self.at += 1
            return_bool = True
        matching = None
        if self.value() in ("on", "ignoring"):
            on = self.next()[1] == "on"
            matching = (on, self.label_list())
        group: str | None = None
        include: tuple[str, ...] = ()
        if self.value() in ("group_left", "group_right"):
            if op in SET_OPERATORS:
                self.fail(f"no grouping ({op} matches many-to-many)")
            group = "left" if self.next()[1] == "group_left" else "right"
            include = self.label_list() if self.value() == "(" else ()
        # ^ is right-associative: its right side may hold another ^.
        rhs = self.expression(precedence - 1 if op == "^" else precedence)
        return Binary(op, lhs, rhs, return_bool, matching, group, include)

    def unary(self) -> Expr:
        if self.value() in ("-", "+"):
            sign = self.next()[1]
            # -a ^ b is -(a ^ b): the operand binds everything tighter than * and /.
            operand = self.expression(PRECEDENCE["*"])
            return Negation(operand) if sign == "-" else operand
        return self.postfix(self.primary())

    def postfix(self, expr: Expr) -> Expr:
        while True:
            if self.value() == "[":
                if not isinstance(expr, Selector) or expr.range is not None:
                    self.fail("a range only after a selector")
                self.at += 1
                seconds = self.duration("a duration (subqueries are not supported)")
                self.expect("]")
                expr = Selector(expr.name, expr.matchers, seconds, expr.offset)
            elif self.value() == "offset":
                if not isinstance(expr, Selector):
                    self.fail("offset only after a selector")
                self.at += 1
                seconds = self.duration("a duration after offset")
                expr = Selector(expr.name, expr.matchers, expr.range, seconds)
            else:
                return expr

    def duration(self, expected: str) -> float:
        """The seconds of the duration token next."""
        token = self.next()
        if token[0] != "duration":
            self.fail(expected)
        return duration(token[1])

    def primary(self) -> Expr:
        kind, text, _ = self.next()
        if kind == "number":
            return Number(float(int(text, 16)) if text[:2].lower() == "0x" else float(text))
        if kind == "duration" and text.isdigit():
            return Number(float(text))
        if text == "(":
            inner = self.expression(0)
            self.expect(")")
            return inner
        if text == "{":
            self.at -= 1
            return self.selector(None)
        if kind != "name":
            self.at -= 1
            self.fail("a number, a selector, a function, an aggregation or '('")
        if text in AGGREGATIONS and self.value() in ("(", "by", "without"):
            return self.aggregation(text)
        if text in FUNCTIONS and self.value() == "(":
            return self.call(text)
        if self.value() == "(":
            self.at -= 1
            self.fail("a function the engine knows: " + ", ".join(sorted(FUNCTIONS)))
        return self.selector(text)

    def selector(self, name: str | None) -> Selector:
        matchers: list[Matcher] = []
        if self.value() == "{":
            self.at += 1
            while self.value() != "}":
                label = self.next()
                if label[0] != "name":
                    self.at -= 1
                    self.fail("a label name")
                op = self.next()[1]
                if op not in ("=", "!=", "=~", "!~"):
                    self.at -= 1
                    self.fail("=, !=, =~ or !~")
                value = self.next()
                if value[0] != "string":
                    self.at -= 1
                    self.fail("a quoted label value")
                matchers.append(Matcher(label[1], op, _unquote(value[1])))
                if self.value() == ",":
                    self.at += 1
                elif self.value() != "}":
                    self.fail("',' or '}'")
            self.at += 1
        if name is None:
            names = [m for m in matchers if m.label == "__name__"]
            if not names:
                self.fail("a metric name, or a __name__ matcher")
            if names[0].op == "=":
                name = names[0].value
                matchers = [m for m in matchers if m is not names[0]]
        return Selector(name, tuple(matchers))

    def aggregation(self, op: str) -> Aggregation:
        labels: tuple[str, ...] | None = None
        without = True
        if self.value() in ("by", "without"):
            without = self.next()[1] == "without"
            labels = self.label_list()
        self.expect("(")
        expr = self.expression(0)
        self.expect(")")
        if labels is None and self.value() in ("by", "without"):
            without = self.next()[1] == "without"
            labels = self.label_list()
        if labels is None:
            return Aggregation(op, expr, (), False)  # no grouping: one group of everything
        return Aggregation(op, expr, labels, without)

    def call(self, function: str) -> Call:
        self.expect("(")
        args: list[Expr] = []
        while self.value() != ")":
            args.append(self.expression(0))
            if self.value() == ",":
                self.at += 1
            elif self.value() != ")":
                self.fail("',' or ')'")
        self.at += 1
        kinds = FUNCTIONS[function]
        if len(args) != len(kinds):
            raise ParseError(f"{self.text!r}: {function}() takes {len(kinds)} argument(s)")
        for kind, arg in zip(kinds, args, strict=True):
            ranged = isinstance(arg, Selector) and arg.range is not None
            if (kind == "range") != ranged:
                raise ParseError(f"{self.text!r}: {function}() takes a {kind} selector")
        return Call(function, tuple(args))

    def label_list(self) -> tuple[str, ...]:
        self.expect("(")
        labels = []
        while self.value() != ")":
            token = self.next()
            if token[0] != "name":
                self.at -= 1
                self.fail("a label name")
            labels.append(token[1])
            if self.value() == ",":
                self.at += 1
            elif self.value() != ")":
                self.fail("',' or ')'")
        self.at += 1
        return tuple(labels)


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)
