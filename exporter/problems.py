"""Log a recurring problem once when it starts and once when it ends.

A collector that fails every second must not write a line every second: the
operator needs to know when it started failing and when it recovered.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable


class ProblemLog:
    """Remembers which problems are ongoing, by key."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._ongoing: dict[Hashable, str] = {}

    def report(self, key: Hashable, message: str, *args: object) -> None:
        """Log a warning the first time `key` fails, or when its message changes."""
        text = message % args
        if self._ongoing.get(key) == text:
            return
        self._ongoing[key] = text
        self._logger.warning(message, *args)

    def resolve(self, key: Hashable, message: str, *args: object) -> None:
        """Log at info once when a reported problem under `key` has gone away."""
        if self._ongoing.pop(key, None) is not None:
            self._logger.info(message, *args)
