"""Shared fixtures."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import Daemon, start_daemon


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "real_time: runs for real minutes against a real engine; scripts/test runs these as a"
        " step of their own after the main suite",
    )
    config.addinivalue_line(
        "markers",
        "differential: minutes of CPU comparing gpuload's rule engine with promtool on generated"
        " series; scripts/test runs these as a step of their own after the main suite",
    )
    config.addinivalue_line(
        "markers",
        "image: builds the container image with podman and runs it; only `scripts/test --image`"
        " runs these (they need root, podman, buildah and debootstrap)",
    )
    config.addinivalue_line(
        "markers",
        "engines: a minute or more of real engines under load (Prometheus with Alertmanager, a"
        " fleet, an image's install, a soak, slow clients against three servers); scripts/test"
        " runs these as a step of their own after the main suite",
    )


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


@pytest.fixture
def processes() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start helper processes (Prometheus, Alertmanager); kill every one at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(*command: str, log: Path) -> subprocess.Popen[str]:
        with log.open("w") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=10)
