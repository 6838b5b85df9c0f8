"""No input file can crash, hang or exhaust a gpuload process: each bad one is one line.

Config files of `gpuload serve` and `gpuload relay`, the web config file, token files and the
thresholds file are all read by `exporter.settings.read_input` (a regular file, without
blocking, at most 1 MiB, strict UTF-8) and, where YAML, by its strict loader (no aliases, no
duplicate keys, bounded depth and integers).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers import gpuload
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import config
from exporter.alerting import thresholds
from exporter.relay import config as relay_config
from exporter.relay.targets import KINDS
from exporter.settings import MAX_INPUT_BYTES, ConfigError

COLLECTORS = {"utilization": True}


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


# What each reader is given, and what its one line must say.
SPECIAL_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a FIFO": (_fifo, "a FIFO, not a regular file"),
    "/dev/zero": (lambda _tmp: Path("/dev/zero"), "a character device, not a regular file"),
    "a folder": (lambda tmp: tmp, "a folder, not a regular file"),
}


def _serve_config(tmp_path: Path, name: str) -> list[str]:
    return ["--config", str(tmp_path / name)]


@pytest.mark.parametrize("kind", sorted(SPECIAL_FILES))
@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--config", "{file}"],
        ["serve", "--web.config.file", "{file}"],
        ["relay", "--config", "{file}"],
    ],
)
def test_a_fifo_a_device_or_a_folder_is_refused_at_once(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    make, expected = SPECIAL_FILES[kind]
    path = make(tmp_path)
    result = gpuload(*(str(path) if word == "{file}" else word for word in command), timeout=120)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_token_file_that_is_a_fifo_or_a_device_is_refused(tmp_path: Path) -> None:
    for token in (_fifo(tmp_path), Path("/dev/zero")):
        file = tmp_path / "relay.yaml"
        file.write_text(f"web:\n  auth:\n    bearer_token_file: {token}\n")
        result = gpuload("relay", "--config", str(file), timeout=120)
        assert result.returncode == 2
        assert "not a regular file" in result.stderr
        assert "web.auth.bearer_token_file" in result.stderr


def test_a_token_file_named_with_a_nul_byte_is_refused_in_one_line(tmp_path: Path) -> None:
    file = tmp_path / "relay.yaml"
    file.write_text('web:\n  auth:\n    bearer_token_file: "a\\0b"\n')
    result = gpuload("relay", "--config", str(file), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "NUL byte" in result.stderr and "web.auth.bearer_token_file" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_thresholds_from_a_device_or_too_large_are_refused(tmp_path: Path) -> None:
    with pytest.raises(thresholds.ThresholdsError, match="a character device"):
        thresholds.load("/dev/zero")
    large = tmp_path / "thresholds.yaml"
    large.write_text("# " + "x" * MAX_INPUT_BYTES)
    with pytest.raises(thresholds.ThresholdsError, match="larger than 1048576 bytes"):
        thresholds.load(large)


def _written(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _load_serve(tmp_path: Path, text: str | bytes) -> config.Config:
    return config.load(file=_written(tmp_path / "gpuload.yaml", text), collectors=COLLECTORS)


def _load_relay(tmp_path: Path, text: str | bytes) -> relay_config.RelayConfig:
    """On loopback, where the relay needs no credentials."""
    return relay_config.load(
        file=_written(tmp_path / "relay.yaml", text),
        environ={},
        flags={"web.listen_address": "127.0.0.1:0"},
    )


@pytest.mark.parametrize("load", [_load_serve, _load_relay], ids=["serve", "relay"])
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("web:\n  x: " + "[" * 20000 + "]" * 20000 + "\n", "nested deeper than 32 levels"),
        ("log:\n  level: " + "9" * 401 + "\n", "an integer of more than 20 digits"),
        (b"log:\n  level: info\n# caf\xe9\n", "not UTF-8: byte 0xe9 at offset 24"),
        ("log:\n  level: info\n  level: debug\n", "line 3, column 3: duplicate key 'level'"),
        ("# " + "x" * MAX_INPUT_BYTES + "\n", "larger than 1048576 bytes"),
    ],
    ids=["deep", "huge-integer", "latin-1", "duplicate-key", "too-large"],
)
def test_a_bad_file_is_one_error_naming_what_was_wrong(
    tmp_path: Path, load: Callable[[Path, str | bytes], object], text: str | bytes, expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, text)
    message = str(raised.value)
    assert expected in message
    assert message.startswith("config file ") and "\n" not in message


def test_a_huge_value_is_cut_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        _load_serve(tmp_path, "metrics_profile: " + "m" * 500_000 + "\n")
    message = str(raised.value)
    assert "(500002 characters)" in message  # its repr, quotes included
    assert len(message) < 400


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("metrics_profile: {}\n", "metrics_profile: {} is not valid: expected one of minimal"),
        ("web:\n  telemetry_path: /healthz\n", "/healthz is gpuload's own"),
        ("web:\n  telemetry_path: /\n", "/ is gpuload's own"),
    ],
)
def test_serve_refuses_what_cannot_work(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        _load_serve(tmp_path, text)


def test_an_empty_section_is_no_setting_rather_than_a_bad_one(tmp_path: Path) -> None:
    assert _load_serve(tmp_path, "web: {}\nlog: {}\n").web.listen_address == ":19400"
    assert _load_relay(tmp_path, "queue: {}\n").queue.path == "gpuload-relay.db"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "delivery:\n  backoff_initial: 10m\n  backoff_max: 1m\n",
            r"delivery.backoff_initial: 600s is above delivery.backoff_max \(60s\)",
        ),
        ("web:\n  max_body_bytes: " + "1" + "0" * 19 + "\n", "expected an integer from 1 to"),
        ("web:\n  max_body_bytes: 1000000000\n", "expected an integer from 1 to 67108864"),
    ],
)
def test_the_relay_refuses_what_cannot_work(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        _load_relay(tmp_path, text)


def test_every_path_gpuload_answers_itself_is_reserved() -> None:
    """The paths the telemetry path may not take are those the server answers besides it."""
    from exporter.server.http import Application

    app = Application(lambda: None, "/metrics")
    app.status = lambda _environ, start_response: start_response("200 OK", []) or [b""]

    def status_of(path: str) -> str:
        statuses: list[str] = []
        app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, lambda s, _h: statuses.append(s))
        return statuses[0]

    for path in config.RESERVED_PATHS:
        assert not status_of(path).startswith("404"), path
    assert status_of("/elsewhere").startswith("404")


# A few hundred examples in the suite; `scripts/fuzz` runs the same properties for longer.
FUZZ_EXAMPLES = int(os.environ.get("GPULOAD_FUZZ_EXAMPLES", "150"))
_KEYS = st.sampled_from(
    [
        *config.SETTINGS.by_key,
        *relay_config.SETTINGS.by_key,
        "web",
        "log",
        "queue",
        "delivery",
        "targets",
        "route",
        "alerting",
        "tls_server_config",
        "basic_auth_users",
        "http_server_config",
        "cert_file",
        "min_version",
        "matchers",
        "routes",
        # Every key of every target kind, so that each kind's settings are fuzzed.
        *sorted(set().union(*(kind.accepted_keys() for kind in KINDS.values()))),
    ]
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(sorted(KINDS))
)
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(_KEYS | st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)


def _readers() -> dict[str, Callable[[Path], object]]:
    from exporter.web import webconfig

    return {
        "serve": lambda path: config.load(file=path, collectors=COLLECTORS),
        "relay": lambda path: relay_config.load(
            file=path, environ={}, flags={"web.listen_address": "127.0.0.1:0"}
        ),
        "web config": webconfig.load,
        "thresholds": thresholds.load,
    }


def _only_clear_errors(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "input.yaml"
    path.write_bytes(content)
    for name, read in _readers().items():
        try:
            read(path)
        except (ConfigError, thresholds.ThresholdsError) as error:
            message = str(error)
            assert "\n" not in message and len(message) < 2000, (name, message)


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_DOCUMENTS)
def test_any_document_is_read_or_refused_in_one_line(tmp_path: Path, document: object) -> None:
    _only_clear_errors(tmp_path, yaml.safe_dump(document, allow_unicode=True).encode())


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_bytes_are_read_or_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    _only_clear_errors(tmp_path, content)
