"""Inhibit rules: Alertmanager's matcher syntax and its inhibitor's semantics, locally.

Local alerting drives them end to end in tests/test_local_alerting.py; the thresholds file's
validation of them is in tests/test_alert_rules.py.
"""

from __future__ import annotations

import re

import pytest

from exporter.alerting.inhibition import InhibitRule, find_inhibitor
from exporter.matchers import parse_matcher, parse_matchers


@pytest.mark.parametrize(
    ("text", "name", "operator", "value"),
    [
        ('alertname="GPUFellOffBus"', "alertname", "=", "GPUFellOffBus"),
        ("alertname=GPUFellOffBus", "alertname", "=", "GPUFellOffBus"),
        (' gpu != "3" ', "gpu", "!=", "3"),
        ('xid=~"79|48"', "xid", "=~", "79|48"),
        ("severity!~warn.*", "severity", "!~", "warn.*"),
        ('gpu=""', "gpu", "=", ""),
        ("gpu=", "gpu", "=", ""),
        # OpenMetrics escapes: \" \n \\; any other backslash stays a backslash.
        (r'summary="say \"hi\"\n"', "summary", "=", 'say "hi"\n'),
        (r'path="C:\dir\\x"', "path", "=", "C:\\dir\\x"),
        ("le=a=b", "le", "=", "a=b"),
    ],
)
def test_matchers_parse_as_alertmanager_reads_them(
    text: str, name: str, operator: str, value: str
) -> None:
    matcher = parse_matcher(text)
    assert (matcher.name, matcher.operator, matcher.value) == (name, operator, value)


def test_one_entry_may_hold_several_matchers_in_braces() -> None:
    matchers = parse_matchers('{alertname="GPUXidError", summary="a, b", gpu!="0",}')
    assert [str(m) for m in matchers] == ['alertname="GPUXidError"', 'summary="a, b"', 'gpu!="0"']


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alertname", "is not a matcher: expected a label name, one of = != =~ !~"),
        ('3gpu="1"', "is not a matcher"),
        ('alertname=="GPUFellOffBus"', "an unescaped double quote inside the value"),
        ('alertname="GPUFellOffBus', "opening double quote is never closed"),
        ('alertname=GPUFellOffBus"', "an unescaped double quote inside the value"),
        ('xid=~"("', "'(' is not a regex"),
        ("", "holds no matcher"),
        ('alertname="A",,gpu="1"', "'' is not a matcher"),
    ],
)
def test_a_bad_matcher_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_matchers(text)


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ('xid=~"79|48"', {"xid": "79"}, True),
        # Anchored at both ends, as Alertmanager compiles ^(?:...)$.
        ('xid=~"7"', {"xid": "79"}, False),
        ('xid=~"9"', {"xid": "79"}, False),
        ('xid!~"7"', {"xid": "79"}, True),
        ('alertname!="GPUXidError"', {"alertname": "GPUXidError"}, False),
        # A missing label is the empty string.
        ('gpu!="3"', {}, True),
        ('gpu=""', {}, True),
        ('gpu=~".+"', {}, False),
        ('gpu="3"', {}, False),
    ],
)
def test_matchers_match_whole_values_and_a_missing_label_is_empty(
    text: str, labels: dict[str, str], expected: bool
) -> None:
    assert parse_matcher(text).matches(labels) is expected


def _rule(source: str, target: str, *equal: str) -> InhibitRule:
    return InhibitRule(tuple(parse_matchers(source)), tuple(parse_matchers(target)), equal)


FELL_OFF = _rule('alertname="GPUFellOffBus"', 'alertname="GPUXidError"', "instance", "gpu")


def _alert(name: str, **labels: str) -> dict[str, str]:
    return {"alertname": name, "instance": "n1:19400", **labels}


def test_a_firing_source_inhibits_targets_with_equal_labels_only() -> None:
    lost = _alert("GPUFellOffBus", gpu="3")
    assert find_inhibitor(_alert("GPUXidError", gpu="3", xid="79"), [lost], [FELL_OFF]) == lost
    assert find_inhibitor(_alert("GPUXidError", gpu="5", xid="79"), [lost], [FELL_OFF]) is None
    other_node = {**lost, "instance": "n2:19400"}
    assert find_inhibitor(_alert("GPUXidError", gpu="3"), [other_node], [FELL_OFF]) is None
    # Not a target of the rule at all.
    assert find_inhibitor(_alert("GPUTemperatureHigh", gpu="3"), [lost], [FELL_OFF]) is None
    assert find_inhibitor(_alert("GPUXidError", gpu="3"), [], [FELL_OFF]) is None


def test_a_label_missing_on_one_side_only_is_not_equal() -> None:
    """docs/runbooks.md: an alert without `gpu` is neither inhibited by nor inhibits one GPU's."""
    rule = _rule('alertname="A"', 'alertname="B"', "instance", "gpu")
    assert find_inhibitor(_alert("B"), [_alert("A", gpu="3")], [rule]) is None
    assert find_inhibitor(_alert("B", gpu="3"), [_alert("A")], [rule]) is None
    # Missing on both sides: "" equals "".
    assert find_inhibitor(_alert("B"), [_alert("A")], [rule]) == _alert("A")


def test_an_alert_on_both_sides_of_a_rule_inhibits_neither_itself_nor_its_peers() -> None:
    """Alertmanager passes over sources that match the target side when the target is a source."""
    rule = _rule('severity="critical"', 'severity=~"warning|critical"', "gpu")
    critical = _alert("GPUXidError", gpu="3", severity="critical")
    other_critical = _alert("GPUFellOffBus", gpu="3", severity="critical")
    warning = _alert("GPUTemperatureHigh", gpu="3", severity="warning")
    firing = [critical, other_critical, warning]
    assert find_inhibitor(critical, firing, [rule]) is None
    assert find_inhibitor(other_critical, firing, [rule]) is None
    assert find_inhibitor(warning, firing, [rule]) == critical
