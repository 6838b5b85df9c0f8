"""Shared fixtures."""

from __future__ import annotations

import ast
import functools
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import Daemon, start_daemon

# The real engines a test can start, by the program's name, and the helpers that start one.
ENGINE_PROGRAMS = frozenset(
    {
        "promtool",
        "prometheus",
        "prometheus-alertmanager",
        "alertmanager",
        "victoria-metrics",
        "vmalert",
        "vmagent",
        "chromium",
        "podman",
        "buildah",
    }
)
ENGINE_HELPERS = frozenset({"run_prometheus", "promtool_test_rules"})


@functools.cache
def needs_an_engine(module: Path) -> bool:
    """Whether a test module starts a real engine: it names an engine's program or helper.

    `scripts/test --quick` leaves such modules out. A module is judged whole: a file with one
    promtool check and twenty pure tests is left out too, which keeps the rule simple and the
    quick run honest (it never half-runs a file).
    """
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Constant) and node.value in ENGINE_PROGRAMS:
            return True
        if isinstance(node, ast.Name) and node.id in ENGINE_HELPERS:
            return True
        if isinstance(node, ast.alias) and node.name in ENGINE_HELPERS:
            return True
    return False


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="leave out the test modules that start a real engine (Prometheus, Alertmanager,"
        " VictoriaMetrics, Chromium, podman): scripts/test --quick",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--quick"):
        return
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        (left_out if needs_an_engine(item.path) else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "real_time: runs for real minutes against a real engine; scripts/test runs these as a"
        " step of their own, beside every other step from the start",
    )
    config.addinivalue_line(
        "markers",
        "differential: minutes of CPU comparing gpuload's rule engine with promtool on generated"
        " series; scripts/test runs these as a step of their own, beside the main suite",
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
        " runs these as a step of their own, after the main suite",
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
