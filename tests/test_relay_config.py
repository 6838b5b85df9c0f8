"""The relay's configuration and routing: defaults, layers, secrets, errors naming key paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT, gpuload
from relay_helpers import start_relay_process, write_config

from exporter.matchers import parse_matcher
from exporter.relay.config import ConfigError, load, startup_warnings
from exporter.relay.routes import Route, targets_for


def write(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "relay.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def loopback(**document: Any) -> dict[str, Any]:
    return {"web": {"listen_address": "127.0.0.1:19401"}, **document}


def test_defaults_listen_on_19401_and_require_auth_there() -> None:
    with pytest.raises(ConfigError, match=r"web.auth: required when listening on :19401"):
        load()
    settings = load(flags={"web.listen_address": "127.0.0.1:19401"})
    assert settings.web.max_body_bytes == 1 << 20
    assert settings.web.path == "/alerts"
    assert settings.queue.max_age == 3600


def test_auth_from_file_and_env_without_showing_them(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0ken\n")
    settings = load(file=write(tmp_path, {"web": {"auth": {"bearer_token_file": "token"}}}))
    assert settings.web.listen_address == ":19401"
    assert settings.web.auth.bearer_token is not None
    assert settings.web.auth.bearer_token.value == "t0ken"
    assert "t0ken" not in repr(settings) and "t0ken" not in str(settings.web.auth.bearer_token)
    basic = {"web": {"auth": {"basic_auth": {"username": "am", "password_env": "RELAY_PW"}}}}
    settings = load(file=write(tmp_path, basic), environ={"RELAY_PW": "pw"})
    assert (settings.web.auth.username, settings.web.auth.password.value) == ("am", "pw")


def test_opting_out_of_auth_is_explicit() -> None:
    settings = load(flags={"web.allow_unauthenticated": "true"})
    assert settings.web.auth.bearer_token is None


def test_environment_beats_file_and_flags_beat_environment(tmp_path: Path) -> None:
    path = write(tmp_path, loopback(queue={"path": "from-file.db", "max_age": "2h"}))
    settings = load(
        file=path,
        environ={"GPULOAD_RELAY_QUEUE_PATH": "from-env.db", "GPULOAD_RELAY_QUEUE_MAX_AGE": "30m"},
        flags={"queue.path": "from-flag.db"},
    )
    assert settings.queue.path == "from-flag.db"
    assert settings.queue.max_age == 1800


@pytest.mark.parametrize(
    ("document", "environ", "message"),
    [
        (
            loopback(queue={"max_age": "soon"}),
            {},
            r"config file queue.max_age: 'soon' is not valid",
        ),
        (loopback(quue={"path": "x"}), {}, r"config file quue.path: unknown setting"),
        (loopback(), {"GPULOAD_RELAY_QUEUE_PATHS": "x"}, r"GPULOAD_RELAY_QUEUE_PATHS: not a"),
        (
            loopback(targets={"s": {"type": "slak", "url": "https://x"}}),
            {},
            r"targets.s.type: 'slak' is not valid: expected one of dingtalk, discord",
        ),
        (loopback(targets={"s": {"type": "slack"}}), {}, r"targets.s: url .* is required"),
        (
            loopback(targets={"s": {"type": "slack", "url_env": "NOPE"}}),
            {},
            r"targets.s.url_env: environment variable NOPE is not set",
        ),
        (
            loopback(targets={"s": {"type": "slack", "url": "https://x", "secret": "y"}}),
            {},
            r"targets.s.secret: not used by type slack",
        ),
        (
            loopback(targets={"s": {"type": "slack", "url": "https://x", "colour": 1}}),
            {},
            r"targets.s.colour: unknown setting",
        ),
        (
            loopback(targets={"s": {"type": "slack", "url": "https://x", "template": "{{ a"}}),
            {},
            r"targets.s.template: '\{\{ a' is not valid: line 1",
        ),
        (
            loopback(route={"targets": ["nope"]}),
            {},
            r"route.targets\[0\]: 'nope' is not a target",
        ),
        (
            loopback(
                targets={"s": {"type": "slack", "url": "https://x"}},
                route={"routes": [{"matchers": ["severity=~(bad"], "targets": ["s"]}]},
            ),
            {},
            r"route.routes\[0\].matchers\[0\]: 'severity=~\(bad' is not valid: "
            r".*'\(bad' is not a regex RE2",
        ),
        (
            loopback(targets={"s": {"type": "slack", "url": "https://x"}}),
            {},
            r"config file route: give the top route's targets",
        ),
        (
            loopback(message={"timezone": "Mars/Olympus"}),
            {},
            r"message.timezone: 'Mars/Olympus' is not valid: expected an IANA time zone",
        ),
        (
            {"web": {"listen_address": ":19401", "auth": {"bearer_token": "inline"}}},
            {},
            r"web.auth.bearer_token: unknown setting",
        ),
    ],
)
def test_errors_name_the_key_path(
    tmp_path: Path, document: dict[str, Any], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load(file=write(tmp_path, document), environ=environ)


def test_targets_and_routes_from_the_example_file(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "relay.yaml"
    environ = {
        "RELAY_TOKEN": "t",
        "SLACK_OPS_URL": "https://hooks.slack.com/services/T/B/x",
        "SLACK_ML_URL": "https://hooks.slack.com/services/T/B/y",
        "PAGERDUTY_ROUTING_KEY": "k",
        "DINGTALK_URL": "https://oapi.dingtalk.com/robot/send?access_token=a",
        "DINGTALK_SECRET": "SEC",
    }
    settings = load(file=example, environ=environ)
    assert {t.kind for t in settings.targets.values()} >= {"slack", "pagerduty", "dingtalk"}
    assert targets_for(settings.route, {"severity": "critical", "team": "ml"}) == [
        "pagerduty",
        "slack-ml",
    ]
    assert targets_for(settings.route, {"severity": "warning"}) == ["slack-ops"]
    assert "hooks.slack.com" not in repr(settings)


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ('severity="critical"', {"severity": "critical"}, True),
        ('severity="critical"', {"severity": "warning"}, False),
        ("severity!=critical", {}, True),
        ('team=~"ml|ai"', {"team": "ai"}, True),
        ('team=~"ml|ai"', {"team": "mlops"}, False),  # anchored, as in Alertmanager
        ('team!~"ml.*"', {"team": "infra"}, True),
        ('node=""', {}, True),
        (r'summary="say \"hi\""', {"summary": 'say "hi"'}, True),
    ],
)
def test_matchers_work_like_alertmanager(text: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_matcher(text).matches(labels) is matches


def test_first_match_wins_unless_continue() -> None:
    def route(matcher: str, target: str, keep_going: bool = False) -> Route:
        return Route((parse_matcher(matcher),), (target,), keep_going)

    tree = Route(
        targets=("default",),
        routes=(
            route('severity="critical"', "pager", keep_going=True),
            route('team="ml"', "ml"),
            route('team=~".+"', "teams"),
            Route((parse_matcher('gpu!=""'),), (), routes=(route('node="n1"', "n1"),)),
        ),
    )
    assert targets_for(tree, {"severity": "critical", "team": "ml"}) == ["pager", "ml"]
    assert targets_for(tree, {"team": "infra"}) == ["teams"]
    assert targets_for(tree, {"severity": "info"}) == ["default"]
    # A child without targets inherits its parent's; its own children refine it.
    assert targets_for(tree, {"gpu": "0"}) == ["default"]
    assert targets_for(tree, {"gpu": "0", "node": "n1"}) == ["n1"]


RETIRED = "https://contoso.webhook.office.com/webhookb2/0c1d@0c1d/IncomingWebhook/abc/0c1d"
WORKFLOWS = "https://prod-00.westus.logic.azure.com:443/workflows/abc/triggers/manual/paths/invoke"


def test_retired_teams_connector_url_is_warned_about_without_showing_it(tmp_path: Path) -> None:
    targets = {
        "old": {"type": "teams", "url": RETIRED},
        "new": {"type": "teams", "url": WORKFLOWS},
        "hook": {"type": "webhook", "url": RETIRED},
    }
    settings = load(file=write(tmp_path, loopback(targets=targets, route={"targets": ["old"]})))
    warnings = startup_warnings(settings)
    assert len(warnings) == 1
    assert warnings[0].startswith("targets.old.url: an Office 365 connector webhook")
    assert "Workflows" in warnings[0] and "webhook.office.com/webhookb2" not in warnings[0]


def test_relay_logs_one_warning_line_for_a_retired_connector(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        {
            "targets": {"old": {"type": "teams", "url": RETIRED}},
            "route": {"targets": ["old"]},
        },
    )
    relay = start_relay_process(path)
    try:
        warnings = [line for line in relay.lines if "WARNING" in line]
    finally:
        relay.process.terminate()
        relay.process.wait(timeout=10)
    assert len(warnings) == 1, relay.log()
    assert "targets.old.url" in warnings[0] and "retired" in warnings[0]
    assert "0c1d" not in relay.log()  # the URL is a secret


def test_every_missing_secret_is_named_in_one_run(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "web": {"listen_address": ":19401", "auth": {"bearer_token_env": "RELAY_TOKEN"}},
                "targets": {
                    "ops": {"type": "slack", "url_env": "SLACK_OPS_URL"},
                    "pager": {"type": "pagerduty", "routing_key_file": "pd-key"},
                },
                "route": {"targets": ["ops"]},
            }
        )
    )
    with pytest.raises(ConfigError) as raised:
        load(file=path, environ={})
    # In the file's order (yaml.safe_dump sorts the keys: route, targets, web).
    assert str(raised.value) == (
        "config file: 3 secrets are missing: targets.ops.url_env: environment variable"
        " SLACK_OPS_URL is not set; targets.pager.routing_key_file: cannot read"
        f" {tmp_path / 'pd-key'} (No such file or directory); web.auth.bearer_token_env:"
        " environment variable RELAY_TOKEN is not set"
    )


def relay_process(config: Path) -> subprocess.CompletedProcess[str]:
    """`gpuload relay --config CONFIG` run to its end (it exits at once on these configs)."""
    return gpuload("relay", "--config", str(config))


def test_a_relay_without_targets_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(yaml.safe_dump({"web": {"listen_address": "127.0.0.1:0"}}))
    result = relay_process(path)
    assert result.returncode == 2
    assert result.stderr == (
        "gpuload relay: no targets: the relay would accept every notification and deliver none;"
        " give at least one under `targets` (docs/relay.md, examples/relay-local.yaml)\n"
    )


def test_a_missing_queue_folder_is_named(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    queue = tmp_path / "no-such-folder" / "relay.db"
    path.write_text(
        yaml.safe_dump(
            {
                "web": {"listen_address": "127.0.0.1:0"},
                "queue": {"path": str(queue)},
                "targets": {"hook": {"type": "webhook", "url": "http://127.0.0.1:9/hook"}},
                "route": {"targets": ["hook"]},
            }
        )
    )
    result = relay_process(path)
    assert result.returncode == 1
    assert f"cannot open the queue {queue}: its folder {queue.parent} does not exist" in (
        result.stderr
    )


def test_the_laptop_example_runs_as_it_is(tmp_path: Path) -> None:
    config = load(file=ROOT / "examples" / "relay-local.yaml", environ={})
    assert list(config.targets) == ["local-hook"]
    assert config.web.listen_address == "127.0.0.1:19401"


def test_route_regexes_are_re2_as_alertmanagers_are(tmp_path: Path) -> None:
    """(a+)+$ cannot blow up; a backreference, which Go's regexp lacks too, is refused."""
    matcher = parse_matcher('job=~"(a+)+$"')
    assert matcher.matches({"job": "aaaa"})
    # 30,000 characters: a backtracking engine would take longer than the universe's age; the
    # subprocess's timeout only bounds a regression.
    script = (
        "from exporter.matchers import parse_matcher\n"
        "m = parse_matcher('job=~\"(a+)+$\"')\n"
        "print(m.matches({'job': 'a' * 30000 + '!'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout == "False\n"
    with pytest.raises(ValueError, match="not a regex RE2"):
        parse_matcher(r'job=~"(a)\1"')
    config = tmp_path / "relay.yaml"
    config.write_text(
        "targets: {hook: {type: webhook, url: 'http://127.0.0.1:9/'}}\n"
        "route: {targets: [hook], routes: [{matchers: ['job=~\"(a)\\\\1\"'], targets: [hook]}]}\n"
    )
    refused = relay_process(config)
    assert refused.returncode == 2
    assert "not a regex RE2 (and Alertmanager) accepts: invalid escape sequence" in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr  # not also RE2's own log line
