"""Encoder sessions: NVML's encoder stats in base units, absent where a GPU has no NVENC."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Clock, exposition_text, parse_metrics, simulated_node, value_of

from exporter import sim

# Two L4s, one encoding three streams, next to an H100 SXM, which has no NVENC (models.yaml).
ENCODING = """
driver: {version: "550.90.07", cuda_version: 12040}
loop: false
gpus:
  - model: l4
    overrides:
      encoder_sessions: 3
      encoder_fps: 59
      encoder_latency: 0.0125
  - model: l4
  - model: h100-sxm
phases:
  - duration: 1h
    utilization: 0.3
"""


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[dict]:
    path = tmp_path / "encoding.yaml"
    path.write_text(textwrap.dedent(ENCODING))
    collection = simulated_node(path, Clock(10))
    try:
        yield parse_metrics(exposition_text(collection.run_cycle()))
    finally:
        collection.close()
        sim.uninstall()


def _of_gpu(samples: dict, family: str, gpu: str) -> float | None:
    for (name, labels), value in samples.items():
        if name == family and dict(labels).get("gpu") == gpu:
            return float(value)
    return None


@pytest.mark.parametrize(
    ("family", "value"),
    [
        ("gpu_encoder_sessions", 3.0),
        ("gpu_encoder_average_fps", 59.0),
        ("gpu_encoder_average_latency_seconds", 0.0125),  # NVML answers 12500 µs
    ],
)
def test_encoder_stats_are_published_in_base_units(
    scraped: dict, family: str, value: float
) -> None:
    assert _of_gpu(scraped, family, "0") == pytest.approx(value)


def test_no_session_is_a_count_of_zero_without_averages(scraped: dict) -> None:
    assert _of_gpu(scraped, "gpu_encoder_sessions", "1") == 0
    assert _of_gpu(scraped, "gpu_encoder_average_fps", "1") is None
    assert _of_gpu(scraped, "gpu_encoder_average_latency_seconds", "1") is None


def test_a_gpu_without_nvenc_has_no_session_series_and_no_error(scraped: dict) -> None:
    for family in ("gpu_encoder_sessions", "gpu_encoder_average_fps"):
        assert _of_gpu(scraped, family, "2") is None
    assert value_of(scraped, "gpuload_collector_success", collector="encoder") == 1
