"""The node's verdict: its GPUs counted by what they need, and alike GPUs grouped into one block.

GPUs are alike when they are the same model with the same recorded state, bottleneck classes,
alerts (by name and state), MIG layout and reported XID codes; their figures may differ only in
their numbers, which a group shows as ranges ("busy 22-24%"). XIDs are listed with the GPU they
happened on, and a GPU that reported one is never counted as plainly "healthy".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from exporter.alerting.states import LEVELS, Verdict
from exporter.doctor.xids import Xid

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class Group:
    """Alike GPUs: the first one's verdict stands for all, with its figures as ranges."""

    verdicts: list[Verdict]
    xids: dict[str, list[Xid]] = field(default_factory=dict)

    @property
    def gpus(self) -> list[int]:
        """The GPU indexes in the group."""
        return [int(verdict.gpu) for verdict in self.verdicts]

    @property
    def label(self) -> str:
        """``GPU 3`` or ``GPUs 0-2,4-7``."""
        if len(self.verdicts) == 1:
            return f"GPU {self.verdicts[0].gpu}"
        return f"GPUs {index_ranges(self.gpus)}"

    def merged(self, lines: list[list[str]]) -> list[str]:
        """Per-GPU lines of the same shape as one list, differing numbers as ranges."""
        return [merge([texts[i] for texts in lines]) for i in range(len(lines[0]))]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        first = self.verdicts[0]
        return {
            "gpus": self.gpus,
            "label": self.label,
            "name": first.name,
            "state": first.state,
            "attention": first.attention,
            "healthy": first.healthy,
            "summary": first.summary(),
        }


@dataclass
class Node:
    """The verdict on a whole node."""

    name: str
    verdicts: list[Verdict]
    groups: list[Group]
    xids: dict[str, list[Xid]] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        """How many GPUs each headline has, the most urgent first."""
        counts: dict[str, int] = {}
        for verdict in sorted(self.verdicts, key=_severity):
            word = headline(verdict, self.xids.get(verdict.gpu, []))
            counts[word] = counts.get(word, 0) + 1
        return counts

    @property
    def healthy(self) -> bool:
        """Whether every GPU needs nothing done."""
        return all(verdict.attention == "ok" for verdict in self.verdicts)

    def verdict(self) -> str:
        """``node n1: 8 GPUs, 8 input-starved``; ``node n1: 8 GPUs, healthy (8 saturated)``."""
        if not self.verdicts:
            return f"node {self.name}: no GPUs"
        tally = ", ".join(f"{count} {word}" for word, count in self.counts.items())
        if self.healthy:
            tally = f"healthy ({tally})"
        gpus = len(self.verdicts)
        return f"node {self.name}: {gpus} GPU{'' if gpus == 1 else 's'}, {tally}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "name": self.name,
            "gpus": len(self.verdicts),
            "counts": self.counts,
            "healthy": self.healthy,
            "verdict": self.verdict(),
        }


def summarize(name: str, verdicts: list[Verdict], xids: dict[str, list[Xid]]) -> Node:
    """Group alike GPUs (the most urgent first, then by first GPU)."""
    groups: dict[tuple[Any, ...], Group] = {}
    for verdict in verdicts:
        group = groups.setdefault(_likeness(verdict, xids.get(verdict.gpu, [])), Group([]))
        group.verdicts.append(verdict)
        group.xids[verdict.gpu] = xids.get(verdict.gpu, [])
    ordered = sorted(groups.values(), key=lambda g: (_severity(g.verdicts[0]), g.gpus))
    return Node(name, verdicts, ordered, xids)


def headline(verdict: Verdict, xids: list[Xid]) -> str:
    """The verdict's headline; "<state> with XIDs" for a GPU no alert names but that reported one.

    An XID GPUXidError does not page on (13, 31, 43: the application's fault, as a rule) leaves
    the GPU's state as the rules give it, but the GPU is not called plainly healthy beside it.
    """
    word = verdict.headline()
    if xids and word == verdict.state and verdict.state != "lost":
        return f"{word} with XIDs"
    return word


def _severity(verdict: Verdict) -> int:
    return LEVELS.index(verdict.attention)


def _likeness(verdict: Verdict, xids: list[Xid]) -> tuple[Any, ...]:
    return (
        verdict.name,
        verdict.state,
        verdict.attention,
        tuple(b.name for b in verdict.bottlenecks),
        tuple((a.name, a.state, a.labels.get("mig_instance")) for a in verdict.alerts),
        tuple((i.instance, i.profile, i.sm_active is None) for i in verdict.instances),
        tuple(xid.code for xid in xids),
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
