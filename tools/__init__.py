"""Build and check tooling: what makes the committed artefacts and checks the simulator.

Nothing here ships: the wheel and the image carry ``exporter`` only, and ``exporter`` never
imports ``tools``. Run each from the repository root:

- ``python -m tools.regenerate`` (``scripts/regenerate``) runs every generator below that writes
  a committed file, then the golden files (``tools.golden``) and the docs' metrics tables
  (``tools.metrics_docs``);
- ``python -m tools.render_rules`` writes ``alert_rules/*.rules.yml`` from the thresholds;
- ``python -m tools.dashboards.render`` writes ``grafana/dashboards/*.json``;
- ``python -m tools.chart`` (``scripts/refresh-chart``) copies both into the Helm chart;
- ``python -m tools.vectors --out DIR`` writes the rule vectors as promtool test files;
- ``python -m tools.conformance DIR`` compares gpuload on recorded machines with nvidia-smi.

``--check`` on the first four exits 1 when a committed file is stale; the tests check the same.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# thresholds.yaml, the rendered rule files and their vectors.
RULES_DIR = ROOT / "alert_rules"
