"""No threshold is written twice: alert_rules/thresholds.yaml holds every value the rules judge by.

The Python that judges a GPU (the local evaluator, the doctor, the status page, the dashboards)
reads the values from the loaded thresholds or from the rules rendered from them. This test
reads every fraction and every large number of thresholds.yaml and looks for them as literals in
the Python of ``exporter/``. The simulator (``exporter/sim``) is left out: its numbers model a
GPU's behaviour, they judge nothing. A literal that is not a threshold (a timeout, a histogram
bucket) is listed below with what it is.
"""

from __future__ import annotations

import tokenize
from collections.abc import Iterator
from pathlib import Path

import yaml
from helpers import ROOT

from exporter.alerting import thresholds

PACKAGE = ROOT / "exporter"
# (file, the line's text) -> what the literal is, for the lines whose number happens to equal a
# threshold's value without being one.
NOT_THRESHOLDS = {
    (
        "exporter/report/arguments.py",
        "MIN_COVERAGE = 0.95",
    ): "the share of a report's period with data below which it is partial",
    (
        "exporter/cli.py",
        "close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)",
    ): "how close a mistyped flag must be to be suggested",
    (
        "exporter/config.py",
        "return self.collect_timeout or max(0.1, self.collect_interval * 0.8)",
    ): "the shortest collection timeout, in seconds",
    (
        "exporter/doctor/sampling.py",
        "timeout=max(0.1, interval * 0.8) if clock is None else SCENARIO_TIMEOUT_SECONDS,",
    ): "the shortest collection timeout, in seconds",
    ("exporter/session.py", "_BACKOFF_SLACK_SECONDS = 0.1"): "seconds of scheduling slack",
    ("exporter/web/server.py", "poll_interval: float = 0.2,"): "seconds between checks for a stop",
    (
        "exporter/relay/metrics.py",
        "buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),",
    ): "histogram buckets of delivery seconds",
    ("exporter/relay/delivery.py", "_SHUT_AGAIN_SECONDS = 0.05"): "seconds between shutdown tries",
    ("exporter/relay/targets/feishu.py", "min_interval = 0.6"): "seconds between two messages",
    ("exporter/relay/targets/pagerduty.py", "min_interval = 0.5"): "seconds between two events",
    ("tools/dashboards/grafana.py", '"exponent": 0.5,'): "a panel's colour scale",
    ("tools/conformance.py", "time.sleep(0.05)"): "seconds between polls",
    ("tools/golden.py", "_POLL_SECONDS = 0.1"): "seconds between polls",
    (
        "tools/kubelet.py",
        "while self.hanging.is_set() and not self._released.wait(0.05):",
    ): "seconds between checks for a cancelled call",
}


def _numbers(value: object) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list) and not all(isinstance(item, int) for item in value):
        # A list of integers is a list of codes (GPUXidError's XIDs), not of thresholds.
        for item in value:
            yield from _numbers(item)


def threshold_values() -> set[float]:
    """Every value of thresholds.yaml that could only be a threshold if written in Python."""
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    found = set(_numbers(document))
    # Small whole numbers (a 5 °C margin) are everywhere in code and mean nothing alone.
    return {value for value in found if not value.is_integer() or value >= 1000}


def literals(path: Path) -> Iterator[tuple[float, str]]:
    """Each number literal of a Python file, with its line."""
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type != tokenize.NUMBER:
                continue
            try:
                value = float(token.string.replace("_", ""))
            except ValueError:
                continue  # an imaginary literal
            yield value, token.line.strip()


def test_the_threshold_values_are_found_where_they_are_written() -> None:
    """The scan finds what it looks for: thresholds.yaml's values include the known ones."""
    values = threshold_values()
    loaded = thresholds.load()
    assert loaded.alert("GPUUtilizationLow").number("below") in values
    assert loaded.bottlenecks.link_busy_above in values
    assert float(loaded.in_use_memory_floor_bytes) in values


def test_no_threshold_value_is_written_in_python() -> None:
    values = threshold_values()
    found = []
    # The runtime and the tooling that renders dashboards and rules from the thresholds.
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tools").rglob("*.py")]):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("exporter/sim/"):
            continue
        for value, line in literals(path):
            if value in values and (relative, line) not in NOT_THRESHOLDS:
                found.append(f"{relative}: {line}")
    assert found == [], "threshold values written in Python, read them from thresholds instead"


def test_every_listed_literal_is_still_there() -> None:
    """A line that no longer exists leaves the list, so the list cannot excuse a new one."""
    missing = []
    for relative, line in NOT_THRESHOLDS:
        path = ROOT / relative
        if not path.exists() or line not in {text for _v, text in literals(path)}:
            missing.append((relative, line))
    assert missing == []
