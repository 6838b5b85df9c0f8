"""Every scalar setting of `gpuload relay`, declared once: key path, parser, default, flag, help.

The YAML file nests by the key path (``queue.max_age``), the environment spells it
``GPULOAD_RELAY_QUEUE_MAX_AGE``; the settings with a flag are on the command line. ``targets``
and ``route`` are structures and come from the file only (`exporter.relay.config`). Apart from
that module so that building the command line, which every `gpuload` command does, does not
import the relay's configuration.
"""

from __future__ import annotations

import zoneinfo
from typing import Any

from exporter.settings import (
    LOG_SETTINGS,
    RELAY_ENV_PREFIX,
    Setting,
    Settings,
    at_most,
    listen_address,
    parse_bool,
    parse_duration,
    parse_positive_integer,
    parse_url_path,
)

DEFAULT_PORT = 19401


def _timezone(value: Any) -> str:
    text = str(value)
    try:
        zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError("expected an IANA time zone like UTC or Asia/Shanghai") from None
    return text


def _url(value: Any) -> str:
    text = str(value).rstrip("/")
    if not text.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return text


def parse_text(value: Any) -> str:
    """A string, or a number written as one; not a bool, list or mapping."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError("expected a string")
    return str(value)


def parse_queue_path(value: Any) -> str:
    """A queue file: not SQLite's in-memory names, whose notifications a restart loses."""
    text = parse_text(value)
    if not text.strip() or text == ":memory:" or text.startswith("file::memory:"):
        raise ValueError(
            "an in-memory queue loses every notification it holds at a restart: give a file, "
            "e.g. gpuload-relay.db"
        )
    return text


def _check_interval(value: Any) -> float:
    """How often the queue file's integrity is checked: damage is found within it."""
    seconds = parse_duration(value)
    if seconds > 60:
        raise ValueError("expected a duration of at most 60s: damage must be found within a minute")
    return seconds


# Secrets (`*_file`, `*_env`) are references here; `exporter.relay.config` reads them.
SETTINGS = Settings(
    [
        listen_address(DEFAULT_PORT),
        Setting("web.path", parse_url_path, "/alerts", "--web.path", "path Alertmanager posts to"),
        # Alertmanager's payloads are KiB; the bound keeps a typo from letting a client fill memory.
        Setting("web.max_body_bytes", at_most(64 << 20), 1 << 20),
        Setting("web.allow_unauthenticated", parse_bool, False),
        Setting(
            "web.config_file",
            parse_text,
            None,
            # The exporter-toolkit's flag, shared with `gpuload serve`.
            "--web.config.file",
            "web config file in the exporter-toolkit format: TLS and basic auth",
        ),
        Setting("web.auth.bearer_token_file", parse_text),
        Setting("web.auth.bearer_token_env", parse_text),
        Setting("web.auth.basic_auth.username", parse_text),
        Setting("web.auth.basic_auth.password_file", parse_text),
        Setting("web.auth.basic_auth.password_env", parse_text),
        Setting(
            "queue.path",
            parse_queue_path,
            "gpuload-relay.db",
            "--queue.path",
            "the SQLite queue file",
        ),
        Setting("queue.max_age", parse_duration, 3600.0),
        Setting("queue.dedup_window", parse_duration, 3600.0),
        Setting("queue.dead_letter_retention", parse_duration, 7 * 24 * 3600.0),
        Setting("queue.check_interval", _check_interval, 30.0),
        Setting("delivery.timeout", parse_duration, 10.0),
        Setting("delivery.backoff_initial", parse_duration, 1.0),
        Setting("delivery.backoff_max", parse_duration, 300.0),
        Setting("delivery.storm_threshold", parse_positive_integer, 3),
        Setting("delivery.digest_max", parse_positive_integer, 20),
        Setting("message.grafana_url", _url),
        Setting("message.grafana_dashboard", parse_text, "gpuload-node"),
        Setting("message.timezone", _timezone, "UTC"),
        *LOG_SETTINGS,
    ],
    program="gpuload relay",
    prefix=RELAY_ENV_PREFIX,
    structures=("targets", "route"),
)
