"""The daemon's HTTP application: /metrics, /healthz, /readyz and a landing page.

The scrape path reads the latest snapshot and never calls NVML. /metrics is
prometheus_client's exposition on a dedicated registry: its content negotiation
(OpenMetrics when asked), gzip when asked and `name[]` filtering; in the two usual formats
the snapshot is written by `exporter.server.exposition`, byte for byte the same, for less
CPU. A snapshot does not change once published, so its encoded answer is kept per format
(content type and gzip) until the next snapshot replaces it; see `MetricsEndpoint`. Those
answers are handed to the HTTP front process, which serves them (`exporter.server.front`).
"""

from __future__ import annotations

import gzip
import html
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.collection import Snapshot
from exporter.server.exposition import Exposition, format_of

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class SnapshotCollector(Collector):
    """Serves the families of the latest snapshot to a prometheus_client registry."""

    def __init__(self, latest: Callable[[], Snapshot | None]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        """Yield the latest snapshot's families; nothing before the first cycle."""
        snapshot = self._latest()
        if snapshot is None:
            return
        yield from snapshot.each_family()


def build_registry(
    latest: Callable[[], Snapshot | None],
    *,
    front_pid: Callable[[], int] | None = None,
) -> CollectorRegistry:
    """A dedicated registry: the snapshot plus the process's own metrics (and its front's)."""
    # Without describe(), a collector is left out of `name[]` filtered answers unless the
    # registry is told to keep collectors that name nothing.
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(SnapshotCollector(latest))
    ProcessCollector(registry=registry)
    if front_pid is not None:
        # gpuload_http_process_*: the HTTP front process's CPU, memory and file descriptors.
        ProcessCollector(namespace="gpuload_http", pid=front_pid, registry=registry)
    PlatformCollector(registry=registry)
    return registry


@dataclass
class _Demand:
    """How one format (content type, gzip) of /metrics has been asked for."""

    encoder: Callable[[CollectorRegistry], bytes]
    generation: int  # the cached snapshot's generation when it was last asked for
    last: float  # monotonic time of the first request for that snapshot
    gap: float | None = None  # seconds between the last two such requests

    def asked(self, generation: int, now: float) -> None:
        """Note a request; the first request per snapshot measures the scrape interval."""
        if generation == self.generation:
            return
        self.gap, self.last, self.generation = now - self.last, now, generation

    def due(self, now: float, cycle: float) -> bool:
        """Whether the next request is expected before the next snapshot replaces this one."""
        elapsed = now - self.last
        if self.gap is None:
            # Asked for once (a person's curl, a probe): its next request may never come, so
            # nothing is encoded for it until a second one shows an interval.
            return False
        # The snapshot a scrape gets is published less than a cycle before it, and
        # Prometheus scrapes on a fixed schedule: from 1.5 cycles before the expected scrape
        # (half a cycle of slack for jitter) until two scrapes were missed (it has gone).
        return self.gap - 1.5 * cycle <= elapsed <= 2 * self.gap + cycle


class MetricsEndpoint:
    """/metrics: each snapshot is encoded once per format, not once per scrape.

    Encoding ~1,700 series costs milliseconds of Python (OpenMetrics more, gzip more again),
    while a snapshot only changes once per collection interval. Later scrapes in a format
    (HA Prometheus pairs, dashboards, concurrent scrapers) get the same bytes, and
    concurrent first scrapes wait for one encoding instead of each doing it. The process's
    own `process_*` metrics are encoded with the snapshot, so they are as fresh as the
    snapshot: within one collection interval. `name[]` filtering and anything but GET go to
    prometheus_client's app uncached.

    The first scrape after a new snapshot would pay for the encoding, and that is every
    scrape of a Prometheus scraping less often than it collects. `prime` lets the
    collection thread encode a new snapshot instead, in the formats that are expected to
    be asked for before the next snapshot: those asked for before, from shortly before
    their next expected scrape (the interval between past scrapes). Priming every format
    every cycle would encode 15 times per scrape at 1 s collection and 15 s scrapes; see
    bench/OPTIMIZATIONS.md.
    """

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        clock: Callable[[], float] = time.monotonic,
        front_pid: Callable[[], int] | None = None,
    ) -> None:
        self._latest = latest
        self._clock = clock
        self._uncached = make_wsgi_app(build_registry(latest, front_pid=front_pid))
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._generation = 0
        # Encodes exactly the snapshot being cached, even if a newer one is published meanwhile.
        self._registry = build_registry(lambda: self._snapshot, front_pid=front_pid)
        # The newest snapshot `prime` has finished with: scrapes serve it, never waiting for the
        # encoding of a newer one (tens of ms at 16 GPUs). None until the first prime.
        self._handed: Snapshot | None = None
        self._priming: Snapshot | None = None
        self._priming_registry = build_registry(lambda: self._priming, front_pid=front_pid)
        # Writes snapshots in the two usual formats; the process's own metrics after them.
        self._writer = Exposition(build_registry(lambda: None, front_pid=front_pid))
        # (content type, gzip) -> the encoded answer for self._snapshot.
        self._answers: dict[tuple[str, bool], bytes] = {}
        self._demand: dict[tuple[str, bool], _Demand] = {}
        self._primed_at: float | None = None
        # Called with (generation, answers) whenever answers are encoded: the HTTP front
        # process serves them from then on.
        self.publish: Callable[[int, dict[tuple[str, bool], bytes]], None] | None = None

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Answer a scrape from the cache when it can."""
        query = environ.get("QUERY_STRING", "")
        snapshot = self._handed or self._latest()
        method = environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD") or "name" in query or snapshot is None:
            return self._uncached(environ, start_response)
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        compressed = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        key = (content_type, compressed)
        with self._lock:
            body, encoded = self._answer(snapshot, key, encoder)
            generation = self._generation
            demand = self._demand.get(key)
            # A HEAD (a health check, curl -I) is no scrape: no format is primed for it.
            if method == "GET":
                if demand is None:
                    self._demand[key] = _Demand(encoder, generation, self._clock())
                else:
                    demand.asked(generation, self._clock())
        if encoded and self.publish is not None:
            self.publish(generation, {key: body})
        headers = [("Content-Type", content_type)]
        if compressed:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    def prime(self, snapshot: Snapshot) -> list[tuple[str, bool]]:
        """Encode `snapshot` now in the formats due to be asked for; returns those formats."""
        now = self._clock()
        # The collection interval, as this is called once per cycle.
        cycle = 0.0 if self._primed_at is None else now - self._primed_at
        self._primed_at = now
        with self._lock:
            due = [(key, d.encoder) for key, d in self._demand.items() if d.due(now, cycle)]
        # Encoded outside the lock: meanwhile scrapes get the previous snapshot's answers.
        self._priming = snapshot
        answers = {}
        try:
            for key, encoder in due:
                answers[key] = _encoded(
                    self._priming_registry, key, encoder, snapshot, self._writer
                )
        finally:
            # Handed over even if an encoding failed: a scrape then encodes it, and says why.
            self._priming = None
            with self._lock:
                self._cache(snapshot)
                self._answers.update(answers)
                self._handed = snapshot
                generation, current = self._generation, dict(self._answers)
            if self.publish is not None:
                self.publish(generation, current)
        return [key for key, _ in due]

    def asked(self, key: tuple[str, bool], generation: int, when: float) -> None:
        """Note a request answered elsewhere (the HTTP front) from generation's answer."""
        with self._lock:
            demand = self._demand.get(key)
            if demand is not None:
                demand.asked(generation, when)

    def _answer(
        self,
        snapshot: Snapshot,
        key: tuple[str, bool],
        encoder: Callable[[CollectorRegistry], bytes],
    ) -> tuple[bytes, bool]:
        """The cached answer for `snapshot` in format `key` and whether it was encoded now."""
        self._cache(snapshot)
        body = self._answers.get(key)
        if body is not None:
            return body, False
        body = self._answers[key] = _encoded(self._registry, key, encoder, snapshot, self._writer)
        return body, True

    def _cache(self, snapshot: Snapshot) -> None:
        """Make `snapshot` the cached one: a new generation, no answers yet (lock held)."""
        if self._snapshot is not snapshot:
            self._snapshot, self._answers = snapshot, {}
            self._generation += 1


def _encoded(
    registry: CollectorRegistry,
    key: tuple[str, bool],
    encoder: Callable[[CollectorRegistry], bytes],
    snapshot: Snapshot | None = None,
    writer: Exposition | None = None,
) -> bytes:
    form = format_of(encoder)
    if snapshot is not None and writer is not None and form is not None:
        body = writer.encode(snapshot, form)  # the same bytes, a fraction of the CPU
    else:
        body = encoder(registry)
    if key[1]:
        # Level 1, not gzip's 9: 0.4 ms instead of 3.7 ms for 8 GPUs' answer,
        # 20% larger (12.5 KB instead of 10.4 KB); see bench/RESULTS.md.
        body = gzip.compress(body, compresslevel=1)
    return body


class Application:
    """The WSGI application routing gpuload's endpoints."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        telemetry_path: str,
        front_pid: Callable[[], int] | None = None,
    ) -> None:
        self._latest = latest
        self._telemetry_path = telemetry_path
        self.metrics = MetricsEndpoint(latest, front_pid=front_pid)
        # The live status page (`/` and /api/v1/status); the plain landing page without one.
        self.status: WsgiApp | None = None

    def prime(self, snapshot: Snapshot) -> None:
        """Encode a new snapshot for the scrapes expected before the next (see MetricsEndpoint)."""
        self.metrics.prime(snapshot)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Dispatch a request by path."""
        path = environ.get("PATH_INFO", "/")
        if path == self._telemetry_path:
            return self.metrics(environ, start_response)
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            if self._latest() is None:
                return _text(start_response, "503 Service Unavailable", "collecting\n")
            return _text(start_response, "200 OK", "ready\n")
        if self.status is not None and path in ("/", "/api/v1/status"):
            return self.status(environ, start_response)
        if path == "/":
            page = landing_page(self._latest(), self._telemetry_path)
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [page.encode()]
        return _text(start_response, "404 Not Found", "not found\n")


def _text(start_response: StartResponse, status: str, body: str) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [body.encode()]


def landing_page(snapshot: Snapshot | None, telemetry_path: str) -> str:
    """A small HTML page listing the GPUs and linking the endpoints."""
    if snapshot is None:
        rows = "<tr><td colspan=4>first collection pending</td></tr>"
        nvml = "starting"
    else:
        nvml = "up" if snapshot.nvml_up else "down (see the log)"
        rows = (
            "".join(
                f"<tr><td>{gpu.index}</td><td>{html.escape(gpu.name)}</td>"
                f"<td><code>{html.escape(gpu.uuid)}</code></td>"
                f"<td>{'stale' if gpu.stale else 'up' if gpu.up else 'lost'}</td></tr>"
                for gpu in snapshot.gpus
            )
            or "<tr><td colspan=4>no GPUs</td></tr>"
        )
    path = html.escape(telemetry_path)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gpuload</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:left}}</style>
</head><body>
<h1>gpuload {html.escape(__version__)}</h1>
<p>NVML: {nvml}</p>
<table><tr><th>GPU</th><th>Name</th><th>UUID</th><th>State</th></tr>{rows}</table>
<p><a href="{path}">Metrics</a> · <a href="/healthz">Health</a> ·
<a href="/readyz">Readiness</a></p>
</body></html>
"""
