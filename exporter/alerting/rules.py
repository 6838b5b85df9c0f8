"""gpuload's Prometheus rules, built from the thresholds: what goes in which rule file.

Two rule files: recording rules (``level:metric:operations``, :mod:`exporter.alerting.recording`,
and the GPU pods' owners and teams, :mod:`exporter.alerting.owners`), then the alerts
(:mod:`exporter.alerting.alerts`), in four groups (utilization, health, the GPU inventory, the
exporter). Every rule is a definition (:mod:`exporter.alerting.definition`) built
from the thresholds; the files are their rendering. Readers of the rules (the local evaluator,
the doctor, the status page, the dashboards) take the definitions from here, and the names the
rules share (:data:`STATES`, :data:`BOTTLENECK_ALERTS`, :func:`recording_names`) with them.
"""

from __future__ import annotations

from typing import Any

from exporter.alerting.accounting import accounting_group
from exporter.alerting.alerts import alert_groups
from exporter.alerting.definition import Alert, Group, Recording, Rule
from exporter.alerting.expressions import (
    BOTTLENECK_ALERTS,
    COLLECTED_AT,
    GPM_RATIOS,
    GPU,
    NODE,
    STATES,
    recording_names,
)
from exporter.alerting.owners import owners_group
from exporter.alerting.recording import bottleneck_classes, fleet_group, recording_group
from exporter.alerting.thresholds import Thresholds

__all__ = [
    "ALERTS_FILE",
    "BOTTLENECK_ALERTS",
    "COLLECTED_AT",
    "GPM_RATIOS",
    "GPU",
    "NODE",
    "RECORDING_FILE",
    "STATES",
    "Alert",
    "Group",
    "Recording",
    "Rule",
    "alerts",
    "bottleneck_rules",
    "group_names",
    "recording_names",
    "rule_files",
    "rule_groups",
]

RECORDING_FILE = "gpuload-recording.rules.yml"
ALERTS_FILE = "gpuload-alerts.rules.yml"


def rule_groups(thresholds: Thresholds) -> dict[str, tuple[Group, ...]]:
    """Every rule group by rule file, the recording file first: the order one step settles them."""
    return {
        RECORDING_FILE: (
            recording_group(thresholds),
            fleet_group(thresholds),
            owners_group(thresholds),
            accounting_group(thresholds),
        ),
        ALERTS_FILE: alert_groups(thresholds),
    }


def rule_files(thresholds: Thresholds) -> dict[str, dict[str, Any]]:
    """Return the rule files' contents by file name, ready to dump as YAML."""
    return {
        name: {"groups": [group.render() for group in groups]}
        for name, groups in rule_groups(thresholds).items()
    }


def group_names(thresholds: Thresholds) -> list[str]:
    """Every rule group, recording groups first: the order one evaluation step settles them in."""
    return [group.name for groups in rule_groups(thresholds).values() for group in groups]


def alerts(thresholds: Thresholds) -> tuple[Alert, ...]:
    """Every alert's definition, in the rule files' order."""
    return tuple(
        alert for groups in rule_groups(thresholds).values() for g in groups for alert in g.alerts()
    )


def bottleneck_rules(thresholds: Thresholds) -> list[Rule]:
    """The rules of ``gpu:gpu_bottleneck:class5m`` as the rule file holds them, one per class."""
    return [rule.render() for rule in bottleneck_classes(thresholds)]
