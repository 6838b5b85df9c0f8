"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from helpers import Daemon, start_daemon


@pytest.fixture
def daemon_factory() -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(*args: str, **kwargs: object) -> Daemon:
        daemon = start_daemon(*args, **kwargs)  # type: ignore[arg-type]
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
