"""Render the Grafana dashboards in ``grafana/dashboards/`` from their definitions, or check them.

``python -m tools.dashboards.render`` rewrites ``grafana/dashboards/*.json``; with ``--check``
it writes nothing and exits 1 if a committed file differs from what the definitions render.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from exporter.alerting.thresholds import DEFAULT_PATH, Thresholds, load
from tools import ROOT
from tools.dashboards import bottlenecks, efficiency, fleet, node
from tools.render_rules import write_rendered

DASHBOARDS_DIR = ROOT / "grafana" / "dashboards"

# File name -> the function that builds the dashboard.
DASHBOARDS: dict[str, Callable[[Thresholds], dict[str, Any]]] = {
    "gpuload-fleet.json": fleet.build,
    "gpuload-node.json": node.build,
    "gpuload-bottlenecks.json": bottlenecks.build,
    "gpuload-efficiency.json": efficiency.build,
}


def render(thresholds: Thresholds) -> dict[str, str]:
    """Return each dashboard file's text by file name."""
    return {
        name: json.dumps(build(thresholds), indent=2, ensure_ascii=False) + "\n"
        for name, build in DASHBOARDS.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write the dashboards, or with ``--check`` report those that differ; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m tools.dashboards.render", description=__doc__)
    parser.add_argument("--thresholds", type=Path, default=DEFAULT_PATH, help="thresholds file")
    parser.add_argument("--out", type=Path, default=DASHBOARDS_DIR, help="folder of the JSON")
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args(argv)
    texts = {args.out / name: text for name, text in render(load(args.thresholds)).items()}
    return write_rendered(texts, check=args.check, differs="differs from its definition")


if __name__ == "__main__":
    sys.exit(main())
