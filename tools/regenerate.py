"""Regenerate every committed file that derives from the code, or check that none is stale.

``python -m tools.regenerate`` (``scripts/regenerate``) runs, in this order, since each part
reads what the one before writes:

1. ``rules``: ``alert_rules/*.rules.yml`` from the thresholds (``tools.render_rules``);
2. ``dashboards``: ``grafana/dashboards/*.json`` (``tools.dashboards.render``);
3. ``chart``: the Helm chart's copies of both (``tools.chart``);
4. ``golden``: ``tests/golden/metrics-*.txt``, the real daemon's /metrics on pinned scenarios
   (``tools.golden``; about half a minute);
5. ``docs``: the README's metrics tables and docs/fleet.md's families per profile, from the
   collectors' registry, the profiles and the golden files (``tools.metrics_docs``).

``--check`` writes nothing and exits 1 naming each stale file. Name parts to run only those.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from exporter.alerting.thresholds import DEFAULT_PATH, load
from tools import ROOT, RULES_DIR, chart, golden, metrics_docs, render_rules
from tools.dashboards import render as dashboards

COMMAND = "scripts/regenerate"


def _rule_files() -> dict[Path, str]:
    return {
        RULES_DIR / name: text for name, text in render_rules.render(load(DEFAULT_PATH)).items()
    }


def _dashboards() -> dict[Path, str]:
    rendered = dashboards.render(load(DEFAULT_PATH))
    return {dashboards.DASHBOARDS_DIR / name: text for name, text in rendered.items()}


def file_part(expected: Callable[[], dict[Path, str]]) -> Callable[[bool], list[Path]]:
    """A part that writes the files `expected` returns: the stale ones, written unless checking."""

    def run(check: bool) -> list[Path]:
        stale = []
        for path, text in expected().items():
            if path.exists() and path.read_text(encoding="utf-8") == text:
                continue
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
        return stale

    return run


def _chart(check: bool) -> list[Path]:
    # The chart's own refresh also removes copies whose source is gone.
    return chart.stale_files() if check else chart.refresh()


PARTS: dict[str, Callable[[bool], list[Path]]] = {
    "rules": file_part(_rule_files),
    "dashboards": file_part(_dashboards),
    "chart": _chart,
    "golden": file_part(golden.expected_files),
    "docs": file_part(metrics_docs.expected_files),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate, or with ``--check`` report the stale files; return the exit code."""
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"of {', '.join(PARTS)} (all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part {', '.join(unknown)}: expected some of {', '.join(PARTS)}")
    failed = False
    for part, run in PARTS.items():
        if args.parts and part not in args.parts:
            continue
        try:
            stale = run(args.check)
        except metrics_docs.StaleGoldenError as error:
            print(f"{COMMAND}: {error}", file=sys.stderr)
            failed = True
            continue
        for path in stale:
            verb = f"stale: run {COMMAND}" if args.check else "regenerated"
            print(f"{path.relative_to(ROOT)}: {verb}", file=sys.stderr)
        failed = failed or (args.check and bool(stale))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
