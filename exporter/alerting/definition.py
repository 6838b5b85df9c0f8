"""The shape of a rule: one definition per alert and per recorded series, and its YAML form.

An :class:`Alert` holds everything Prometheus and the local evaluator know about one alert, its
name written once; a :class:`Recording` one recording rule; a :class:`Group` the rules
Prometheus evaluates together, in order. The rule modules (:mod:`exporter.alerting.recording`,
:mod:`exporter.alerting.alerts`) build them from the thresholds; :mod:`exporter.alerting.rules`
puts them in files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.alerting.thresholds import AlertThresholds, Thresholds, duration_seconds

# One rule as it is written to a rule file.
Rule = dict[str, Any]


@dataclass(frozen=True)
class Recording:
    """One recording rule: the series it records, its expression and its extra labels."""

    record: str
    expr: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def render(self) -> Rule:
        """The rule as the rule file holds it."""
        rule: Rule = {"record": self.record, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True)
class Alert:
    """One alerting rule: its condition, timing, severity and the texts a notification shows.

    ``not_local`` says why the exporter cannot evaluate the alert on its own samples, and
    ``partly_local`` which part of it the exporter evaluates; both empty: it evaluates it all.
    ``reading`` is the quantity ``value`` formats, without the condition: what the local
    evaluator reads when the alert resolves, so that its resolve says the value then (a rule
    file has no place for it: Alertmanager resolves with the last firing value).
    """

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    # The measured value, formatted, which notifications show.
    value: str
    runbook_url: str
    for_: str = "0s"
    keep_firing_for: str = "0s"
    not_local: str = ""
    partly_local: str = ""
    reading: str = ""

    @classmethod
    def of(
        cls,
        thresholds: Thresholds,
        settings: AlertThresholds,
        expr: str,
        *,
        summary: str,
        description: str,
        value: str,
        windowed: bool = False,
        not_local: str = "",
        partly_local: str = "",
        reading: str = "",
    ) -> Alert:
        """The alert that ``settings`` configure; ``windowed``: ``expr`` judges its `for:` itself.

        A windowed alert's expression looks back over the `for:` in one window, so the rule has
        no `for:` of its own (see :func:`~exporter.alerting.expressions.above_for`).
        """
        return cls(
            name=settings.name,
            expr=expr,
            severity=settings.severity,
            summary=summary,
            description=description,
            value=value,
            runbook_url=thresholds.runbook_url(settings.name),
            for_="0s" if windowed else settings.for_,
            keep_firing_for=settings.keep_firing_for,
            not_local=not_local,
            partly_local=partly_local,
            reading=reading,
        )

    @property
    def labels(self) -> dict[str, str]:
        """The labels the rule adds to every alert it raises."""
        return {"severity": self.severity}

    @property
    def annotations(self) -> dict[str, str]:
        """The texts of a notification, templated on the alert's labels and value."""
        return {
            "summary": self.summary,
            "description": self.description,
            "value": self.value,
            "runbook_url": self.runbook_url,
        }

    def render(self) -> Rule:
        """The rule as the rule file holds it: a zero `for:` or `keep_firing_for:` is left out."""
        rule: Rule = {"alert": self.name, "expr": self.expr}
        if duration_seconds(self.for_):
            rule["for"] = self.for_
        if duration_seconds(self.keep_firing_for):
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = self.labels
        rule["annotations"] = self.annotations
        return rule


@dataclass(frozen=True)
class Group:
    """A rule group: rules Prometheus evaluates in order, at one time, every ``interval``.

    ``not_local`` says why the local evaluator leaves the whole group out (its rules read series
    no exporter has); empty: it parses the group's rules with the others.
    """

    name: str
    rules: tuple[Recording | Alert, ...]
    # Empty: Prometheus's global evaluation interval.
    interval: str = ""
    not_local: str = ""

    def alerts(self) -> tuple[Alert, ...]:
        """The group's alerting rules, in order."""
        return tuple(rule for rule in self.rules if isinstance(rule, Alert))

    def recordings(self) -> tuple[Recording, ...]:
        """The group's recording rules, in order."""
        return tuple(rule for rule in self.rules if isinstance(rule, Recording))

    def render(self) -> dict[str, Any]:
        """The group as the rule file holds it."""
        group: dict[str, Any] = {"name": self.name}
        if self.interval:
            group["interval"] = self.interval
        group["rules"] = [rule.render() for rule in self.rules]
        return group


# One alert's definition: the function that builds it from the thresholds.
AlertDefinition = Callable[[Thresholds], Alert]
