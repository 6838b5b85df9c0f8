"""Lets the benchmark read the simulated NVML's call counter out of a daemon it started.

``gpuload sim exec`` puts its own ``sitecustomize`` first on the child's path; that one installs
the simulator and then runs the next ``sitecustomize`` on the path, which is this one when the
benchmark puts ``bench/site`` on ``PYTHONPATH``. On SIGUSR1 it writes the simulator's ``calls``
counter (C function name -> calls so far) and ``cpu_seconds`` (its own CPU time so far) as JSON
to the file named by ``BENCH_NVML_CALLS_FILE``.
The handler runs only when the signal arrives, so it costs the daemon nothing in between.

With ``BENCH_SERVING`` set (by ``python -m bench.serving``) it also switches one serving
mechanism off, to measure what that mechanism buys.
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


def _serving_variant(variant: str) -> None:
    """A serving mechanism switched off, for `python -m bench.serving` (BENCH_SERVING)."""
    if variant == "no-front":
        # The daemon answers every request itself, as before the front existed.
        from exporter.server import daemon
        from exporter.server.wsgi import Server

        class InProcess:
            pid = 0

            def __init__(self, address: str, app: object, **_: object) -> None:
                self._server = Server(address, app)  # type: ignore[arg-type]

            @property
            def url(self) -> str:
                return self._server.url

            def start(self) -> None:
                self._server.start()

            def publish(self, generation: int, answers: object) -> None:
                pass

            def stop(self) -> None:
                self._server.stop()

        daemon.FrontProcess = InProcess  # type: ignore[assignment,misc]
    elif variant == "no-inline":
        # The front hands every connection to a thread; no TCP_DEFER_ACCEPT.
        from exporter.server import front

        front._BOOTSTRAP = (
            "import sys, socket; sys.path.insert(0, {root!r}); "
            "import exporter.server.wsgi as w; w.Server.answer_inline = lambda *a: None; "
            "del socket.TCP_DEFER_ACCEPT; "
            "from exporter.server.front import main; sys.exit(main(sys.argv[1:]))"
        )
    elif variant == "no-spare-threads":
        # A new thread for every connection.
        from exporter.server import wsgi

        wsgi._ThreadingServer.max_spare_threads = 0


if os.environ.get("BENCH_SERVING"):
    _serving_variant(os.environ["BENCH_SERVING"])
