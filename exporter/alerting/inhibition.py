"""Alertmanager's inhibit rules, applied to the local alerts' notifications.

The rules are defined once, in ``alert_rules/thresholds.yaml`` (``inhibit_rules:``, read by
:mod:`exporter.alerting.thresholds`), in Alertmanager's own syntax, so that local alerting mutes
what an Alertmanager loading the same rules would mute
(<https://prometheus.io/docs/alerting/latest/configuration/#inhibit_rule>): a target alert is
muted while a firing alert that matches the rule's source matchers has the same values of the
``equal`` labels, a missing label counting as empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.matchers import Matcher


@dataclass(frozen=True)
class InhibitRule:
    """One inhibit rule: its source and target matchers and the labels that must be equal."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()


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
