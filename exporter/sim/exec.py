"""Running another program with the simulated NVML active inside it (``gpuload sim exec``).

The child gets ``exporter/sim/site`` first on its ``PYTHONPATH``; the ``sitecustomize`` module
there installs the simulator from ``GPULOAD_SIM_*`` variables when the interpreter starts, so any
Python program that imports pynvml (nvitop, gpustat, a user's script) sees the scenario's GPUs.
The epoch is fixed here, so every process started with the same arguments sees the same values.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

import exporter
from exporter.sim.installer import (
    ENV_CALLER,
    ENV_DEPENDENCIES,
    ENV_EPOCH,
    ENV_SCENARIO,
    ENV_SEED,
    ENV_TIME,
)
from exporter.sim.scenario import SCENARIO_DIR, load_scenario, scenario_path

SITE_DIR = Path(__file__).parent / "site"
# The directory holding the `exporter` package, so that the child can import it.
PACKAGE_ROOT = Path(exporter.__file__).resolve().parent.parent


def child_environment(
    scenario: str,
    environ: dict[str, str],
    *,
    epoch: float,
    seed: int | None,
    pinned_time: float | None,
    caller: str | None = None,
) -> dict[str, str]:
    """Return ``environ`` extended with the path and GPULOAD_SIM_* variables the child needs."""
    env = dict(environ)
    path = scenario_path(scenario)
    shipped = path.parent == SCENARIO_DIR and path.stem == scenario
    # A file path is made absolute: the child, or a process it starts, may change directory.
    env[ENV_SCENARIO] = scenario if shipped else str(path.resolve())
    env[ENV_EPOCH] = repr(float(epoch))
    for name, value in ((ENV_SEED, seed), (ENV_TIME, pinned_time), (ENV_CALLER, caller)):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    paths = [str(SITE_DIR), str(PACKAGE_ROOT)]
    # The simulator needs PyYAML, which the child's environment may lack. Its location is
    # appended to the child's path, after the child's own packages, so nothing is shadowed.
    env[ENV_DEPENDENCIES] = str(Path(yaml.__file__).resolve().parent.parent)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([existing] if existing else []))
    return env


def exec_command(
    scenario: str,
    argv: list[str],
    *,
    epoch: float | None,
    seed: int | None,
    pinned_time: float | None,
    caller: str | None = None,
) -> int:
    """Run ``argv`` with the simulated NVML active in it; return its exit code.

    SIGINT and SIGTERM received meanwhile are forwarded to the child. A child killed by a
    signal yields ``128 + signal``, as shells report it.

    Raises:
        ScenarioError: the scenario does not load (checked before starting the child).
        OSError: the command cannot be started.
    """
    load_scenario(scenario)
    env = child_environment(
        scenario,
        dict(os.environ),
        epoch=time.time() if epoch is None else epoch,
        seed=seed,
        pinned_time=pinned_time,
        caller=caller,
    )
    child = subprocess.Popen(argv, env=env)
    previous = _forward_signals(child)
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _forward_signals(child: subprocess.Popen[bytes]) -> dict[int, _Handler]:
    """Relay SIGINT/SIGTERM to the child; return the handlers to restore afterwards."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # signal handlers can only be set from the main thread

    def forward(signum: int, frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    return {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
