"""How the one HTTP server of `gpuload serve` and `gpuload relay` reads a request (RFC 9112).

Exact bytes are sent over raw sockets to real processes, and everything they answer until
they close is read back. A head the server could read two ways is refused with one answer
that says what was wrong, and nothing after it on that connection is read as a request:
what a proxy in front of it forwards as one request must never be two here, nor the reverse.
Refusals that need only the head (no credentials, too large) come before the body is sent.
"""

from __future__ import annotations

import base64
import json
import re
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import bcrypt
import pytest
import requests
import yaml
from helpers import Daemon, parse_metrics, start_daemon
from relay_helpers import notification, start_relay_process, write_config

from exporter.web.server import MAX_BODY

USER, PASSWORD = "prometheus", "correct horse battery staple"
CREDENTIALS = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
TOKEN = "relay-t0ken"
RELAY_MAX_BODY = 4096


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    running = start_daemon("--simulate", "mixed")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An exporter over plain HTTP whose web config has basic auth and nothing else."""
    # Cost 4: the tests are about when the check happens, not about bcrypt's slowness.
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web_config = tmp_path_factory.mktemp("guarded") / "web.yml"
    web_config.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    running = start_daemon("--simulate", "mixed", "--web.config.file", str(web_config))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A relay with a bearer token and a small body limit; its target is never reached."""
    directory = tmp_path_factory.mktemp("relay")
    web = {
        "listen_address": "127.0.0.1:0",
        "auth": {"bearer_token_env": "RELAY_TOKEN"},
        "max_body_bytes": RELAY_MAX_BODY,
    }
    config = write_config(
        directory,
        {
            "web": web,
            "targets": {"hook": {"type": "webhook", "url": "http://127.0.0.1:9/hook"}},
            "route": {"targets": ["hook"]},
        },
    )
    running = start_relay_process(config, env={"RELAY_TOKEN": TOKEN})
    yield running
    running.stop()


# --- sending bytes and reading answers ----------------------------------------------------


def address(server: Daemon) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    return host, int(port)


def shown(received: bytes) -> str:
    """``received`` for an assertion message: its start and end if it is long."""
    if len(received) <= 600:
        return repr(received)
    return f"{received[:400]!r} ... ({len(received)} bytes) ... {received[-150:]!r}"


def read_to_end(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes (a 10 s timeout on each read)."""
    received = b""
    try:
        while chunk := connection.recv(1 << 16):
            received += chunk
    except TimeoutError:
        raise AssertionError(f"not closed 10 s after sending {shown(received)}") from None
    return received


def read_answer(connection: socket.socket) -> bytes:
    """The first answer on ``connection`` (a 100 Continue too), read whole, nothing after it."""
    received = b""
    while True:
        head, blank, body = received.partition(b"\r\n\r\n")
        if blank:
            length = re.search(rb"\r\nContent-Length: ([0-9]+)\r\n", head + b"\r\n")
            if len(body) >= (int(length.group(1)) if length else 0):
                return received
        # A server that waits for more (such as the body) before answering times this out.
        chunk = connection.recv(1 << 16)
        assert chunk, f"closed before a whole answer: {shown(received)}"
        received += chunk


def exchange(server: Daemon, request: bytes) -> bytes:
    """Send ``request`` in one write; everything answered until the server closes."""
    with socket.create_connection(address(server), timeout=10) as connection:
        connection.sendall(request)
        return read_to_end(connection)


@dataclass
class Reply:
    """One answer read back: its status, headers (names in lower case) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("latin-1")


def replies(received: bytes) -> list[Reply]:
    """The answers in ``received``, one after the other, each framed by its Content-Length.

    Interim (1xx) answers are in the list too.
    """
    found: list[Reply] = []
    rest = received
    while rest:
        head, blank, rest = rest.partition(b"\r\n\r\n")
        assert blank, f"an answer whose head does not end: {shown(received)}"
        status_line, *lines = head.split(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 "), f"not a status line: {shown(received)}"
        status = int(status_line.split(b" ")[1])
        headers = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.lower()] = value.strip()
        length = int(headers.get("content-length", "0")) if status >= 200 else 0
        assert len(rest) >= length, f"shorter than its Content-Length: {shown(received)}"
        found.append(Reply(status, headers, rest[:length]))
        rest = rest[length:]
    return found


def finals(received: bytes) -> list[Reply]:
    """The final answers in ``received``: a 100 Continue is only an interim one."""
    return [reply for reply in replies(received) if reply.status >= 200]


def the_one_answer(received: bytes, status: int, says: str) -> Reply:
    """The only answer in ``received``: of ``status``, and its body says ``says`` (any case)."""
    answers = finals(received)
    assert [answer.status for answer in answers] == [status], shown(received)
    assert says.lower() in answers[0].text.lower(), shown(received)
    return answers[0]


def refused(server: Daemon, request: bytes, status: int, says: str) -> Reply:
    """Send ``request``: one answer, ``status``, saying ``says``; the server goes on serving."""
    answer = the_one_answer(exchange(server, request), status, says)
    assert server.get("/healthz").text.strip() == "ok"
    assert "Traceback" not in server.log()
    return answer


def get(*lines: bytes, version: bytes = b"HTTP/1.1", target: bytes = b"/healthz") -> bytes:
    """A GET whose head has these header lines (none added), then Connection: close."""
    head = [b"GET " + target + b" " + version, *lines, b"Connection: close"]
    return b"\r\n".join([*head, b"", b""])


def post(*lines: bytes, body: bytes = b"", target: bytes = b"/metrics") -> bytes:
    """A POST with Host, these header lines and ``body`` (no Content-Length added)."""
    head = [b"POST " + target + b" HTTP/1.1", b"Host: x", *lines]
    return b"\r\n".join([*head, b"", b""]) + body


# --- header lines --------------------------------------------------------------------------


def test_a_header_name_read_as_content_length_by_wsgi_cannot_smuggle_a_request(
    daemon: Daemon,
) -> None:
    # WSGI names both "Content-Length" and "Content_Length" CONTENT_LENGTH: a proxy that
    # forwards this as one request without a body, and a server that read the second
    # request as its body (or the reverse), would answer a different number of requests.
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    first = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent_Length: %d\r\n\r\n" % len(smuggled)
    refused(daemon, first + smuggled, 400, "'Content_Length'")


def test_a_good_request_pipelined_after_a_good_one_is_answered_too(daemon: Daemon) -> None:
    # The smuggling test's bytes without the underscored header: two answers.
    answer = exchange(
        daemon,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    scrape, health = finals(answer)
    assert scrape.status == health.status == 200
    assert "gpu_up{" in scrape.text
    assert health.text == "ok\n"


@pytest.mark.parametrize(
    "line",
    [
        b"X_Forwarded_For: 10.0.0.1",
        b"Transfer_Encoding: chunked",
        b"X(1): a",
        b"X@Y: a",
        b"X/Y: a",
        b'"X": a',
        b"X\x00Y: a",
        b"\xc3\x9cber: a",
        b": no name",
    ],
)
def test_a_header_name_outside_token_or_with_an_underscore_is_refused(
    daemon: Daemon, line: bytes
) -> None:
    refused(daemon, get(b"Host: x", line), 400, "a header name must be")


@pytest.mark.parametrize("line", [b"Content-Length : 5", b"Content-Length\t: 5", b"Host : y"])
def test_whitespace_before_the_colon_is_refused(daemon: Daemon, line: bytes) -> None:
    # RFC 9112 5.1: a proxy may read "Content-Length : 5" as a header of another name.
    refused(daemon, get(b"Host: x", line) + b"hello", 400, "a header name must be")


@pytest.mark.parametrize("continuation", [b" b", b"\tb", b" Content-Length: 5"])
def test_an_obsolete_folded_header_line_is_refused(daemon: Daemon, continuation: bytes) -> None:
    refused(daemon, get(b"Host: x", b"X-A: a", continuation), 400, "a folded header line")


@pytest.mark.parametrize("value", [b"a\x00b", b"a\x01b", b"\x1b[31m", b"a\x7fb", b"a\x0bb"])
def test_a_control_character_in_a_header_value_is_refused(daemon: Daemon, value: bytes) -> None:
    refused(daemon, get(b"Host: x", b"X-A: " + value), 400, "a control character in a header")


def test_a_tab_in_a_header_value_is_accepted(daemon: Daemon) -> None:
    the_one_answer(exchange(daemon, get(b"Host: x", b"X-A: a\tb")), 200, "ok")


@pytest.mark.parametrize(
    "request_bytes",
    [
        get(b"Host: x", b"X-A: a\rb"),
        get(b"Host: x", b"X-A: a\r"),
        get(b"Host: x\rContent-Length: 5"),
        get(b"Host: x", target=b"/heal\rthz"),
    ],
    ids=["inside-a-value", "at-the-end-of-a-value", "as-a-line-end", "in-the-request-line"],
)
def test_a_bare_cr_in_the_head_is_refused(daemon: Daemon, request_bytes: bytes) -> None:
    refused(daemon, request_bytes, 400, "a bare CR in the head")


# --- Content-Length and Transfer-Encoding --------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"+5", b"-5", b"5, 5", b"5,5", b"0x5", b"5.0", b"5 5", b"", b"\xef\xbc\x95", b"1" * 20],
    ids=lambda value: repr(value),
)
def test_content_length_must_be_digits_only(daemon: Daemon, value: bytes) -> None:
    request = post(b"Content-Length: " + value, b"Connection: close", body=b"hello")
    refused(daemon, request, 400, "Content-Length must be one number")


@pytest.mark.parametrize(
    "lines",
    [
        (b"Content-Length: 5", b"Content-Length: 5"),
        (b"Content-Length: 5", b"Content-Length: 6"),
        (b"Content-Length: 5", b"content-length: 5"),
    ],
    ids=["equal", "different", "other-case"],
)
def test_content_length_must_appear_once(daemon: Daemon, lines: tuple[bytes, bytes]) -> None:
    request = post(*lines, b"Connection: close", body=b"hello")
    refused(daemon, request, 400, "more than one Content-Length")


@pytest.mark.parametrize(
    "lines",
    [
        (b"Content-Length: 5", b"Transfer-Encoding: chunked"),
        (b"Transfer-Encoding: chunked", b"Content-Length: 5"),
        (b"Transfer-Encoding: identity", b"Content-Length: 5"),
    ],
)
def test_content_length_with_transfer_encoding_is_refused(
    daemon: Daemon, lines: tuple[bytes, bytes]
) -> None:
    request = post(*lines, body=b"5\r\nhello\r\n0\r\n\r\n")
    refused(daemon, request, 400, "both Content-Length and Transfer-Encoding")


@pytest.mark.parametrize("coding", [b"chunked", b"gzip, chunked", b"identity"])
def test_transfer_encoding_alone_asks_for_a_length(daemon: Daemon, coding: bytes) -> None:
    # The chunks after the head are not read as a next request: one answer.
    request = post(b"Transfer-Encoding: " + coding, body=b"5\r\nhello\r\n0\r\n\r\n")
    refused(daemon, request, 411, "Content-Length")


# --- Expect ----------------------------------------------------------------------------------


def test_expect_100_continue_is_answered_before_the_body_is_sent(daemon: Daemon) -> None:
    head = post(b"Expect: 100-continue", b"Content-Length: 3", b"Connection: close")
    with socket.create_connection(address(daemon), timeout=10) as connection:
        connection.sendall(head)
        received = read_answer(connection)
        assert received == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.sendall(b"abc")
        received += read_to_end(connection)
    # prometheus_client answers POST /metrics with 405: it had the whole request.
    assert [reply.status for reply in replies(received)] == [100, 405]
    the_one_answer(received, 405, "POST")


def test_expect_100_continue_without_a_body_gets_only_the_answer(daemon: Daemon) -> None:
    answer = exchange(daemon, get(b"Host: x", b"Expect: 100-continue"))
    assert [reply.status for reply in replies(answer)] == [200]


def test_expect_100_continue_on_a_refused_request_gets_only_the_refusal(daemon: Daemon) -> None:
    request = post(b"Expect: 100-continue", b"Content-Length: %d" % (MAX_BODY + 1))
    answer = exchange(daemon, request)
    assert [reply.status for reply in replies(answer)] == [413]


@pytest.mark.parametrize("value", [b"something", b"100-continue, x", b"200-ok"])
def test_an_expectation_other_than_100_continue_is_refused(daemon: Daemon, value: bytes) -> None:
    refused(daemon, get(b"Host: x", b"Expect: " + value), 417, "cannot meet Expect")


def test_expect_is_ignored_on_http_1_0(daemon: Daemon) -> None:
    # An HTTP/1.0 client cannot wait for a 100: neither a 417 nor a 100 is sent.
    answer = exchange(daemon, get(b"Expect: something", version=b"HTTP/1.0"))
    the_one_answer(answer, 200, "ok")
    request = b"POST /metrics HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"
    answer = exchange(daemon, request)
    assert [reply.status for reply in replies(answer)] == [405]


# --- Host ------------------------------------------------------------------------------------


def test_an_http_1_1_request_without_host_is_refused(daemon: Daemon) -> None:
    refused(daemon, get(), 400, "an HTTP/1.1 request without Host")


@pytest.mark.parametrize("second", [b"Host: x", b"Host: y", b"host: x"])
def test_two_host_lines_are_refused(daemon: Daemon, second: bytes) -> None:
    refused(daemon, get(b"Host: x", second), 400, "more than one Host")


@pytest.mark.parametrize("value", [b"a/b", b"user@x", b"a b", b"x:80:80", b"[::1", b"x?y"])
def test_an_invalid_host_is_refused(daemon: Daemon, value: bytes) -> None:
    refused(daemon, get(b"Host: " + value), 400, "Host is not a host name")


@pytest.mark.parametrize(
    "value", [b"x", b"127.0.0.1:9400", b"[::1]:9400", b"gpu-node-7.example.com", b""]
)
def test_a_valid_host_is_accepted(daemon: Daemon, value: bytes) -> None:
    the_one_answer(exchange(daemon, get(b"Host: " + value)), 200, "ok")


def test_an_http_1_0_request_without_host_is_answered(daemon: Daemon) -> None:
    the_one_answer(exchange(daemon, get(version=b"HTTP/1.0")), 200, "ok")


# --- the request line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"GET  /healthz HTTP/1.1",
        b"GET /healthz  HTTP/1.1",
        b" GET /healthz HTTP/1.1",
        b"GET /healthz HTTP/1.1 ",
        b"GET\t/healthz HTTP/1.1",
        b"GET /healthz",
        b"GET /healthz HTTP/1.1 x",
        b"GET /healthz http/1.1",
        b"GET /healthz HTTP/1",
        b"G(ET /healthz HTTP/1.1",
    ],
)
def test_a_request_line_must_be_method_target_version(daemon: Daemon, line: bytes) -> None:
    refused(daemon, line + b"\r\nHost: x\r\n\r\n", 400, "not a request line")


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/3.0"])
def test_a_version_other_than_1_0_and_1_1_is_not_supported(daemon: Daemon, version: bytes) -> None:
    answer = refused(daemon, get(b"Host: x", version=version), 505, "HTTP/1.1 expected")
    assert version.decode() in answer.text


def test_a_later_http_1_minor_version_is_read_as_1_1(daemon: Daemon) -> None:
    (reply,) = finals(exchange(daemon, get(b"Host: x", version=b"HTTP/1.2")))
    assert reply.status == 200


@pytest.mark.parametrize("target", [b"healthz", b"*", b"?name[]=gpu_up", b"http:/x/healthz"])
def test_a_target_must_start_with_a_slash(daemon: Daemon, target: bytes) -> None:
    refused(daemon, get(b"Host: x", target=target), 400, "a request target must start with /")


def test_an_absolute_target_is_served_by_its_path(daemon: Daemon) -> None:
    answer = exchange(daemon, get(b"Host: x", target=b"http://x/healthz"))
    the_one_answer(answer, 200, "ok")


def test_options_asterisk_reaches_the_application(daemon: Daemon) -> None:
    request = b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    # The exporter has no page "*": a 404 from the application, not a 400 from the server.
    the_one_answer(exchange(daemon, request), 404, "not found")


# --- the body --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [100_000, MAX_BODY])
def test_a_body_reaches_the_application_whole(daemon: Daemon, size: int) -> None:
    # prometheus_client answers POST /metrics with 405 once it has the request; a body read
    # short would leave its rest to be read as a next request, a 400 after the 405.
    request = post(b"Connection: close", b"Content-Length: %d" % size, body=b"x" * size)
    the_one_answer(exchange(daemon, request), 405, "POST")


def test_a_body_that_does_not_come_in_time_gets_408_from_both_daemons(
    daemon: Daemon, relay: Daemon
) -> None:
    # Several at once on each: the server's sweeper, which shuts connections down at their
    # deadline without a word, once won the race against the reader's 408 now and then.
    authorized = b"Authorization: Bearer " + TOKEN.encode()
    requests_by_server = [
        (daemon, post(b"Content-Length: 10", body=b"abc")),
        (relay, post(authorized, b"Content-Length: 100", body=b"abc", target=b"/alerts")),
    ]

    def late(server: Daemon, request: bytes) -> bytes:
        with socket.create_connection(address(server), timeout=30) as connection:
            connection.sendall(request)
            return read_to_end(connection)

    with ThreadPoolExecutor(8) as pool:
        answers = [
            (server, pool.submit(late, server, request))
            for server, request in requests_by_server
            for _ in range(4)
        ]
        for server, answer in answers:
            assert answer.result().startswith(b"HTTP/1.1 408 "), (server.url, answer.result())
            the_one_answer(answer.result(), 408, "the body came too slowly")


def test_a_refused_body_sent_after_the_refusal_is_read_and_dropped(daemon: Daemon) -> None:
    # Many clients send their body whatever is answered meanwhile. A server that closed at
    # once would reset the connection on the first byte of it, and the client, still
    # sending, would see an error instead of the answer: the server reads and drops it first.
    with socket.create_connection(address(daemon), timeout=10) as connection:
        connection.sendall(post(b"Content-Length: %d" % (MAX_BODY + 1)))
        # The answer, and the end of what the server sends: it has stopped writing, not reading.
        received = read_to_end(connection)
        # In pieces: a closed server's reset comes back on loopback before the next one.
        for _ in range(20):
            connection.sendall(b"x" * 10_000)
    the_one_answer(received, 413, f"over {MAX_BODY}")
    assert daemon.get("/healthz").text == "ok\n"


# --- refusals before the body: basic auth and the relay --------------------------------------


@pytest.mark.parametrize("expect", [(), (b"Expect: 100-continue",)], ids=["plain", "expect"])
def test_a_client_without_credentials_is_refused_before_sending_its_body(
    guarded: Daemon, expect: tuple[bytes, ...]
) -> None:
    # No body byte is sent: a server that waited for it would answer 408 after its 10 s
    # deadline, or time this client's 10 s read out.
    answer = exchange(guarded, post(b"Content-Length: 500000", *expect))
    assert [reply.status for reply in replies(answer)] == [401], shown(answer)
    refusal = the_one_answer(answer, 401, "unauthorized")
    assert refusal.headers["www-authenticate"].startswith("Basic")
    assert refusal.headers["connection"] == "close"


def test_a_client_with_credentials_gets_100_continue_and_the_answer(guarded: Daemon) -> None:
    head = post(
        b"Authorization: " + CREDENTIALS.encode(),
        b"Expect: 100-continue",
        b"Content-Length: 3",
        b"Connection: close",
    )
    with socket.create_connection(address(guarded), timeout=10) as connection:
        connection.sendall(head)
        interim = read_answer(connection)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.sendall(b"abc")
        received = interim + read_to_end(connection)
    the_one_answer(received, 405, "POST")


def test_a_refused_request_without_a_body_keeps_its_connection(guarded: Daemon) -> None:
    answer = exchange(
        guarded,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert [(reply.status, reply.text) for reply in finals(answer)] == [
        (401, "unauthorized: send a user and password of basic_auth_users\n"),
        (200, "ok\n"),
    ]


@pytest.mark.parametrize(
    ("lines", "status", "says"),
    [
        ((b"Content-Length: 500000",), 401, "unauthorized"),
        ((b"Authorization: Bearer wrong", b"Content-Length: 500000"), 401, "unauthorized"),
        (
            (b"Authorization: Bearer " + TOKEN.encode(), b"Content-Length: 500000"),
            413,
            f"over the limit of {RELAY_MAX_BODY}",
        ),
        (
            (b"Authorization: Bearer " + TOKEN.encode(), b"Connection: close"),
            411,
            "a Content-Length is required",
        ),
    ],
    ids=["no-credentials", "wrong-token", "too-large", "no-length"],
)
def test_the_relay_refuses_a_notification_before_its_body_is_sent(
    relay: Daemon, lines: tuple[bytes, ...], status: int, says: str
) -> None:
    answer = exchange(relay, post(*lines, target=b"/alerts"))
    the_one_answer(answer, status, says)
    assert relay.get("/healthz").status_code == 200


def test_the_relay_takes_a_notification_with_its_token(relay: Daemon) -> None:
    # The refusals above are of these credentials' absence, not of every request.
    body = json.dumps(notification()).encode()
    answer = requests.post(
        relay.url + "alerts",
        data=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


# --- requests that are fine ------------------------------------------------------------------


def test_head_of_metrics_answers_the_headers_of_a_scrape(daemon: Daemon) -> None:
    scrape = daemon.get("/metrics")
    head = requests.head(daemon.url + "metrics", timeout=10)
    assert scrape.status_code == head.status_code == 200
    assert head.headers["Content-Type"] == scrape.headers["Content-Type"]
    assert int(head.headers["Content-Length"]) > 1000
    assert head.content == b""
    openmetrics = {"Accept": "application/openmetrics-text;version=1.0.0"}
    head = requests.head(daemon.url + "metrics", headers=openmetrics, timeout=10)
    assert head.status_code == 200
    assert head.headers["Content-Type"].startswith("application/openmetrics-text")


def test_one_connection_carries_several_requests(daemon: Daemon) -> None:
    answer = exchange(
        daemon,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    answers = finals(answer)
    assert [(reply.status, reply.text) for reply in answers] == [
        (200, "ok\n"),
        (200, "ready\n"),
        (200, "ok\n"),
    ]
    assert [reply.headers.get("connection") for reply in answers] == [None, None, "close"]


def test_an_http_1_0_request_closes_its_connection(daemon: Daemon) -> None:
    answer = exchange(daemon, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n")
    the_one_answer(answer, 200, "ok")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048577\r\n\r\n", 413),
        (b"GET /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /" + b"a" * 17000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"A: b\r\n" * 101 + b"\r\n", 431),
    ],
)
def test_a_bad_request_is_answered_and_the_daemon_goes_on(
    daemon: Daemon, request_bytes: bytes, status: int
) -> None:
    answer = the_one_answer(exchange(daemon, request_bytes), status, "")
    assert answer.text.strip()  # says what was wrong
    assert daemon.get("/healthz").text == "ok\n"


def test_name_filtering_and_unknown_pages(daemon: Daemon) -> None:
    filtered = daemon.get("/metrics", params={"name[]": "gpu_up"})
    names = {name for name, _ in parse_metrics(filtered.text)}
    assert names == {"gpu_up"}
    assert daemon.get("/no-such-page").status_code == 404
