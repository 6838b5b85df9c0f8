"""The daemon's HTTP application: /metrics, /healthz, /readyz and a landing page.

The scrape path reads the latest snapshot and never calls NVML. /metrics is written by
`exporter.server.exposition` in the format a scrape asks for (OpenMetrics or the text format,
gzip when asked, `name[]` to filter). A snapshot does not change once published, so its
encoded answer is kept per format until the next snapshot replaces it; see `MetricsEndpoint`.
"""

from __future__ import annotations

import gzip
import html
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from exporter import __version__
from exporter.server.exposition import Exposition, ProcessMetrics, gzip_accepted, negotiate
from exporter.snapshot import Snapshot

if TYPE_CHECKING:
    from exporter.server.dcgm import DcgmFamily

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


# What /metrics writes before the first cycle: one empty snapshot, so that its layout (and the
# writer's formats kept for it) is made once, not on every scrape.
_NO_SNAPSHOT = Snapshot((), False, 0.0)


class _Encoded:
    """One format's answer for one snapshot, or the encoding of it under way."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.body: bytes | None = None
        self.done = threading.Event()


class MetricsEndpoint:
    """/metrics: each snapshot is encoded once per format, not once per scrape.

    Encoding ~1,700 series costs milliseconds of Python, while a snapshot only changes once
    per collection interval. Later scrapes in a format (HA Prometheus pairs, dashboards,
    concurrent scrapers) get the same bytes. While one scrape encodes a new snapshot, the
    scrapes that come meanwhile get the previous snapshot's answer, one interval older, rather
    than all waiting for that encoding; with no previous answer they wait for it. The
    process's own `process_*` metrics are encoded with the snapshot, so they are as fresh as
    the snapshot: within one collection interval. `name[]` filtered answers are not kept.
    """

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        dcgm: Callable[[Snapshot], list[DcgmFamily]] | None = None,
    ) -> None:
        self._latest = latest
        self._writer = Exposition(ProcessMetrics(), dcgm)
        self._lock = threading.Lock()
        # (format, gzip) -> the newest answer done, and the encoding under way if any.
        self._done: dict[tuple[str, bool], _Encoded] = {}
        self._encoding: dict[tuple[str, bool], _Encoded] = {}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Answer a scrape from the cache when it can."""
        method = environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD"):
            start_response(
                "405 Method Not Allowed",
                [("Content-Type", "text/plain; charset=utf-8"), ("Allow", "GET, HEAD")],
            )
            return [f"method {method} not allowed: /metrics answers GET and HEAD\n".encode()]
        snapshot = self._latest()
        form, content_type = negotiate(environ.get("HTTP_ACCEPT", ""))
        compressed = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        headers = [("Content-Type", content_type)]
        if compressed:
            headers.append(("Content-Encoding", "gzip"))
        if snapshot is None:
            # Before the first cycle: the process's own metrics only.
            body = _compressed(self._writer.encode(_NO_SNAPSHOT, form), compressed)
        elif "name" in environ.get("QUERY_STRING", ""):
            names = parse_qs(environ["QUERY_STRING"]).get("name[]", [])
            body = _compressed(self._writer.encode(snapshot, form, names), compressed)
        else:
            body = self._answer(snapshot, (form, compressed))
        start_response("200 OK", headers)
        return [body]

    def _answer(self, snapshot: Snapshot, key: tuple[str, bool]) -> bytes:
        with self._lock:
            done = self._done.get(key)
            if done is not None and done.snapshot is snapshot:
                return done.body  # type: ignore[return-value]
            under_way = self._encoding.get(key)
            if under_way is not None and under_way.snapshot is snapshot:
                if done is not None:
                    return done.body  # type: ignore[return-value]
                mine = None
            else:
                mine = under_way = self._encoding[key] = _Encoded(snapshot)
        if mine is None:
            under_way.done.wait()
            # None: that encoding raised; this scrape tries it again itself.
            return under_way.body or self._answer(snapshot, key)
        try:
            mine.body = _compressed(self._writer.encode(snapshot, key[0]), key[1])
        finally:
            with self._lock:
                if self._encoding.get(key) is mine:
                    del self._encoding[key]
                # A scrape that read the latest snapshot just before a newer one came may
                # finish after that one's encoding: the newer answer stays.
                if mine.body is not None and (key not in self._done or self._latest() is snapshot):
                    self._done[key] = mine
            mine.done.set()
        return mine.body


def _compressed(body: bytes, compressed: bool) -> bytes:
    # Level 1, not gzip's 9: 0.4 ms instead of 3.7 ms for 8 GPUs' answer,
    # 20% larger (12.5 KB instead of 10.4 KB); see bench/RESULTS.md.
    return gzip.compress(body, compresslevel=1) if compressed else body


class Application:
    """The WSGI application routing gpuload's endpoints."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        telemetry_path: str,
        dcgm: Callable[[Snapshot], list[DcgmFamily]] | None = None,
    ) -> None:
        """``dcgm``: dcgm-exporter's fields, also served on /metrics (`exporter.server.dcgm`)."""
        self._latest = latest
        self._telemetry_path = telemetry_path
        self.metrics = MetricsEndpoint(latest, dcgm)
        # The live status page (`/` and /api/v1/status); the plain landing page without one.
        self.status: WsgiApp | None = None

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
