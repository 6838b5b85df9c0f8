"""The benchmark's HTTP client (bench/load.py) against a real server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import load


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = f"{self.path} {self.headers.get('Accept')} {self.headers.get('Connection')}"
        if self.path == "/short":
            # Says 100 bytes, sends 5, closes: a cut answer.
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"short")
            self.close_connection = True
            return
        status = 503 if self.path == "/down" else 200
        self._answer(status, body.encode())

    def do_POST(self) -> None:
        received = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(200, b"got " + received)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_scrape_sends_the_headers_and_reads_the_whole_body(port: int) -> None:
    started = time.perf_counter()
    seconds, body = load.scrape(port, {"Accept": "text/plain"}, "/metrics")
    elapsed = time.perf_counter() - started
    assert body == b"/metrics text/plain close"
    # The latency reported is the request's, in seconds: inside the call's own span, however
    # long that took (not milliseconds, nor a time since some other start).
    assert 0 < seconds <= elapsed


def test_a_post_carries_its_body(port: int) -> None:
    _seconds, body = load.request(port, "POST", "/alerts", {}, b'{"alerts": []}')
    assert body == b'got {"alerts": []}'


@pytest.mark.parametrize(
    ("path", "error"), [("/down", "answered 'HTTP/1.1 503"), ("/short", "answered 5 of 100 bytes")]
)
def test_an_answer_that_is_not_a_whole_200_is_an_error(port: int, path: str, error: str) -> None:
    with pytest.raises(RuntimeError, match=error):
        load.scrape(port, {}, path)
