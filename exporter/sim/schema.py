"""The scenario file's primitive values: each validator takes a raw YAML value and its key path.

A value that does not fit raises :class:`ScenarioError` naming the key path and what was
expected, e.g. ``gpus[1].count: expected an integer 1..64``. Shared by the scenario's sections
(:mod:`exporter.sim.scenario` and :mod:`exporter.sim.pods`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any


class ScenarioError(ValueError):
    """A scenario or GPU model file is missing, malformed, or has an invalid key or value."""


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def _fail(path: str, message: str) -> ScenarioError:
    return ScenarioError(f"{path}: {message}")


def _is_number(value: object) -> bool:
    # YAML booleans are ints in Python; a `true` where a number belongs is a mistake.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mapping(
    value: object, path: str, allowed: Collection[str], required: Collection[str] = ()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "expected a mapping")
    for key in value:
        if key not in allowed:
            raise _fail(f"{path}.{key}" if path else str(key), "unknown key")
    for key in required:
        if key not in value:
            raise _fail(f"{path}.{key}" if path else key, "required key is missing")
    return value


def _list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(path, "expected a list")
    return value


def _number(value: object, path: str, low: float, high: float) -> float:
    if not _is_number(value) or not low <= float(value) <= high:  # type: ignore[arg-type]
        raise _fail(path, f"expected a number {low:g}..{high:g}")
    return float(value)  # type: ignore[arg-type]


def _integer(value: object, path: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _fail(path, f"expected an integer {low}..{high}")
    return value


def _string(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, "expected a non-empty string")
    return value


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, "expected true or false")
    return value


def _choice(value: object, path: str, choices: Mapping[str, int] | Collection[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _fail(path, f"expected one of {', '.join(sorted(choices))}")
    return value


def _duration(value: object, path: str) -> float:
    if _is_number(value) and float(value) >= 0:  # type: ignore[arg-type]
        return float(value)  # type: ignore[arg-type]
    match = _DURATION_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise _fail(path, "expected seconds or a duration like '90s', '5m', '2h'")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
