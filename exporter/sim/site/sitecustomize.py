"""Installs the simulated NVML when a Python process started by ``gpuload sim exec`` starts.

Python imports the first ``sitecustomize`` on ``sys.path`` at start-up; this one is put first by
``exec_command``. It installs the simulator from the GPULOAD_SIM_* variables, then imports the
``sitecustomize`` that would otherwise have run (a virtualenv's or the distribution's), so that
it is chained rather than shadowed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    try:
        import pynvml  # noqa: F401 - only processes that can use NVML need the simulator
    except ImportError:
        return
    dependencies = os.environ.get("GPULOAD_SIM_DEPENDENCIES")
    if dependencies and dependencies not in sys.path:
        sys.path.append(dependencies)
    try:
        from exporter.sim import install_from_env

        install_from_env(os.environ)
    except Exception as exc:  # noqa: BLE001 - never break the interpreter's start-up
        print(f"gpuload sim: simulated NVML not installed: {exc}", file=sys.stderr)


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
