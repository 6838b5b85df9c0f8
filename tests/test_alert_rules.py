"""The shipped rule files: rendered from the one thresholds file, valid, promtool-tested."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.alerting import health, rules, templates, thresholds
from exporter.alerting.evaluator import RuleSet, local_rules
from exporter.relay import payload
from exporter.relay import templates as relay_templates
from tools import RULES_DIR, render_rules, vectors

RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.test.yml"))

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")


def test_committed_rule_files_are_what_the_thresholds_render() -> None:
    rendered = render_rules.render(thresholds.load())
    assert sorted(rendered) == [path.name for path in RULE_FILES]
    for path in RULE_FILES:
        assert path.read_text(encoding="utf-8") == rendered[path.name], (
            f"{path} differs from alert_rules/thresholds.yaml: "
            "run `.venv/bin/python -m tools.render_rules` and commit the result"
        )


def test_render_check_reports_a_stale_file(tmp_path: Path) -> None:
    for path in RULE_FILES:
        shutil.copy(path, tmp_path / path.name)
    assert render_rules.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "gpuload-alerts.rules.yml").write_text("groups: []\n", encoding="utf-8")
    assert render_rules.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_threshold_reaches_the_rules() -> None:
    """Changing a threshold in the one definition changes the rendered rules."""
    loaded = thresholds.load()
    baseline = render_rules.render(loaded)
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    document["alerts"]["GPUUtilizationLow"]["below"] = 0.25
    document["alerts"]["GPUUtilizationHigh"]["for"] = "7m"
    document["alerts"]["GPUDataLoaderStarved"]["idle_above"] = 0.35
    document["runbook_base_url"] = "https://example.org/runbooks.md"
    rendered = render_rules.render(thresholds.parse(document))
    changed = rendered["gpuload-alerts.rules.yml"]
    assert changed != baseline["gpuload-alerts.rules.yml"]
    assert "gpuload_last_collection_timestamp_seconds\n      )) < 0.25" in changed
    assert "gpuload_last_collection_timestamp_seconds\n      )) > 0.35" in changed
    assert "min_over_time(gpu:gpu_utilization_seconds:rate1m[7m])" in changed
    assert "https://example.org/runbooks.md#gpuutilizationlow" in changed
    # The bottleneck class and the fleet states reuse the alerts' thresholds.
    recording = rendered["gpuload-recording.rules.yml"]
    assert "gpu:gpu_idle_seconds:rate5m > 0.35" in recording
    assert "gpu:gpu_busy:ratio5m < 0.25" in recording


def test_every_alert_has_severity_and_annotations() -> None:
    loaded = thresholds.load()
    alerts = [
        rule
        for group in rules.rule_files(loaded)["gpuload-alerts.rules.yml"]["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    assert [rule["alert"] for rule in alerts] == list(thresholds.PARAMETERS)
    for rule in alerts:
        assert rule["labels"]["severity"] in thresholds.SEVERITIES
        # `value`: the measured value, formatted, which the relay's notifications show.
        assert set(rule["annotations"]) == {"summary", "description", "value", "runbook_url"}
        assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())


def test_every_alert_has_a_runbook_section() -> None:
    runbooks = (RULES_DIR.parent / "docs" / "runbooks.md").read_text(encoding="utf-8")
    for name in thresholds.PARAMETERS:
        assert f"\n## {name}\n" in runbooks, f"docs/runbooks.md has no section for {name}"


def test_every_alert_has_a_promtool_unit_test() -> None:
    """Every alert is checked by promtool: in a unit test here or in a shared vector.

    The shared vectors (alert_rules/vectors/) become promtool tests in
    tests/test_local_alerting.py, which also runs them through the local evaluator.
    """
    tested = {
        case["alertname"]
        for path in UNIT_TESTS
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]
        for case in group.get("alert_rule_test", [])
    }
    tested |= {
        name
        for path in vectors.vector_files()
        for case in vectors.load_file(path)
        for name in case.alerts
    }
    assert tested == set(thresholds.PARAMETERS)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("below", 30, "alerts.GPUUtilizationLow.below: expected a ratio between 0 and 1"),
        ("for", "5 minutes", "alerts.GPUUtilizationLow.for: '5 minutes' is not a duration"),
        ("severity", "page", "alerts.GPUUtilizationLow.severity: expected one of"),
        ("bellow", 0.3, "alerts.GPUUtilizationLow.bellow: unknown key"),
    ],
)
def test_bad_thresholds_name_the_key(key: str, value: object, message: str) -> None:
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    document["alerts"]["GPUUtilizationLow"][key] = value
    with pytest.raises(thresholds.ThresholdsError, match=message.replace(".", r"\.")):
        thresholds.parse(document)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.update(gap_tolerance="1m"),
            "gap_tolerance: 1m is not longer than short_window (1m)",
        ),
        (
            lambda d: d["alerts"]["GPUJobHung"].update({"for": "5m"}),
            "alerts.GPUJobHung.for: GPUJobHung has no `for:` of its own",
        ),
    ],
)
def test_settings_that_belong_to_another_are_refused(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    """The gap tolerance must hold a short window; GPUJobHung judges GPUUtilizationHigh's window."""
    _assert_refused(change, message)
    loaded = thresholds.load()
    assert loaded.alert("GPUJobHung").for_ == loaded.alert("GPUUtilizationHigh").for_


def documented_inhibit_rules() -> list[dict[str, Any]]:
    """The inhibit rules of docs/runbooks.md's "Routing and inhibition", as written there."""
    text = (RULES_DIR.parent / "docs" / "runbooks.md").read_text(encoding="utf-8")
    section = text.split("\n## Routing and inhibition\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(inhibit_rules:.*?)```", section, re.DOTALL)
    assert block, "docs/runbooks.md documents no inhibit_rules block"
    found: list[dict[str, Any]] = yaml.safe_load(block.group(1))["inhibit_rules"]
    return found


def test_the_runbooks_show_the_inhibit_rules_of_the_thresholds_file() -> None:
    """One definition: the block docs/runbooks.md gives for Alertmanager is thresholds.yaml's."""
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    assert documented_inhibit_rules() == document["inhibit_rules"]
    # A fault's alerts are folded in the rules, where no `for:` delays the fold: no inhibit rule
    # mutes one of them (it would only mute it once its source fired).
    folded = {"GPUXidError", *(name for fold in health.FOLDS for name in fold.outranks)}
    for rule in thresholds.load().inhibit_rules:
        assert not {str(m) for m in rule.target} & {f'alertname="{n}"' for n in folded}


def _first_rule(**fields: object) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["inhibit_rules"][0].update(fields)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.pop("inhibit_rules"),
            "inhibit_rules: expected a list of Alertmanager inhibit rules ([] for none), got None",
        ),
        (lambda d: d["inhibit_rules"].append("x"), "inhibit_rules[1]: expected a mapping, got str"),
        (
            _first_rule(source_match={"alertname": "GPUFellOffBus"}),
            "inhibit_rules[0].source_match: unknown key, expected source_matchers,"
            " target_matchers, equal",
        ),
        (
            _first_rule(source_matchers='alertname="GPUFellOffBus"'),
            "inhibit_rules[0].source_matchers: expected a non-empty list of matchers like"
            ' [alertname="GPUFellOffBus"], got \'alertname="GPUFellOffBus"\'',
        ),
        (
            _first_rule(target_matchers=[]),
            "inhibit_rules[0].target_matchers: expected a non-empty list of matchers",
        ),
        (
            _first_rule(target_matchers=['alertname=="GPUXidError"']),
            "inhibit_rules[0].target_matchers[0]: 'alertname==\"GPUXidError\"': an unescaped"
            " double quote inside the value",
        ),
        (
            _first_rule(target_matchers=['alertname="GPUXidError"', 'xid=~"(79"']),
            "inhibit_rules[0].target_matchers[1]: 'xid=~\"(79\"': '(79' is not a regex",
        ),
        (
            _first_rule(target_matchers=["alertname is GPUXidError"]),
            "inhibit_rules[0].target_matchers[0]: 'alertname is GPUXidError' is not a matcher:"
            " expected a label name, one of = != =~ !~ and a value",
        ),
        (
            _first_rule(equal="gpu"),
            "inhibit_rules[0].equal: expected a list of label names like [instance, gpu],"
            " got 'gpu'",
        ),
        (_first_rule(equal=["gpu-id"]), "inhibit_rules[0].equal: expected a list of label names"),
    ],
)
def test_bad_inhibit_rules_name_the_key(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    _assert_refused(change, message)


def _assert_refused(change: Callable[[dict[str, Any]], None], message: str) -> None:
    """The shipped thresholds, changed so, are refused with ``message``."""
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    change(document)
    with pytest.raises(thresholds.ThresholdsError, match=re.escape(message)):
        thresholds.parse(document)


def test_inhibit_rules_take_every_matcher_form_alertmanager_reads() -> None:
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    document["inhibit_rules"] = [
        {
            "source_matchers": ["alertname=GPUFellOffBus", 'severity!="info"'],
            "target_matchers": ['{alertname=~"GPUXid.*", xid!~"13|31"}'],
        }
    ]
    (rule,) = thresholds.parse(document).inhibit_rules
    assert [str(m) for m in rule.source] == ['alertname="GPUFellOffBus"', 'severity!="info"']
    assert [str(m) for m in rule.target] == ['alertname=~"GPUXid.*"', 'xid!~"13|31"']
    assert rule.equal == ()
    document["inhibit_rules"] = []
    assert thresholds.parse(document).inhibit_rules == ()


def test_team_label_names_the_pod_label_the_owner_rules_read() -> None:
    """The team comes from kube_pod_labels' label_<team_label>, whatever the key is called."""
    assert (
        'kube_pod_labels{label_team!=""}'
        in render_rules.render(thresholds.load())[rules.RECORDING_FILE]
    )
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    document["team_label"] = "app_kubernetes_io_team"
    recording = render_rules.render(thresholds.parse(document))[rules.RECORDING_FILE]
    assert 'kube_pod_labels{label_app_kubernetes_io_team!=""}' in recording
    assert '"team", "$1", "label_app_kubernetes_io_team", "(.*)"' in recording
    assert "label_team" not in recording
    # A thresholds file from before the key keeps working, with the pod label `team`.
    del document["team_label"]
    assert thresholds.parse(document).team_label == "team"


@pytest.mark.parametrize("value", ["app.kubernetes.io/team", "", None, 3])
def test_a_team_label_kube_state_metrics_cannot_write_is_refused(value: object) -> None:
    _assert_refused(
        lambda d: d.update(team_label=value),
        "team_label: expected a pod label's key as kube-state-metrics writes it after label_"
        " (letters, digits and _; app.kubernetes.io/team is app_kubernetes_io_team),"
        f" got {value!r}",
    )


def test_the_local_evaluator_leaves_the_kube_state_metrics_rules_out() -> None:
    """The owner rules read series no exporter has, in PromQL the local engine does not parse."""
    loaded = thresholds.load()
    left_out = [g for g in rules.rule_groups(loaded)[rules.RECORDING_FILE] if g.not_local]
    assert [g.name for g in left_out] == ["gpuload.owners", "gpuload.accounting"]
    families = RuleSet.of(loaded).families()
    for group in left_out:
        assert not {rule.record for rule in group.recordings()} & families
    assert not any(name.startswith("kube_pod") for name in families)


def test_load_exposes_the_documented_defaults() -> None:
    loaded = thresholds.load()
    assert loaded.alert("GPUUtilizationLow").number("below") == 0.30
    assert loaded.alert("GPUUtilizationHigh").number("above") == 0.95
    assert loaded.alert("GPUUtilizationLow").for_ == "5m"
    assert loaded.alert("GPULoadImbalance").number("spread_above") == 0.40
    assert loaded.alert("GPULoadImbalance").for_ == "10m"
    assert loaded.in_use_memory_floor_bytes == 1 << 30
    assert thresholds.duration_seconds("1h30m") == 5400


@needs_promtool
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_promtool_check_rules(path: Path) -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda path: path.name)
def test_promtool_unit_tests(path: Path) -> None:
    result = subprocess.run(
        ["promtool", "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_value_reaches_the_relays_message() -> None:
    """Each alert's `value` annotation renders to text, and the relay's message shows it."""
    loaded = thresholds.load()
    labels = {"gpu": "3", "uuid": "GPU-3", "instance": "n1:19400", "job": "gpuload", "link": "2"}
    labels |= {"xid": "79", "collector": "power", "mig_instance": "1", "mig_profile": "1g.10gb"}
    for rule in local_rules(loaded):
        rendered = {
            name: templates.render(text, {**labels, **rule.labels}, 0.42)
            for name, text in rule.annotations.items()
        }
        assert rendered["value"].strip(), rule.name
        alert = payload.Alert(
            "firing", {**labels, "alertname": rule.name}, rendered, "", "", "", "f"
        )
        view = relay_templates.view(alert, relay_templates.MessageSettings())
        text = relay_templates.alert_text(view, relay_templates.SLACK)
        assert f"value {rendered['value']}" in text, (rule.name, text)
