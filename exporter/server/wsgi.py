"""The threaded WSGI server both daemons serve HTTP with, TLS and basic auth included.

`Server` binds its address, or adopts a socket that is already listening: `gpuload serve`
binds in the daemon and serves from its HTTP front process (see `exporter.server.front`).
"""

from __future__ import annotations

import functools
import logging
import queue
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from socketserver import StreamRequestHandler, TCPServer, ThreadingMixIn
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exporter.server.webconfig import Watcher, WebSecurity

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@functools.cache
def _quiet_handler() -> type[StreamRequestHandler]:
    """The request handler of wsgiref, quiet and buffered.

    Made on first use: wsgiref's server module brings http.server, http.client and the email
    package (~7 MB), which the HTTP front process, with its own handler, does without.
    """
    from wsgiref.simple_server import WSGIRequestHandler

    class QuietHandler(WSGIRequestHandler):
        """Request handler that does not write an access-log line per scrape."""

        # Buffered: the status line, headers and body leave in one send, not one each.
        wbufsize = 1 << 16

        def log_message(self, format: str, *args: Any) -> None:
            """Drop per-request logs: scrapes every few seconds would flood the log."""

        def get_environ(self) -> dict[str, Any]:
            """The WSGI environ; HTTPS=on over TLS, so that wsgi.url_scheme says https."""
            environ = super().get_environ()
            if hasattr(self.connection, "getpeercert"):
                environ["HTTPS"] = "on"
            return environ

    return QuietHandler


# What a server's `answer_inline` did with a new connection's first request.
NOT_ANSWERED, ANSWERED, ANSWERED_AND_CLOSED = 0, 1, 2


class _ThreadingServer(ThreadingMixIn, TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a sixth simultaneous connection has its SYN
    # dropped and the client retries after a second, which 10 concurrent scrapers (or an
    # Alertmanager burst at the relay) hit at once.
    request_queue_size = 128
    # Set when the web config turns TLS on.
    watcher: Watcher | None = None
    # Threads that finished a connection wait for the next one instead of exiting: starting a
    # thread makes the accepting thread wait until the new one has run, a wait for the GIL
    # that grows with load, paid by a relay on every notification. There is still one thread
    # per connection in progress, as many as come; see bench/RESULTS.md (relay).
    max_spare_threads = 32

    def __init__(
        self, address: tuple[str, int], handler: Any, listener: socket.socket | None = None
    ) -> None:
        self._spare_lock = threading.Lock()
        self._spare = 0
        self._closed = False
        self._handoff: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._listener = listener
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
        self.server_name = socket.getfqdn(str(host))
        self.server_port = port
        # What every request's WSGI environ starts from, as wsgiref's server has it.
        self.base_environ = {
            "SERVER_NAME": self.server_name,
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(port),
            "REMOTE_HOST": "",
            "CONTENT_LENGTH": "",
            "SCRIPT_NAME": "",
        }

    def set_app(self, application: WsgiApp) -> None:
        """The WSGI application requests are handed to."""
        self.application = application

    def get_app(self) -> WsgiApp:
        """The WSGI application, for the request handler."""
        return self.application

    def server_activate(self) -> None:
        """Listen, unless the adopted socket already does."""
        if self._listener is None:
            super().server_activate()

    # Answers a new connection's first request on the accepting thread when it can (the
    # HTTP front's held /metrics answers): returns NOT_ANSWERED, ANSWERED (the connection's
    # next requests are read on a thread as usual) or ANSWERED_AND_CLOSED. Never over TLS.
    answer_inline: Callable[[socket.socket], int] | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a spare thread, or on a new one when none is waiting."""
        # No handoff to another thread for the common scrape: under load each one was a wait
        # for a core, and most of the 10-concurrent-scraper tail (bench/OPTIMIZATIONS.md).
        inline = self.answer_inline if self.watcher is None else None
        if inline is not None and inline(request) == ANSWERED_AND_CLOSED:
            self.shutdown_request(request)
            return
        with self._spare_lock:
            if self._spare:
                self._spare -= 1
                self._handoff.put((request, client_address))
                return
        threading.Thread(
            target=self._serve, args=(request, client_address), name="http-connection", daemon=True
        ).start()

    def _serve(self, request: Any, client_address: Any) -> None:
        while True:
            self.process_request_thread(request, client_address)
            with self._spare_lock:
                if self._closed or self._spare >= self.max_spare_threads:
                    return
                self._spare += 1
            connection = self._handoff.get()
            if connection is None:
                return
            request, client_address = connection

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
        """Close the socket and let the spare threads end."""
        super().server_close()
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
        handler: type[StreamRequestHandler] | None = None,
        poll_interval: float = 0.2,
    ) -> None:
        """Bind (or take ``listener``); serving starts with `start`.

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
        self._httpd = server_class((host, port), handler or _quiet_handler(), listener)
        self._httpd.set_app(app)
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
    def httpd(self) -> TCPServer:
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
