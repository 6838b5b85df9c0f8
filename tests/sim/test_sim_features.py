"""The simulator's per-feature mappings come from one table: exporter/sim/features.py."""

from __future__ import annotations

import pynvml
import pytest

from exporter.nvml import Device
from exporter.sim import install
from exporter.sim.features import FEATURE_OF, FEATURES, OUTPUTS, READINGS, Output, Reading
from exporter.sim.functions import FUNCTIONS
from exporter.sim.scenario import FEATURES as SCENARIO_FEATURES
from exporter.sim.scenario import METRICS, parse_scenario


def test_every_feature_function_is_simulated_and_needs_its_feature() -> None:
    for function, feature in FEATURE_OF.items():
        assert function in FUNCTIONS, function
        assert FUNCTIONS[function].feature == feature
    gated = {name for name, function in FUNCTIONS.items() if function.feature}
    assert gated == set(FEATURE_OF)


def test_scenarios_take_every_feature_and_reading_metric() -> None:
    assert set(SCENARIO_FEATURES) == {feature.name for feature in FEATURES}
    for output in OUTPUTS:
        assert METRICS[output.metric] == output.kind


@pytest.mark.parametrize("reading", READINGS, ids=lambda reading: reading.function)
def test_every_reading_has_a_wrapper_and_a_known_feature(reading: Reading) -> None:
    assert reading.feature in {feature.name for feature in FEATURES}
    assert callable(getattr(Device, reading.method))


def _scenario_value(output: Output) -> float:
    return 0.25 if output.kind == "fraction" else 3.0


def test_a_reading_answers_its_scenario_metrics_in_nvml_units(base_scenario: dict) -> None:
    base_scenario["gpus"] = [{"model": "l4"}]  # an inference card with NVENC and NVDEC
    base_scenario["phases"][0].update({o.metric: _scenario_value(o) for o in OUTPUTS})
    install(parse_scenario(base_scenario), pinned_time=10.0)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for reading in READINGS:
            answer = getattr(pynvml, reading.function)(handle)
            values = answer if isinstance(answer, (list, tuple)) else (answer,)
            # The codec utilization calls also give their sampling period after the value.
            for output, value in zip(reading.outputs, values, strict=False):
                assert value == round(_scenario_value(output) * output.nvml_per_unit), output.metric
    finally:
        pynvml.nvmlShutdown()
