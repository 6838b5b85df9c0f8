"""exporter.names is the one list of GPM metrics: its ids are NVML's, and every part follows it."""

from __future__ import annotations

import pynvml
import pytest

from exporter.collectors import gpm as gpm_collector
from exporter.names import GPM_METRICS
from exporter.sim import gpm as sim_gpm
from exporter.sim.scenario import METRICS as SCENARIO_METRICS

# gpuload's GPM metric -> the pynvml constant of its NVML metric id.
_PYNVML_CONSTANTS = {
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "fp16_active": "NVML_GPM_METRIC_FP16_UTIL",
    "fp32_active": "NVML_GPM_METRIC_FP32_UTIL",
    "fp64_active": "NVML_GPM_METRIC_FP64_UTIL",
    "integer_active": "NVML_GPM_METRIC_INTEGER_UTIL",
    "graphics_active": "NVML_GPM_METRIC_GRAPHICS_UTIL",
}


@pytest.mark.parametrize("metric", sorted(GPM_METRICS))
def test_gpm_metric_ids_are_pynvml_constants(metric: str) -> None:
    assert GPM_METRICS[metric] == getattr(pynvml, _PYNVML_CONSTANTS[metric])


def test_every_gpm_metric_has_a_pynvml_constant() -> None:
    assert set(GPM_METRICS) == set(_PYNVML_CONSTANTS)


def test_collector_and_simulator_follow_the_names() -> None:
    published = {family.name for family in gpm_collector.RATIOS}
    assert published == {f"gpu_{metric}_ratio" for metric in GPM_METRICS}
    simulated = {sim_gpm.METRICS[metric_id][0] for metric_id in GPM_METRICS.values()}
    assert simulated == set(GPM_METRICS)
    assert all(SCENARIO_METRICS[metric] == "fraction" for metric in GPM_METRICS)
