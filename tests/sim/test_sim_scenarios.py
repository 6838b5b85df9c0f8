"""Scenario loading: shipped scenarios, realistic GPU profiles, strict validation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.sim import ScenarioError, describe_scenarios, load_scenario, scenario_names

REQUIRED_SCENARIOS = {
    "idle",
    "training",
    "data-starved",
    "saturated",
    "thermal-throttle",
    "mixed",
    "h100-nvlink",
    "memory-bound",
    "a100-mig",
    "legacy-v100",
    "fell-off-bus",
    "ecc-remap",
}


def test_required_scenarios_ship_and_load() -> None:
    assert set(scenario_names()) >= REQUIRED_SCENARIOS
    for name in scenario_names():
        scenario = load_scenario(name)
        assert scenario.name == name
        assert scenario.gpus
        assert scenario.description


def test_h100_sxm_profile_is_realistic() -> None:
    gpu = load_scenario("training").gpus[0]
    model = gpu.model
    assert model.name == "NVIDIA H100 80GB HBM3"
    assert model.memory_total == 81559 * 2**20
    assert model.power_limit == 700
    assert (model.pcie_max_generation, model.pcie_max_width) == (5, 16)
    assert 87 <= model.temp_slowdown <= 90
    assert 92 <= model.temp_shutdown <= 95
    assert model.fans == 0
    assert len(load_scenario("training").gpus) == 8


def test_mixed_node_spans_generations_and_an_older_driver() -> None:
    scenario = load_scenario("mixed")
    names = {gpu.model.name for gpu in scenario.gpus}
    assert {"NVIDIA H100 PCIe", "NVIDIA A100 80GB PCIe", "Tesla T4", "NVIDIA L4"} <= names
    assert "nvmlDeviceGetCurrentClocksEventReasons" in scenario.driver.lacks
    assert max(len(gpu.lacks) for gpu in scenario.gpus) >= 4


@pytest.mark.parametrize(
    ("scenario", "gpu", "has", "lacks"),
    [
        ("training", 0, {"gpm", "nvlink", "row_remapping"}, {"retired_pages"}),
        ("faulty", 0, {"nvlink", "row_remapping"}, {"gpm", "retired_pages"}),
        ("legacy-v100", 0, {"nvlink", "retired_pages"}, {"gpm", "row_remapping"}),
    ],
)
def test_models_declare_their_newer_features(
    scenario: str, gpu: int, has: set[str], lacks: set[str]
) -> None:
    spec = load_scenario(scenario).gpus[gpu]
    assert not has & spec.lacks
    assert lacks <= spec.lacks


def test_a_gpu_entry_can_remove_a_declared_feature(
    base_scenario: dict[str, Any], write_scenario: Callable[[dict[str, Any]], Path]
) -> None:
    base_scenario["gpus"][0]["lacks"] = ["gpm", "nvlink"]
    assert {"gpm", "nvlink"} <= load_scenario(write_scenario(base_scenario)).gpus[0].lacks


def test_pci_bus_ids_are_distinct() -> None:
    for name in scenario_names():
        ids = [gpu.pci_bus_id for gpu in load_scenario(name).gpus]
        assert len(set(ids)) == len(ids)


def test_describe_lists_every_scenario() -> None:
    table = describe_scenarios()
    assert table.splitlines()[0].split()[:3] == ["NAME", "GPUS", "MODELS"]
    for name in scenario_names():
        assert any(line.startswith(name + " ") for line in table.splitlines())


def test_unknown_scenario_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ScenarioError, match=r"unknown scenario 'nope'.*training"):
        load_scenario("nope")


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")


def _set(document: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path; numeric parts index lists."""
    *parents, last = path.split(".")
    target: Any = document
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value


BAD_VALUES = [
    (
        "gpus.0.phases",
        [{"duration": 10}, {"duration": 10, "utilization": 1.5}],
        "gpus[0].phases[1].utilization: expected a number 0..1 or a pattern mapping",
    ),
    ("phases.0.utilization", True, "phases[0].utilization: expected a number 0..1"),
    (
        "phases.0.utilization",
        {"pattern": "sawtooth", "min": 0, "max": 1},
        "phases[0].utilization.period: required key is missing",
    ),
    (
        "phases.0.utilization",
        {"pattern": "zigzag"},
        "phases[0].utilization.pattern: expected one of",
    ),
    ("phases.0.power", "900 watts", "phases[0].power: expected a number 0..1.5"),
    ("phases.0.duration", "ten minutes", "phases[0].duration: expected seconds or a duration"),
    (
        "phases.0.processes.0.memory",
        "lots",
        "phases[0].processes[0].memory: expected a number 0..1 (fraction of total memory)",
    ),
    ("phases.0.clock_event_reasons", ["too_hot"], "phases[0].clock_event_reasons[0]: expected"),
    ("gpus.0.model", "b300", "gpus[0].model: expected one of"),
    ("gpus.0.colour", "green", "gpus[0].colour: unknown key"),
    ("gpus.0.lacks", ["teleport"], "gpus[0].lacks[0]: expected one of"),
    ("gpus.0.power_limit", "lots", "gpus[0].power_limit: expected watts"),
    ("gpus.0.uuid", "GPU-1234", "gpus[0].uuid: only allowed on an entry with count 1"),
    ("driver.lacks", ["nvmlDoesNotExist"], "driver.lacks[0]: expected the name of a simulated"),
    ("driver.cuda_version", "12.4", "driver.cuda_version: expected an integer"),
    ("phasez", [], "phasez: unknown key"),
    (
        "faults",
        [{"kind": "error", "call": "nvmlDeviceGetName", "error": "BOGUS"}],
        "faults[0].error: expected an NVML error name",
    ),
    ("faults", [{"kind": "meteor"}], "faults[0].kind: expected one of"),
    ("faults", [{"kind": "gpu_lost", "gpu": 9}], "faults[0].gpu: expected an integer 0..1"),
    ("faults", [{"kind": "gpu_lost"}], "faults[0].gpu: required key is missing"),
    (
        "faults",
        [{"kind": "driver_not_loaded", "at": 50, "until": 40}],
        "faults[0].until: must be later than 'at'",
    ),
    (
        "faults",
        [{"kind": "hang", "call": "nvmlDeviceGetName", "seconds": 1, "colour": 1}],
        "faults[0].colour: unknown key",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_invalid_scenario_names_the_key_path(
    base_scenario: dict[str, Any],
    write_scenario: Callable[[dict[str, Any]], Path],
    path: str,
    value: Any,
    message: str,
) -> None:
    _set(base_scenario, path, value)
    with pytest.raises(ScenarioError) as raised:
        load_scenario(write_scenario(base_scenario))
    assert message in str(raised.value)


def test_missing_driver_is_reported(
    base_scenario: dict[str, Any], write_scenario: Callable[[dict[str, Any]], Path]
) -> None:
    del base_scenario["driver"]
    with pytest.raises(ScenarioError, match="driver: required key is missing"):
        load_scenario(write_scenario(base_scenario))


def test_duplicate_pci_bus_ids_are_rejected(
    base_scenario: dict[str, Any], write_scenario: Callable[[dict[str, Any]], Path]
) -> None:
    base_scenario["gpus"] = [
        {"model": "t4", "pci_bus_id": "0000:3b:00.0"},
        {"model": "t4", "pci_bus_id": "00000000:3B:00.0"},
    ]
    with pytest.raises(ScenarioError, match="gpus: GPUs 0 and 1 share PCI bus id"):
        load_scenario(write_scenario(base_scenario))


def test_invalid_yaml_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("gpus: [\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="invalid YAML"):
        load_scenario(path)
