"""The HTTP front process of `gpuload serve`: scrapes answered without waiting for the GIL.

The daemon collects on one Python thread per GPU, then publishes, encodes and evaluates:
for about a tenth of a second per cycle its GIL is busy, and a scrape answered inside it
waits behind every thread (12-15 ms p99 at 16 GPUs on 2 cores, bench/RESULTS.md). The front
is a small process of its own, without NVML or prometheus_client, that serves on the
daemon's listening socket with the web config's TLS and basic auth. It answers /metrics
from the encoded answers the daemon hands it after encoding them; every other request, and a
format it holds no answer for, it forwards to the daemon over a fresh socket pair whose other
end it passes over (SCM_RIGHTS): no port or path is opened for it, and the chart's root file
system is read-only.

The daemon owns the listening socket and both channels, both socket pairs:
- answers (stream, daemon -> front): a 4-byte length, a JSON header
  ``{"generation": n, "answers": [[content type, gzip, size], ...]}``, then the bodies.
  A newer generation replaces the answers held; the same one adds to them.
- requests (sequenced packets, front -> daemon): ``C`` and the client's address, with one
  connection's descriptor to serve; or ``A`` and JSON ``[content type, gzip, generation,
  monotonic time]``, the first request answered from an answer, which the daemon's
  `MetricsEndpoint` needs to know when to encode the next snapshot ahead of the scrape.

The front exits when the answers channel closes (the daemon stopped or died); the daemon
starts it again when it exits otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote
from wsgiref.util import is_hop_by_hop

from exporter.server.wsgi import (
    ANSWERED,
    ANSWERED_AND_CLOSED,
    NOT_ANSWERED,
    Server,
    StartResponse,
    WsgiApp,
    keeps_alive,
    refusal,
    response,
)

log = logging.getLogger(__name__)

# What a scrape gets while the front restarts: at once, not after its own timeout.
_RESTARTING = refusal("gpuload: the HTTP front is restarting")

# (content type, gzip): one encoded answer of /metrics.
Key = tuple[str, bool]

# A forwarded request the daemon has not answered in this time gets a 503.
FORWARD_TIMEOUT = 60.0
# Answers the front has not taken in this time mean it is stuck: it is started again.
SEND_TIMEOUT = 10.0
# The Accept / Accept-Encoding pairs remembered: scrapers send the same ones every time.
MAX_HEADER_PAIRS = 64
_LENGTH = struct.Struct("!I")


class Answers:
    """The newest generation's encoded answers, as the daemon hands them over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = -1
        self._bodies: dict[Key, bytes] = {}

    def get(self, key: Key) -> tuple[int, bytes] | None:
        """The generation and body held for `key`, if any."""
        with self._lock:
            body = self._bodies.get(key)
            return None if body is None else (self._generation, body)

    def update(self, generation: int, bodies: dict[Key, bytes]) -> None:
        """Take a generation's answers; older ones than those held are dropped."""
        with self._lock:
            if generation > self._generation:
                self._generation, self._bodies = generation, dict(bodies)
            elif generation == self._generation:
                self._bodies = {**self._bodies, **bodies}

    def follow(self, channel: socket.socket) -> None:
        """Read the daemon's messages until it closes the channel."""
        with channel.makefile("rb") as reader:
            while True:
                head = reader.read(_LENGTH.size)
                if len(head) < _LENGTH.size:
                    return
                header = json.loads(reader.read(_LENGTH.unpack(head)[0]))
                bodies = {}
                for content_type, compressed, size in header["answers"]:
                    body = reader.read(size)
                    if len(body) < size:
                        return
                    bodies[(content_type, bool(compressed))] = body
                self.update(header["generation"], bodies)


def encode_answers(generation: int, answers: dict[Key, bytes]) -> bytes:
    """One answers-channel message."""
    header = json.dumps(
        {
            "generation": generation,
            "answers": [[key[0], key[1], len(body)] for key, body in answers.items()],
        }
    ).encode()
    return b"".join([_LENGTH.pack(len(header)), header, *answers.values()])


class FrontApp:
    """The front's WSGI application: held answers for /metrics, the daemon for the rest."""

    def __init__(self, answers: Answers, daemon: socket.socket, telemetry_path: str) -> None:
        self._answers = answers
        self._daemon = daemon
        self._telemetry_path = telemetry_path
        # (Accept, Accept-Encoding) -> the answer the daemon chose for them: learnt from its
        # replies, so that the content negotiation stays prometheus_client's, in the daemon.
        self._keys: dict[tuple[str, str], Key] = {}
        self._reported: dict[Key, int] = {}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Answer from the held answers when one fits, else forward to the daemon."""
        cacheable = (
            environ.get("REQUEST_METHOD") == "GET"
            and environ.get("PATH_INFO") == self._telemetry_path
            # The daemon answers `name[]` filters uncached, as it would without a front.
            and "name" not in environ.get("QUERY_STRING", "")
        )
        negotiated = (environ.get("HTTP_ACCEPT", ""), environ.get("HTTP_ACCEPT_ENCODING", ""))
        held = self.held(*negotiated) if cacheable else None
        if held is not None:
            headers, body = held
            start_response("200 OK", headers)
            return [body]
        status, headers, body = self._forward(environ)
        if cacheable and status.startswith("200 ") and len(self._keys) < MAX_HEADER_PAIRS:
            named = {name.lower(): value for name, value in headers}
            content_type = named.get("content-type")
            if content_type:
                self._keys[negotiated] = (content_type, named.get("content-encoding") == "gzip")
        start_response(status, headers)
        return [body]

    def held(self, accept: str, accept_encoding: str) -> tuple[list[tuple[str, str]], bytes] | None:
        """The headers and body of the held /metrics answer for these request headers, if any.

        None for a format the daemon has not answered yet: the request is then forwarded.
        """
        key = self._keys.get((accept, accept_encoding))
        held = None if key is None else self._answers.get(key)
        if key is None or held is None:
            return None
        generation, body = held
        self._report(key, generation)
        headers = [("Content-Type", key[0])]
        if key[1]:
            headers.append(("Content-Encoding", "gzip"))
        return headers, body

    def _report(self, key: Key, generation: int) -> None:
        """Tell the daemon of the first request answered from each answer."""
        if self._reported.get(key) == generation:
            return
        self._reported[key] = generation
        message = json.dumps([key[0], key[1], generation, time.monotonic()])
        # A daemon gone is no error here: this process ends with the answers channel. Never
        # waits (this may run on the accepting thread): a note the daemon has no room for is
        # dropped, and that format is then encoded when a scrape asks for it, not primed.
        with contextlib.suppress(OSError):
            self._daemon.send(b"A" + message.encode(), socket.MSG_DONTWAIT)

    def _forward(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
        """Send the request to the daemon on a new socket pair; its answer, or a 503."""
        mine, theirs = socket.socketpair()
        try:
            with theirs:
                address = str(environ.get("REMOTE_ADDR", "")).encode()
                socket.send_fds(self._daemon, [b"C" + address], [theirs.fileno()])
            mine.settimeout(FORWARD_TIMEOUT)
            # The daemon may answer, and close, without reading a body: its answer still counts.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                mine.sendall(_request(environ))
            answer = _read_to_end(mine)
        except OSError as error:
            log.warning("the daemon did not answer %s: %s", environ.get("PATH_INFO"), error)
            return _unavailable()
        finally:
            mine.close()
        head, separator, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("iso-8859-1").split("\r\n")
        status = lines[0].partition(" ")[2]
        if not separator or not status:
            log.warning("the daemon's answer to %s was cut short", environ.get("PATH_INFO"))
            return _unavailable()
        headers = [_header(line) for line in lines[1:] if line]
        return status, [(name, value) for name, value in headers if not is_hop_by_hop(name)], body


def _read_to_end(connection: socket.socket) -> bytes:
    """Everything the daemon sends until it closes (it answers once, as HTTP/1.0)."""
    chunks = []
    # Closed with part of the request unread, the connection ends in a reset after the answer.
    with contextlib.suppress(ConnectionResetError):
        while chunk := connection.recv(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks)


def _unavailable() -> tuple[str, list[tuple[str, str]], bytes]:
    plain = [("Content-Type", "text/plain; charset=utf-8")]
    return "503 Service Unavailable", plain, b"the daemon did not answer\n"


def _header(line: str) -> tuple[str, str]:
    name, _, value = line.partition(":")
    return name.strip(), value.strip()


def _request(environ: dict[str, Any]) -> bytes:
    """The request as the daemon's HTTP server reads it."""
    # The server has unquoted the path (as ISO-8859-1); quote it again as it came.
    path = quote(str(environ.get("PATH_INFO", "/")).encode("iso-8859-1"), safe="/;=,@:!$&'()*+~")
    query = environ.get("QUERY_STRING", "")
    lines = [f"{environ['REQUEST_METHOD']} {path}{'?' if query else ''}{query} HTTP/1.0"]
    for name, value in environ.items():
        if name.startswith("HTTP_") and not is_hop_by_hop(name[5:].replace("_", "-")):
            lines.append(f"{name[5:].replace('_', '-').title()}: {value}")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    if environ.get("CONTENT_TYPE"):
        lines.append(f"Content-Type: {environ['CONTENT_TYPE']}")
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join([*lines, "", ""]).encode("iso-8859-1") + body


def answer_held(app: FrontApp, telemetry_path: str, connection: socket.socket) -> int:
    """Answer a new connection's first request on the accepting thread, if it is a scrape.

    Only a GET of exactly the telemetry path, already received whole, without a body, whose
    answer is held and small enough to go into the socket's buffer at once: anything else
    (not arrived yet, a query, a forward to the daemon, a large answer) is left to the
    connection's thread, as before. Returns a `wsgi` NOT_ANSWERED, ANSWERED or
    ANSWERED_AND_CLOSED.
    """
    try:
        peeked = connection.recv(_INLINE_HEAD_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing received yet (or a reset): the thread's read will tell
        return NOT_ANSWERED
    end = peeked.find(b"\r\n\r\n")
    if end < 0:
        return NOT_ANSWERED
    lines = peeked[:end].decode("iso-8859-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] != "GET" or parts[1] != telemetry_path:
        return NOT_ANSWERED
    if parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        return NOT_ANSWERED
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            return NOT_ANSWERED  # the thread answers 400
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]},{value}" if headers.get(name) else value
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        return NOT_ANSWERED
    held = app.held(headers.get("accept", ""), headers.get("accept-encoding", ""))
    if held is None or len(held[1]) > _INLINE_MAX_BODY:
        return NOT_ANSWERED
    keep_alive = keeps_alive(parts[2], headers.get("connection", ""))
    try:
        connection.recv(end + 4)  # the request, peeked above: the next read starts after it
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * _INLINE_MAX_BODY)
        answer = response("GET", "200 OK", held[0], held[1], keep_alive)
        sent = connection.send(answer, socket.MSG_DONTWAIT)
        if sent < len(answer):  # a buffer smaller than asked for: the rest, waiting
            connection.settimeout(FORWARD_TIMEOUT)
            connection.sendall(answer[sent:])
            connection.settimeout(None)
    except OSError:  # the client went away
        return ANSWERED_AND_CLOSED
    return ANSWERED if keep_alive else ANSWERED_AND_CLOSED


# A scrape answered on the accepting thread: its head is read in one peek, its answer (a gzip
# answer is 6-24 KB from 1 to 16 GPUs) must fit the socket's send buffer at once.
_INLINE_HEAD_BYTES = 8192
_INLINE_MAX_BODY = 64 * 1024
# The front's serving thread is never asked to stop (the process exits): it wakes this rarely.
_STOP_POLL_SECONDS = 600.0


def main(argv: list[str]) -> int:
    """The front process: serve until the daemon closes the answers channel."""
    settings = json.loads(argv[0])
    # The front lives as long as the daemon's channel: a signal to the whole process group
    # (^C in a terminal) stops the daemon, which then closes it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from exporter import logs

    logs.setup(settings["log_level"], settings["log_format"])
    security = None
    if settings["web_config"]:
        from exporter.server import webconfig

        try:
            security = webconfig.load(settings["web_config"])
        except (ValueError, OSError) as error:  # changed since the daemon read it
            log.error("web config %s: %s", settings["web_config"], error)
            return 2
    answers = Answers()
    channel = socket.socket(fileno=settings["answers"])
    daemon = socket.socket(fileno=settings["requests"])
    app = FrontApp(answers, daemon, settings["telemetry_path"])
    listener = socket.socket(fileno=settings["listener"])
    # The front stops only when it exits, so its serving thread need not wake to check:
    # five wakes a second cost ~0.5-1 ms of CPU a second on an idle node.
    server = Server(
        settings["address"],
        app,
        security,
        listener=listener,
        poll_interval=_STOP_POLL_SECONDS,
    )
    if security is None:
        # Behind TLS or basic auth every request goes through the connection's thread.
        server.answer_inline(partial(answer_held, app, settings["telemetry_path"]))
        if hasattr(socket, "TCP_DEFER_ACCEPT"):
            # Linux: a connection is accepted once its first bytes are in (HTTP clients speak
            # first), so that a scrape is usually whole when `answer_held` looks at it.
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 1)
    server.start()
    try:
        answers.follow(channel)
    finally:
        server.stop(wait=False)
    return 0


# Started with -I: the simulator's and the benchmark's sitecustomize (PYTHONPATH) stay out,
# and the front imports the same package as the daemon.
_BOOTSTRAP = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from exporter.server.front import main; sys.exit(main(sys.argv[1:]))"
)


class FrontProcess:
    """The daemon's side: binds, starts the front, hands it answers, serves what it forwards.

    Forwarded connections are served by a `Server` that never accepts: it binds the
    listening socket the front accepts on, and serves the connections the front passes.
    """

    def __init__(
        self,
        address: str,
        app: WsgiApp,
        *,
        telemetry_path: str,
        web_config: str | None,
        tls: bool,
        logging_settings: tuple[str, str],
        asked: Callable[[Key, int, float], None],
    ) -> None:
        self._server = Server(address, app)
        self._address = address
        self._telemetry_path = telemetry_path
        self._web_config = web_config
        self._tls = tls
        self._logging = logging_settings
        self._asked = asked
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._answers: socket.socket | None = None
        self._watcher = threading.Thread(target=self._watch, name="http-front", daemon=True)

    @property
    def url(self) -> str:
        """The base URL the front serves at."""
        url = self._server.url
        return url.replace("http://", "https://", 1) if self._tls else url

    @property
    def pid(self) -> int:
        """The front's process id; 0 while none runs."""
        process = self._process
        return 0 if process is None or process.returncode is not None else process.pid

    def start(self) -> None:
        """Start the front, and start it again whenever it exits until `stop`."""
        with self._send_lock:
            self._spawn()
        self._watcher.start()

    def publish(self, generation: int, answers: dict[Key, bytes]) -> None:
        """Hand answers to the front; a front that does not take them is started again."""
        message = encode_answers(generation, answers)
        with self._send_lock:
            process, channel = self._process, self._answers
            if process is None or channel is None:
                return
            try:
                channel.sendall(message)
            except OSError as error:
                # A front that has exited is started again by the watcher, which says so.
                if process.poll() is None and not self._stopping.is_set():
                    log.error("the HTTP front did not take the answers (%s): restarting it", error)
                    process.kill()

    def stop(self) -> None:
        """Close the channels (the front then exits), wait for it, close the socket."""
        self._stopping.set()
        with self._send_lock:
            process, channel = self._process, self._answers
            if channel is not None:
                channel.close()
        if process is not None:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._watcher.is_alive():
            self._watcher.join(timeout=2)
        self._server.stop()

    def _spawn(self) -> None:
        if self._answers is not None:
            self._answers.close()
        answers, answers_end = socket.socketpair()
        requests, requests_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener = self._server.httpd.socket
        settings = {
            "listener": listener.fileno(),
            "answers": answers_end.fileno(),
            "requests": requests_end.fileno(),
            "address": self._address,
            "telemetry_path": self._telemetry_path,
            "web_config": self._web_config,
            "log_level": self._logging[0],
            "log_format": self._logging[1],
        }
        root = str(Path(__file__).resolve().parents[2])
        with answers_end, requests_end:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOTSTRAP.format(root=root), json.dumps(settings)],
                pass_fds=(listener.fileno(), answers_end.fileno(), requests_end.fileno()),
                stdin=subprocess.DEVNULL,
            )
        answers.settimeout(SEND_TIMEOUT)
        self._answers = answers
        threading.Thread(
            target=self._serve_forwarded, args=(requests,), name="http-forwarded", daemon=True
        ).start()

    def _serve_forwarded(self, channel: socket.socket) -> None:
        """Serve the connections the front passes over, and note its answered requests."""
        with channel:
            while True:
                try:
                    message, descriptors, _, _ = socket.recv_fds(channel, 4096, 1)
                except OSError:
                    return
                connections = [socket.socket(fileno=fd) for fd in descriptors]
                if not message:
                    return
                if message[:1] == b"C" and connections:
                    client = (message[1:].decode(errors="replace"), 0)
                    self._server.httpd.process_request(connections.pop(), client)
                elif message[:1] == b"A":
                    content_type, compressed, generation, when = json.loads(message[1:])
                    self._asked((content_type, bool(compressed)), generation, when)
                for extra in connections:
                    extra.close()

    def _refuse_until(self, deadline: float) -> bool:
        """While no front runs, answer every connection at once; True once stopping.

        Left in the listen backlog, a scrape would wait out its timeout (the restart delay
        grows to 30 s); a 503 tells Prometheus at once. Over TLS, which only the front speaks,
        the connection is closed instead.
        """
        listener = self._server.httpd.socket
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                ready, _, _ = select.select([listener], [], [], min(remaining, 0.2))
                if not ready:
                    continue
                connection, _peer = listener.accept()
            except (OSError, ValueError):  # closed by stop(), or taken by a new front
                self._stopping.wait(0.05)
                continue
            with connection:
                if not self._tls:
                    connection.settimeout(1.0)
                    with contextlib.suppress(OSError):
                        connection.sendall(_RESTARTING)
        return True

    def _watch(self) -> None:
        """Start the front again when it exits, waiting longer after each quick exit."""
        delay = 1.0
        while True:
            process = self._process
            assert process is not None
            started = time.monotonic()
            code = process.wait()
            if self._stopping.is_set():
                return
            delay = 1.0 if time.monotonic() - started > 60 else delay
            log.error("the HTTP front exited with status %s; starting it again in %gs", code, delay)
            if self._refuse_until(time.monotonic() + delay):
                return
            delay = min(delay * 2, 30.0)
            with self._send_lock:
                if self._stopping.is_set():
                    return
                self._spawn()
