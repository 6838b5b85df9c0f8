"""Routing like Alertmanager's: a tree of label matchers choosing targets per alert.

A route matches an alert when all its matchers do (`exporter.matchers`, Alertmanager's
syntax and RE2 regexes). Children are tried in order;
the first that matches takes the alert unless it has ``continue: true``, in which
case the next siblings are tried too. A route none of whose children matched
delivers to its own targets. The root matches every alert; its targets are the
default. A child without targets inherits its parent's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.matchers import Matcher


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
