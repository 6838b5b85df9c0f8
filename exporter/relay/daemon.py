"""`gpuload relay`: the HTTP endpoint, the queue and a delivery worker per target, together."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

from exporter.relay.config import RelayConfig
from exporter.relay.engine import Engine
from exporter.relay.server import RelayApplication
from exporter.web.server import Server
from exporter.web.signals import stop_on_signals

log = logging.getLogger(__name__)

PRUNE_SECONDS = 60.0


class Relay:
    """A running relay: start it, read its URL, stop it."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.engine = Engine(config, quiet=self._quiet)
        self.queue = self.engine.queue
        self.app = RelayApplication(
            queue=self.queue,
            route=config.route,
            metrics=self.engine.metrics,
            auth=config.web.auth,
            path=config.web.path,
            max_body_bytes=config.web.max_body_bytes,
            max_age=config.queue.max_age,
            wake=self.engine.wake,
        )
        # The application refuses a notification over the limit first, with advice and a metric.
        self.server = Server(
            config.web.listen_address,
            self.app,
            config.web.security,
            max_body=config.web.max_body_bytes,
        )
        self._stopped = threading.Event()
        self._pruner = threading.Thread(target=self._prune, name="prune", daemon=True)

    @property
    def url(self) -> str:
        """The base URL the relay listens at."""
        return self.server.url

    def _quiet(self, timeout: float) -> bool:
        """Wait until no notification is being committed, `timeout` seconds at most."""
        return self.app.drain(timeout)

    def start(self) -> None:
        """Serve and deliver in the background."""
        self.engine.start()
        self._pruner.start()
        self.server.start()

    def stop(self) -> None:
        """Stop accepting, let commits in progress finish, stop the workers: seconds at most."""
        self.app.stopping = True
        self.server.stop()
        if not self.app.drain(timeout=2.0):
            log.warning("a commit was still in progress at shutdown; Alertmanager will resend it")
        self._stopped.set()
        self.engine.stop()

    def _prune(self) -> None:
        while not self._stopped.wait(PRUNE_SECONDS):
            try:
                self.queue.prune(time.time(), self.config.queue.dead_letter_retention)
            except sqlite3.Error as error:
                log.warning("cannot prune the queue: %s", error)


def _why(path: str, error: sqlite3.Error) -> str:
    """Why the queue file could not be opened, in the words of what to change."""
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        return f"its folder {folder} does not exist (set queue.path)"
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return f"its folder {folder} is on a read-only file system: give a writable queue.path"
    if not os.access(folder, os.W_OK):
        return f"this user cannot write in its folder {folder}: give a writable queue.path"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "this user cannot write the file: give it write permission, or another queue.path"
    return f"{error} (set queue.path)"


def serve(config: RelayConfig, *, stop: threading.Event | None = None) -> int:
    """Run the relay until SIGTERM/SIGINT (or `stop` is set); returns the exit code."""
    try:
        relay = Relay(config)
    except sqlite3.Error as error:
        log.error("cannot open the queue %s: %s", config.queue.path, _why(config.queue.path, error))
        return 1
    except OSError as error:
        log.error("cannot listen on %s: %s", config.web.listen_address, error.strerror or error)
        return 1
    stop = stop or threading.Event()
    stop_on_signals(stop)
    relay.start()
    auth = (
        "bearer token"
        if config.web.auth.bearer_token
        else ("basic auth" if config.web.auth.password else "no authentication")
    )
    if config.web.security is not None:
        auth = f"{auth}; web config {config.web.config_file}: {config.web.security.describe()}"
    log.info(
        "listening on %s (POST %s, %s), queue %s, targets: %s",
        relay.url,
        config.web.path,
        auth,
        config.queue.path,
        ", ".join(f"{name} ({t.kind})" for name, t in config.targets.items()) or "none",
    )
    # Python runs a signal's handler on the main thread, and only once that thread wakes: a
    # SIGTERM the kernel hands to another thread would otherwise wait for ever.
    while not stop.wait(1.0):
        pass
    relay.stop()
    log.info("stopped")
    return 0
