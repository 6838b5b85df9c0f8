"""HTTP/1.1 framing (RFC 9112): a request's head read one way only, an answer written whole.

The server (`exporter.web.server`) reads a request's lines within its bounds and hands them here:
a request line and header fields that could be read two ways are refused (`BadRequest`), never
guessed at. The answers it writes, a refusal included, are made here too.
"""

from __future__ import annotations

import re

# A plain-text answer's headers.
PLAIN = [("Content-Type", "text/plain; charset=utf-8")]
BAD = "400 Bad Request"


class BadRequest(Exception):
    """A request that is not read: answered with ``status`` and the connection closed."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


# RFC 9110 5.6.2 `token` characters, less "_": CGI's environ names turn "-" into "_", so a
# header "Content_Length" would otherwise be read as Content-Length (request smuggling).
_TOKEN = re.compile(rb"[!#$%&'*+\-.^`|~0-9A-Za-z]+")
_METHOD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Field values and request targets: no control characters but a tab (RFC 9110 5.5).
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_DIGITS = re.compile(rb"[0-9]{1,19}")
# A Host value: a name, an IPv4 or a bracketed IPv6 address, and an optional port.
_HOST = re.compile(rb"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(:[0-9]*)?")


def request_line(line: bytes) -> tuple[str, str, str]:
    """Method, target and version of a request line (RFC 9112 3)."""
    parts = line.split(b" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]):
        raise BadRequest(BAD, "not a request line: METHOD TARGET HTTP/1.1 expected")
    method, target, version = (part.decode("iso-8859-1") for part in parts)
    if not re.fullmatch(r"HTTP/[0-9]\.[0-9]", version):
        raise BadRequest(BAD, "not a request line: METHOD TARGET HTTP/1.1 expected")
    if not version.startswith("HTTP/1."):
        raise BadRequest("505 HTTP Version Not Supported", f"{version}: HTTP/1.1 expected")
    if version != "HTTP/1.0":
        version = "HTTP/1.1"  # a later 1.x is read as the highest this server speaks (RFC 9110)
    if _CONTROL.search(parts[1]) or b"\t" in parts[1]:
        raise BadRequest(BAD, "a control character in the request target")
    if target.startswith(("http://", "https://")):
        # The absolute form (to a proxy): its path is the target, its authority the host.
        target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
    elif not (target.startswith("/") or (target == "*" and method == "OPTIONS")):
        raise BadRequest(BAD, f"a request target must start with /, not {target[:40]!r}")
    return method, target, version


def header_fields(lines: list[bytes]) -> dict[str, str]:
    """Header lines as WSGI environ keys and values; a BadRequest for a malformed one."""
    fields: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            if line[:1] in (b" ", b"\t"):
                raise BadRequest(BAD, "a folded header line (obsolete, RFC 9112 5.2)")
            shown = name[:40].decode("iso-8859-1")
            raise BadRequest(
                BAD, f"a header name must be letters, digits and !#$%&'*+-.^`|~: {shown!r}"
            )
        value = value.strip(b" \t")
        if _CONTROL.search(value):
            raise BadRequest(BAD, "a control character in a header value")
        key = name.decode("ascii").upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = f"HTTP_{key}"
        text = value.decode("iso-8859-1")
        if key in fields:
            if key in ("CONTENT_LENGTH", "HTTP_HOST"):
                raise BadRequest(BAD, f"more than one {name.decode('ascii')}")
            fields[key] = f"{fields[key]},{text}" if fields[key] else text
        else:
            fields[key] = text
    if "CONTENT_LENGTH" in fields and not _DIGITS.fullmatch(fields["CONTENT_LENGTH"].encode()):
        raise BadRequest(BAD, "Content-Length must be one number of at most 19 digits")
    if "HTTP_HOST" in fields and not _HOST.fullmatch(fields["HTTP_HOST"].encode("latin-1")):
        raise BadRequest(BAD, "Host is not a host name or address with an optional port")
    return fields


def keeps_alive(version: str, connection: str) -> bool:
    """Whether the connection stays open after this request (HTTP/1.1: unless told to close)."""
    tokens = {token.strip().lower() for token in connection.split(",")}
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens


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
    headers = [*PLAIN, ("Retry-After", "1")]
    return response("GET", "503 Service Unavailable", headers, f"{reason}\n".encode(), False)
