"""End-to-end: the real daemon on pinned scenarios, its /metrics diffed against golden files.

The scenarios, the daemon's start and the one regex of non-deterministic families are in
``tools/golden.py``. Rewrite the golden files after an intended change with ``scripts/regenerate``
(it also regenerates the README's metrics table and docs/fleet.md's lists from them) and review
the diff.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.collectors import REGISTRY
from tools import golden


@pytest.fixture(scope="module", params=golden.NAMES)
def scrape(request) -> tuple[str, str]:
    return request.param, golden.scrape(request.param)


def test_metrics_match_the_golden_file(scrape: tuple[str, str]) -> None:
    name, text = scrape
    actual = golden.deterministic(text)
    expected = golden.path(name).read_text()
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True), "golden", "actual"
        )
    )
    assert not diff, f"/metrics changed; if intended, run scripts/regenerate:\n{diff}"


def test_promtool_accepts_the_exposition(scrape: tuple[str, str]) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/test (Debian package prometheus)"
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape[1],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_every_registered_family_is_in_a_golden_file_and_the_readme() -> None:
    shown_text = "".join(path.read_text() for path in golden.GOLDEN_DIR.glob("metrics-*.txt"))
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    names = {family.name for spec in REGISTRY.values() for family in spec.families}
    names |= {
        "gpu_info",
        "gpu_up",
        "gpuload_gpu_stale",
        "gpuload_nvml_up",
        "gpuload_collector_success",
        "gpuload_nvml_errors_total",
        "gpuload_build_info",
    }
    shown = {
        name
        for name in names
        if golden.NON_DETERMINISTIC.match(name)
        or f"# HELP {name} " in shown_text
        or f"# HELP {name.removesuffix('_total')}" in shown_text
    }
    assert sorted(names - shown) == [], "families no golden scenario shows"
    assert sorted(n for n in names if f"`{n}" not in readme) == [], "families the README omits"
