"""Routing like Alertmanager's: a tree of label matchers choosing targets per alert.

A route matches an alert when all its matchers do. Children are tried in order;
the first that matches takes the alert unless it has ``continue: true``, in which
case the next siblings are tried too. A route none of whose children matched
delivers to its own targets. The root matches every alert; its targets are the
default. A child without targets inherits its parent's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# name op "value" | name op value, as in Alertmanager's `matchers`.
_MATCHER = re.compile(
    r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|(.*?))\s*$'
)
_UNESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True)
class Matcher:
    """One label matcher: ``name op value`` with op in =, !=, =~, !~."""

    name: str
    op: str
    value: str
    pattern: re.Pattern[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether the labels satisfy the matcher; an absent label is the empty string."""
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self.pattern is not None
        found = self.pattern.fullmatch(actual) is not None
        return found if self.op == "=~" else not found


def parse_matcher(text: str) -> Matcher:
    """A matcher from ``severity="critical"``, ``team=~"ml|ai"`` or ``env!=dev``.

    Raises:
        ValueError: saying what is expected.
    """
    match = _MATCHER.match(text)
    if not match:
        raise ValueError('expected name="value" with one of =, !=, =~, !~')
    name, op, quoted, bare = match.groups()
    value = _UNESCAPE.sub(r"\1", quoted) if quoted is not None else bare
    pattern = None
    if op in ("=~", "!~"):
        try:
            pattern = re.compile(value)
        except re.error as error:
            raise ValueError(f"bad regular expression: {error}") from None
    return Matcher(name, op, value, pattern)


@dataclass(frozen=True)
class Route:
    """A node of the routing tree."""

    matchers: tuple[Matcher, ...] = ()
    targets: tuple[str, ...] = ()
    continue_matching: bool = False
    routes: tuple[Route, ...] = field(default_factory=tuple)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether every matcher of this route matches."""
        return all(matcher.matches(labels) for matcher in self.matchers)


def targets_for(route: Route, labels: Mapping[str, str]) -> list[str]:
    """The targets an alert with these labels goes to, in order, without repeats."""
    found: list[str] = []
    for name in _walk(route, labels, route.targets):
        if name not in found:
            found.append(name)
    return found


def _walk(route: Route, labels: Mapping[str, str], inherited: Sequence[str]) -> list[str]:
    own = route.targets or tuple(inherited)
    chosen: list[str] = []
    matched = False
    for child in route.routes:
        if not child.matches(labels):
            continue
        matched = True
        chosen.extend(_walk(child, labels, own))
        if not child.continue_matching:
            break
    return chosen if matched else list(own)
