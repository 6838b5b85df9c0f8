"""Alertmanager's inhibit rules, applied to the local alerts' notifications.

The rules are defined once, in ``alert_rules/thresholds.yaml`` (``inhibit_rules:``, read by
:mod:`exporter.alerting.thresholds`), in Alertmanager's own syntax, so that local alerting mutes
what an Alertmanager loading the same rules would mute
(<https://prometheus.io/docs/alerting/latest/configuration/#inhibit_rule>): a target alert is
muted while a firing alert that matches the rule's source matchers has the same values of the
``equal`` labels, a missing label counting as empty.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Alertmanager's classic matcher (pkg/labels/parse.go): a label name, an operator (=~ before =,
# or `=` would take the `~` into the value), and a value, quoted or not, around any whitespace.
_MATCHER = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(=~|=|!=|!~)\s*(.*?)\s*$", re.DOTALL)
OPERATORS = ("=", "!=", "=~", "!~")
EXAMPLE = 'alertname="GPUFellOffBus"'


@dataclass(frozen=True)
class Matcher:
    """One label matcher: ``name``, an operator of :data:`OPERATORS` and ``value``."""

    name: str
    operator: str
    value: str
    # The value anchored at both ends, as Alertmanager compiles it, for =~ and !~.
    regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this matcher; a missing label is the empty string."""
        actual = labels.get(self.name, "")
        if self.regex is not None:
            return (self.regex.fullmatch(actual) is not None) == (self.operator == "=~")
        return (actual == self.value) == (self.operator == "=")

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.operator}"{escaped}"'


@dataclass(frozen=True)
class InhibitRule:
    """One inhibit rule: its source and target matchers and the labels that must be equal."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()


def parse_matchers(text: str) -> list[Matcher]:
    """Parse one entry of ``source_matchers`` or ``target_matchers`` as Alertmanager does.

    An entry holds one matcher (``alertname="GPUFellOffBus"``) or several separated by commas
    outside quotes, optionally inside braces (``{alertname="A", gpu!="0"}``).

    Raises:
        ValueError: a matcher is malformed or its regex does not compile; the message says how.
    """
    body = text.removeprefix("{").removesuffix("}")
    tokens: list[str] = []
    token: list[str] = []
    quoted = escaped = False
    for char in body:
        if char == ",":
            if not quoted:
                tokens.append("".join(token))
                token = []
                continue
        elif char == '"':
            if escaped:
                escaped = False
            else:
                quoted = not quoted
        elif char == "\\":
            escaped = not escaped
        else:
            escaped = False
        token.append(char)
    if "".join(token).strip():
        tokens.append("".join(token))
    if not tokens:
        raise ValueError(f"{text!r} holds no matcher: expected one like {EXAMPLE}")
    return [parse_matcher(token) for token in tokens]


def parse_matcher(text: str) -> Matcher:
    r"""Parse one matcher: a label name, ``=``, ``!=``, ``=~`` or ``!~``, and a value.

    The value may be double-quoted; inside it ``\"``, ``\n`` and ``\\`` are escapes, and an
    unescaped ``"`` may only close a quoted value. A regex must match the whole label value.

    Raises:
        ValueError: ``text`` is not such a matcher, or its regex does not compile.
    """
    match = _MATCHER.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a matcher: expected a label name, one of"
            f" {' '.join(OPERATORS)} and a value, like {EXAMPLE}"
        )
    name, operator, raw = match.groups()
    try:
        value = _unquote(raw)
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}") from error
    if operator not in ("=~", "!~"):
        return Matcher(name, operator, value)
    try:
        regex = re.compile(f"(?:{value})")
    except re.error as error:
        raise ValueError(f"{text!r}: {value!r} is not a regex: {error}") from error
    return Matcher(name, operator, value, regex)


def _unquote(raw: str) -> str:
    """The value of a matcher with its quotes and escapes undone, as Alertmanager reads them."""
    quoted = raw.startswith('"')
    body = raw[1:] if quoted else raw
    value: list[str] = []
    closed = False
    index = 0
    while index < len(body):
        char = body[index]
        last = index == len(body) - 1
        if char == "\\" and not last:
            following = body[index + 1]
            # A spurious escape (not \n, \" or \\) stays a literal backslash.
            value.append({"n": "\n", '"': '"', "\\": "\\"}.get(following, "\\" + following))
            index += 2
            continue
        if char == '"':
            if not quoted or not last:
                raise ValueError(r"an unescaped double quote inside the value (write \" for one)")
            closed = True
        else:
            value.append(char)
        index += 1
    if quoted and not closed:
        raise ValueError("the value's opening double quote is never closed")
    return "".join(value)


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy every matcher (an empty set matches everything)."""
    return all(matcher.matches(labels) for matcher in matchers)


def find_inhibitor(
    target: Mapping[str, str],
    firing: Iterable[Mapping[str, str]],
    rules: Iterable[InhibitRule],
) -> Mapping[str, str] | None:
    """The labels of a firing alert that inhibits ``target`` under ``rules``; None if none does.

    As Alertmanager's inhibitor: a rule applies when ``target`` matches its target matchers and
    a firing alert matches its source matchers with equal values of the ``equal`` labels. When
    ``target`` matches the source matchers too, alerts that match both sides are passed over,
    so that no alert inhibits itself nor its peers.
    """
    firing = list(firing)
    for rule in rules:
        if not matches_all(rule.target, target):
            continue
        two_sided = matches_all(rule.source, target)
        for source in firing:
            if not matches_all(rule.source, source):
                continue
            if any(source.get(name, "") != target.get(name, "") for name in rule.equal):
                continue
            if two_sided and matches_all(rule.target, source):
                continue
            return source
    return None
