"""`gpuload serve`: collect in the background, serve the latest snapshot over HTTP."""

from __future__ import annotations

import gc
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.alerting import states, thresholds
from exporter.alerting.local import LocalAlerting, instance_label
from exporter.collection import Collection
from exporter.collectors.processes import resolve_host_pid_namespace
from exporter.config import Config
from exporter.server.dcgm import DcgmView, keeps_sources
from exporter.server.http import Application
from exporter.server.status import StatusPage
from exporter.snapshot import Snapshot
from exporter.web.server import Server
from exporter.web.signals import stop_on_signals

if TYPE_CHECKING:
    from exporter.sim import SimulatedNvml
    from exporter.sim.kubelet import SimulatedKubelet

log = logging.getLogger(__name__)

IDLE_POLL_SECONDS = 600.0


def _install_simulator(config: Config) -> SimulatedNvml:
    """Install the simulated NVML; its ``elapsed`` is the node's clock (scenario seconds)."""
    # Imported here: a real deployment never loads the simulator.
    from exporter import sim

    settings = config.simulate
    assert settings.scenario is not None
    library = sim.install(
        settings.scenario,
        epoch=settings.epoch,
        seed=settings.seed,
        pinned_time=settings.time,
        caller=settings.caller,
    )
    log.info(
        "using the simulated NVML, scenario %s, caller %s (not a real GPU)",
        settings.scenario,
        library.scenario.caller,
    )
    return library


def _start_kubelet(library: SimulatedNvml) -> SimulatedKubelet | None:
    """The simulated kubelet of a scenario with a ``kubernetes`` section, started; else None."""
    if library.scenario.kubernetes is None:
        return None
    # Imported here: grpc, and only for a scenario with pods.
    from exporter.sim.kubelet import SimulatedKubelet

    kubelet = SimulatedKubelet(library).start()
    log.info(
        "simulated kubelet of node %s: pod resources at %s, pods at %s",
        kubelet.node,
        kubelet.pod_resources_server.socket_path,
        kubelet.pod_list_server.url,
    )
    return kubelet


def _collector_options(
    config: Config, simulated_caller: str | None, kubelet: SimulatedKubelet | None = None
) -> Mapping[str, Mapping[str, Any]]:
    """The collectors' options, with ``processes.host_pid_namespace: auto`` decided.

    The kernel says whether gpuload runs in the host's PID namespace; on a simulated node the
    scenario's caller says it, as the simulated driver hides the processes from the same caller.
    A simulated kubelet replaces the ``kubernetes`` collector's socket, pod list and /proc, and
    puts the node on Kubernetes.
    """
    options = {name: dict(values) for name, values in config.collector_options.items()}
    if kubelet is not None:
        options.setdefault("kubernetes", {}).update(kubelet.collector_options)
    processes = options.get("processes")
    if processes is not None and processes.get("host_pid_namespace") == "auto":
        if simulated_caller is None:
            decided = resolve_host_pid_namespace("auto")
        else:
            from exporter.sim import privileges

            decided = str(privileges.sees_processes(simulated_caller)).lower()
        processes["host_pid_namespace"] = decided
    return options


def _local_alerting(config: Config, external_url: str) -> LocalAlerting | None:
    port = int(external_url.rstrip("/").rsplit(":", 1)[1])
    settings = config.alerting
    path = settings.thresholds_file or thresholds.DEFAULT_PATH
    if settings.delivery is None and not Path(path).exists():
        # An installed package without the repository's alert_rules/: the exporter still serves.
        log.warning(
            "no thresholds file at %s: local alerts and the status page's verdicts are off "
            "(set alerting.thresholds_file to a copy of alert_rules/thresholds.yaml)",
            path,
        )
        return None
    notifier = None
    if settings.delivery is not None:
        # Imported here: delivery brings the relay's targets, jinja2, requests and sqlite3.
        import sqlite3

        from exporter.alerting.notify import Notifier

        try:
            notifier = Notifier(settings.delivery, external_url)
        except sqlite3.Error as error:
            raise OSError(f"alert queue {settings.delivery.queue.path}: {error}") from error
    instance = settings.instance or instance_label(config.web.listen_address, port)
    return LocalAlerting(
        thresholds.load(settings.thresholds_file),
        instance=instance,
        job=settings.job,
        notifier=notifier,
        # The status page's verdicts read the same history.
        also_keep=states.FAMILIES,
        evaluation_interval=settings.evaluation_interval,
        repeat_interval=settings.repeat_interval,
        history_path=config.history.path,
        history_prometheus=_history_prometheus(config, instance),
    )


def _history_prometheus(config: Config, instance: str) -> tuple[str, str] | None:
    """(URL, instance label) of the Prometheus the history is taken from at start, if any."""
    if not config.history.prometheus:
        return None
    label = config.history.instance or os.environ.get("NODE_NAME") or instance
    return config.history.prometheus, label


def _dcgm_view(config: Config, hostname: str | None) -> DcgmView | None:
    """dcgm-exporter's fields when `metrics.dcgm_compat` is on; the host label as it names it."""
    settings = config.metrics
    if not settings.dcgm_compat:
        return None
    return DcgmView(
        hostname or socket.gethostname(),
        host_label=settings.dcgm_hostname_label,
        gr_engine_fallback=settings.dcgm_gr_engine_from_utilization,
    )


def _run_cycle(collection: Collection, alerting: LocalAlerting | None) -> Snapshot:
    snapshot = collection.run_cycle()
    if alerting is None:
        return snapshot
    try:
        alerting.observe(snapshot)
    except Exception:  # local alerting must never stop collection
        log.exception("local alert evaluation failed")
    return snapshot


def _collect_until(stop: threading.Event, interval: float, cycle: Callable[[], object]) -> None:
    """Run `cycle` every `interval` seconds, at once first, until `stop` is set.

    Cycles never overlap: one that ran past the next due time is followed at the first due time
    still ahead (the ones it missed are skipped, not run back to back to catch up).
    """
    due = time.monotonic()
    while not stop.is_set():
        try:
            cycle()
        except Exception:  # one failed cycle must not end collection
            log.exception("collection cycle failed")
        now = time.monotonic()
        due += interval
        if due <= now:
            due += math.ceil((now - due) / interval + 1e-9) * interval
        stop.wait(due - now)


def serve(config: Config, *, stop: threading.Event | None = None) -> int:
    """Run the exporter until SIGTERM/SIGINT (or `stop` is set); returns the exit code."""
    # Retries and slow reads are scheduled on the node's clock: the simulated node's when
    # simulating, so that a pinned scenario clock (--sim.time) gives the same output every run.
    clock: Callable[[], float] = time.monotonic
    simulated_caller = None
    kubelet = None
    if config.simulate.scenario:
        library = _install_simulator(config)
        clock, simulated_caller = library.elapsed, library.scenario.caller
        kubelet = _start_kubelet(library)
    try:
        return _serve(config, clock, simulated_caller, kubelet, stop)
    finally:
        if kubelet is not None:
            kubelet.stop()


def _serve(
    config: Config,
    clock: Callable[[], float],
    simulated_caller: str | None,
    kubelet: SimulatedKubelet | None,
    stop: threading.Event | None,
) -> int:
    # On Kubernetes the pod's host name is the pod's: the chart passes the node's name.
    hostname = os.environ.get("NODE_NAME") or None
    dcgm_view = _dcgm_view(config, hostname)
    collection = Collection(
        config.collectors,
        timeout=config.effective_collect_timeout,
        options=_collector_options(config, simulated_caller, kubelet),
        slow_interval=config.collect_slow_interval,
        clock=clock,
        profile=config.metrics_profile,
        keep_also=keeps_sources() if dcgm_view is not None else None,
    )
    app = Application(lambda: collection.snapshot, config.web.telemetry_path, dcgm_view)
    try:
        # The serving thread wakes only to see whether it should stop; the daemon exits instead
        # (stop(wait=False)), so it never needs to: 0.5-1 ms of CPU a second saved.
        server = Server(
            config.web.listen_address, app, config.web.security, poll_interval=IDLE_POLL_SECONDS
        )
    except OSError as error:
        # One plain line, whatever the log format: nothing runs yet to read a log.
        print(
            f"gpuload: cannot listen on {config.web.listen_address}: "
            f"{error.strerror or error} (another process on that port? "
            "--web.listen-address chooses another)",
            file=sys.stderr,
        )
        return 1
    try:
        alerting = _local_alerting(config, server.url)
    except (ValueError, OSError) as error:  # bad thresholds, unusable queue
        log.error("local alerting: %s", error)
        server.stop(wait=False)
        return 1
    app.status = StatusPage(
        lambda: collection.snapshot,
        config.web.telemetry_path,
        alerting,
        config.collect_interval,
        hostname=hostname,
        scenario=config.simulate.scenario,
    )
    stop = stop or threading.Event()
    stop_on_signals(stop)

    enabled = sorted(name for name, on in config.collectors.items() if on)
    if alerting is not None:
        alerting.start()
    # Everything imported and built so far lives as long as the process: out of the cyclic
    # collector's way, its full collections no longer walk it (bench/OPTIMIZATIONS.md, 37).
    gc.freeze()
    server.start()
    host = config.web.listen_address.rpartition(":")[0].strip("[]")
    log.info(
        "listening on %s%s (metrics at %s), collecting every %gs with %s",
        server.url,
        " on every interface" if host in ("", "0.0.0.0", "::") else "",
        config.web.telemetry_path,
        config.collect_interval,
        ", ".join(enabled),
    )
    if config.web.security is not None:
        log.info("web config %s: %s", config.web.config_file, config.web.security.describe())
    if config.alerting.delivery is not None:
        log.info(
            "local alerts to %s, queued in %s",
            ", ".join(config.alerting.delivery.targets),
            config.alerting.delivery.queue.path,
        )
    # The main thread collects: Python runs a signal's handler there, between two waits.
    _collect_until(stop, config.collect_interval, lambda: _run_cycle(collection, alerting))
    server.stop(wait=False)
    if alerting is not None:
        alerting.stop()
    collection.close()
    log.info("stopped")
    return 0
