"""What every target is: a request built from notifications, and a verdict on the answer."""

from __future__ import annotations

import email.utils
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from exporter.problems import ProblemLog
from exporter.relay.payload import Notification
from exporter.relay.target_config import NoOptions, TargetConfig, TargetSetting, declared_options
from exporter.relay.templates import MessageSettings, TemplateError, compile_template, render
from exporter.settings import parse_duration, parse_duration_or_zero

log = logging.getLogger(__name__)

# Longest pause a Retry-After may impose; a larger value is a misbehaving server.
MAX_RETRY_AFTER = 3600.0


@dataclass(frozen=True)
class OutboundRequest:
    """One HTTP POST to a target."""

    url: str
    body: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Outcome:
    """What a target's answer means: delivered, retry later, or rejected for good.

    ``confirmed`` is false when the service only accepted the message for later processing
    (Teams Workflows answer 202 and run the flow afterwards): it counts as delivered, since
    nothing more can be learnt, but the message may still fail where no one sees it.
    """

    delivered: bool
    retry: bool
    reason: str
    retry_after: float | None = None
    confirmed: bool = True

    @property
    def verdict(self) -> str:
        """``delivered``, ``accepted (unconfirmed)``, ``retry`` or ``final``, for people."""
        if self.delivered:
            return "delivered" if self.confirmed else "accepted (unconfirmed)"
        return "retry" if self.retry else "final"


DELIVERED = Outcome(True, False, "")


def json_body(document: Any) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = moment.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def outcome_by_status(status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
    """The usual HTTP verdict: 2xx delivered; 429, 408 and 5xx retried; other 4xx rejected."""
    if 200 <= status < 300:
        return DELIVERED
    reason = f"HTTP {status}{_excerpt(body)}"
    if status in (408, 425, 429) or status >= 500:
        return Outcome(False, True, reason, parse_retry_after(headers.get("Retry-After")))
    return Outcome(False, False, reason)


def _excerpt(body: bytes) -> str:
    text = body[:200].decode("utf-8", errors="replace").strip().replace("\n", " ")
    return f": {text}" if text else ""


def json_errcode_outcome(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    code_fields: Sequence[str],
    retry_codes: Mapping[int, float],
    retry_after_header: str | None = None,
) -> Outcome:
    """The verdict for chat robots that answer with an error code in the JSON.

    A code in `retry_codes` (a rate limit, "system busy") is retried after its pause, or after
    `retry_after_header` seconds when the answer has that header, whatever the HTTP status;
    another non-zero code is final; without one the HTTP status decides.
    """
    code, message = _error_code(body, code_fields)
    if code is not None and code in retry_codes:
        pause = parse_retry_after(headers.get(retry_after_header)) if retry_after_header else None
        reason = f"HTTP {status}, error code {code}: {message}"[:300]
        return Outcome(False, True, reason, retry_codes[code] if pause is None else pause)
    verdict = outcome_by_status(status, headers, body)
    if not verdict.delivered or code in (None, 0):
        return verdict
    return Outcome(False, False, f"error code {code}: {message}"[:300])


def _error_code(body: bytes, code_fields: Sequence[str]) -> tuple[int | None, str]:
    try:
        document = json.loads(body)
    except ValueError:
        return None, ""
    if not isinstance(document, dict):
        return None, ""
    code = next((document[f] for f in code_fields if f in document), None)
    if not isinstance(code, int) or isinstance(code, bool):
        return None, ""
    return code, str(document.get("errmsg") or document.get("msg") or "")


def parse_http_url(value: Any) -> str:
    """An http:// or https:// URL."""
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value


def parse_template(value: Any) -> str:
    """A user template that compiles; the error gives its line and reason."""
    if not isinstance(value, str):
        raise ValueError("expected a template as a string")
    compile_template(value)  # TemplateError is a ValueError
    return value


# The settings every kind takes; a kind's options may declare one of these names again to
# change it (PagerDuty's URL has a default), and then the kind's own declaration holds.
SHARED_SETTINGS = (
    TargetSetting(
        "url", parse_http_url, required=True, secret=True, help="where messages are posted"
    ),
    TargetSetting("template", parse_template, help="the message text as a Jinja template"),
    TargetSetting(
        "min_interval",
        parse_duration_or_zero,
        help="pause between two messages (default: the kind's, from its rate limit)",
    ),
    TargetSetting("timeout", parse_duration, help="per request; overrides delivery.timeout"),
)


class Target:
    """A delivery target of one kind; subclasses build its messages.

    Class attributes declare the kind's own settings (`options_type`, a dataclass of
    `option(...)` fields that the configuration fills; instances read it as ``self.options``),
    the default pause between messages (`min_interval`, from the service's rate limit) and
    whether several notifications can be coalesced into one digest message (`digests`).
    """

    kind: ClassVar[str]
    options_type: ClassVar[type[Any]] = NoOptions
    min_interval: ClassVar[float] = 0.0
    digests: ClassVar[bool] = True
    options: Any

    @classmethod
    def declarations(cls) -> dict[str, TargetSetting]:
        """Every setting the kind takes by name: the shared ones, then its own."""
        declared = {setting.name: setting for setting in SHARED_SETTINGS}
        declared.update((setting.name, setting) for setting in declared_options(cls.options_type))
        return declared

    @classmethod
    def accepted_keys(cls) -> set[str]:
        """The keys a target section of this kind may hold, ``type`` included."""
        return {"type"} | {key for setting in cls.declarations().values() for key in setting.keys}

    def __init__(self, config: TargetConfig, settings: MessageSettings) -> None:
        if not isinstance(config.options, self.options_type):
            raise TypeError(
                f"target {config.name}: a {self.kind} target takes "
                f"{self.options_type.__name__}, not {type(config.options).__name__}"
            )
        self.config = config
        self.options = config.options
        self.name = config.name
        self.settings = settings
        self.interval = self.min_interval if config.min_interval is None else config.min_interval
        self._template = compile_template(config.template) if config.template else None
        self._problems = ProblemLog(log)

    @property
    def url(self) -> str:
        """The target's URL (a secret for most services)."""
        assert self.config.url is not None
        return self.config.url.value

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """The request delivering one notification, or a digest of several."""
        raise NotImplementedError

    def outcome(self, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        """What the target's answer means."""
        return outcome_by_status(status, headers, body)

    def user_text(self, notification: Notification) -> str | None:
        """The user template's text, or None without one or when it fails (logged once)."""
        if self._template is None:
            return None
        try:
            text = render(self._template, notification, self.settings)
        except TemplateError as error:
            self._problems.report(
                "template",
                "target %s: template failed (%s); sending the default message",
                self.name,
                error,
            )
            return None
        self._problems.resolve("template", "target %s: template renders again", self.name)
        return text


KINDS: dict[str, type[Target]] = {}
T = TypeVar("T", bound=Target)


def register(cls: type[T]) -> type[T]:
    """Class decorator: make a target kind known to the configuration.

    Raises:
        ValueError: the kind is registered twice.
        TypeError: its options declare a field the configuration could not fill.
    """
    if cls.kind in KINDS:
        raise ValueError(f"target kind {cls.kind!r} registered twice")
    cls.declarations()  # Fails at import, not at a user's start, on a bad declaration.
    KINDS[cls.kind] = cls
    return cls
