"""``python -m bench.serve_with SERVER PORT SCENARIO``: gpuload's /metrics behind one HTTP server.

One process (gunicorn: its master and one worker) collects a simulated node every second and
serves gpuload's WSGI application with SERVER on 127.0.0.1:PORT, until it is terminated:
- ``gpuload``: gpuload's own `exporter.web.server.Server`, a thread per connection;
- ``cheroot``: `cheroot.wsgi.Server`, 16 threads;
- ``waitress``: `waitress.serve`, 16 threads;
- ``gunicorn``: 1 ``gthread`` worker with 16 threads.
Run by `bench/servers.py` with the python of bench/.venv-servers, where the other servers are
installed; nothing of them goes into gpuload's own dependencies. ``--cycles-file`` names a file
that holds the number of collection cycles done so far, rewritten after each.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

SERVERS = ("gpuload", "cheroot", "waitress", "gunicorn")
THREADS = 16
INTERVAL = 1.0


def build(scenario: str, cycles_file: str | None) -> Any:
    """Install the simulated NVML, start collecting every second; the WSGI application."""
    # Imported here: gunicorn's master never builds the application, only its worker does.
    from exporter import config as settings
    from exporter import sim
    from exporter.collection import Collection
    from exporter.collectors import REGISTRY
    from exporter.server.http import Application
    from exporter.sim import privileges

    library = sim.install(scenario, epoch=None, seed=0)
    config = settings.load()  # the defaults of `gpuload serve`: its timeout, slow reads and profile
    # `host_pid_namespace: auto` as `gpuload serve --simulate` decides it: by the caller.
    visible = privileges.sees_processes(library.scenario.caller)
    collection = Collection(
        dict.fromkeys(REGISTRY, True),
        timeout=config.effective_collect_timeout,
        options={"processes": {"host_pid_namespace": str(visible).lower()}},
        slow_interval=config.collect_slow_interval,
        clock=library.elapsed,
        profile=config.metrics_profile,
    )
    app = Application(lambda: collection.snapshot, "/metrics")
    threading.Thread(
        target=_collect, args=(collection, cycles_file), name="collect", daemon=True
    ).start()
    # As `gpuload serve` does: what lives as long as the process is out of the cyclic GC's way.
    gc.freeze()
    return app


def _collect(collection: Any, cycles_file: str | None) -> None:
    """A cycle every INTERVAL (a late one delays the next, as the daemon's scheduler does)."""
    cycles, due = 0, time.monotonic()
    while True:
        collection.run_cycle()
        cycles += 1
        if cycles_file:
            partial = f"{cycles_file}.new"
            Path(partial).write_text(str(cycles))
            os.replace(partial, cycles_file)
        due = max(due + INTERVAL, time.monotonic())
        time.sleep(due - time.monotonic())


def serve(server: str, port: int, scenario: str, cycles_file: str | None) -> None:
    """Serve until terminated."""
    if server == "gunicorn":
        _gunicorn(port, scenario, cycles_file)
        return
    app = build(scenario, cycles_file)
    if server == "gpuload":
        from exporter.web.server import Server

        Server(f"127.0.0.1:{port}", app).start()
        threading.Event().wait()
    elif server == "cheroot":
        from cheroot import wsgi

        wsgi.Server(("127.0.0.1", port), app, numthreads=THREADS).safe_start()
    elif server == "waitress":
        import waitress

        waitress.serve(app, host="127.0.0.1", port=port, threads=THREADS)


def _gunicorn(port: int, scenario: str, cycles_file: str | None) -> None:
    from gunicorn.app.base import BaseApplication

    class Gunicorn(BaseApplication):
        """gunicorn's master here; the application is built in its worker (not preloaded)."""

        def load_config(self) -> None:
            settings = {
                "bind": f"127.0.0.1:{port}",
                "workers": 1,
                "worker_class": "gthread",
                "threads": THREADS,
                "loglevel": "warning",
                "graceful_timeout": 2,
            }
            for name, value in settings.items():
                self.cfg.set(name, value)

        def load(self) -> Any:
            return build(scenario, cycles_file)

    Gunicorn().run()


def main() -> int:
    """Parse the arguments and serve."""
    parser = argparse.ArgumentParser(prog="python -m bench.serve_with", description=__doc__)
    parser.add_argument("server", choices=SERVERS)
    parser.add_argument("port", type=int)
    parser.add_argument("scenario", help="a scenario file or a shipped scenario's name")
    parser.add_argument("--cycles-file", help="where to keep the count of collection cycles")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    serve(args.server, args.port, args.scenario, args.cycles_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
