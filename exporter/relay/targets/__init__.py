"""Delivery targets, one module per service; each registers its kind when imported."""

from __future__ import annotations

from exporter.relay.target_config import TargetConfig
from exporter.relay.targets import (  # noqa: F401  (imported to register their kinds)
    dingtalk,
    discord,
    feishu,
    pagerduty,
    slack,
    teams,
    webhook,
    wecom,
)
from exporter.relay.targets.base import KINDS, OutboundRequest, Outcome, Target
from exporter.relay.templates import MessageSettings

__all__ = ["KINDS", "OutboundRequest", "Outcome", "Target", "build"]


def build(config: TargetConfig, settings: MessageSettings) -> Target:
    """The target object for a configured target."""
    return KINDS[config.kind](config, settings)
