"""Render the rule files in ``alert_rules/`` from the thresholds, or check they are up to date.

``python -m tools.render_rules`` rewrites ``alert_rules/*.rules.yml``; with ``--check`` it
writes nothing and exits 1 if a committed file differs from what the thresholds render.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from exporter.alerting.rules import rule_files
from exporter.alerting.thresholds import DEFAULT_PATH, Thresholds, load
from tools import RULES_DIR

HEADER = (
    "# Rendered from alert_rules/thresholds.yaml by `python -m tools.render_rules`.\n"
    "# Do not edit: change the thresholds (or exporter/alerting/rules.py) and render again.\n"
)


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line expressions, so the rendered PromQL reads as written."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump(document: dict[str, Any]) -> str:
    """Return one rule file's text: the header and the document as block YAML."""
    body = yaml.dump(
        document, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True, indent=2
    )
    return HEADER + body


def render(thresholds: Thresholds) -> dict[str, str]:
    """Return each rule file's text by file name."""
    return {name: dump(document) for name, document in rule_files(thresholds).items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Write the rule files, or with ``--check`` report those that differ; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m tools.render_rules", description=__doc__)
    parser.add_argument("--thresholds", type=Path, default=DEFAULT_PATH, help="thresholds file")
    parser.add_argument("--out", type=Path, default=RULES_DIR, help="folder of the rule files")
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args(argv)
    texts = {args.out / name: text for name, text in render(load(args.thresholds)).items()}
    return write_rendered(texts, check=args.check, differs="differs from the thresholds")


def write_rendered(texts: Mapping[Path, str], *, check: bool, differs: str) -> int:
    """Write each file whose text changed, or with `check` only report it; the exit code.

    Shared by the rule files' and the dashboards' render commands.
    """
    stale = []
    for path, text in texts.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path}: {differs if check else 'rendered'}", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
