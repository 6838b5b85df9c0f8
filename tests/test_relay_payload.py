"""Alertmanager's payload: what is accepted, what is refused and why; no input crashes the relay."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relay_helpers import FakeTarget, alert, notification, running_relay

from exporter.relay import payload


def test_alertmanager_payload_is_parsed_keeping_unknown_fields() -> None:
    document = notification(alert(), alert("GPUMemoryNearlyFull", status="resolved"))
    document["routeLabels"] = {"receiver": "relay"}
    document["truncatedAlerts"] = 2
    parsed = payload.parse(json.dumps(document).encode())
    assert parsed.status == "firing"
    assert [a.status for a in parsed.alerts] == ["firing", "resolved"]
    assert parsed.truncated_alerts == 2
    assert json.loads(parsed.to_json()) == document
    assert parsed.subset([1]).status == "resolved"
    assert json.loads(parsed.subset([1]).to_json())["alerts"] == [document["alerts"][1]]


def test_dedup_key_is_the_group_status_and_alerts() -> None:
    base = notification(alert(), alert(gpu="4"))
    key = payload.parse(json.dumps(base)).dedup_key()
    reordered = dict(base, alerts=list(reversed(base["alerts"])))
    assert payload.parse(json.dumps(reordered)).dedup_key() == key
    changed = copy.deepcopy(base)
    changed["alerts"][1]["status"] = "resolved"
    assert payload.parse(json.dumps(changed)).dedup_key() != key
    restarted = copy.deepcopy(base)
    restarted["alerts"][0]["startsAt"] = "2026-01-03T00:00:00Z"
    assert payload.parse(json.dumps(restarted)).dedup_key() != key


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"alerts": []}', "version 4: version is missing"),
        (b'{"version": "3", "alerts": []}', 'version is "3"'),
        (b'{"version": "4", "alerts": []}', "alerts: expected a non-empty list"),
        (b'{"version": "4", "alerts": [1]}', "alerts[0]: expected an object"),
    ],
)
def test_refusals_say_why_in_one_line(body: bytes, reason: str) -> None:
    with pytest.raises(payload.PayloadError) as refused:
        payload.parse(body)
    assert reason in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_field_of_the_wrong_type_is_named() -> None:
    document = notification(alert())
    document["alerts"][0]["labels"]["gpu"] = 3
    with pytest.raises(payload.PayloadError, match=r"alerts\[0\].labels: expected an object"):
        payload.parse(json.dumps(document))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = [
    "version",
    "groupKey",
    "status",
    "receiver",
    "alerts",
    "truncatedAlerts",
    "groupLabels",
    "commonLabels",
    "externalURL",
]
ALERT_FIELDS = [
    "status",
    "labels",
    "annotations",
    "startsAt",
    "endsAt",
    "fingerprint",
    "generatorURL",
]


@st.composite
def mutated_payloads(draw: st.DrawFn) -> Any:
    """A valid payload with some fields replaced by arbitrary JSON or removed."""
    document = notification(*[alert(gpu=str(i)) for i in range(draw(st.integers(1, 3)))])
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        if draw(st.booleans()):
            document[field] = draw(json_values)
        else:
            document.pop(field, None)
    if isinstance(document.get("alerts"), list) and document["alerts"]:
        target = document["alerts"][0]
        if isinstance(target, dict):
            for field in draw(st.lists(st.sampled_from(ALERT_FIELDS), max_size=3)):
                target[field] = draw(json_values)
    return document


def _parse_or_refuse(body: bytes) -> None:
    try:
        parsed = payload.parse(body)
    except payload.PayloadError as error:
        assert "\n" not in str(error)
        return
    parsed.dedup_key()
    parsed.to_json()


# scripts/fuzz runs these longer (GPULOAD_FUZZ_EXAMPLES).
FUZZ_EXAMPLES = int(os.environ.get("GPULOAD_FUZZ_EXAMPLES", "300"))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_are_refused(body: bytes) -> None:
    _parse_or_refuse(body)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values | mutated_payloads())
def test_any_json_parses_or_is_refused(document: Any) -> None:
    _parse_or_refuse(json.dumps(document).encode())


def test_deep_nesting_is_refused_not_a_crash() -> None:
    _parse_or_refuse(b"[" * 100_000 + b"]" * 100_000)


def test_no_input_makes_the_endpoint_answer_500(tmp_path: Path) -> None:
    receiver = FakeTarget()
    config = {
        "targets": {"hook": {"type": "webhook", "url": receiver.url}},
        "route": {"targets": ["hook"]},
        "web": {"listen_address": "127.0.0.1:0", "max_body_bytes": 2000},
    }
    try:
        with running_relay(tmp_path, config) as relay:
            session = requests.Session()
            bodies = (
                st.binary(max_size=2500)
                | json_values.map(lambda v: json.dumps(v).encode())
                | mutated_payloads().map(lambda v: json.dumps(v).encode())
            )
            headers = st.fixed_dictionaries(
                {},
                optional={
                    "Content-Type": st.sampled_from(["application/json", "text/plain", "x/y"]),
                    # The client refuses header values with surrounding whitespace.
                    "Authorization": st.text(
                        st.characters(min_codepoint=32, max_codepoint=126), max_size=40
                    ).filter(lambda value: value == value.strip()),
                },
            )

            @settings(
                max_examples=150,
                deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            )
            @given(bodies, headers, st.sampled_from(["alerts", "alerts?x=1", "", "metrics"]))
            def check(body: bytes, extra: dict[str, str], path: str) -> None:
                answer = session.post(relay.url + path, data=body, headers=extra, timeout=10)
                assert answer.status_code in (200, 400, 404, 405, 413), answer.text
                if path.startswith("alerts") and answer.status_code == 400:
                    assert answer.text.count("\n") == 1

            check()
            assert requests.get(relay.url + "healthz", timeout=5).status_code == 200
    finally:
        receiver.close()
