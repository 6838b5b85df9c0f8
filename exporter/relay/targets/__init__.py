"""Delivery targets, one module per service; each registers its kind when imported.

Importing this package imports every module in it, so the kinds are complete without a
central list: adding a target kind means adding one module.
"""

from __future__ import annotations

import importlib
import pkgutil

from exporter.relay.target_config import TargetConfig
from exporter.relay.targets.base import KINDS, OutboundRequest, Outcome, Target
from exporter.relay.templates import MessageSettings

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["KINDS", "OutboundRequest", "Outcome", "Target", "build"]


def build(config: TargetConfig, settings: MessageSettings) -> Target:
    """The target object for a configured target."""
    return KINDS[config.kind](config, settings)
