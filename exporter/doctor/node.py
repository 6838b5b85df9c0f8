"""The node's verdict: its GPUs counted by state, and alike GPUs grouped into one block.

GPUs are alike when they are the same model in the same state with the same findings, the same
unmeasured figures and the same MIG layout and instance states; their evidence may differ only in
its numbers, which a group shows as ranges ("utilization mean 22-24%"). A critical XID is part of
a hardware-fault finding; an application's XID (13, 31, 43, ...) does not set a GPU apart from the
others of its group, whose block lists it with the GPU it happened on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from exporter.doctor.verdicts import HEALTHY, ORDER, Finding, Report

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class Group:
    """Alike GPUs: the first one's report stands for all, with its evidence as ranges."""

    reports: list[Report]

    @property
    def gpus(self) -> list[int]:
        """The GPU indexes in the group."""
        return [int(report.gpu) for report in self.reports]

    @property
    def label(self) -> str:
        """``GPU 3`` or ``GPUs 0-2,4-7``."""
        if len(self.reports) == 1:
            return f"GPU {self.reports[0].gpu}"
        return f"GPUs {index_ranges(self.gpus)}"

    def evidence(self, position: int) -> list[str]:
        """The evidence of the group's finding at ``position``, numbers merged into ranges."""
        lines = [report.findings[position].evidence for report in self.reports]
        return [merge([texts[i] for texts in lines]) for i in range(len(lines[0]))]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        first = self.reports[0]
        return {
            "gpus": self.gpus,
            "label": self.label,
            "name": first.name,
            "state": first.state,
            "healthy": first.healthy,
            "summary": first.findings[0].summary if first.findings else "",
        }


@dataclass
class Node:
    """The verdict on a whole node."""

    name: str
    reports: list[Report]
    groups: list[Group]

    @property
    def states(self) -> dict[str, int]:
        """How many GPUs are in each state, the most serious first."""
        counts: dict[str, int] = {}
        for report in sorted(self.reports, key=_severity):
            counts[report.state] = counts.get(report.state, 0) + 1
        return counts

    @property
    def healthy(self) -> bool:
        """Whether every GPU was measured and needs nothing done."""
        return all(report.state in HEALTHY for report in self.reports)

    def verdict(self) -> str:
        """``node n1: 8 GPUs, 8 input-starved``; ``node n1: 8 GPUs, healthy (8 busy)``."""
        tally = ", ".join(f"{count} {state}" for state, count in self.states.items())
        if not self.reports:
            return f"node {self.name}: no GPUs"
        if self.healthy:
            tally = f"healthy ({tally})"
        return f"node {self.name}: {len(self.reports)} GPUs, {tally}"

    def xids(self) -> list[str]:
        """Every XID of the node, one line each, the most serious first."""
        found = [(xid, report.gpu) for report in self.reports for xid in report.xids]
        found.sort(key=lambda item: (not item[0].critical, int(item[1]), item[0].code))
        return [xid.text(gpu) for xid, gpu in found]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "name": self.name,
            "gpus": len(self.reports),
            "states": self.states,
            "healthy": self.healthy,
            "verdict": self.verdict(),
            "xids": [xid.to_json(report.gpu) for report in self.reports for xid in report.xids],
        }


def summarize(name: str, reports: list[Report]) -> Node:
    """Group alike GPUs (in the order of their first GPU) and count the states."""
    groups: dict[tuple[Any, ...], Group] = {}
    for report in reports:
        groups.setdefault(_likeness(report), Group([])).reports.append(report)
    ordered = sorted(groups.values(), key=lambda group: (_severity(group.reports[0]), group.gpus))
    return Node(name, reports, ordered)


def _severity(report: Report) -> int:
    return ORDER.index(report.state) if report.state in ORDER else len(ORDER)


def _finding_likeness(finding: Finding) -> tuple[Any, ...]:
    templates = tuple(_NUMBER.sub("#", line) for line in finding.evidence)
    return (finding.state, finding.summary, templates, tuple(finding.steps))


def _likeness(report: Report) -> tuple[Any, ...]:
    return (
        report.name,
        report.state,
        tuple(_finding_likeness(finding) for finding in report.findings),
        tuple(report.unmeasured),
        report.mig_mode,
        tuple(
            (i.instance, i.profile, tuple(_finding_likeness(f) for f in i.findings))
            for i in report.instances
        ),
    )


def merge(texts: list[str]) -> str:
    """Texts that differ only in their numbers as one, each differing number as ``low-high``."""
    numbers = [_NUMBER.findall(text) for text in texts]
    merged = []
    for column in zip(*numbers, strict=True):
        low = min(column, key=float)
        high = max(column, key=float)
        merged.append(low if float(low) == float(high) else f"{low}-{high}")
    pieces = iter(merged)
    return _NUMBER.sub(lambda _match: next(pieces), texts[0])


def index_ranges(indexes: list[int]) -> str:
    """``[0, 1, 2, 4, 5]`` as ``0-2,4-5``."""
    spans: list[list[int]] = []
    for index in sorted(indexes):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
