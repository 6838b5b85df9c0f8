"""Every list of GPU states and bottleneck classes follows the rules' own lists.

The rules define the states of ``gpu:gpu_state:5m`` (:data:`exporter.alerting.rules.STATES`) and
the classes of ``gpu:gpu_bottleneck:class5m`` (:data:`exporter.alerting.rules.BOTTLENECK_ALERTS`)
once. The words the doctor and the status page print (:mod:`exporter.alerting.states`), the
status page's attention levels, and the dashboards' colours, labels and value mappings (their
source in ``tools/dashboards/`` and the JSON rendered from it) name them again for a person:
each list must hold the same states, a word, label or colour for each, and none of its own.
"""

from __future__ import annotations

import json
import re
from typing import Any

from exporter.alerting import rules, states, thresholds
from exporter.server.status import SEVERITIES
from tools.dashboards import fleet
from tools.dashboards.bottlenecks import BOTTLENECKS
from tools.dashboards.render import DASHBOARDS_DIR

# A state label matcher in a dashboard query (not `alertstate`).
STATE_MATCHER = re.compile(r'(?<![a-z_])state="([a-z_]+)"')


def _dashboard(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((DASHBOARDS_DIR / name).read_text(encoding="utf-8"))
    return document


def _panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    panel: dict[str, Any] = next(p for p in dashboard["panels"] if p.get("title") == title)
    return panel


def test_every_state_has_words_for_the_doctor_and_the_status_page() -> None:
    """The rules' states, and the one state of a verdict before any is recorded."""
    assert set(states.STATE_WORDS) == {*rules.STATES, states.UNRECORDED}
    assert states.UNRECORDED not in rules.STATES
    assert all(states.STATE_WORDS.values())


def test_every_state_has_a_colour_on_the_fleet_dashboard() -> None:
    assert set(fleet.STATE_COLOURS) == set(rules.STATES)
    assert all(fleet.STATE_COLOURS.values())


def test_the_rendered_fleet_dashboard_counts_and_colours_exactly_the_rules_states() -> None:
    dashboard = _dashboard("gpuload-fleet.json")
    overrides = _panel(dashboard, "GPUs by state")["fieldConfig"]["overrides"]
    coloured = {
        override["matcher"]["options"]: override["properties"][0]["value"]["fixedColor"]
        for override in overrides
    }
    assert coloured == fleet.STATE_COLOURS
    counted = set(STATE_MATCHER.findall(json.dumps(dashboard).replace('\\"', '"')))
    assert counted == set(rules.STATES)


def test_every_bottleneck_class_has_words_a_measure_a_label_and_a_colour() -> None:
    """The classes are the rules'; the doctor's, page's and dashboard's words follow them."""
    classes = list(rules.BOTTLENECK_ALERTS)
    assert list(BOTTLENECKS) == classes
    assert all(shown and colour for shown, colour in BOTTLENECKS.values())
    assert list(states.BOTTLENECK_WORDS) == classes
    assert all(states.BOTTLENECK_WORDS.values())
    assert list(states.BOTTLENECK_VALUES) == classes
    assert all(states.BOTTLENECK_VALUES.values())


def test_every_bottleneck_class_names_an_alert_the_rules_define() -> None:
    defined = {alert.name for alert in rules.alerts(thresholds.load())}
    named = {alert for alert in rules.BOTTLENECK_ALERTS.values() if alert is not None}
    assert named <= defined


def test_the_rendered_bottleneck_dashboard_maps_exactly_the_rules_classes() -> None:
    table = _panel(_dashboard("gpuload-bottlenecks.json"), "What limits each in-use GPU")
    overrides = {
        o["matcher"]["options"]: o["properties"] for o in table["fieldConfig"]["overrides"]
    }
    mapping = next(p["value"] for p in overrides["Bottleneck"] if p["id"] == "mappings")
    options = mapping[0]["options"]
    assert list(options) == list(rules.BOTTLENECK_ALERTS)
    assert {key: (o["text"], o["color"]) for key, o in options.items()} == BOTTLENECKS


def test_the_status_page_has_a_symbol_and_a_word_for_every_attention_level() -> None:
    assert list(SEVERITIES) == list(states.LEVELS)
    assert all(symbol and word for _rank, symbol, word in SEVERITIES.values())
