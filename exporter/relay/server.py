"""The relay's HTTP endpoint: POST notifications, /metrics, /healthz, /readyz.

A notification is answered 200 only after it is committed to the queue, 400
when it is not an Alertmanager payload or cannot be stored (with a one-line
reason), 401 without the configured credentials, 411/413 without a length or
over the limit, and 503 when the queue cannot commit it, so that Alertmanager
sends it again. Alertmanager does not retry a 4xx: a notification over the
limit is lost, so the answer and the log say how to keep under it (its
``max_alerts``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import make_wsgi_app

from exporter.problems import ProblemLog
from exporter.relay import payload
from exporter.relay.config import AuthConfig
from exporter.relay.metrics import RelayMetrics
from exporter.relay.queue import Queue
from exporter.relay.routes import Route, targets_for
from exporter.web.answers import Answer, refused_unless_preflighted

log = logging.getLogger(__name__)

_PLAIN = [("Content-Type", "text/plain; charset=utf-8")]

StartResponse = Callable[..., Any]


class Authenticator:
    """Checks the Authorization header against the configured credentials in constant time."""

    def __init__(self, auth: AuthConfig) -> None:
        self._expected: bytes | None = None
        if auth.bearer_token is not None:
            self._expected = b"Bearer " + auth.bearer_token.value.encode()
        elif auth.password is not None and auth.username is not None:
            pair = f"{auth.username}:{auth.password.value}".encode()
            self._expected = b"Basic " + base64.b64encode(pair)
        self.scheme = "Bearer" if auth.bearer_token is not None else "Basic"

    @property
    def required(self) -> bool:
        """Whether requests must carry credentials."""
        return self._expected is not None

    def allows(self, header: str) -> bool:
        """Whether the Authorization header carries the configured credentials."""
        if self._expected is None:
            return True
        given = header.strip().encode("latin-1", errors="replace")
        scheme, _, value = given.partition(b" ")
        if self.scheme == "Basic" and scheme.lower() == b"basic":
            # Compare the decoded pair: encoders may differ in padding or case of the scheme.
            try:
                value = base64.b64encode(base64.b64decode(value.strip(), validate=True))
            except (binascii.Error, ValueError):
                return False
        return hmac.compare_digest(b"%s %s" % (scheme.capitalize(), value.strip()), self._expected)


class RelayApplication:
    """The WSGI application of the relay."""

    def __init__(
        self,
        *,
        queue: Queue,
        route: Route,
        metrics: RelayMetrics,
        auth: AuthConfig,
        path: str,
        max_body_bytes: int,
        max_age: float,
        wake: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._queue = queue
        self._route = route
        self._metrics = metrics
        self._auth = Authenticator(auth)
        self._path = path
        self._max_body = max_body_bytes
        self._max_age = max_age
        self._wake = wake
        self._clock = clock
        self._metrics_app = make_wsgi_app(metrics.registry)
        self._problems = ProblemLog(log)
        self._in_flight = 0
        self._idle = threading.Condition()
        self.stopping = False

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Dispatch a request by path."""
        path = environ.get("PATH_INFO", "/")
        if path == self._path:
            return self._notification(environ, start_response)
        if path == "/metrics":
            return self._metrics_app(environ, start_response)
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok")
        if path == "/readyz":
            return self._ready(start_response)
        if path == "/":
            return _text(
                start_response,
                "200 OK",
                f"gpuload relay: POST Alertmanager "
                f"notifications to {self._path}; see /metrics, /healthz, /readyz",
            )
        return _text(start_response, "404 Not Found", "not found")

    def _ready(self, start_response: StartResponse) -> list[bytes]:
        if self.stopping:
            return _text(start_response, "503 Service Unavailable", "stopping")
        try:
            self._queue.check()
        except sqlite3.Error as error:
            return _text(start_response, "503 Service Unavailable", f"queue unavailable: {error}")
        return _text(start_response, "200 OK", "ready")

    def preflight(self, environ: dict[str, Any]) -> Answer | None:
        """A notification refused on its head, before its body is read (see Server)."""
        if environ.get("PATH_INFO", "/") != self._path:
            return None
        if environ.get("REQUEST_METHOD") != "POST":
            self._metrics.rejected.labels("method").inc()
            return Answer(
                "405 Method Not Allowed",
                [("Allow", "POST"), *_PLAIN],
                b"POST Alertmanager notifications here\n",
            )
        if not self._auth.allows(environ.get("HTTP_AUTHORIZATION", "")):
            self._metrics.rejected.labels("unauthorized").inc()
            return Answer(
                "401 Unauthorized",
                [("WWW-Authenticate", f'{self._auth.scheme} realm="gpuload relay"'), *_PLAIN],
                b"unauthorized: send the configured credentials\n",
            )
        if "CONTENT_LENGTH" not in environ:
            self._metrics.rejected.labels("no_length").inc()
            return Answer("411 Length Required", _PLAIN, b"a Content-Length is required\n")
        length = int(environ["CONTENT_LENGTH"])  # digits only: the server checked
        if length > self._max_body:
            self._metrics.rejected.labels("too_large").inc()
            self._problems.report(
                "too_large",
                "refused a notification over web.max_body_bytes (%d bytes), which Alertmanager "
                "drops: set max_alerts in the receiver's webhook_configs (or raise the limit)",
                self._max_body,
            )
            reason = (
                f"body of {length} bytes is over the limit of {self._max_body}; set max_alerts "
                "in this receiver's webhook_configs to send fewer alerts per notification\n"
            )
            return Answer("413 Content Too Large", _PLAIN, reason.encode())
        return None

    def _notification(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        refused = refused_unless_preflighted(self.preflight, environ, start_response)
        if refused is not None:
            return refused
        body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        try:
            notification = payload.parse(body)
        except payload.PayloadError as error:
            self._metrics.rejected.labels("malformed").inc()
            return _text(start_response, "400 Bad Request", str(error))
        return self._commit(notification, start_response)

    def _commit(
        self, notification: payload.Notification, start_response: StartResponse
    ) -> list[bytes]:
        rows = []
        for target, indexes in self.routes(notification).items():
            subset = notification.subset(indexes)
            rows.append((target, subset.dedup_key(), subset.to_json(), notification.group_key))
        with self._idle:
            self._in_flight += 1
        try:
            results = self._queue.enqueue(rows, self._clock(), self._max_age) if rows else []
        except sqlite3.DataError as error:
            # This notification alone cannot be stored: sending it again would not help.
            self._metrics.rejected.labels("malformed").inc()
            return _text(start_response, "400 Bad Request", str(error).splitlines()[0])
        except sqlite3.Error as error:
            self._metrics.rejected.labels("storage").inc()
            self._problems.report(
                "storage",
                "cannot commit notifications to %s: %s; answering 503 so Alertmanager retries",
                self._queue.path,
                error,
            )
            return _text(start_response, "503 Service Unavailable", f"cannot store it: {error}")
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
        self._problems.resolve("storage", "committing notifications to %s again", self._queue.path)
        self._problems.resolve("too_large", "accepting notifications within the size limit again")
        self._metrics.received.inc()
        if not rows:
            self._problems.report(
                "unrouted",
                "a notification matched no route and the top route has no targets: dropped",
            )
        for target, queued in results:
            if queued:
                self._wake(target)
            else:
                self._metrics.duplicates.labels(target).inc()
        return _text(start_response, "200 OK", "queued")

    def routes(self, notification: payload.Notification) -> dict[str, list[int]]:
        """Which alerts (by index) go to which target."""
        chosen: dict[str, list[int]] = {}
        for index, alert in enumerate(notification.alerts):
            for target in targets_for(self._route, alert.labels):
                chosen.setdefault(target, []).append(index)
        return chosen

    def drain(self, timeout: float) -> bool:
        """Wait until no commit is in progress; False if one still is after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True


def _text(start_response: StartResponse, status: str, body: str) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [body.encode() + b"\n"]
