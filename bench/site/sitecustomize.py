"""Lets the benchmark read the simulated NVML's call counter out of a daemon it started.

``gpuload sim exec`` puts its own ``sitecustomize`` first on the child's path; that one installs
the simulator and then runs the next ``sitecustomize`` on the path, which is this one when the
benchmark puts ``bench/site`` on ``PYTHONPATH``. On SIGUSR1 it writes the simulator's ``calls``
counter (C function name -> calls so far) and ``cpu_seconds`` (its own CPU time so far) as JSON
to the file named by ``BENCH_NVML_CALLS_FILE``.
The handler runs only when the signal arrives, so it costs the daemon nothing in between.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from types import FrameType


def _dump(_signum: int, _frame: FrameType | None) -> None:
    target = os.environ.get("BENCH_NVML_CALLS_FILE")
    library = getattr(sys.modules.get("pynvml"), "nvmlLib", None)
    if not target or not hasattr(library, "calls"):
        return
    temporary = f"{target}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump({"calls": dict(library.calls), "cpu_seconds": library.cpu_seconds}, out)
    os.replace(temporary, target)


if os.environ.get("BENCH_NVML_CALLS_FILE"):
    signal.signal(signal.SIGUSR1, _dump)
