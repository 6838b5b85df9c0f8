"""The web configuration file (`--web.config.file`): TLS and basic auth for both daemons.

The format is the Prometheus exporter-toolkit's, so one file serves node_exporter and
gpuload alike: ``tls_server_config`` (certificate, key, client certificates, TLS versions,
cipher suites), ``http_server_config.headers`` and ``basic_auth_users`` (bcrypt hashes).
What Python's `ssl` module cannot do is refused at start with the reason, never ignored;
docs/security.md lists it. `load` validates the file once at start; `Watcher` reloads it
when it or a file it names changes, so certificates rotate without a restart.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt

from exporter.settings import ConfigError, load_yaml, parse_bool, read_input
from exporter.web.answers import Answer, refused_unless_preflighted

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's client-auth policies. RequestClientCert asks for a certificate that is never checked
# nor used: not asking at all lets exactly the same clients in.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_NOT_SUPPORTED = {
    "tls_server_config.client_auth_type: RequireAnyClientCert": (
        "accepts a client certificate without verifying it, which Python's ssl module "
        "cannot do; use RequireAndVerifyClientCert with client_ca_file"
    ),
    "tls_server_config.cert": "give the certificate as cert_file",
    "tls_server_config.key": "give the key as key_file",
    "tls_server_config.client_ca": "give the client CA as client_ca_file",
    "tls_server_config.curve_preferences": "Python's ssl module sets no curve list",
    "rate_limit": "put a rate-limiting proxy in front of gpuload",
}
# Go's names (crypto/tls CipherSuites) -> OpenSSL's, for TLS 1.2 and below.
_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# TLS 1.3's suites are not configurable (in Go either): accepted and left to OpenSSL.
_TLS13_CIPHERS = {
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
}
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_BCRYPT = re.compile(rb"^\$2[abxy]?\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")
# Salt and digest of the hash an unknown user is checked against, so that the answer takes as
# long as for a known one; its cost is the users' highest (`_unknown_user_hash`).
_DUMMY_SALT_AND_DIGEST = b"8TU9MagyLROAYZbyi833AeJeVxvMJyKwXBYcnrvj/iecWIVOawNay"
# Paths that answer without basic auth: see docs/security.md.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
HANDSHAKE_TIMEOUT = 10.0


@dataclass(frozen=True)
class TLSSettings:
    """The parsed ``tls_server_config`` and the `ssl` context built from it."""

    cert_file: Path
    key_file: Path
    client_auth_type: str
    client_ca_file: Path | None
    client_allowed_sans: tuple[str, ...]
    context: ssl.SSLContext = field(repr=False, compare=False)


@dataclass(frozen=True)
class WebSecurity:
    """One reading of the web configuration file."""

    path: Path
    tls: TLSSettings | None
    # username -> bcrypt hash; never shown.
    users: Mapping[str, bytes] = field(repr=False)
    headers: tuple[tuple[str, str], ...]
    # What the files this reading came from looked like, to notice changes.
    stamp: tuple[Any, ...] = field(repr=False, compare=False)
    # What an unknown user's password is checked against: a hash at the users' highest cost.
    unknown_user_hash: bytes = field(repr=False, compare=False)

    @property
    def authenticates(self) -> bool:
        """Whether every request must prove who it is (basic auth or verified certificate)."""
        verified = (
            self.tls is not None and self.tls.client_auth_type == "RequireAndVerifyClientCert"
        )
        return bool(self.users) or verified

    def files(self) -> list[Path]:
        """The web config file and the files it names."""
        return [self.path, *_named_files(self.tls)]

    def describe(self) -> str:
        """What the file turns on, for the start-up log line (no secrets)."""
        parts = []
        if self.tls is not None:
            parts.append(f"TLS, client certificates: {self.tls.client_auth_type}")
        if self.users:
            parts.append(f"basic auth ({len(self.users)} users)")
        return ", ".join(parts) or "no TLS nor basic auth"


def _named_files(tls: TLSSettings | None) -> list[Path]:
    if tls is None:
        return []
    named = [tls.cert_file, tls.key_file, tls.client_ca_file]
    return [path for path in named if path is not None]


def _stamp(paths: Iterable[Path]) -> tuple[Any, ...]:
    stamps: list[Any] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            stamps.append((str(path), None))
            continue
        stamps.append((str(path), stat.st_mtime_ns, stat.st_size, stat.st_ino))
    return tuple(stamps)


class _Problem(Exception):
    """A bad key in the file: its path in the file and what is wrong."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")


def load_setting(path: str, where: str) -> WebSecurity:
    """`load` for a setting naming the file; errors start with ``where`` (source and key path).

    Raises:
        ConfigError: naming the key path and the key in the web config file.
    """
    try:
        return load(path)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


def load(path: str | Path) -> WebSecurity:
    """Read and check the web configuration file; relative paths in it are beside it.

    Raises:
        ConfigError: ``PATH: KEY: problem``, naming the key in the file; never a secret.
    """
    path = Path(path)
    try:
        return _load(path)
    except (_Problem, ConfigError) as problem:
        raise ConfigError(f"{path}: {problem}") from None


def _load(path: Path) -> WebSecurity:
    before = _stamp([path])
    try:
        text = read_input(path)
    except ConfigError as error:
        raise _Problem("file", str(error)) from None
    # Says the line and the problem, never the text there (it may hold a hash); no aliases.
    tree = load_yaml(text, "file")
    tree = {} if tree is None else tree
    _check_mapping(tree, "(top level)")
    for key in tree:
        _check_supported(str(key))
    _check_known(tree, "", {"tls_server_config", "http_server_config", "basic_auth_users"})
    tls = _tls(tree.get("tls_server_config"), path.parent)
    users = _users(tree.get("basic_auth_users"))
    headers = _headers(tree.get("http_server_config"))
    # The config file's stamp from before it was read: a change while reading reloads again.
    stamp = before + _stamp(_named_files(tls))
    return WebSecurity(
        path=path,
        tls=tls,
        users=users,
        headers=headers,
        stamp=stamp,
        unknown_user_hash=_unknown_user_hash(users),
    )


def _check_mapping(value: Any, key: str) -> None:
    if not isinstance(value, Mapping):
        raise _Problem(key, "expected a mapping")


def _check_supported(key: str) -> None:
    if key in _NOT_SUPPORTED:
        raise _Problem(key, f"not supported by gpuload: {_NOT_SUPPORTED[key]}")


def _check_known(tree: Mapping[Any, Any], prefix: str, known: set[str]) -> None:
    for key in tree:
        if str(key) not in known:
            listed = ", ".join(sorted(known))
            raise _Problem(f"{prefix}{key}", f"unknown setting (known: {listed})")


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _Problem(key, "expected a non-empty string")
    return value


def _tls(tree: Any, base: Path) -> TLSSettings | None:
    if tree is None or tree == {}:
        return None
    key = "tls_server_config"
    _check_mapping(tree, key)
    for name in tree:
        _check_supported(f"{key}.{name}")
    _check_known(tree, f"{key}.", _TLS_KEYS)
    for required in ("cert_file", "key_file"):
        if tree.get(required) is None:
            raise _Problem(f"{key}.{required}", "required to serve TLS")
    cert_file = base / _string(tree["cert_file"], f"{key}.cert_file")
    key_file = base / _string(tree["key_file"], f"{key}.key_file")
    client_auth = str(tree.get("client_auth_type", "NoClientCert"))
    _check_supported(f"{key}.client_auth_type: {client_auth}")
    if client_auth not in _CLIENT_AUTH:
        raise _Problem(
            f"{key}.client_auth_type",
            f"{client_auth!r} is not valid: expected one of {', '.join(_CLIENT_AUTH)}",
        )
    ca_value = tree.get("client_ca_file")
    client_ca = None if ca_value is None else base / _string(ca_value, f"{key}.client_ca_file")
    verifies = _CLIENT_AUTH[client_auth] != ssl.CERT_NONE
    if verifies and client_ca is None:
        raise _Problem(f"{key}.client_ca_file", f"required with client_auth_type {client_auth}")
    if client_ca is not None and not verifies:
        raise _Problem(
            f"{key}.client_ca_file",
            f"set, but client_auth_type {client_auth} checks no client certificate; "
            "use RequireAndVerifyClientCert",
        )
    sans = _string_list(tree.get("client_allowed_sans"), f"{key}.client_allowed_sans")
    if sans and client_auth != "RequireAndVerifyClientCert":
        raise _Problem(
            f"{key}.client_allowed_sans", "needs client_auth_type RequireAndVerifyClientCert"
        )
    context = _context(tree, cert_file, key_file, client_auth, client_ca)
    return TLSSettings(cert_file, key_file, client_auth, client_ca, tuple(sans), context)


def _string_list(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Problem(key, "expected a list of strings")
    return list(value)


def _version(tree: Mapping[str, Any], name: str, default: str) -> ssl.TLSVersion:
    value = str(tree.get(name, default))
    if value not in _VERSIONS:
        raise _Problem(
            f"tls_server_config.{name}",
            f"{value!r} is not valid: expected one of {', '.join(_VERSIONS)}",
        )
    return _VERSIONS[value]


def _no_password() -> bytes:
    # An encrypted key would otherwise make OpenSSL prompt on the terminal.
    return b""


def _context(
    tree: Mapping[str, Any],
    cert_file: Path,
    key_file: Path,
    client_auth: str,
    client_ca: Path | None,
) -> ssl.SSLContext:
    key = "tls_server_config"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    minimum = _version(tree, "min_version", "TLS12")
    maximum = _version(tree, "max_version", "TLS13")
    if minimum > maximum:
        raise _Problem(f"{key}.min_version", "is above max_version")
    context.minimum_version, context.maximum_version = minimum, maximum
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_password)
    except (OSError, ssl.SSLError) as error:
        raise _Problem(
            f"{key}.cert_file/key_file",
            f"cannot load {cert_file} with {key_file} ({_reason(error)}; "
            "an unencrypted PEM key matching the certificate is expected)",
        ) from None
    _ciphers(context, tree)
    for name, version in (("min_version", minimum), ("max_version", maximum)):
        if version < ssl.TLSVersion.TLSv1_2 and not _negotiates(context, version):
            raise _Problem(
                f"{key}.{name}",
                f"{tree[name]} cannot be negotiated with this system's OpenSSL (its security "
                "level or cipher_suites forbid it): expected TLS12 or TLS13",
            )
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as error:
            raise _Problem(
                f"{key}.client_ca_file", f"cannot load {client_ca} ({_reason(error)})"
            ) from None
    context.verify_mode = _CLIENT_AUTH[client_auth]
    context.set_alpn_protocols(["http/1.1"])
    return context


def _negotiates(context: ssl.SSLContext, version: ssl.TLSVersion) -> bool:
    """Whether a handshake at exactly `version` succeeds with `context`, tried in memory.

    OpenSSL takes any minimum_version and then may refuse every client at it: checked here, so
    that a setting that cannot be honoured stops the start instead of silently doing nothing.
    """
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    with contextlib.suppress(ssl.SSLError):
        client.set_ciphers("ALL:@SECLEVEL=0")  # the client allows anything: the server decides
    try:
        client.minimum_version = client.maximum_version = version
    except (ValueError, ssl.SSLError):
        return False
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = [
        client.wrap_bio(to_client, to_server),
        context.wrap_bio(to_server, to_client, server_side=True),
    ]
    for _ in range(8):  # a TLS 1.0-1.2 handshake takes two round trips
        for end in list(ends):
            try:
                end.do_handshake()
                ends.remove(end)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return False
        if not ends:
            return True
    return False


def _reason(error: Exception) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or "not a valid PEM file"
    return getattr(error, "strerror", None) or str(error)


def _ciphers(context: ssl.SSLContext, tree: Mapping[str, Any]) -> None:
    key = "tls_server_config.cipher_suites"
    names = _string_list(tree.get("cipher_suites"), key)
    for name in names:
        if name not in _CIPHERS and name not in _TLS13_CIPHERS:
            known = ", ".join(sorted([*_CIPHERS, *_TLS13_CIPHERS]))
            raise _Problem(key, f"{name!r} is not a cipher suite (known: {known})")
    chosen = [_CIPHERS[name] for name in names if name in _CIPHERS]
    if chosen:
        try:
            context.set_ciphers(":".join(chosen))
        except ssl.SSLError:
            raise _Problem(key, "none of them is available in this OpenSSL") from None
    try:
        prefer = parse_bool(tree.get("prefer_server_cipher_suites", True))
    except ValueError as error:
        raise _Problem("tls_server_config.prefer_server_cipher_suites", str(error)) from None
    if not prefer:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE


def _users(tree: Any) -> dict[str, bytes]:
    if tree is None:
        return {}
    _check_mapping(tree, "basic_auth_users")
    users = {}
    for name, hashed in tree.items():
        key = f"basic_auth_users.{name}"
        if not isinstance(name, str) or not name or ":" in name:
            raise _Problem(key, "a username is a non-empty string without ':'")
        # The value is never quoted back: it is the secret.
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed.encode()):
            raise _Problem(
                key,
                "not a bcrypt hash ($2a$, $2b$ or $2y$, a cost of 04-31, 53 characters; "
                "make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)",
            )
        users[name] = hashed.encode()
    return users


def _unknown_user_hash(users: Mapping[str, bytes]) -> bytes:
    """A hash no password matches, at the highest cost of the users' hashes.

    bcrypt's time doubles with each step of cost: checking a password against a hash of
    another cost than the users' would tell, by its time, that the user does not exist. The
    cost is read from each hash (``$2b$12$...``); nothing is hashed here.
    """
    cost = max((int(hashed.split(b"$")[2]) for hashed in users.values()), default=10)
    return b"$2b$%02d$%s" % (cost, _DUMMY_SALT_AND_DIGEST)


def _headers(tree: Any) -> tuple[tuple[str, str], ...]:
    if tree is None:
        return ()
    _check_mapping(tree, "http_server_config")
    _check_known(tree, "http_server_config.", {"headers", "http2"})
    if "http2" in tree:
        # gpuload speaks HTTP/1.1 only; true (the default) is accepted and means nothing.
        try:
            parse_bool(tree["http2"])
        except ValueError as error:
            raise _Problem("http_server_config.http2", str(error)) from None
    headers = tree.get("headers") or {}
    _check_mapping(headers, "http_server_config.headers")
    _check_known(headers, "http_server_config.headers.", set(_HEADERS))
    chosen = []
    for name, value in headers.items():
        key = f"http_server_config.headers.{name}"
        text = _string(value, key)
        allowed = _HEADERS[name]
        if allowed is not None and text.lower() not in allowed:
            raise _Problem(key, f"{text!r} is not valid: expected one of {', '.join(allowed)}")
        chosen.append((str(name), text))
    return tuple(chosen)


class Watcher:
    """The web configuration in force, reloaded when its file or a file it names changes.

    The files are looked at (stat, no reading) at most once a second, on a new connection
    or request; a change is read and checked like at start. A reloaded file that fails the
    checks, or that turns TLS on or off (the listening socket cannot change), is logged
    once and the previous settings stay in force.
    """

    CHECK_SECONDS = 1.0

    def __init__(self, security: WebSecurity, clock: Callable[[], float] = time.monotonic) -> None:
        self._security = security
        self._clock = clock
        self._lock = threading.Lock()
        self._checked = clock()
        self._rejected: tuple[Any, ...] | None = None

    @property
    def tls(self) -> bool:
        """Whether the listener speaks TLS."""
        return self._security.tls is not None

    def current(self) -> WebSecurity:
        """The settings in force, after looking for a change at most once a second."""
        now = self._clock()
        with self._lock:
            if now - self._checked < self.CHECK_SECONDS:
                return self._security
            self._checked = now
            stamp = _stamp(self._security.files())
            if stamp in (self._security.stamp, self._rejected):
                return self._security
            self._reload(stamp)
            return self._security

    def _reload(self, stamp: tuple[Any, ...]) -> None:
        try:
            fresh = load(self._security.path)
        except ConfigError as error:
            self._rejected = stamp
            log.error("web config not reloaded, the previous settings stay: %s", error)
            return
        if (fresh.tls is None) != (self._security.tls is None):
            self._rejected = stamp
            log.error(
                "web config not reloaded: %s turns TLS %s, which needs a restart",
                fresh.path,
                "on" if fresh.tls is not None else "off",
            )
            return
        self._security, self._rejected = fresh, None
        log.info("web config %s reloaded: %s", fresh.path, fresh.describe())

    def accept(self, connection: socket.socket, address: Any) -> ssl.SSLSocket | None:
        """TLS handshake on an accepted connection (in its own thread); None if it failed."""
        tls = self.current().tls
        assert tls is not None
        connection.settimeout(HANDSHAKE_TIMEOUT)
        try:
            wrapped = tls.context.wrap_socket(
                connection, server_side=True, do_handshake_on_connect=False
            )
        except (OSError, ValueError) as error:
            log.debug("TLS with %s failed: %s", address, error)
            connection.close()
            return None
        try:
            wrapped.do_handshake()
            if tls.client_allowed_sans and not _san_allowed(
                wrapped.getpeercert(), tls.client_allowed_sans
            ):
                log.debug("TLS client %s: certificate SAN not in client_allowed_sans", address)
                wrapped.close()
                return None
        except (OSError, ValueError) as error:
            # Scanners and clients with the wrong CA: routine, so not above debug.
            log.debug("TLS handshake with %s failed: %s", address, error)
            wrapped.close()
            return None
        wrapped.settimeout(None)
        return wrapped


def _san_allowed(certificate: Mapping[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    if not certificate:
        return False
    for kind, value in certificate.get("subjectAltName", ()):
        for wanted in allowed:
            if value == wanted or (kind == "IP Address" and _same_ip(value, wanted)):
                return True
    return False


def _same_ip(left: str, right: str) -> bool:
    try:
        return ipaddress.ip_address(left.strip()) == ipaddress.ip_address(right.strip())
    except ValueError:
        return False


class Guard:
    """WSGI middleware: basic auth (except on `OPEN_PATHS`) and the configured headers.

    bcrypt is slow by design (tens of milliseconds at cost 10), so a successful check is
    remembered, like the exporter-toolkit does, by a SHA-256 of user, hash and password:
    a scraper's later requests cost a hash, not a bcrypt. Failures are not remembered.
    """

    CACHE_SIZE = 256

    def __init__(self, app: WsgiApp, watcher: Watcher) -> None:
        self._app = app
        self._watcher = watcher
        self._lock = threading.Lock()
        self._allowed: set[bytes] = set()

    def preflight(self, environ: dict[str, Any]) -> Answer | None:
        """401 without valid credentials, decided on the head, before any body is read."""
        security = self._watcher.current()
        guarded = security.users and environ.get("PATH_INFO", "/") not in OPEN_PATHS
        if guarded and not self._authorized(security, environ.get("HTTP_AUTHORIZATION", "")):
            headers = [
                ("WWW-Authenticate", 'Basic realm="gpuload"'),
                ("Content-Type", "text/plain; charset=utf-8"),
                *security.headers,
            ]
            body = b"unauthorized: send a user and password of basic_auth_users\n"
            return Answer("401 Unauthorized", headers, body)
        inner = getattr(self._app, "preflight", None)
        refused: Answer | None = inner(environ) if inner is not None else None
        if refused is not None:
            return refused._replace(headers=[*refused.headers, *security.headers])
        return None

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """The application's answer, with the configured headers, once `preflight` let it in."""
        extra = list(self._watcher.current().headers)

        def respond(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            return start_response(status, [*headers, *extra], *exc_info)

        refused = refused_unless_preflighted(self.preflight, environ, start_response)
        return self._app(environ, respond) if refused is None else refused

    def _authorized(self, security: WebSecurity, header: str) -> bool:
        scheme, _, encoded = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, colon, password = decoded.partition(b":")
        if not colon:
            return False
        hashed, known = security.unknown_user_hash, False
        # Every name is compared, in constant time: the time says nothing about which exist.
        for name, candidate in security.users.items():
            if hmac.compare_digest(name.encode(), user):
                hashed, known = candidate, True
        key = hashlib.sha256(b"\0".join((user, hashed, password))).digest()
        with self._lock:
            if known and key in self._allowed:
                return True
        try:
            matches = bcrypt.checkpw(password, hashed)
        except ValueError:  # bcrypt refuses passwords over 72 bytes
            return False
        if not (matches and known):
            return False
        with self._lock:
            if len(self._allowed) >= self.CACHE_SIZE:
                self._allowed.clear()
            self._allowed.add(key)
        return True
