from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter import config

COLLECTORS = {"utilization": True, "fan": True, "experimental": False}


def load(tmp_path: Path, text: str | None = None, **kwargs: object) -> config.Config:
    file = None
    if text is not None:
        file = tmp_path / "gpuload.yaml"
        file.write_text(text)
    return config.load(file=file, collectors=COLLECTORS, **kwargs)  # type: ignore[arg-type]


def test_defaults_listen_on_all_interfaces_every_second(tmp_path: Path) -> None:
    settings = load(tmp_path)
    assert settings.web.listen_address == ":19400"
    assert settings.collect_interval == 1.0
    assert settings.collectors == {"utilization": True, "fan": True, "experimental": False}
    assert settings.log.format == "text"


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    text = "collect_interval: 5s\nweb:\n  listen_address: ':1111'\nlog:\n  level: debug\n"
    env = {"GPULOAD_COLLECT_INTERVAL": "2s", "GPULOAD_WEB_LISTEN_ADDRESS": ":2222"}
    settings = load(tmp_path, text, environ=env, flags={"web.listen_address": ":3333"})
    assert settings.web.listen_address == ":3333"
    assert settings.collect_interval == 2.0
    assert settings.log.level == "debug"


@pytest.mark.parametrize(
    ("text", "env", "flags"),
    [
        ("collectors:\n  fan:\n    enabled: false\n", {}, {}),
        ("", {"GPULOAD_COLLECTORS_FAN_ENABLED": "false"}, {}),
        ("collectors:\n  fan:\n    enabled: true\n", {}, {"collectors.fan.enabled": False}),
    ],
)
def test_collector_can_be_disabled_from_each_source(
    tmp_path: Path, text: str, env: dict[str, str], flags: dict[str, object]
) -> None:
    settings = load(tmp_path, text, environ=env, flags=flags)
    assert settings.collectors["fan"] is False
    assert settings.collectors["utilization"] is True


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("500ms", 0.5), ("1s", 1.0), ("2m", 120.0), (3, 3.0), ("1.5", 1.5)],
)
def test_durations_accept_units(tmp_path: Path, value: object, seconds: float) -> None:
    assert load(tmp_path, flags={"collect_interval": value}).collect_interval == seconds


@pytest.mark.parametrize(
    ("text", "env", "flags", "message"),
    [
        ("colect_interval: 1s\n", {}, {}, "config file colect_interval: unknown setting"),
        ("web:\n  listen_adress: ':1'\n", {}, {}, "config file web.listen_adress: unknown"),
        ("collect_interval: fast\n", {}, {}, "config file collect_interval: 'fast' is not valid"),
        ("collect_interval: 0\n", {}, {}, "collect_interval: 0 is not valid: expected a duration"),
        ("collectors:\n  nvlink:\n    enabled: true\n", {}, {}, "collectors are: experimental"),
        ("log:\n  format: xml\n", {}, {}, "log.format: 'xml' is not valid: expected one of text"),
        ("", {"GPULOAD_LISTEN": ":1"}, {}, "environment variable GPULOAD_LISTEN: not a gpuload"),
        ("", {"GPULOAD_COLLECTORS_FAN_ENABLED": "maybe"}, {}, "expected true or false"),
        ("", {}, {"web.listen_address": "localhost"}, "flag web.listen_address: 'localhost'"),
        ("", {}, {"web.listen_address": ":70000"}, "port 0-65535"),
        ("", {}, {"web.telemetry_path": "metrics"}, "expected a path starting with /"),
        ("- a\n- b\n", {}, {}, "expected a mapping of settings"),
        ("web: [\n", {}, {}, "not valid YAML"),
    ],
)
def test_bad_settings_are_rejected_naming_the_key(
    tmp_path: Path, text: str, env: dict[str, str], flags: dict[str, object], message: str
) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(message)):
        load(tmp_path, text, environ=env, flags=flags)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read it"):
        config.load(file=tmp_path / "absent.yaml")


def test_simulator_and_relay_variables_are_not_exporter_settings(tmp_path: Path) -> None:
    environ = {"GPULOAD_SIM_SCENARIO": "training", "GPULOAD_RELAY_WEB_LISTEN_ADDRESS": ":1"}
    settings = load(tmp_path, environ=environ)
    assert settings.simulate.scenario is None
    assert settings.web.listen_address == ":19400"


def test_collect_timeout_defaults_below_the_interval(tmp_path: Path) -> None:
    settings = load(tmp_path, flags={"collect_interval": "2s"})
    assert settings.effective_collect_timeout == pytest.approx(1.6)
    assert load(tmp_path, flags={"collect_timeout": "5s"}).effective_collect_timeout == 5.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (".nan", "expected a duration above zero"),
        (".inf", "expected a duration above zero"),
        ("99999999999h", "expected a duration of at most a year"),
        ("0s", "expected a duration above zero"),
    ],
)
def test_durations_are_finite_and_bounded(tmp_path: Path, value: str, expected: str) -> None:
    path = tmp_path / "gpuload.yaml"
    path.write_text(f"collect_interval: {value}\n")
    with pytest.raises(config.ConfigError, match=rf"config file collect_interval: .*{expected}"):
        config.load(file=path)


def test_yaml_aliases_are_refused_before_they_expand(tmp_path: Path) -> None:
    # A "billion laughs": nine levels of nine aliases, 9**9 strings once expanded.
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level, name in enumerate("bcdefghi"):
        previous = "abcdefghi"[level]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    path = tmp_path / "gpuload.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(config.ConfigError) as raised:
        config.load(file=path)
    assert str(raised.value) == (
        f"config file {path}: not valid YAML at line 2, column 8: aliases (*name) are not"
        " accepted in a config file"
    )


def test_a_yaml_error_names_the_line_and_never_shows_the_text(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    secret = "https://hooks.slack.com/services/T000/B000/XXXXSECRET"
    path.write_text(f"targets:\n  ops:\n    type: slack\n    url: {secret}\n   bad: [\n")
    with pytest.raises(config.ConfigError) as raised:
        config.read_settings_file(path)
    assert "XXXXSECRET" not in str(raised.value)
    assert str(raised.value).startswith(f"config file {path}: not valid YAML at line 5")


def test_a_bad_value_of_a_secret_key_is_not_echoed(tmp_path: Path) -> None:
    from exporter.relay.config import load as load_relay

    path = tmp_path / "relay.yaml"
    path.write_text("web:\n  auth:\n    bearer_token_file: [SECRET]\n")
    with pytest.raises(config.ConfigError) as raised:
        load_relay(file=path, environ={})
    assert "SECRET" not in str(raised.value)
    assert "web.auth.bearer_token_file" in str(raised.value)


def _at(config_object: object, key: str) -> object:
    for part in key.split("."):
        config_object = getattr(config_object, part)
    return config_object


def test_each_setting_of_each_program_comes_from_its_one_declaration(tmp_path: Path) -> None:
    """File key, variable, flag and default of every setting: all from the table's entry."""
    from exporter import cli
    from exporter.relay import config as relay_config
    from exporter.relay.settings import SETTINGS as RELAY

    serve_help = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for table, loaded, command in (
        (config.SETTINGS, config.load(), "serve"),
        (RELAY, relay_config.load(flags={"web.listen_address": "127.0.0.1:0"}), "relay"),
    ):
        flags = serve_help[command]._option_string_actions
        for key, setting in table.by_key.items():
            if key.startswith("web.auth.") or key == "web.listen_address":
                continue  # secrets are read into web.auth; the address was given above
            assert _at(loaded, key) == setting.default, key
            if setting.flag is not None:
                assert flags[setting.flag].dest == key
                assert flags[setting.flag].help == setting.help_line()
    # A value through each layer reaches the field at the key path, parsed by the one parser.
    file = tmp_path / "relay.yaml"
    file.write_text("queue:\n  max_age: 2m\n")
    loaded = relay_config.load(
        file=file,
        environ={"GPULOAD_RELAY_DELIVERY_DIGEST_MAX": "7"},
        flags={"web.listen_address": "127.0.0.1:0", "log.format": "json"},
    )
    assert (loaded.queue.max_age, loaded.delivery.digest_max, loaded.log.format) == (
        120.0,
        7,
        "json",
    )


def _documented(path: Path) -> str:
    """The settings table of a document: the lines from its `| key (file) |` header on."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| key (file) |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end])


def test_the_documented_settings_are_the_declared_ones() -> None:
    """README's and docs/relay.md's tables name each setting declared in code, and its flag."""
    from helpers import ROOT

    from exporter.relay.settings import SETTINGS as RELAY

    for table, document in ((config.SETTINGS, "README.md"), (RELAY, "docs/relay.md")):
        text = _documented(ROOT / document)
        for key, setting in table.by_key.items():
            # A row may group keys of one section: `simulate.epoch`, `.seed`, ...
            assert f"`{key}`" in text or f"`.{key.rsplit('.', 1)[-1]}`" in text, (document, key)
            if setting.flag is not None:
                assert f"`{setting.flag}`" in text, (document, setting.flag)
        keys = set(re.findall(r"^\| `([a-z_.]+)`", text, re.MULTILINE)) - {
            "collectors.NAME.enabled"
        }
        assert keys <= set(table.by_key), (document, keys - set(table.by_key))
