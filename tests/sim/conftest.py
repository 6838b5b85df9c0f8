"""Fixtures for the simulated NVML tests: a hand-driven clock and a clean pynvml per test."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.sim import uninstall

EPOCH = 1_700_000_000.0


class ManualClock:
    """A clock that only moves when the test says so."""

    def __init__(self, epoch: float = EPOCH) -> None:
        self.epoch = epoch
        self.now = epoch

    def __call__(self) -> float:
        return self.now

    def at(self, elapsed: float) -> None:
        """Move to ``elapsed`` seconds after the epoch."""
        self.now = self.epoch + elapsed

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(autouse=True)
def _uninstall_simulator() -> Iterator[None]:
    yield
    uninstall()


BASE_SCENARIO: dict[str, Any] = {
    "description": "two GPUs for tests",
    "driver": {"version": "570.86.16", "cuda_version": 12080},  # every simulated function
    "gpus": [{"model": "h100-sxm", "count": 2}],
    "phases": [
        {
            "name": "steady",
            "duration": 60,
            "utilization": {"value": 0.5, "noise": 0.02},
            "processes": [{"name": "python job.py", "memory": "10GiB"}],
        }
    ],
}


@pytest.fixture
def base_scenario() -> dict[str, Any]:
    """A fresh copy of a small valid scenario document to modify."""
    return copy.deepcopy(BASE_SCENARIO)


@pytest.fixture
def write_scenario(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write a scenario document as YAML and return its path."""

    def write(document: dict[str, Any]) -> Path:
        path = tmp_path / "scenario.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        return path

    return write
