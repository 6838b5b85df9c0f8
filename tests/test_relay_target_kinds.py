"""Target kinds declare their own settings; the loader, the chart and the docs follow them.

Every module of ``exporter/relay/targets`` registers a kind when the package is imported; no
list names them. The configuration accepts exactly the keys a kind declares, the chart's schema
is generated from the same declarations (``scripts/refresh-chart``), and docs/relay.md names
each kind with what it needs and takes.
"""

from __future__ import annotations

import dataclasses
import json
import pkgutil
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from helpers import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.relay import targets
from exporter.relay.config import ConfigError, Secret, load
from exporter.relay.target_config import NoOptions, TargetConfig, declared_options
from exporter.relay.targets import KINDS
from exporter.relay.targets.base import Target, register
from exporter.relay.targets.dingtalk import DingTalkOptions
from exporter.relay.targets.pagerduty import EVENTS_URL, PagerDutyOptions
from exporter.relay.targets.webhook import WebhookOptions
from exporter.relay.templates import MessageSettings

PACKAGE = ROOT / "exporter" / "relay" / "targets"


def section(kind: str, **settings: Any) -> dict[str, Any]:
    """A valid section of `kind`: its required settings given inline, then `settings`."""
    required = {
        name: "https://hooks.example.com/1"
        for name, setting in KINDS[kind].declarations().items()
        if setting.required
    }
    return {"type": kind, **required, **settings}


def load_target(
    tmp_path: Path, values: dict[str, Any], environ: dict[str, str] | None = None
) -> TargetConfig:
    path = tmp_path / "relay.yaml"
    document = {
        "web": {"listen_address": "127.0.0.1:19401"},
        "targets": {"t": values},
        "route": {"targets": ["t"]},
    }
    path.write_text(yaml.safe_dump(document))
    return load(file=path, environ=environ or {}).targets["t"]


def own_options(kind: str) -> set[str]:
    return {setting.name for setting in declared_options(KINDS[kind].options_type)}


def test_every_module_of_the_package_registers_a_kind() -> None:
    modules = {m.name for m in pkgutil.iter_modules([str(PACKAGE)])} - {"base"}
    assert modules == {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "base"}
    registered = {spec.__module__.rpartition(".")[2] for spec in KINDS.values()}
    assert registered == modules
    assert len(KINDS) == len(modules) >= 8


def test_the_package_lists_no_module_by_hand() -> None:
    source = (PACKAGE / "__init__.py").read_text()
    for module in {spec.__module__.rpartition(".")[2] for spec in KINDS.values()}:
        assert not re.search(rf"\b{module}\b", source), module


FOREIGN_KEYS = [
    (kind, key)
    for kind in sorted(KINDS)
    for key in sorted(set().union(*(spec.accepted_keys() for spec in KINDS.values())))
    if key not in KINDS[kind].accepted_keys()
]


@pytest.mark.parametrize(
    ("kind", "key"), FOREIGN_KEYS, ids=[f"{k}-{key}" for k, key in FOREIGN_KEYS]
)
def test_each_kind_refuses_a_key_of_another_kind_in_one_line(
    tmp_path: Path, kind: str, key: str
) -> None:
    owners = sorted(other for other, spec in KINDS.items() if key in spec.accepted_keys())
    # A *_file and a *_env key name a file and a variable that exist: the key itself is wrong.
    (tmp_path / "VALUE_NOT_SHOWN").write_text("v")
    value = "VALUE_NOT_SHOWN" if key.endswith(("_file", "_env")) else "x"
    with pytest.raises(ConfigError) as raised:
        load_target(tmp_path, section(kind, **{key: value}), {"VALUE_NOT_SHOWN": "v"})
    message = str(raised.value)
    assert message.startswith(
        f"config file targets.t.{key}: not used by type {kind}, only by {', '.join(owners)} "
        f"(type {kind} takes: "
    )
    assert "\n" not in message


def test_every_kind_has_a_key_of_its_own_refused_by_another() -> None:
    """The cases above are not empty: each kind owns a key some other kind refuses."""
    assert {kind for kind, _key in FOREIGN_KEYS} == set(KINDS)


def test_an_unknown_key_lists_what_the_kind_takes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_target(tmp_path, section("feishu", colour="red"))
    assert str(raised.value) == (
        "config file targets.t.colour: unknown setting (known: min_interval, secret, "
        "secret_env, secret_file, template, timeout, type, url, url_env, url_file)"
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"type": "dingtalk", "url": "https://x", "at_all": "maybe"},
            "config file targets.t.at_all: 'maybe' is not valid: expected true or false",
        ),
        (
            {"type": "dingtalk", "url": "https://x", "at_mobiles": "13800000000"},
            "config file targets.t.at_mobiles: '13800000000' is not valid: "
            "expected a list of mobile numbers",
        ),
        (
            {"type": "slack", "url": "https://x", "min_interval": "often"},
            "config file targets.t.min_interval: 'often' is not valid",
        ),
        (
            {"type": "pagerduty", "url": "https://x"},
            "config file targets.t: routing_key (or routing_key_file, routing_key_env) is required",
        ),
        (
            {"type": "webhook", "url": "https://x", "content_type": ["text/plain"]},
            "config file targets.t.content_type: ['text/plain'] is not valid: expected a string",
        ),
    ],
)
def test_a_bad_or_missing_setting_names_its_key_path(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_target(tmp_path, values)
    assert str(raised.value).startswith(message)


def test_a_secret_that_is_no_url_is_refused_without_being_shown(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_target(tmp_path, section("pagerduty", url_env="PD_URL"), {"PD_URL": "hunter2"})
    assert str(raised.value) == "config file targets.t.url: expected an http:// or https:// URL"


def test_each_kind_gets_its_own_options_typed(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("R0UT1NG\n")
    pager = load_target(tmp_path, {"type": "pagerduty", "routing_key_file": "key"})
    assert pager.url is None
    assert isinstance(pager.options, PagerDutyOptions)
    assert pager.options.routing_key.value == "R0UT1NG"
    assert pager.options.url is None
    assert targets.build(pager, MessageSettings()).url == EVENTS_URL
    assert "R0UT1NG" not in repr(pager)

    robot = load_target(
        tmp_path,
        {
            "type": "dingtalk",
            "url": "https://oapi.dingtalk.com/robot/send?access_token=a",
            "secret_env": "ROBOT_SECRET",
            "at_mobiles": [13800000000, "13900000000"],
            "at_all": "true",
            "min_interval": "5s",
        },
        {"ROBOT_SECRET": "SEC1"},
    )
    assert robot.options == DingTalkOptions(
        secret=Secret("SEC1", "environment variable ROBOT_SECRET"),
        at_mobiles=("13800000000", "13900000000"),
        at_all=True,
    )
    assert robot.min_interval == 5.0

    hook = load_target(tmp_path, {"type": "webhook", "url": "http://127.0.0.1:9/"})
    assert hook.options == WebhookOptions(secret=None, content_type="application/json")
    slack = load_target(tmp_path, {"type": "slack", "url": "https://hooks.slack.com/x"})
    assert slack.options == NoOptions()


def test_every_setting_says_what_it_is_for() -> None:
    for kind, spec in KINDS.items():
        for name, setting in spec.declarations().items():
            assert setting.help, f"{kind}.{name}"


def test_a_declaration_the_configuration_cannot_fill_fails_at_import() -> None:
    @dataclasses.dataclass(frozen=True)
    class Undeclared:
        colour: str = "red"

    class Careless(Target):
        kind = "careless"
        options_type: ClassVar[type[Any]] = Undeclared

    with pytest.raises(TypeError, match=r"Undeclared.colour: declare it with option"):
        register(Careless)

    class Twice(Target):
        kind = "slack"

    with pytest.raises(ValueError, match="registered twice"):
        register(Twice)
    assert "careless" not in KINDS and KINDS["slack"] is not Twice


def test_the_chart_schema_takes_exactly_the_discovered_kinds() -> None:
    schema = json.loads((ROOT / "helm" / "gpuload" / "values.schema.json").read_text())
    relay_targets = schema["properties"]["relay"]["properties"]["targets"]
    assert relay_targets["additionalProperties"] == {"$ref": "#/$defs/relayTarget"}
    target = schema["$defs"]["relayTarget"]
    assert target["properties"]["type"]["enum"] == sorted(KINDS)
    secrets_by_kind = {
        rule["if"]["properties"]["type"]["const"]: rule["then"]["properties"]["secrets"]
        for rule in target["allOf"]
    }
    assert secrets_by_kind["pagerduty"]["propertyNames"] == {"enum": ["routing_key", "url"]}
    described = secrets_by_kind["pagerduty"]["properties"]["url"]["description"]
    assert described == KINDS["pagerduty"].declarations()["url"].help
    assert sorted(secrets_by_kind) == sorted(KINDS)


def _docs_table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/relay.md's targets table: kind -> (the settings it needs, those it also takes)."""
    text = (ROOT / "docs" / "relay.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        match = re.fullmatch(r"`([a-z]+)`", cells[0]) if len(cells) == 6 else None
        if match:
            names = [set(re.findall(r"`([a-z_]+)`", cell)) for cell in cells[1:3]]
            rows[match.group(1)] = (names[0], names[1])
    return rows


def test_the_docs_name_every_kind_with_what_it_needs_and_takes() -> None:
    text = (ROOT / "docs" / "relay.md").read_text()
    (listed,) = re.findall(r"^ +type: ([a-z |]+)$", text, re.MULTILINE)
    assert sorted(listed.split(" | ")) == sorted(KINDS)
    expected = {}
    for kind, spec in KINDS.items():
        declared = spec.declarations()
        needs = {name for name, setting in declared.items() if setting.required}
        takes = {name for name in own_options(kind) if not declared[name].required}
        expected[kind] = (needs, takes)
    assert _docs_table() == expected


NEW_KIND = '''
"""Echo: a kind written for a test, to show that one module is all a kind needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporter.relay.payload import Notification
from exporter.relay.target_config import option
from exporter.relay.targets.base import OutboundRequest, Target, register
from exporter.settings import parse_bool


@dataclass(frozen=True)
class EchoOptions:
    """What an echo target takes besides the shared settings."""

    loud: bool = option(parse_bool, default=False, help="shout")


@register
class Echo(Target):
    """Sends the group key back."""

    kind = "echo"
    options_type = EchoOptions
    options: EchoOptions

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """The group key, loud or not."""
        key = notifications[0].group_key
        body = key.upper() if self.options.loud else key
        return OutboundRequest(self.url, body.encode(), {})
'''

NEW_KIND_CHECK = """
import sys
from pathlib import Path

from exporter.relay.config import ConfigError, load

folder = Path(sys.argv[1])
(folder / "good.yaml").write_text(
    "web: {listen_address: '127.0.0.1:1'}\\n"
    "targets: {e: {type: echo, url: 'http://127.0.0.1:9/', loud: true}}\\n"
    "route: {targets: [e]}\\n"
)
print(load(file=folder / "good.yaml").targets["e"].options)
(folder / "bad.yaml").write_text(
    "web: {listen_address: '127.0.0.1:1'}\\n"
    "targets: {s: {type: slack, url: 'http://127.0.0.1:9/', loud: true}}\\n"
    "route: {targets: [s]}\\n"
)
try:
    load(file=folder / "bad.yaml")
except ConfigError as error:
    print(error)
"""


def test_a_new_kind_is_one_module(tmp_path: Path) -> None:
    """A copy of the package with one more module: the configuration takes the new kind."""
    shutil.copytree(
        ROOT / "exporter", tmp_path / "exporter", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "exporter" / "relay" / "targets" / "echo.py").write_text(textwrap.dedent(NEW_KIND))
    result = subprocess.run(
        [sys.executable, "-c", NEW_KIND_CHECK, str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    good, bad = result.stdout.splitlines()
    assert good == "EchoOptions(loud=True)"
    assert bad.startswith(
        "config file targets.s.loud: not used by type slack, only by echo (type slack takes: "
    )


def test_a_target_refuses_options_of_another_kind() -> None:
    config = TargetConfig(name="t", kind="dingtalk", url=Secret("https://x"), options=NoOptions())
    with pytest.raises(TypeError, match="a dingtalk target takes DingTalkOptions, not NoOptions"):
        targets.build(config, MessageSettings())


ALL_KEYS = sorted(set().union(*(spec.accepted_keys() for spec in KINDS.values())))
VALUES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.sampled_from(["https://hooks.example.com/1", "10s", "MISSING", *sorted(KINDS)])
    | st.lists(st.integers() | st.text(max_size=5), max_size=3)
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.sampled_from(sorted(KINDS)), st.dictionaries(st.sampled_from(ALL_KEYS), VALUES))
def test_any_section_of_any_kind_is_read_or_refused_in_one_line(
    tmp_path: Path, kind: str, values: dict[str, Any]
) -> None:
    try:
        config = load_target(tmp_path, {**values, "type": kind})
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    assert isinstance(config.options, KINDS[kind].options_type)
