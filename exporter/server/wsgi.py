"""The HTTP server of `gpuload serve` (its front and its daemon) and of `gpuload relay`.

`Server` binds its address, or adopts a socket that is already listening: `gpuload serve`
binds in the daemon and serves from its HTTP front process (see `exporter.server.front`).
One thread per connection, with TLS and basic auth as the web config file says, and bounds
that a client, authenticated or not, cannot get past (`Connections`):
- at most MAX_CONNECTIONS connections; a new one beyond makes room by closing the connection
  that has waited longest for a request, or, with none waiting, is answered 503;
- a request's head and body arrive within REQUEST_TIMEOUT of its connection (or, on a kept-alive
  connection, of its request line), however slowly they trickle in; an idle kept-alive
  connection is closed after KEEP_ALIVE_TIMEOUT;
- a head of at most MAX_HEAD bytes and MAX_HEADER_LINES lines (431 beyond), a body only with
  Content-Length, at most `max_body` bytes (413 beyond; the relay checks its own limit).
"""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import StreamRequestHandler, TCPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

if TYPE_CHECKING:
    from exporter.server.webconfig import Watcher, WebSecurity

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
# The front's and the daemon's largest request body (they have no use for one).
MAX_BODY = 1 << 20

# What a server's `answer_inline` did with a new connection's first request.
NOT_ANSWERED, ANSWERED, ANSWERED_AND_CLOSED = 0, 1, 2

_PLAIN = [("Content-Type", "text/plain; charset=utf-8")]


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
        now = time.monotonic()
        with self._changed:
            if len(self._held) >= self._limit:
                waiting = [held for held in self._held.values() if held.deadline is not None]
                if not waiting:
                    return None
                oldest = min(waiting, key=lambda held: held.since)
                self._drop(oldest, shut=True)
            try:
                held = Connection(connection.dup(), now)
            except OSError:  # out of descriptors: the new connection waits its turn
                return None
            self._held[id(held)] = held
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep, name="http-deadlines")
                self._sweeper.daemon = True
                self._sweeper.start()
            elif self._sweeper_asleep:
                self._sweeper_asleep = False
                self._changed.notify()
            return held

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

    def answering(self, held: Connection) -> None:
        """The request is in: no deadline, and never closed to make room, while answered."""
        with self._changed:
            held.deadline = None

    def leave(self, held: Connection) -> None:
        """The connection ended (unless it was shut down already)."""
        with self._changed:
            if self._held.get(id(held)) is held:
                self._drop(held, shut=False)

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
        with self._changed:
            while not self._closed:
                now = time.monotonic()
                for held in list(self._held.values()):
                    if held.deadline is not None and held.deadline <= now:
                        self._drop(held, shut=True)
                self._sweeper_asleep = not self._held
                self._changed.wait(None if self._sweeper_asleep else 1.0)


class _BadRequest(Exception):
    """A request that is not read: answered with ``status`` and the connection closed."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Handler(StreamRequestHandler):
    """HTTP/1.1 with keep-alive, as much of it as scrapers, browsers and Alertmanager use.

    A request line, header lines and a body of Content-Length bytes, handed to the WSGI
    application, whose answer is sent whole with its length. wsgiref's handler took ~230 µs
    of CPU per scrape (its header parser is the email package's) and reads heads unbounded.
    """

    timeout = KEEP_ALIVE_TIMEOUT  # each read; the deadlines above are shorter
    wbufsize = 0  # each answer is written whole, in one send
    server: _ThreadingServer

    def handle(self) -> None:
        """Answer requests until the client closes, asks to close, or sends a bad one."""
        held = self.server.current()
        connections = self.server.connections
        while True:
            try:
                head = self._read_head(held)
                if head is None:
                    return
                environ, keep_alive, body = self._environ(*head)
            except _BadRequest as error:
                self._send("GET", error.status, _PLAIN, f"{error}\n".encode(), False)
                return
            except OSError:  # reset, shut down, or idle past the timeout
                return
            connections.answering(held)
            status, headers, answer = self._run(environ)
            keep_alive = keep_alive and body.whole() and not connections.closed
            self.connection.settimeout(SEND_TIMEOUT)
            self._send(environ["REQUEST_METHOD"], status, headers, answer, keep_alive)
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
                raise _BadRequest(
                    "431 Request Header Fields Too Large", f"a head over {MAX_HEAD} bytes"
                )
            left -= len(line)
            if not line.endswith(b"\n"):
                if lines or line:
                    raise _BadRequest("400 Bad Request", "the request ended early")
                return None
            if line in (b"\r\n", b"\n"):
                if lines:
                    return lines, deadline
                continue  # an empty line before the request line is ignored (RFC 9112)
            if not lines:
                deadline = self.server.connections.request_started(held)
            lines.append(line.rstrip(b"\r\n"))
            if len(lines) > MAX_HEADER_LINES:
                raise _BadRequest(
                    "431 Request Header Fields Too Large",
                    f"more than {MAX_HEADER_LINES} header lines",
                )

    def _environ(self, lines: list[bytes], deadline: float) -> tuple[dict[str, Any], bool, _Body]:
        parts = lines[0].decode("iso-8859-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest("400 Bad Request", "not an HTTP/1 request line")
        method, target, version = parts
        path, _, query = target.partition("?")
        tls = hasattr(self.connection, "getpeercert")
        environ: dict[str, Any] = dict(self.server.base_environ)
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
        for line in lines[1:]:
            name, colon, value = line.decode("iso-8859-1").partition(":")
            if not colon or not name or name != name.strip():
                raise _BadRequest("400 Bad Request", "a header line without a name")
            key = name.upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = f"HTTP_{key}"
            value = value.strip()
            environ[key] = f"{environ[key]},{value}" if environ.get(key) else value
        if "HTTP_TRANSFER_ENCODING" in environ:
            raise _BadRequest("400 Bad Request", "a body must come with Content-Length")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise _BadRequest("400 Bad Request", "Content-Length is not a number") from None
        limit = self.server.max_body
        if length < 0 or (limit is not None and length > limit):
            raise _BadRequest("413 Content Too Large", f"a body of {length} bytes, over {limit}")
        body = _Body(self.rfile, self.connection, length, deadline)
        environ["wsgi.input"] = body
        return environ, keeps_alive(version, environ.get("HTTP_CONNECTION", "")), body

    def _run(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
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
            return "500 Internal Server Error", _PLAIN, b"internal error\n"
        return started[0], started[1], body

    def _send(
        self,
        method: str,
        status: str,
        headers: list[tuple[str, str]],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self.wfile.write(response(method, status, headers, body, keep_alive))


class _Body(io.RawIOBase):
    """A request's body as `wsgi.input`: its Content-Length bytes, by the request's deadline.

    A body that has not come by then reads short (the application answers it) and the
    connection is closed after the answer.
    """

    def __init__(self, rfile: Any, connection: socket.socket, length: int, deadline: float):
        super().__init__()
        self._rfile = rfile
        self._connection = connection
        self._left = length
        self._deadline = deadline
        self._broken = False

    def readable(self) -> bool:
        return True

    def whole(self) -> bool:
        """Whether the body was read to its end (else the connection cannot go on)."""
        return self._left == 0 and not self._broken

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0 or self._broken:
            return 0
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            self._broken = True
            return 0
        self._connection.settimeout(remaining)
        try:
            chunk = self._rfile.read1(min(len(buffer), self._left))
        except OSError:
            chunk = b""
        if not chunk:
            self._broken = True
            return 0
        buffer[: len(chunk)] = chunk
        self._left -= len(chunk)
        return len(chunk)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all of the body when negative), fewer if it stops coming."""
        wanted = self._left if size is None or size < 0 else min(size, self._left)
        chunks = []
        while wanted > 0:
            chunk = super().read(wanted)
            if not chunk:
                break
            chunks.append(chunk)
            wanted -= len(chunk)
        return b"".join(chunks)


def keeps_alive(version: str, connection: str) -> bool:
    """Whether the connection stays open after this request (HTTP/1.1: unless told to close)."""
    if version == "HTTP/1.1":
        return "close" not in connection.lower()
    return "keep-alive" in connection.lower()


def response(
    method: str, status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool
) -> bytes:
    """An HTTP/1.1 answer, whole: status line, headers, Content-Length, body (not for HEAD)."""
    head = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers)]
    if not any(name.lower() == "content-length" for name, _ in headers):
        head.append(f"Content-Length: {len(body)}")
    if not keep_alive:
        head.append("Connection: close")
    head += ["", ""]
    payload = "\r\n".join(head).encode("iso-8859-1")
    return payload if method == "HEAD" else payload + body


def refusal(reason: str) -> bytes:
    """A whole 503 answer that asks the client to come back in a second, and closes."""
    headers = [*_PLAIN, ("Retry-After", "1")]
    return response("GET", "503 Service Unavailable", headers, f"{reason}\n".encode(), False)


_FULL = refusal("gpuload: too many connections")


class _ThreadingServer(TCPServer):
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a sixth simultaneous connection has its SYN
    # dropped and the client retries after a second, which 10 concurrent scrapers (or an
    # Alertmanager burst at the relay) hit at once.
    request_queue_size = 128
    # Set when the web config turns TLS on.
    watcher: Watcher | None = None
    # Threads that finished a connection wait for the next one instead of exiting: starting a
    # thread makes the accepting thread wait until the new one has run, a wait for the GIL
    # that grows with load, paid by a relay on every notification.
    max_spare_threads = 32
    # None: the application reads and judges the body's length (the relay's own limit).
    max_body: int | None = MAX_BODY
    application: WsgiApp

    def __init__(
        self, address: tuple[str, int], handler: Any, listener: socket.socket | None = None
    ) -> None:
        self._spare_lock = threading.Lock()
        self._spare = 0
        self._closed = False
        self._handoff: queue.SimpleQueue[tuple[Any, Any, Connection] | None] = queue.SimpleQueue()
        self._listener = listener
        self._local = threading.local()
        self.connections = Connections()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        """Bind the address, or take over the socket already listening."""
        if self._listener is None:
            super().server_bind()
        else:
            self.socket.close()
            self.socket = self._listener
            self.server_address = self.socket.getsockname()
        host, port = self.server_address[:2]
        # What every request's WSGI environ starts from.
        self.base_environ = {
            "SERVER_NAME": socket.getfqdn(str(host)),
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(port),
            "SCRIPT_NAME": "",
        }

    def server_activate(self) -> None:
        """Listen, unless the adopted socket already does."""
        if self._listener is None:
            super().server_activate()

    # Answers a new connection's first request on the accepting thread when it can (the
    # HTTP front's held /metrics answers): returns NOT_ANSWERED, ANSWERED (the connection's
    # next requests are read on a thread as usual) or ANSWERED_AND_CLOSED. Never over TLS.
    answer_inline: Callable[[socket.socket], int] | None = None

    def current(self) -> Connection:
        """The connection the calling thread serves."""
        held: Connection = self._local.held
        return held

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a spare thread, or on a new one when none is waiting."""
        # No handoff to another thread for the common scrape: under load each one was a wait
        # for a core, and most of the 10-concurrent-scraper tail (bench/OPTIMIZATIONS.md).
        # Answered here, a connection holds nothing: it is held only if it goes on.
        inline = self.answer_inline if self.watcher is None else None
        answered = NOT_ANSWERED if inline is None else inline(request)
        if answered == ANSWERED_AND_CLOSED:
            self.shutdown_request(request)
            return
        held = self.connections.admit(request)
        if held is None:
            # Full of connections being answered: a plain client is told so, TLS is closed.
            if self.watcher is None and answered == NOT_ANSWERED:
                with contextlib.suppress(OSError):
                    request.send(_FULL, socket.MSG_DONTWAIT)
            self.shutdown_request(request)
            return
        if answered == ANSWERED:
            self.connections.idle(held)
        with self._spare_lock:
            if self._spare:
                self._spare -= 1
                self._handoff.put((request, client_address, held))
                return
        threading.Thread(
            target=self._serve,
            args=(request, client_address, held),
            name="http-connection",
            daemon=True,
        ).start()

    def _serve(self, request: Any, client_address: Any, held: Connection) -> None:
        while True:
            self._local.held = held
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 (handle_error logs it; the thread goes on)
                self.handle_error(request, client_address)
            finally:
                self.connections.leave(held)
                self.shutdown_request(request)
            with self._spare_lock:
                if self._closed or self._spare >= self.max_spare_threads:
                    return
                self._spare += 1
            connection = self._handoff.get()
            if connection is None:
                return
            request, client_address, held = connection

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
        """Close the socket, shut the connections down and let the spare threads end."""
        super().server_close()
        self.connections.close()
        with self._spare_lock:
            self._closed = True
            for _ in range(self._spare):
                self._handoff.put(None)
            self._spare = 0

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
        listener: socket.socket | None = None,
        max_body: int | None = MAX_BODY,
        poll_interval: float = 0.2,
    ) -> None:
        """Bind (or take ``listener``); serving starts with `start`.

        ``max_body``: the largest request body read, None to leave it to the application.
        ``poll_interval``: how often the serving thread wakes to see whether `stop` was
        called, and so the longest `stop` waits for it (each wake costs CPU even when idle).
        """
        host, port = parse_address(address)
        server_class = _ThreadingServerV6 if ":" in host else _ThreadingServer
        watcher = None
        if security is not None:
            # Imported here: bcrypt and yaml stay out of a front process without a web config.
            from exporter.server.webconfig import Guard, Watcher

            watcher = Watcher(security)
            app = Guard(app, watcher)
        self._httpd = server_class((host, port), Handler, listener)
        self._httpd.application = app
        self._httpd.max_body = max_body
        if watcher is not None and watcher.tls:
            self._httpd.watcher = watcher
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            name="http",
            kwargs={"poll_interval": poll_interval},
            daemon=True,
        )

    def answer_inline(self, answer: Callable[[socket.socket], int]) -> None:
        """Let ``answer`` try each new connection's first request on the accepting thread."""
        self._httpd.answer_inline = answer

    @property
    def httpd(self) -> _ThreadingServer:
        """The server, for connections handed over from elsewhere (`process_request`)."""
        return self._httpd

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
