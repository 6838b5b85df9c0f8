"""The HTTP server of `gpuload serve` and of `gpuload relay`: one parser, bounds no client passes.

One thread per connection, with TLS and basic auth as the web config file says. Framing is read
strictly (RFC 9112): a head this server could read two ways is refused with a 400, never
guessed at (`Handler`, with `exporter.web.framing`). Bounds that a client, authenticated or
not, cannot get past (`Connections`):
- at most MAX_CONNECTIONS connections; a new one beyond makes room by closing the connection
  that has waited longest for its request (head or body), or, with none waiting, is answered
  503;
- a request's head and body arrive within REQUEST_TIMEOUT of its connection (or, on a kept-alive
  connection, of its request line), however slowly they trickle in; an idle kept-alive
  connection is closed after KEEP_ALIVE_TIMEOUT;
- a head of at most MAX_HEAD bytes and MAX_HEADER_LINES lines (431 beyond), a body only with
  Content-Length, at most `max_body` bytes (413 beyond);
- authentication, and any refusal the application can make from the head alone (its
  `preflight`), is decided before a byte of the body is read: a client without credentials
  never holds a connection while it sends one.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import io
import logging
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import StreamRequestHandler, TCPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from exporter.web.answers import PREFLIGHTED, Answer, Preflight
from exporter.web.framing import (
    BAD,
    PLAIN,
    BadRequest,
    header_fields,
    keeps_alive,
    refusal,
    request_line,
    response,
)

if TYPE_CHECKING:
    from exporter.web.webconfig import Watcher, WebSecurity

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# Bounds of every listening socket: the table in docs/security.md (a test compares them).
MAX_CONNECTIONS = 256
REQUEST_TIMEOUT = 10.0
KEEP_ALIVE_TIMEOUT = 120.0
MAX_HEAD = 16 * 1024
MAX_HEADER_LINES = 100
# A client that does not read its answer is left after this long.
SEND_TIMEOUT = 10.0
# After a refusal, the unread body is read and dropped for this long, up to this much, before
# the connection closes: closing with unread data resets it, and the client may lose the answer.
LINGER_SECONDS = 2.0
LINGER_BYTES = 256 * 1024
# The exporter's largest request body (it has no use for one); the relay sets its own.
MAX_BODY = 1 << 20
# When full, how many of the longest-waiting connections are looked at for one to close.
_EVICTION_PEEKS = 8
# While a body is read, its reader answers 408 at the request's deadline; the sweeper, which
# shuts the connection down without a word, waits this much longer, in case the reader cannot.
ANSWER_GRACE = 2.0


class Connection:
    """One connection held by a server: what it waits for, and until when."""

    __slots__ = ("_shutter", "deadline", "idle", "since")

    def __init__(self, shutter: socket.socket, now: float) -> None:
        # A duplicate of the connection's descriptor: shutting it down wakes the thread
        # reading the connection, whoever has closed their own descriptor meanwhile.
        self._shutter = shutter
        self.since = now
        self.deadline: float | None = now + REQUEST_TIMEOUT
        self.idle = False

    def unread(self) -> bool:
        """Whether bytes the client sent wait, unread, in the connection's receive buffer."""
        try:
            return bool(self._shutter.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # nothing to read
            return False

    def close(self, *, shut: bool) -> None:
        """Let go of the connection; ``shut``: shut it down for its thread too."""
        with contextlib.suppress(OSError):
            if shut:
                self._shutter.shutdown(socket.SHUT_RDWR)
            self._shutter.close()


class Connections:
    """The connections a server holds, with their deadlines and the cap on their number.

    A connection waits (for its first request, for the rest of a request, or idle between
    requests) until a deadline, and is shut down when it passes; one being answered has none.
    """

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        self._limit = limit
        self._changed = threading.Condition()
        self._held: dict[int, Connection] = {}
        self._closed = False
        self._sweeper: threading.Thread | None = None
        # The sweeper waits without a timeout while no connection is held; only then does a
        # new connection wake it (not on every scrape: a wake is a wait for the GIL).
        self._sweeper_asleep = False

    def __len__(self) -> int:
        return len(self._held)

    @property
    def closed(self) -> bool:
        """Whether the server has stopped: no connection is kept alive any more."""
        return self._closed

    def admit(self, connection: socket.socket) -> Connection | None:
        """Hold a new connection; None when full of connections being answered."""
        try:
            held = Connection(connection.dup(), time.monotonic())
        except OSError:  # out of descriptors: the new connection waits its turn
            return None
        evicted = None
        with self._changed:
            if len(self._held) >= self._limit:
                evicted = self._slowest() or held  # none waiting: the new one is not held
                if evicted is not held:
                    del self._held[id(evicted)]
            if evicted is not held:
                self._held[id(held)] = held
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep, name="http-deadlines")
                    self._sweeper.daemon = True
                    self._sweeper.start()
                elif self._sweeper_asleep:
                    self._sweeper_asleep = False
                    self._changed.notify()
        # Descriptors are shut and closed outside the lock: those calls wait on the kernel.
        if evicted is held:
            held.close(shut=False)
            return None
        if evicted is not None:
            evicted.close(shut=True)
        return held

    def _slowest(self) -> Connection | None:
        """The connection to close to make room: the one waiting longest for its request.

        One with bytes waiting unread (a whole head, a TLS ClientHello) is passed over: its
        thread, slow to start on a busy server, has not got to it yet. A client that reopens
        every connection closed would otherwise have legitimate requests closed unread.
        """
        waiting = (held for held in self._held.values() if held.deadline is not None)
        oldest = heapq.nsmallest(_EVICTION_PEEKS, waiting, key=lambda waiter: waiter.since)
        for candidate in oldest:
            if not candidate.unread():
                return candidate
        return oldest[0] if oldest else None

    def idle(self, held: Connection) -> None:
        """The connection waits for its next request, for at most KEEP_ALIVE_TIMEOUT."""
        with self._changed:
            held.since = time.monotonic()
            held.deadline, held.idle = held.since + KEEP_ALIVE_TIMEOUT, True

    def request_started(self, held: Connection) -> float:
        """A request line came in: the rest of its request within REQUEST_TIMEOUT."""
        with self._changed:
            if held.idle and held.deadline is not None:
                held.deadline = time.monotonic() + REQUEST_TIMEOUT
                held.idle = False
            return held.deadline or time.monotonic() + REQUEST_TIMEOUT

    def reading_body(self, held: Connection, deadline: float) -> None:
        """The head is in: its reader times the body out at ``deadline`` and answers 408.

        A sweeper shutting the connection down at the same deadline would race the reader
        and sometimes win, closing it without an answer.
        """
        with self._changed:
            if held.deadline is not None:
                held.deadline = deadline + ANSWER_GRACE

    def answering(self, held: Connection) -> None:
        """The request is in: no deadline, and never closed to make room, while answered."""
        # Under the lock, as `admit` and the sweeper choose which waiting connections to close:
        # one that has started its answer is never chosen.
        with self._changed:
            held.deadline = None

    def leave(self, held: Connection) -> None:
        """The connection ended (unless it was shut down already)."""
        with self._changed:
            mine = self._held.get(id(held)) is held
            if mine:
                del self._held[id(held)]
        if mine:
            held.close(shut=False)

    def close(self) -> None:
        """Shut down the connections waiting for a request (those being answered finish)."""
        with self._changed:
            self._closed = True
            for held in list(self._held.values()):
                if held.deadline is not None:
                    self._drop(held, shut=True)
            self._changed.notify()

    def _drop(self, held: Connection, *, shut: bool) -> None:
        del self._held[id(held)]
        held.close(shut=shut)

    def _sweep(self) -> None:
        """Shut down the connections past their deadline, once a second while any is held."""
        while True:
            with self._changed:
                if self._closed:
                    return
                now, late = time.monotonic(), []
                for held in list(self._held.values()):
                    if held.deadline is not None and held.deadline <= now:
                        del self._held[id(held)]
                        late.append(held)
                self._sweeper_asleep = not self._held and not late
                if not late:
                    self._changed.wait(None if self._sweeper_asleep else 1.0)
            for held in late:
                held.close(shut=True)


@dataclass
class _Request:
    """A request's head, parsed: its WSGI environ and how to read and answer it."""

    environ: dict[str, Any]
    keep_alive: bool
    length: int
    expects_continue: bool


class Handler(StreamRequestHandler):
    """HTTP/1.1 with keep-alive, strict on framing (RFC 9112), bounded by `Connections`.

    A request line and header lines; the application's preflight on them; then a body of
    Content-Length bytes, read whole by the request's deadline; then the WSGI application,
    whose answer is sent whole with its length, in one write. One parser for every request:
    a head this server reads one way is never read another way by another path.
    """

    timeout = KEEP_ALIVE_TIMEOUT  # each read; the deadlines above are shorter
    wbufsize = 0  # each answer is written whole, in one send
    server: _ThreadingServer
    rfile: io.BufferedReader  # rbufsize -1: socket.makefile's buffered reader, with peek

    def handle(self) -> None:
        """Answer requests until the client closes, asks to close, or sends a bad one."""
        held = self.server.current()
        connections = self.server.connections
        while True:
            try:
                head = self._read_head(held)
                if head is None:
                    return
                lines, deadline = head
                request = self._parse(lines)
            except BadRequest as error:
                self._send("GET", Answer(error.status, PLAIN, f"{error}\n".encode()), False)
                self._linger()
                return
            except OSError:  # reset, shut down, or idle past the timeout
                return
            environ = request.environ
            method = environ["REQUEST_METHOD"]
            refused = self._preflight(request)
            if refused is not None:
                # The body is never read: the connection goes on only if it has none.
                keep_alive = request.keep_alive and request.length == 0
                self._send(method, refused, keep_alive and not connections.closed)
                if not keep_alive:
                    self._linger()
                    return
                connections.idle(held)
                continue
            if request.length:
                connections.reading_body(held, deadline)
            try:
                if request.expects_continue and request.length:
                    self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = self._read_body(request.length, deadline)
            except OSError:
                return
            if body is None:
                timeout = Answer("408 Request Timeout", PLAIN, b"the body came too slowly\n")
                self._send(method, timeout, False)
                self._linger()
                return
            environ["wsgi.input"] = io.BytesIO(body)
            environ[PREFLIGHTED] = True
            # Only now, the request whole, does the connection stop waiting: while its head or
            # body trickles in, it may be closed to make room for another.
            connections.answering(held)
            answer = self._run(environ)
            keep_alive = request.keep_alive and not connections.closed
            self.connection.settimeout(SEND_TIMEOUT)
            self._send(method, answer, keep_alive)
            if not keep_alive:
                return
            self.connection.settimeout(self.timeout)
            connections.idle(held)

    def _read_head(self, held: Connection) -> tuple[list[bytes], float] | None:
        """The request line and header lines, and the request's deadline.

        None when the client closed between requests.
        """
        lines: list[bytes] = []
        deadline = 0.0
        left = MAX_HEAD
        while True:
            line = self.rfile.readline(left + 1)
            if len(line) > left:
                raise BadRequest(
                    "431 Request Header Fields Too Large", f"a head over {MAX_HEAD} bytes"
                )
            left -= len(line)
            if not line.endswith(b"\n"):
                if lines or line:
                    raise BadRequest(BAD, "the request ended early")
                return None
            # CRLF ends a line; a bare LF is accepted, a bare CR is not (RFC 9112 2.2).
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
            if b"\r" in line:
                raise BadRequest(BAD, "a bare CR in the head")
            if not line:
                if lines:
                    return lines, deadline
                continue  # an empty line before the request line is ignored (RFC 9112)
            if not lines:
                deadline = self.server.connections.request_started(held)
            lines.append(line)
            if len(lines) > MAX_HEADER_LINES:
                raise BadRequest(
                    "431 Request Header Fields Too Large",
                    f"more than {MAX_HEADER_LINES} header lines",
                )

    def _parse(self, lines: list[bytes]) -> _Request:
        """The request's environ, or a BadRequest naming the first rule it breaks."""
        method, target, version = request_line(lines[0])
        fields = header_fields(lines[1:])
        if version == "HTTP/1.1" and "HTTP_HOST" not in fields:
            raise BadRequest(BAD, "an HTTP/1.1 request without Host")
        if "HTTP_TRANSFER_ENCODING" in fields:
            if "CONTENT_LENGTH" in fields:
                raise BadRequest(BAD, "both Content-Length and Transfer-Encoding")
            raise BadRequest("411 Length Required", "a body must come with Content-Length")
        length = int(fields.get("CONTENT_LENGTH", "0"))
        expectation = fields.get("HTTP_EXPECT", "")
        # An HTTP/1.0 client cannot wait for a 100: its expectation is ignored (RFC 9110).
        expects_continue = version == "HTTP/1.1" and bool(expectation)
        if expects_continue and expectation.lower() != "100-continue":
            raise BadRequest("417 Expectation Failed", f"cannot meet Expect: {expectation}")
        path, _, query = target.partition("?")
        tls = hasattr(self.connection, "getpeercert")
        environ: dict[str, Any] = dict(self.server.base_environ)
        environ.update(fields)
        environ.update(
            {
                "REQUEST_METHOD": method,
                "PATH_INFO": unquote(path, "iso-8859-1"),
                "QUERY_STRING": query,
                "SERVER_PROTOCOL": version,
                "REMOTE_ADDR": str(self.client_address[0]),
                "wsgi.version": (1, 0),
                "wsgi.url_scheme": "https" if tls else "http",
                "wsgi.errors": sys.stderr,
                "wsgi.multithread": True,
                "wsgi.multiprocess": False,
                "wsgi.run_once": False,
            }
        )
        if tls:
            environ["HTTPS"] = "on"
        keep_alive = keeps_alive(version, fields.get("HTTP_CONNECTION", ""))
        return _Request(environ, keep_alive, length, expects_continue)

    def _preflight(self, request: _Request) -> Answer | None:
        """The application's refusal from the head alone, or the server's for a large body."""
        preflight = self.server.preflight
        refused = preflight(request.environ) if preflight is not None else None
        limit = self.server.max_body
        if refused is None and request.length > limit:
            reason = f"a body of {request.length} bytes, over {limit}\n"
            refused = Answer("413 Content Too Large", PLAIN, reason.encode())
        return refused

    def _read_body(self, length: int, deadline: float) -> bytes | None:
        """The body's `length` bytes; None if they have not all come by `deadline`."""
        body = bytearray()
        while len(body) < length:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.connection.settimeout(remaining)
            try:
                chunk = self._arrived(length - len(body))
            except TimeoutError:
                return None
            if not chunk:
                raise ConnectionResetError("the client closed mid-body")
            body += chunk
        self.connection.settimeout(self.timeout)
        return bytes(body)

    def _arrived(self, most: int) -> bytes:
        """What has arrived, up to `most` bytes, waiting for at least one; b"" at the end.

        Waiting in read1(most) would hold a buffer of `most` bytes the while: 1 MiB for each of
        256 connections trickling a body. peek waits in the reader's own 8 KiB buffer.
        """
        if not self.rfile.peek(1):
            return b""
        return self.rfile.read1(most)

    def _linger(self) -> None:
        """Read and drop what the client still sends, briefly, so that it reads our answer."""
        with contextlib.suppress(OSError, ValueError):
            self.connection.shutdown(socket.SHUT_WR)
            deadline, left = time.monotonic() + LINGER_SECONDS, LINGER_BYTES
            while left > 0 and (remaining := deadline - time.monotonic()) > 0:
                self.connection.settimeout(remaining)
                dropped = len(self._arrived(left))
                if not dropped:
                    return
                left -= dropped

    def _run(self, environ: dict[str, Any]) -> Answer:
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> Any:
            started[:] = [status, headers]
            return None

        try:
            result = self.server.application(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
        except Exception:  # one failed request must not end the server
            log.exception("answering %s failed", environ.get("PATH_INFO"))
            return Answer("500 Internal Server Error", PLAIN, b"internal error\n")
        return Answer(started[0], started[1], body)

    def _send(self, method: str, answer: Answer, keep_alive: bool) -> None:
        self.wfile.write(response(method, *answer, keep_alive))


_FULL = refusal("gpuload: too many connections")
# How long a thread that has served its connection waits for another before it ends, and how
# many wait at most (the others end with their connection).
THREAD_IDLE_SECONDS = 60.0
MAX_SPARE_THREADS = 32


class _Threads:
    """The threads that serve connections, one each; up to MAX_SPARE_THREADS wait for the next.

    Starting a thread waits until the new thread runs, which on a busy server (the GIL) held
    the accepting thread up for milliseconds: a client reopening every connection closed to
    it kept legitimate ones waiting in the listen backlog for seconds. Handing a connection
    to a waiting thread does not wait.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None] | None]] = []
        self._closed = False

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a waiting thread, or a new one."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            inbox.put(job)
            return
        thread = threading.Thread(target=self._work, args=(job,), name="http-connection")
        thread.daemon = True
        thread.start()

    def _work(self, job: Callable[[], None] | None) -> None:
        inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        while job is not None:
            job()
            with self._lock:
                if self._closed or len(self._idle) >= MAX_SPARE_THREADS:
                    return
                self._idle.append(inbox)
            try:
                job = inbox.get(timeout=THREAD_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # else a job is being handed over: take it
                        self._idle.remove(inbox)
                        return
                job = inbox.get()

    def close(self) -> None:
        """End the waiting threads; those serving a connection end after it."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


class _ThreadingServer(TCPServer):
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a sixth simultaneous connection has its SYN
    # dropped and the client retries after a second (then 3, 7 s), which 10 concurrent
    # scrapers (or an Alertmanager burst at the relay) hit at once; 128 overflowed under a
    # client reopening hundreds of connections as fast as they were closed. The kernel caps
    # it at net.core.somaxconn (4096 since Linux 5.4).
    request_queue_size = 4096
    # Set when the web config turns TLS on.
    watcher: Watcher | None = None
    max_body: int = MAX_BODY
    application: WsgiApp
    preflight: Preflight | None = None

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        self._local = threading.local()
        self.connections = Connections()
        self.threads = _Threads()
        super().__init__(address, handler)
        host, port = self.server_address[:2]
        # What every request's WSGI environ starts from.
        self.base_environ = {
            "SERVER_NAME": socket.getfqdn(str(host)),
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(port),
            "SCRIPT_NAME": "",
        }

    def current(self) -> Connection:
        """The connection the calling thread serves."""
        held: Connection = self._local.held
        return held

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own, if there is room for it."""
        held = self.connections.admit(request)
        if held is None:
            # Full of connections being answered: a plain client is told so, TLS is closed.
            if self.watcher is None:
                with contextlib.suppress(OSError):
                    request.send(_FULL, socket.MSG_DONTWAIT)
            self.shutdown_request(request)
            return
        # Each answer is one write; without this, Nagle's algorithm holds the last segment of
        # a TLS record until the client's delayed ACK (~40 ms per scrape).
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.threads.run(functools.partial(self._serve, request, client_address, held))

    def _serve(self, request: Any, client_address: Any, held: Connection) -> None:
        self._local.held = held
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 (handle_error logs it)
            self.handle_error(request, client_address)
        finally:
            self.connections.leave(held)
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed: a log line, never socketserver's traceback on stderr.

        A client that hangs up mid-request (a TLS EOF, a reset, a timeout) is the client's
        doing and common: logged at debug, or 100 such clients print 3,500 lines outside the
        log format. Anything else is a bug: logged with its traceback, through the log.
        """
        error = sys.exc_info()[1]
        peer = client_address[0] if isinstance(client_address, tuple) else client_address
        if isinstance(error, OSError):
            log.debug("connection from %s ended: %s", peer, error)
        else:
            log.error("connection from %s failed", peer, exc_info=error)

    def server_close(self) -> None:
        """Close the socket and shut down the connections waiting for a request."""
        super().server_close()
        self.connections.close()
        self.threads.close()

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Serve one connection; over TLS, the handshake happens here, in its own thread."""
        if self.watcher is None:
            super().finish_request(request, client_address)
            return
        wrapped = self.watcher.accept(request, client_address)
        if wrapped is None:
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            # shutdown_request() closes the plain socket, which the TLS one has taken over.
            wrapped.close()


class _ThreadingServerV6(_ThreadingServer):
    address_family = socket.AF_INET6


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port``; an empty host means every interface."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Server:
    """The HTTP server on its own thread; TLS and basic auth as the web config file says."""

    def __init__(
        self,
        address: str,
        app: WsgiApp,
        security: WebSecurity | None = None,
        *,
        max_body: int = MAX_BODY,
        poll_interval: float = 0.2,
    ) -> None:
        """Bind; serving starts with `start`.

        ``app`` may have a `preflight` (see `Preflight`), called before a request's body is
        read. ``max_body``: the largest request body read (413 beyond, after the preflight).
        ``poll_interval``: how often the serving thread wakes to see whether `stop` was
        called, and so the longest `stop` waits for it (each wake costs CPU even when idle).
        """
        host, port = parse_address(address)
        server_class = _ThreadingServerV6 if ":" in host else _ThreadingServer
        watcher = None
        if security is not None:
            # Imported here: bcrypt stays out of a process without a web config.
            from exporter.web.webconfig import Guard, Watcher

            watcher = Watcher(security)
            app = Guard(app, watcher)
        self._httpd = server_class((host, port), Handler)
        self._httpd.application = app
        self._httpd.preflight = getattr(app, "preflight", None)
        self._httpd.max_body = max_body
        if watcher is not None and watcher.tls:
            self._httpd.watcher = watcher
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            name="http",
            kwargs={"poll_interval": poll_interval},
            daemon=True,
        )

    @property
    def url(self) -> str:
        """The base URL the server is reachable at (its real port if 0 was asked)."""
        host, port = str(self._httpd.server_address[0]), self._httpd.server_address[1]
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        shown = f"[{shown}]" if ":" in shown else shown
        scheme = "https" if self._httpd.watcher is not None else "http"
        return f"{scheme}://{shown}:{port}/"

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop accepting and close the socket (also when it never started serving).

        Without ``wait``, the serving thread is not waited for: a process about to exit.
        """
        if wait and self._thread.is_alive():
            # shutdown() waits for serve_forever to notice: it would wait forever if never run.
            self._httpd.shutdown()
            self._thread.join(timeout=1)
        self._httpd.server_close()
