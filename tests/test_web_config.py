"""`--web.config.file`: TLS, client certificates and basic auth, with real processes and clients.

A throwaway CA, server and client certificates are made here with `cryptography`; real
`gpuload serve --simulate idle` and `gpuload relay` processes are started with web config
files and asked by `requests` and by raw `ssl` sockets.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import re
import select
import socket
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from helpers import ROOT, Daemon, follow, wait_until
from relay_helpers import alert, notification, write_config

from exporter import config
from exporter.relay import config as relay_config
from exporter.relay import settings as relay_settings
from exporter.web import webconfig
from exporter.web.answers import PREFLIGHTED
from exporter.web.server import Server

PASSWORD = "correct horse battery staple"
# Cost 4: the tests are about the checks, not bcrypt's slowness.
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
# Linux's shortest delayed ACK (TCP_DELACK_MIN, HZ/25): what Nagle's algorithm waits for.
DELAYED_ACK_MIN = 0.040


# --- certificates -----------------------------------------------------------------------


@dataclass
class Authority:
    """A CA that signs server and client certificates into a directory."""

    name: str
    directory: Path
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )

    def __post_init__(self) -> None:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)])
        self.certificate = (
            _builder(subject, subject, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_file = self._write(f"{self.name}.crt", self.certificate, None)

    def issue(self, name: str, *, server: bool) -> tuple[Path, Path]:
        """A certificate and key for 127.0.0.1 (server) or a client; their file paths."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        usage = (
            x509.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.ExtendedKeyUsageOID.CLIENT_AUTH
        )
        sans: list[x509.GeneralName] = [x509.DNSName(name)]
        if server:
            sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        certificate = (
            _builder(subject, self.certificate.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return self._write(f"{name}.crt", certificate, None), self._write(f"{name}.key", None, key)

    def _write(
        self,
        name: str,
        certificate: x509.Certificate | None,
        key: ec.EllipticCurvePrivateKey | None,
    ) -> Path:
        path = self.directory / name
        if certificate is not None:
            path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        else:
            assert key is not None
            path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return path


def _builder(subject: x509.Name, issuer: x509.Name, public_key: Any) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


@dataclass
class PKI:
    """The good CA with its server and client certificates, and a stranger CA with its own."""

    directory: Path
    ca: Authority
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    other_ca: Authority
    other_server: tuple[Path, Path]
    other_client: tuple[Path, Path]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    ca = Authority("good-ca", directory)
    other = Authority("other-ca", directory)
    return PKI(
        directory=directory,
        ca=ca,
        server=ca.issue("server", server=True),
        client=ca.issue("scraper", server=False),
        other_ca=other,
        other_server=other.issue("other-server", server=True),
        other_client=other.issue("intruder", server=False),
    )


def tls_section(pki: PKI, **extra: Any) -> dict[str, Any]:
    return {"cert_file": str(pki.server[0]), "key_file": str(pki.server[1]), **extra}


def write_web_config(directory: Path, document: dict[str, Any], name: str = "web.yml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(document))
    return path


# --- processes ----------------------------------------------------------------------------


def start(*args: str, env: dict[str, str] | None = None) -> Daemon:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    environment.update(env or {})
    environment["PYTHONUNBUFFERED"] = "1"
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", *args],
        cwd=ROOT,
        env=environment,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    return follow(process, what=f"gpuload {args[0]}", timeout=20)


@pytest.fixture(scope="module")
def processes() -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def launch(*args: str, **kwargs: Any) -> Daemon:
        running = start(*args, **kwargs)
        started.append(running)
        return running

    yield launch
    for running in started:
        running.process.terminate()
    for running in started:
        try:
            running.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            running.process.kill()


def serve(launch: Callable[..., Daemon], web_config: Path, **kwargs: Any) -> Daemon:
    return launch(
        "serve",
        "--simulate",
        "idle",
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.config.file",
        str(web_config),
        **kwargs,
    )


def client_context(
    ca: Path | None, cert: tuple[Path, Path] | None = None, **versions: ssl.TLSVersion
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    for name, version in versions.items():
        setattr(context, name, version)
    return context


def raw_get(url: str, context: ssl.SSLContext, path: str = "/healthz") -> bytes:
    """A GET over a raw TLS socket; raises ssl.SSLError or OSError when TLS refuses."""
    host, port = url.removeprefix("https://").rstrip("/").rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as plain,
        context.wrap_socket(plain, server_hostname=host) as tls,
    ):
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    if not answer:
        raise ConnectionResetError("closed without an answer")
    return answer


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


# --- the exporter -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(pki: PKI, processes: Callable[..., Daemon]) -> Daemon:
    """An exporter with TLS (no client certificates), basic auth and security headers."""
    path = write_web_config(
        pki.directory,
        {
            "tls_server_config": tls_section(pki),
            "basic_auth_users": {"prometheus": HASH},
            "http_server_config": {"headers": {"X-Frame-Options": "deny"}},
        },
        "guarded.yml",
    )
    running = serve(processes, path)
    wait_until(
        lambda: requests.get(running.url + "readyz", verify=pki.ca.cert_file, timeout=5).ok,
        what="readiness over TLS",
    )
    return running


def test_tls_with_the_right_ca_and_password_serves_metrics(pki: PKI, guarded: Daemon) -> None:
    assert guarded.url.startswith("https://127.0.0.1:")
    answer = requests.get(
        guarded.url + "metrics",
        verify=pki.ca.cert_file,
        headers=basic("prometheus", PASSWORD),
        timeout=5,
    )
    assert answer.status_code == 200
    assert "gpu_info" in answer.text
    assert answer.headers["X-Frame-Options"] == "deny"


def test_a_client_trusting_another_ca_fails_the_handshake(pki: PKI, guarded: Daemon) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(guarded.url + "healthz", verify=pki.other_ca.cert_file, timeout=5)


def test_a_client_that_never_handshakes_holds_up_no_one(pki: PKI, guarded: Daemon) -> None:
    host, port = guarded.url.removeprefix("https://").rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        # The handshake runs in the connection's thread, not in the accepting one.
        answer = requests.get(guarded.url + "healthz", verify=pki.ca.cert_file, timeout=5)
        assert answer.status_code == 200


def test_plain_http_to_a_tls_listener_gets_no_answer(guarded: Daemon) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(guarded.url.replace("https://", "http://") + "metrics", timeout=5)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({}, "no Authorization header"),
        (basic("prometheus", "wrong password"), "wrong password"),
        (basic("someone", PASSWORD), "unknown user"),
        ({"Authorization": "Bearer " + PASSWORD}, "another scheme"),
        ({"Authorization": "Basic not-base64!"}, "malformed"),
    ],
)
def test_missing_or_wrong_credentials_get_401(
    pki: PKI, guarded: Daemon, headers: dict[str, str], why: str
) -> None:
    for path in ("metrics", "", "api/v1/status"):
        answer = requests.get(
            guarded.url + path, verify=pki.ca.cert_file, headers=headers, timeout=5
        )
        assert answer.status_code == 401, (why, path)
        assert answer.headers["WWW-Authenticate"].startswith("Basic"), why
        assert answer.headers["X-Frame-Options"] == "deny"
        assert "gpu_" not in answer.text


def test_health_and_readiness_answer_without_credentials(pki: PKI, guarded: Daemon) -> None:
    # Kubernetes probes carry no credentials; these paths reveal nothing but "alive"/"ready".
    for path, body in (("healthz", "ok"), ("readyz", "ready")):
        answer = requests.get(guarded.url + path, verify=pki.ca.cert_file, timeout=5)
        assert answer.status_code == 200
        assert answer.text.strip() == body


def test_password_and_hash_never_reach_logs_or_metrics(pki: PKI, guarded: Daemon) -> None:
    for password in (PASSWORD, "wrong password"):
        requests.get(
            guarded.url + "metrics",
            verify=pki.ca.cert_file,
            headers=basic("prometheus", password),
            timeout=5,
        )
    metrics = requests.get(
        guarded.url + "metrics",
        verify=pki.ca.cert_file,
        headers=basic("prometheus", PASSWORD),
        timeout=5,
    ).text
    logged = guarded.log()
    assert "basic auth (1 users)" in logged
    for secret in (PASSWORD, HASH, HASH[7:], "wrong password"):
        assert secret not in logged
        assert secret not in metrics


def test_kept_alive_tls_scrapes_uncompressed_are_not_held_by_delayed_acks(
    pki: PKI, guarded: Daemon
) -> None:
    """An uncompressed answer is several TLS records, each its own send; a gzipped one is one.

    Without TCP_NODELAY, Nagle's algorithm holds the records after the first until the client
    ACKs it, which on a kept-alive connection it delays by Linux's delayed-ACK minimum, 40 ms:
    each uncompressed scrape took ~44 ms against ~0.2 ms gzipped. The stall is that pair: an
    uncompressed median of 40 ms or more, and over 10 times the gzipped one. Either alone is
    not: at a load of 10 on 2 cores, uncompressed scrapes took 19 times the gzipped ones
    (3.8 against 0.2 ms: more records to encrypt and read while waiting for a CPU), and a slow
    enough machine could take 40 ms over any scrape.
    """
    host, port = guarded.url.removeprefix("https://").rstrip("/").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    context.check_hostname = False
    authorization = basic("prometheus", PASSWORD)["Authorization"]
    # A plain TLS socket as the client: a library's own overhead per request (~4 ms through
    # requests on a loaded machine) would hide the difference measured.
    connections, took = {}, {}
    for encoding in ("identity", "gzip"):
        raw = socket.create_connection((host, int(port)), timeout=10)
        connections[encoding] = context.wrap_socket(raw).makefile("rwb")
        took[encoding] = []

    def scrape(encoding: str) -> tuple[dict[str, str], bytes]:
        stream = connections[encoding]
        stream.write(
            f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nAuthorization: {authorization}\r\n"
            f"Accept-Encoding: {encoding}\r\n\r\n".encode()
        )
        stream.flush()
        status = stream.readline()
        assert status.startswith(b"HTTP/1.1 200 "), status
        headers = {}
        while (line := stream.readline().strip()) != b"":
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.lower()] = value.strip()
        return headers, stream.read(int(headers["content-length"]))

    try:
        # The first scrape of each shakes hands and pays for bcrypt.
        plain_headers, plain = scrape("identity")
        zipped_headers, _ = scrape("gzip")
        assert "content-encoding" not in plain_headers
        assert zipped_headers["content-encoding"] == "gzip"
        # More than one TLS record (16 KiB at most): otherwise there is no second send to hold.
        assert len(plain) > 2 * 16384, "the scenario's answer is too small to tell"
        for _ in range(20):
            for encoding in connections:
                started = time.perf_counter()
                headers, _ = scrape(encoding)  # on the same kept-alive connection every time
                took[encoding].append(time.perf_counter() - started)
                assert "connection" not in headers
    finally:
        for stream in connections.values():
            stream.close()
    uncompressed, gzipped = statistics.median(took["identity"]), statistics.median(took["gzip"])
    print(f"median uncompressed {uncompressed * 1000:.2f} ms, gzip {gzipped * 1000:.2f} ms")
    held = uncompressed >= DELAYED_ACK_MIN and uncompressed > 10 * gzipped
    assert not held, (uncompressed, gzipped)


@pytest.fixture
def bcrypt_checks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, bytes]]:
    """(password, hash) of each bcrypt check from now on (bcrypt still checks them)."""
    checked: list[tuple[bytes, bytes]] = []
    check = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        checked.append((password, hashed))
        return check(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    return checked


def ok_app(environ: dict[str, Any], respond: Callable[..., Any]) -> list[bytes]:
    respond("200 OK", [])
    return [b"ok"]


def status_through(guard: webconfig.Guard, environ: dict[str, Any]) -> str:
    """The status the server answers through ``guard``: its preflight's refusal, else the app's.

    As the server does: the preflight on the head (where basic auth is checked), then the app.
    """
    refusal = guard.preflight(environ)
    if refusal is not None:
        return refusal.status
    statuses: list[str] = []
    guard({**environ, PREFLIGHTED: True}, lambda status, *_: statuses.append(status))
    return statuses[0]


def test_under_another_wsgi_server_the_guard_still_asks_for_credentials(tmp_path: Path) -> None:
    # No preflight ran (another server, a WSGI test client): the guard checks on the call.
    path = write_web_config(tmp_path, {"basic_auth_users": {"alice": HASH}})
    guard = webconfig.Guard(ok_app, webconfig.Watcher(webconfig.load(path)))
    for credentials, expected in (({}, "401 Unauthorized"), (basic("alice", PASSWORD), "200 OK")):
        environ = {"PATH_INFO": "/metrics"}
        if credentials:
            environ["HTTP_AUTHORIZATION"] = credentials["Authorization"]
        assert status_of_call(guard, environ) == expected


def status_of_call(app: Callable[..., Any], environ: dict[str, Any]) -> str:
    statuses: list[str] = []
    b"".join(app(environ, lambda status, *_: statuses.append(status)))
    return statuses[0]


def test_scrapes_after_the_first_skip_bcrypt(
    tmp_path: Path, bcrypt_checks: list[tuple[bytes, bytes]]
) -> None:
    # The server the exporter and the relay serve with, on a web config with basic auth.
    path = write_web_config(tmp_path, {"basic_auth_users": {"prometheus": HASH}})
    server = Server("127.0.0.1:0", ok_app, webconfig.load(path))
    server.start()
    try:
        session = requests.Session()
        session.headers.update(basic("prometheus", PASSWORD))
        for _ in range(21):
            assert session.get(server.url + "metrics", timeout=10).status_code == 200
    finally:
        server.stop()
    # One bcrypt check, the first scrape's: the 20 after it are known by their hash.
    assert [password for password, _ in bcrypt_checks] == [PASSWORD.encode()]


def test_a_successful_bcrypt_check_is_cached(
    tmp_path: Path, bcrypt_checks: list[tuple[bytes, bytes]]
) -> None:
    path = write_web_config(tmp_path, {"basic_auth_users": {"alice": HASH}})
    guard = webconfig.Guard(ok_app, webconfig.Watcher(webconfig.load(path)))
    statuses: list[str] = []

    def ask(user: str, password: str) -> None:
        environ = {
            "PATH_INFO": "/metrics",
            **{"HTTP_AUTHORIZATION": basic(user, password)["Authorization"]},
        }
        statuses.append(status_through(guard, environ))

    ask("alice", PASSWORD)
    assert len(bcrypt_checks) == 1
    for _ in range(10):
        ask("alice", PASSWORD)
    assert len(bcrypt_checks) == 1  # ten cached checks: no bcrypt
    # A wrong password, or an unknown user, always pays for bcrypt: failures are not cached.
    ask("alice", "not it")
    ask("alice", "not it")
    ask("mallory", PASSWORD)
    assert len(bcrypt_checks) == 4
    assert statuses == ["200 OK"] * 11 + ["401 Unauthorized"] * 3


def _cost(hashed: bytes | str) -> int:
    """The cost of a bcrypt hash: ``$2b$12$...`` -> 12."""
    text = hashed.decode() if isinstance(hashed, bytes) else hashed
    return int(text.split("$")[2])


def test_an_unknown_user_is_checked_at_the_highest_cost_of_the_users(
    tmp_path: Path, bcrypt_checks: list[tuple[bytes, bytes]]
) -> None:
    # bcrypt's time doubles with each step of cost: a dummy hash at a fixed 10 answered an
    # unknown user ~4 times faster than a user whose hash is at 12. Hashes of the two costs
    # (HASH's salt and digest with its cost changed: the checks read the cost from the hash).
    at_10, at_12 = f"$2b$10${HASH[7:]}", f"$2b$12${HASH[7:]}"
    path = write_web_config(tmp_path, {"basic_auth_users": {"alice": at_10, "bob": at_12}})
    security = webconfig.load(path)
    guard = webconfig.Guard(ok_app, webconfig.Watcher(security))
    environ = {
        "PATH_INFO": "/metrics",
        "HTTP_AUTHORIZATION": basic("mallory", "x")["Authorization"],
    }
    assert status_through(guard, environ) == "401 Unauthorized"
    # One bcrypt check, at the highest cost, against the hash chosen once at load.
    assert [(password, _cost(hashed)) for password, hashed in bcrypt_checks] == [(b"x", 12)]
    assert bcrypt_checks[0][1] == security.unknown_user_hash
    assert security.unknown_user_hash not in (at_10.encode(), at_12.encode())


@pytest.mark.parametrize(("costs", "expected"), [((4,), 4), ((10, 12), 12), ((13, 5, 11), 13)])
def test_the_unknown_users_hash_takes_the_highest_cost_whatever_the_order(
    tmp_path: Path, costs: tuple[int, ...], expected: int
) -> None:
    users = {f"user{i}": f"$2b${cost:02d}${HASH[7:]}" for i, cost in enumerate(costs)}
    path = write_web_config(tmp_path, {"basic_auth_users": users})
    assert _cost(webconfig.load(path).unknown_user_hash) == expected


@pytest.fixture(scope="module")
def mutual(pki: PKI, processes: Callable[..., Daemon]) -> Daemon:
    """An exporter that requires a client certificate from the good CA."""
    path = write_web_config(
        pki.directory,
        {
            "tls_server_config": tls_section(
                pki,
                client_auth_type="RequireAndVerifyClientCert",
                client_ca_file=str(pki.ca.cert_file),
            )
        },
        "mutual.yml",
    )
    return serve(processes, path)


def test_required_client_certificate_lets_a_good_one_in(pki: PKI, mutual: Daemon) -> None:
    answer = requests.get(
        mutual.url + "metrics", verify=pki.ca.cert_file, cert=tuple(map(str, pki.client)), timeout=5
    )
    assert answer.status_code == 200


@pytest.mark.parametrize("which", ["none", "other CA"])
def test_required_client_certificate_refuses_none_or_a_strangers(
    pki: PKI, mutual: Daemon, which: str
) -> None:
    cert = None if which == "none" else pki.other_client
    with pytest.raises((ssl.SSLError, OSError)):
        raw_get(mutual.url, client_context(pki.ca.cert_file, cert))
    # Nor with requests, the way a scraper asks.
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(
            mutual.url + "healthz",
            verify=pki.ca.cert_file,
            cert=None if cert is None else tuple(map(str, cert)),
            timeout=5,
        )


@pytest.fixture(scope="module")
def tls13_only(pki: PKI, processes: Callable[..., Daemon]) -> Daemon:
    """An exporter with min_version TLS13, its web config given by environment variable."""
    path = write_web_config(
        pki.directory, {"tls_server_config": tls_section(pki, min_version="TLS13")}, "tls13.yml"
    )
    return processes(
        "serve",
        "--simulate",
        "idle",
        "--web.listen-address",
        "127.0.0.1:0",
        env={"GPULOAD_WEB_CONFIG_FILE": str(path)},
    )


def test_min_version_tls13_refuses_a_tls12_client(pki: PKI, tls13_only: Daemon) -> None:
    with pytest.raises(ssl.SSLError, match=r"(?i)version"):
        raw_get(
            tls13_only.url, client_context(pki.ca.cert_file, maximum_version=ssl.TLSVersion.TLSv1_2)
        )
    answer = raw_get(
        tls13_only.url, client_context(pki.ca.cert_file, minimum_version=ssl.TLSVersion.TLSv1_3)
    )
    assert answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n")[0]


def test_a_renewed_certificate_is_served_without_restart(
    pki: PKI, processes: Callable[..., Daemon], tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server[0].read_bytes())
    key.write_bytes(pki.server[1].read_bytes())
    # Relative paths: beside the web config file.
    path = write_web_config(
        tmp_path, {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    )
    running = serve(processes, path)
    assert requests.get(running.url + "healthz", verify=pki.ca.cert_file, timeout=5).ok

    # The files are looked at on connections, at most once a second.
    def healthy(ca: Path) -> bool:
        try:
            return requests.get(running.url + "healthz", verify=ca, timeout=5).ok
        except requests.exceptions.SSLError:
            return False

    # A broken renewal (key of another certificate) keeps the old pair in force, logged once.
    key.write_bytes(pki.other_server[1].read_bytes())
    wait_until(
        lambda: healthy(pki.ca.cert_file) and "web config not reloaded" in running.log(),
        what="the rejected reload",
    )
    for _ in range(3):
        time.sleep(0.5)
        assert healthy(pki.ca.cert_file)
    assert running.log().count("web config not reloaded") == 1

    # The renewal completed (cert-manager, a Kubernetes secret): new handshakes use it.
    cert.write_bytes(pki.other_server[0].read_bytes())
    wait_until(lambda: healthy(pki.other_ca.cert_file), what="the renewed certificate")
    assert "reloaded" in running.log()


# --- the relay ----------------------------------------------------------------------------


def test_relay_serves_tls_and_basic_auth_from_its_config(
    pki: PKI, processes: Callable[..., Daemon], tmp_path: Path
) -> None:
    write_web_config(
        tmp_path,
        {"tls_server_config": tls_section(pki), "basic_auth_users": {"alertmanager": HASH}},
    )
    relay_file = write_config(
        tmp_path,
        {
            "web": {"listen_address": "127.0.0.1:0", "config_file": "web.yml"},
            # A relay refuses to start without a target; this one is never reached.
            "targets": {"hook": {"type": "webhook", "url": "http://127.0.0.1:9/hook"}},
            "route": {"targets": ["hook"]},
        },
    )
    running = processes("relay", "--config", str(relay_file))
    assert running.url.startswith("https://")
    body = notification(alert())
    good = basic("alertmanager", PASSWORD)
    answers = {
        "right": requests.post(
            running.url + "alerts", json=body, headers=good, verify=pki.ca.cert_file, timeout=5
        ),
        "wrong": requests.post(
            running.url + "alerts",
            json=body,
            headers=basic("alertmanager", "nope"),
            verify=pki.ca.cert_file,
            timeout=5,
        ),
        "none": requests.post(
            running.url + "alerts", json=body, verify=pki.ca.cert_file, timeout=5
        ),
        "metrics": requests.get(running.url + "metrics", verify=pki.ca.cert_file, timeout=5),
        "healthz": requests.get(running.url + "healthz", verify=pki.ca.cert_file, timeout=5),
    }
    assert {name: answer.status_code for name, answer in answers.items()} == {
        "right": 200,
        "wrong": 401,
        "none": 401,
        "metrics": 401,
        "healthz": 200,
    }
    assert answers["none"].headers["WWW-Authenticate"].startswith("Basic")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(running.url + "healthz", verify=pki.other_ca.cert_file, timeout=5)
    metrics = requests.get(
        running.url + "metrics", headers=good, verify=pki.ca.cert_file, timeout=5
    )
    assert "gpuload_relay_notifications_received_total 1.0" in metrics.text
    for secret in (PASSWORD, HASH, "nope"):
        assert secret not in running.log()
        assert secret not in metrics.text


def test_relay_takes_the_flag_and_counts_basic_auth_as_authentication(
    pki: PKI, tmp_path: Path
) -> None:
    web = write_web_config(tmp_path, {"basic_auth_users": {"alertmanager": HASH}})
    # Not loopback and no web.auth: the web config's users are the authentication.
    settings = relay_config.load(flags={"web.listen_address": ":0", "web.config_file": str(web)})
    assert settings.web.security is not None and settings.web.security.authenticates
    assert relay_settings.SETTINGS.flag_of("web.config_file") == "--web.config.file"
    assert HASH not in repr(settings)


def test_relay_refuses_its_own_auth_together_with_basic_auth_users(tmp_path: Path) -> None:
    web = write_web_config(tmp_path, {"basic_auth_users": {"alertmanager": HASH}})
    with pytest.raises(config.ConfigError, match="not both"):
        relay_config.load(
            environ={"TOKEN": "t0ken"},
            flags={
                "web.config_file": str(web),
                "web.auth.bearer_token_env": "TOKEN",
                "web.listen_address": "127.0.0.1:0",
            },
        )


# --- bad web configs ------------------------------------------------------------------------


BAD = [
    ({"tls_server_config": {"certfile": "x"}}, "tls_server_config.certfile: unknown setting"),
    ({"basic_auth_user": {}}, "basic_auth_user: unknown setting"),
    ({"tls_server_config": {"key_file": "k"}}, "tls_server_config.cert_file: required"),
    ({"tls_server_config": "TLS"}, "tls_server_config: expected a mapping"),
    ("tls_server_config: [unclosed", "file: not valid YAML at line 1"),
    (
        "basic_auth_users: &a {alice: x}\nhttp_server_config: *a",
        "file: not valid YAML at line 2, column 21: aliases (*name) are not accepted",
    ),
    ({"rate_limit": {"burst": 1}}, "rate_limit: not supported by gpuload"),
    ({"basic_auth_users": {"alice": "$2b$10$short"}}, "basic_auth_users.alice: not a bcrypt hash"),
    ({"basic_auth_users": {"alice": PASSWORD}}, "basic_auth_users.alice: not a bcrypt hash"),
    (
        {"http_server_config": {"headers": {"Server": "x"}}},
        "http_server_config.headers.Server: unknown",
    ),
    (
        {"http_server_config": {"headers": {"X-Frame-Options": "allow"}}},
        "headers.X-Frame-Options: 'allow' is not valid",
    ),
]


@pytest.mark.parametrize(("document", "message"), BAD)
def test_a_bad_web_config_is_refused_naming_the_key(
    tmp_path: Path, document: Any, message: str
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    with pytest.raises(config.ConfigError) as error:
        config.load(flags={"web.config_file": str(path)})
    assert str(error.value).startswith(f"flag web.config_file: {path}: ")
    assert message in str(error.value)
    assert PASSWORD not in str(error.value)
    assert "$2b$10$short" not in str(error.value)


def test_bad_tls_settings_are_refused_naming_the_key(pki: PKI, tmp_path: Path) -> None:
    cases = [
        (
            tls_section(pki, min_version="TLS14"),
            "tls_server_config.min_version: 'TLS14' is not valid",
        ),
        (
            tls_section(pki, min_version="TLS13", max_version="TLS12"),
            "min_version: is above max_version",
        ),
        (
            tls_section(pki, client_auth_type="Sometimes"),
            "client_auth_type: 'Sometimes' is not valid",
        ),
        (
            tls_section(pki, client_auth_type="RequireAnyClientCert"),
            "RequireAnyClientCert: not supported",
        ),
        (
            tls_section(pki, client_auth_type="RequireAndVerifyClientCert"),
            "client_ca_file: required",
        ),
        (tls_section(pki, client_ca_file=str(pki.ca.cert_file)), "client_ca_file: set, but"),
        (tls_section(pki, cipher_suites=["TLS_NULL"]), "cipher_suites: 'TLS_NULL' is not a cipher"),
        (tls_section(pki, curve_preferences=["X25519"]), "curve_preferences: not supported"),
        # Python's default ciphers, at OpenSSL's security level 2, leave TLS 1.0 and 1.1 none.
        (
            tls_section(pki, min_version="TLS10"),
            "tls_server_config.min_version: TLS10 cannot be negotiated",
        ),
        (
            tls_section(pki, min_version="TLS11"),
            "tls_server_config.min_version: TLS11 cannot be negotiated",
        ),
        (
            tls_section(
                pki,
                min_version="TLS10",
                cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
            ),
            "tls_server_config.min_version: TLS10 cannot be negotiated",
        ),
        (
            {"cert_file": str(pki.server[0]), "key_file": str(pki.other_server[1])},
            "cert_file/key_file: cannot load",
        ),
        (
            {"cert_file": str(tmp_path / "missing.crt"), "key_file": str(pki.server[1])},
            "cannot load",
        ),
    ]
    for section, message in cases:
        path = write_web_config(tmp_path, {"tls_server_config": section})
        with pytest.raises(config.ConfigError, match=re.escape(message)) as error:
            config.load(file=None, flags={"web.config_file": str(path)})
        assert "\n" not in str(error.value), str(error.value)  # one line naming the key


def test_good_tls_settings_build_the_context(pki: PKI, tmp_path: Path) -> None:
    section = tls_section(
        pki,
        client_auth_type="VerifyClientCertIfGiven",
        client_ca_file=str(pki.ca.cert_file),
        min_version="TLS12",
        max_version="TLS12",
        cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256"],
    )
    path = write_web_config(
        tmp_path, {"tls_server_config": section, "http_server_config": {"http2": True}}
    )
    tls = webconfig.load(path).tls
    assert tls is not None
    assert tls.context.verify_mode == ssl.CERT_OPTIONAL
    assert tls.context.maximum_version == ssl.TLSVersion.TLSv1_2
    ciphers = {
        cipher["name"] for cipher in tls.context.get_ciphers() if cipher["protocol"] == "TLSv1.2"
    }
    assert ciphers == {"ECDHE-ECDSA-AES256-GCM-SHA384"}


def test_config_file_setting_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    write_web_config(tmp_path / "conf", {"basic_auth_users": {"alice": HASH}})
    main = tmp_path / "conf" / "gpuload.yml"
    main.write_text("web:\n  config_file: web.yml\n")
    settings = config.load(file=main)
    assert settings.web.config_file == str(tmp_path / "conf" / "web.yml")
    assert settings.web.security is not None and set(settings.web.security.users) == {"alice"}
    assert HASH not in repr(settings)


@pytest.mark.parametrize("command", ["serve", "relay"])
def test_a_bad_web_config_exits_2_naming_the_key(tmp_path: Path, command: str) -> None:
    path = write_web_config(
        tmp_path, {"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "SSL3"}}
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    args = (
        ["--simulate", "idle"] if command == "serve" else ["--queue.path", str(tmp_path / "q.db")]
    )
    result = subprocess.run(
        [sys.executable, "-m", "exporter", command, *args, "--web.config.file", str(path)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert "flag --web.config.file:" in result.stderr
    assert "tls_server_config.min_version: 'SSL3' is not valid" in result.stderr


def test_basic_auth_over_plain_http_guards_every_scrape(
    tmp_path: Path, processes: Callable[..., Daemon]
) -> None:
    # Scrapes of one snapshot are answered from the encoded answer the daemon keeps; with
    # basic auth each one still goes through the guard, the first and every one after it.
    running = serve(
        processes, write_web_config(tmp_path, {"basic_auth_users": {"prometheus": HASH}})
    )
    accept = {"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"}
    wait_until(lambda: requests.get(running.url + "readyz", timeout=5).ok, what="readiness")
    for _ in range(3):
        allowed = requests.get(
            running.url + "metrics", headers={**accept, **basic("prometheus", PASSWORD)}, timeout=5
        )
        assert allowed.status_code == 200 and "gpu_up" in allowed.text
        refused = requests.get(running.url + "metrics", headers=accept, timeout=5)
        assert refused.status_code == 401 and "gpu_" not in refused.text


def test_clients_that_give_up_mid_request_cost_no_traceback(pki: PKI, guarded: Daemon) -> None:
    """A TLS client that sends part of a head and closes costs no traceback on stderr.

    It is the client's doing, and a traceback is 35 lines outside the log format for each.
    """
    host, port = guarded.url.removeprefix("https://").rstrip("/").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    before = guarded.log().count("Traceback")
    for _ in range(20):
        # Gone after part of a head, without TLS's close_notify: the server's read hits an EOF.
        with socket.create_connection((host, int(port)), timeout=10) as plain:
            wrapped = context.wrap_socket(plain, server_hostname=host)
            wrapped.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    # The exporter is still serving, and said nothing with a traceback.
    wait_until(
        lambda: requests.get(guarded.url + "healthz", verify=pki.ca.cert_file, timeout=5).ok,
        what="the exporter answering",
    )
    time.sleep(1)  # whatever the daemon would print about those connections, it has by now
    assert guarded.log().count("Traceback") == before, guarded.log()[-3000:]


def test_tls_connections_that_never_handshake_are_closed_and_scrapes_go_on(
    pki: PKI, processes: Callable[..., Daemon]
) -> None:
    """600 connections that never start TLS: at most 256 held, each closed by its deadline."""
    from exporter.web.server import MAX_CONNECTIONS, REQUEST_TIMEOUT

    path = write_web_config(pki.directory, {"tls_server_config": tls_section(pki)}, "tls.yml")
    running = serve(processes, path)
    wait_until(
        lambda: requests.get(running.url + "readyz", verify=pki.ca.cert_file, timeout=5).ok,
        what="readiness over TLS",
    )
    host, port = running.url.removeprefix("https://").rstrip("/").rsplit(":", 1)
    silent = [socket.create_connection((host, int(port)), timeout=30) for _ in range(600)]
    try:
        for _ in range(3):
            scrape = requests.get(running.url + "metrics", verify=pki.ca.cert_file, timeout=10)
            assert scrape.status_code == 200 and "gpu_up{" in scrape.text
        # One process serves every connection: its threads are bounded by the connections held.
        status = Path(f"/proc/{running.process.pid}/status").read_text()
        threads = int(status.split("Threads:")[1].split()[0])
        assert threads < MAX_CONNECTIONS + 64

        open_ones = {connection.fileno(): connection for connection in silent}
        poller = select.poll()
        for fd in open_ones:
            poller.register(fd, select.POLLIN)

        def all_closed() -> bool:
            for fd, _ in poller.poll(0):  # readable: the server's end of file (or a reset)
                poller.unregister(fd)
                open_ones.pop(fd, None)
            return not open_ones

        wait_until(all_closed, timeout=REQUEST_TIMEOUT * 4, what="every silent connection closed")
    finally:
        for connection in silent:
            connection.close()
    assert "Traceback" not in running.log()
