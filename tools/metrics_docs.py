"""The README's metrics tables and docs/fleet.md's families per profile, from the code.

Each is a block between two markers in its document, rewritten whole; the text around the
blocks is written by hand. What they say comes from three places only:

- the collectors' registry (``exporter.collectors.REGISTRY``): each collector's description and
  options, and each family's name, labels and HELP (what is measured, its unit, its NVML call);
- the metrics profiles' filters (``exporter.collectors.profiles.sample_filter``);
- the golden files, for the label values a profile keeps of a family it keeps only in part
  (the SM and memory clocks, the clock events that slow a GPU down, uncorrected ECC errors).

``scripts/regenerate`` writes them after the golden files; ``tests/test_metrics_docs.py`` fails
while a block differs from what this module makes of the code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors import REGISTRY, Family, Sample
from exporter.collectors.base import CollectorSpec
from exporter.collectors.profiles import PROFILES, sample_filter
from tools import ROOT, golden

README = ROOT / "README.md"
FLEET = ROOT / "docs" / "fleet.md"

# One family's series: the values of its declared labels, in their order.
Series = tuple[str, ...]


class StaleGoldenError(RuntimeError):
    """A registered family whose label values no golden file shows, so no profile can be told."""


@dataclass(frozen=True)
class Row:
    """A registered family, its collector, and every series of it the golden files show."""

    collector: CollectorSpec
    family: Family
    series: frozenset[Series]

    def kept(self, profile: str) -> frozenset[Series]:
        """The series the metrics profile publishes of those the golden files show."""
        keep = sample_filter(profile)
        if keep is None:
            return self.series
        return frozenset(s for s in self.series if keep(Sample(self.family.name, 0.0, s)))


def rows(golden_texts: Iterable[str] | None = None) -> list[Row]:
    """Every registered family in collector order, with its series from the golden files."""
    texts = golden_texts if golden_texts is not None else _golden_texts()
    declared = {f.name: f for spec in REGISTRY.values() for f in spec.families}
    shown: dict[str, set[Series]] = {name: set() for name in declared}
    for text in texts:
        for metric in text_string_to_metric_families(text):
            for sample in metric.samples:
                family = declared.get(sample.name)
                if family is not None:
                    shown[family.name].add(
                        tuple(sample.labels.get(label, "") for label in family.labels)
                    )
    result = []
    for spec in sorted(REGISTRY.values(), key=lambda spec: spec.name):
        for family in spec.families:
            # A family without labels has one series, whether a golden file keeps it or not
            # (the PCIe byte counters vary by run and are left out of them).
            if not family.labels:
                shown[family.name] = {()}
            if not shown[family.name]:
                raise StaleGoldenError(
                    f"no golden file shows {family.name}: give a scenario of tools/golden.py "
                    "a GPU that has it, then run scripts/regenerate"
                )
            result.append(Row(spec, family, frozenset(shown[family.name])))
    return result


def _golden_texts() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in sorted(golden.GOLDEN_DIR.glob("*.txt"))]


def describe(row: Row, some: frozenset[Series]) -> str:
    """Which of a family's series `some` are, by the labels whose values set them apart.

    Empty when `some` is every series shown; otherwise e.g. ``clock: memory, sm``.
    """
    if some == row.series:
        return ""
    parts = []
    for position, label in enumerate(row.family.labels):
        values = {s[position] for s in some}
        if values != {s[position] for s in row.series}:
            parts.append(f"{label}: {', '.join(sorted(values))}")
    return "; ".join(parts)


def _named(row: Row, some: frozenset[Series]) -> str:
    detail = describe(row, some)
    return f"`{row.family.name}` ({detail})" if detail else f"`{row.family.name}`"


def profiles_cell(row: Row) -> str:
    """The profiles that publish the family, each with the part of it kept where not all."""
    cells = []
    for profile in PROFILES:
        kept = row.kept(profile)
        if kept:
            detail = describe(row, kept)
            cells.append(f"{profile} ({detail})" if detail else profile)
    return ", ".join(cells)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _signature(family: Family) -> str:
    return f"`{family.name}{{{','.join(family.labels)}}}`" if family.labels else f"`{family.name}`"


def _options(spec: CollectorSpec) -> str:
    return ", ".join(
        f"`collectors.{spec.name}.{key}: {json.dumps(value)}`"
        for key, value in spec.options.items()
    )


def metrics_tables(table_rows: list[Row]) -> str:
    """The README's block: the collectors, then every family they export."""
    lines = ["| collector | reads | options (default) |", "|---|---|---|"]
    for spec in sorted(REGISTRY.values(), key=lambda spec: spec.name):
        enabled = "" if spec.enabled_by_default else " Off unless enabled."
        lines.append(f"| `{spec.name}` | {_cell(spec.description)}{enabled} | {_options(spec)} |")
    lines += [
        "",
        "| family | collector | profiles | what it measures, in which unit, from which NVML call |",
        "|---|---|---|---|",
    ]
    for row in table_rows:
        lines.append(
            f"| {_signature(row.family)} | {row.collector.name} | {profiles_cell(row)} "
            f"| {_cell(row.family.help)} |"
        )
    return "\n".join(lines)


def profile_lists(table_rows: list[Row]) -> str:
    """docs/fleet.md's block: the families of each profile, each one's beyond the smaller one."""
    lines = []
    previous: Mapping[str, frozenset[Series]] = {row.family.name: frozenset() for row in table_rows}
    for profile in PROFILES:
        kept = {row.family.name: row.kept(profile) for row in table_rows}
        added = []
        for row in table_rows:
            name = row.family.name
            if not previous[name] <= kept[name]:
                raise ValueError(f"{profile} drops series of {name} that a smaller profile keeps")
            new = kept[name] - previous[name]
            if new:
                added.append(_named(row, new))
        families = sum(1 for series in kept.values() if series)
        lead = f"`{profile}` ({families} families)"
        lead += ":" if profile == PROFILES[0] else f", adding {len(added)} to the one above:"
        lines.append(f"- {lead} {', '.join(added)}.")
        previous = kept
    return "\n".join(lines)


def _markers(block: str) -> tuple[str, str]:
    return f"<!-- generated by scripts/regenerate: {block} -->", f"<!-- end of {block} -->"


def with_block(text: str, block: str, body: str) -> str:
    """`text` with the lines between the block's two markers replaced by `body`."""
    start, end = _markers(block)
    pattern = re.compile(rf"(?<={re.escape(start)}\n).*?(?=^{re.escape(end)}$)", re.S | re.M)
    if not pattern.search(text):
        raise ValueError(f"no block between {start!r} and {end!r}")
    return pattern.sub(lambda _: body + "\n", text, count=1)


def expected_files(golden_texts: Iterable[str] | None = None) -> dict[Path, str]:
    """The README and docs/fleet.md with their generated blocks as the code says."""
    table_rows = rows(golden_texts)
    readme = with_block(
        README.read_text(encoding="utf-8"), "metrics tables", metrics_tables(table_rows)
    )
    fleet = with_block(
        FLEET.read_text(encoding="utf-8"), "families per profile", profile_lists(table_rows)
    )
    return {README: readme, FLEET: fleet}
