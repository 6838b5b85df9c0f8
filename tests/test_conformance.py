"""Conformance: gpuload on each recorded machine against nvidia-smi's own figures.

The real `gpuload serve --simulate` runs on each imported recording of ../shared/reality; its
/metrics are compared with what nvidia-smi printed in the same file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import ROOT, Daemon, series

from exporter.sim import importer
from tools import conformance
from tools.conformance import EQUAL, MISMATCH, PINNED_TIME

REALITY = ROOT.parent / "shared" / "reality"
NEEDS_REALITY = pytest.mark.skipif(
    not REALITY.is_dir(), reason="needs ../shared/reality (the recorded machines); not present"
)
# Without the recordings, one placeholder case, skipped with NEEDS_REALITY's reason.
RECORDED = list(conformance.recordings(REALITY)) if REALITY.is_dir() else [(REALITY, None)]
T4 = REALITY / "nvidia-smi-xml" / "tesla-t4.xml"
H100 = REALITY / "captures" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"


def _serve(
    daemon_factory: Callable[..., Daemon], tmp_path: Path, path: Path, state: str | None
) -> tuple[conformance.Samples, str]:
    """Import ``path``, run gpuload on it with the scenario clock pinned, scrape /metrics."""
    scenario = tmp_path / f"{path.stem}.yaml"
    scenario.write_text(importer.render(importer.import_file(path, state or "load")))
    daemon = daemon_factory(
        "--simulate", str(scenario), "--sim.time", f"{PINNED_TIME:g}", env=conformance.EVERYTHING
    )
    text = daemon.get("/metrics").text
    return conformance.parse_samples(text), text


@NEEDS_REALITY
@pytest.mark.parametrize(
    ("path", "state"), RECORDED, ids=[f"{p.name}:{s or 'xml'}" for p, s in RECORDED]
)
def test_gpuload_on_an_imported_recording_reports_what_nvidia_smi_printed(
    daemon_factory: Callable[..., Daemon], tmp_path: Path, path: Path, state: str | None
) -> None:
    samples, text = _serve(daemon_factory, tmp_path, path, state)
    report = conformance.compare(conformance.read_reference(path, state), samples)
    assert not report.mismatches, "\n".join(o.describe(report.title) for o in report.mismatches)
    # Every gpu_* family gpuload exported was compared or has a reason not to be.
    assert not report.unclassified
    # Far more than a handful of series, each equal or absent where nvidia-smi said N/A.
    assert report.count(EQUAL) >= 40 and len(report.families) >= 30
    # Every collector ran without an unexpected error on the recorded machine.
    assert report.collectors and set(report.collectors.values()) == {1.0}
    parsed = conformance.parse_samples(text)
    assert not series(parsed, "gpuload_nvml_errors_total"), "unexpected NVML errors"


@NEEDS_REALITY
def test_a_difference_from_the_recording_is_reported_with_file_family_and_both_values(
    daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    samples, _ = _serve(daemon_factory, tmp_path, T4, None)
    tweaked = tmp_path / T4.name
    text = T4.read_text()
    for printed, changed in (
        ("<power_draw>26.78 W</power_draw>", "<power_draw>26.79 W</power_draw>"),
        ("<memory_temp>N/A</memory_temp>", "<memory_temp>45 C</memory_temp>"),
        ("<gpu_temp>40 C</gpu_temp>", "<gpu_temp>N/A</gpu_temp>"),
    ):
        assert printed in text
        text = text.replace(printed, changed)
    tweaked.write_text(text)
    report = conformance.compare(conformance.read_reference(tweaked, None), samples)
    lines = sorted(o.describe(report.title) for o in report.mismatches)
    assert len(lines) == 3, lines
    assert lines[0].startswith("tesla-t4.xml: gpu_power_usage_watts{gpu=0}: nvidia-smi 26.79 W")
    assert lines[0].endswith("gpuload 26.78 (26.78 as printed)")
    assert "gpu_temperature_celsius{gpu=0,sensor=gpu}: nvidia-smi N/A" in lines[1]
    assert lines[1].endswith("gpuload 40")
    assert "gpu_temperature_celsius{gpu=0,sensor=memory}: nvidia-smi 45 C" in lines[2]
    assert lines[2].endswith("gpuload absent")
    assert all(o.result != MISMATCH or o.family.startswith("gpu_") for o in report.outcomes)


@NEEDS_REALITY
def test_gpuload_runs_on_a_driver_without_some_functions_with_every_collector_succeeding(
    daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The recorded library exports every function the simulator models: strip two, as an
    # older or stripped driver would lack them. gpuload falls back to GetTemperature and to the
    # v1 memory call, which has no reserved memory and counts it as used (README, Metrics).
    stripped = {"nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2"}
    capture = tmp_path / H100.name
    lines = [line for line in H100.read_text().splitlines() if line.strip() not in stripped]
    capture.write_text("\n".join(lines) + "\n")
    samples, text = _serve(daemon_factory, tmp_path, capture, "load")
    report = conformance.compare(conformance.read_reference(capture, "load"), samples)
    assert set(report.collectors.values()) == {1.0}
    assert not series(conformance.parse_samples(text), "gpuload_nvml_errors_total")
    outcomes = {(o.family, o.labels): o for o in report.outcomes}
    assert outcomes[("gpu_temperature_celsius", "gpu=0,sensor=gpu")].result == EQUAL
    reserved = outcomes[("gpu_memory_reserved_bytes", "gpu=0")]
    assert (reserved.result, reserved.exported) == (MISMATCH, "absent")
    used = outcomes[("gpu_memory_used_bytes", "gpu=0")]
    assert (used.recorded, used.exported.split(" (")[1]) == ("19818 MiB", "20297 as printed)")
    assert sorted(o.family for o in report.mismatches) == [
        "gpu_memory_reserved_bytes",
        "gpu_memory_used_bytes",  # 19818 + 479 MiB reserved
    ]


def test_the_table_counts_each_result() -> None:
    report = conformance.Report("a.xml", None)
    for result in (EQUAL, EQUAL, conformance.ABSENT, MISMATCH):
        report.outcomes.append(conformance.Outcome("gpu_x", "gpu=0", result, "1", "2", "here"))
    assert conformance.table([report]).splitlines()[-1] == "| `a.xml` | 1 | 4 | 2 | 1 | 1 |"


def test_a_missing_directory_is_said_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance.main(["/nonexistent/reality"]) == 2
    assert "no such directory of recordings" in capsys.readouterr().err
