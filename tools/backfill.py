"""Recording rules over stored samples, as if Prometheus had evaluated them all along.

For data loaded as blocks (`promtool tsdb create-blocks-from openmetrics`): :func:`rule_levels`
orders the rules some series need by what they read, and :func:`record` evaluates one level at a
time against a real Prometheus on the blocks (one range query per rule, what `promtool tsdb
create-blocks-from rules` does in one query per two hours) and loads each level's output as
blocks before the next level, which reads it. The tests' week of the `pods` scenario and
``python -m bench.accounting`` use it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import requests

from exporter.alerting import thresholds
from exporter.alerting.definition import Recording
from exporter.alerting.rules import rule_groups

# A recorded series named in an expression, with its matchers.
_REFERENCE = re.compile(r"([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)(\{[^}]*\})?")


def rule_levels(names: Iterable[str]) -> list[list[Recording]]:
    """The rules that record ``names`` and those they read, by level: each reads earlier ones.

    A reference with equality matchers on a rule's own labels (``{bottleneck="hung"}``) needs
    only the rules of that name whose labels match.
    """
    recordings = [
        rule
        for groups in rule_groups(thresholds.load()).values()
        for group in groups
        for rule in group.recordings()
    ]
    by_name: dict[str, list[Recording]] = defaultdict(list)
    for rule in recordings:
        by_name[rule.record].append(rule)
    level: dict[int, int] = {}

    def needs(rule: Recording) -> list[Recording]:
        found = []
        for name, matchers in _REFERENCE.findall(rule.expr):
            wanted = dict(re.findall(r'(\w+)="([^"]*)"', matchers))
            for other in by_name.get(name, []):
                if other.record == rule.record:
                    continue
                if all(other.labels.get(k, v) == v for k, v in wanted.items()):
                    found.append(other)
        return found

    def depth(rule: Recording) -> int:
        if id(rule) not in level:
            level[id(rule)] = 1 + max((depth(other) for other in needs(rule)), default=0)
        return level[id(rule)]

    targets = set(names)
    wanted: dict[int, Recording] = {}
    todo = [rule for rule in recordings if rule.record in targets]
    while todo:
        rule = todo.pop()
        if id(rule) not in wanted:
            wanted[id(rule)] = rule
            todo.extend(needs(rule))
    levels: list[list[Recording]] = [[] for _ in range(max(map(depth, wanted.values())))]
    for rule in recordings:
        if id(rule) in wanted:
            levels[depth(rule) - 1].append(rule)
    return levels


def create_blocks(openmetrics: Path, data: Path) -> None:
    """Load OpenMetrics text into a Prometheus data folder as blocks (few: up to 8 days each)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool is missing (Debian's prometheus package has it)")
    subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=192h",
            str(openmetrics),
            str(data),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )


def labels_text(labels: dict[str, str]) -> str:
    """``{a="1",b="2"}``, empty values left out (Prometheus's absent label)."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items() if v != "") + "}"


def record(
    levels: list[list[Recording]],
    data: Path,
    folder: Path,
    start_prometheus: Callable[[Path, str], str],
    stop: Callable[[], None],
    span: tuple[int, int, int],
    timings: dict[str, float] | None = None,
) -> None:
    """Evaluate ``levels`` over ``span`` (start, end, step in seconds) into ``data``.

    ``start_prometheus(data, name)`` starts a Prometheus on ``data`` and returns its URL;
    ``stop()`` stops it. Backfilled series have no staleness markers: that Prometheus must look
    back just under a step (``--query.lookback-delta=59s`` for a 60 s step), so that a series
    that ended (a scrape gap, a state left) is gone at the next step, as a staleness marker
    would end it. ``timings`` gets each rule's query seconds, by record name, added up.
    """
    import time

    begin, end, step = span
    for number, rules in enumerate(levels):
        url = start_prometheus(data, f"level-{number}")
        output = folder / f"level-{number}.om"
        try:
            families: dict[str, list[str]] = defaultdict(list)
            for rule in rules:
                started = time.monotonic()
                answer = requests.post(
                    url + "/api/v1/query_range",
                    data={"query": rule.expr, "start": begin, "end": end, "step": step},
                    timeout=600,
                ).json()
                if timings is not None:
                    timings[rule.record] = (
                        timings.get(rule.record, 0.0) + time.monotonic() - started
                    )
                if answer["status"] != "success":
                    raise RuntimeError(f"{rule.record}: {answer}")
                for series in answer["data"]["result"]:
                    labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
                    text = labels_text({**labels, **rule.labels})
                    families[rule.record].extend(
                        f"{rule.record}{text} {value} {t}" for t, value in series["values"]
                    )
        finally:
            stop()
        with output.open("w", encoding="utf-8") as out:
            for name, lines in families.items():
                out.write(f"# TYPE {name} gauge\n")
                out.write("\n".join(lines) + "\n")
            out.write("# EOF\n")
        create_blocks(output, data)
