"""A whole HTTP answer, and the preflight: a refusal an application makes from a request's head.

Shared by the server (`exporter.web.server`), which calls the preflight before it reads a body,
and the applications that refuse there (`exporter.web.webconfig.Guard`, the relay's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

StartResponse = Callable[..., Any]


class Answer(NamedTuple):
    """A whole answer: status line's status, headers, body."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


# An application's `preflight(environ)`: called with a request's head, before its body is
# read; an Answer refuses the request (unauthorized, too large, wrong method) there and then.
Preflight = Callable[[dict[str, Any]], Answer | None]
# Set in the environ once this server has run the application's preflight.
PREFLIGHTED = "gpuload.preflighted"


def refused_unless_preflighted(
    preflight: Preflight, environ: dict[str, Any], start_response: StartResponse
) -> list[bytes] | None:
    """The preflight's refusal where no server ran it (another WSGI server), else None.

    Then the body is read already: the check comes late, but it is never skipped.
    """
    if environ.get(PREFLIGHTED):
        return None
    refused = preflight(environ)
    if refused is None:
        return None
    start_response(refused.status, refused.headers)
    return [refused.body]
