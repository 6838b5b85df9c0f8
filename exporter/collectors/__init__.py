"""Collectors, one per module; each registers itself when imported.

Importing this package imports every module in it, so the registry is complete
without a central list: adding a collector means adding one module.
"""

from __future__ import annotations

import importlib
import pkgutil

from exporter.collectors.base import REGISTRY, CollectorSpec, Family, Reader, Sample

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "CollectorSpec", "Family", "Reader", "Sample"]
