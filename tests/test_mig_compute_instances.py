"""MIG compute instances, per-model profile tables and the H200, through the real pynvml.

A MIG device handle is one compute instance (nvml.h): a GPU instance split into compute
instances has one handle per compute instance, all with its GPU instance id. The recorded H200
(../shared/reality/captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt) has its 3g.71gb
instance split into a 1c and a 2c compute instance.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest
from helpers import ROOT, Clock, exposition_text, parse_metrics, series

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.sim import ScenarioError, load_scenario
from exporter.snapshot import Snapshot

RECORDED_H200 = (
    ROOT.parent / "shared" / "reality" / "captures" / "linux-x86_64__nvidia-h200-mig__590.48.01.txt"
)

SPLIT = """
name: split
driver: {version: "590.48.01", cuda_version: 13010}
gpus:
  - model: h200-sxm
    mig:
      - profile: 3g.71gb
        compute_instances: [1c, {profile: 2c, processes: [{name: ./gpu_burn, memory: 13GiB}]}]
        overrides: {utilization: 0.9, sm_active: 0.6}
      - {profile: 2g.35gb, overrides: {utilization: 0.2, sm_active: 0.1}}
phases:
  - {duration: 1h, utilization: 0.5, power: 300W}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@contextmanager
def _library(scenario: str | Path, at: float = 30) -> Iterator[Clock]:
    clock = Clock(at)
    sim.install(scenario, clock=clock, epoch=0)
    pynvml.nvmlInit()
    try:
        yield clock
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall()


def _mig_devices() -> list[dict[str, Any]]:
    """What NVML says of each MIG device of GPU 0, in handle order."""
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    devices = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except pynvml.NVMLError_NotFound:
            continue
        attributes = pynvml.nvmlDeviceGetAttributes_v2(handle)
        devices.append(
            {
                "index": index,
                "name": pynvml.nvmlDeviceGetName(handle),
                "gi": pynvml.nvmlDeviceGetGpuInstanceId(handle),
                "ci": pynvml.nvmlDeviceGetComputeInstanceId(handle),
                "sm": attributes.multiprocessorCount,
                "gi_slices": attributes.gpuInstanceSliceCount,
                "ci_slices": attributes.computeInstanceSliceCount,
                "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                "used": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
                "processes": [
                    (p.gpuInstanceId, p.computeInstanceId)
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
                ],
            }
        )
    return devices


def test_a_gpu_instance_split_in_two_gives_two_handles_of_one_gpu_instance(
    tmp_path: Path,
) -> None:
    with _library(_write(tmp_path, SPLIT)):
        first, second, other = _mig_devices()
    assert first["gi"] == second["gi"] != other["gi"]
    assert (first["ci"], second["ci"], other["ci"]) == (0, 1, 0)
    # As nvidia-smi -L names them on the recorded H200.
    assert first["name"] == "NVIDIA H200 MIG 1c.3g.71gb"
    assert second["name"] == "NVIDIA H200 MIG 2c.3g.71gb"
    assert other["name"] == "NVIDIA H200 MIG 2g.35gb"
    # The compute instance's own SMs and slices (16 and 32 SMs as recorded); the GPU instance's
    # memory, shared: the same total and the same use on both handles.
    assert (first["sm"], first["ci_slices"], first["gi_slices"]) == (16, 1, 3)
    assert (second["sm"], second["ci_slices"], second["gi_slices"]) == (32, 2, 3)
    assert first["memory_mib"] == second["memory_mib"] == 71424
    assert first["used"] == second["used"] >= 13 * 2**30
    # The process runs in the compute instance that lists it, and is listed once.
    assert first["processes"] == []
    assert second["processes"] == [(second["gi"], 1)]


def test_a_gpu_instances_own_processes_run_in_its_first_compute_instance(tmp_path: Path) -> None:
    text = SPLIT.replace(
        "compute_instances: [1c, {profile: 2c, processes: [{name: ./gpu_burn, memory: 13GiB}]}]",
        "compute_instances: [2c, 1c]",
    ).replace("sm_active: 0.6}", "sm_active: 0.6, processes: [{name: jupyter, memory: 2GiB}]}")
    with _library(_write(tmp_path, text)):
        first, second, _ = _mig_devices()
        parent = pynvml.nvmlDeviceGetHandleByIndex(0)
        everyone = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(parent)
    assert (first["name"], second["name"]) == (
        "NVIDIA H200 MIG 2c.3g.71gb",
        "NVIDIA H200 MIG 1c.3g.71gb",
    )
    assert first["processes"] == [(first["gi"], 0)] and second["processes"] == []
    assert [(p.gpuInstanceId, p.computeInstanceId) for p in everyone] == [(first["gi"], 0)]
    assert first["used"] == second["used"] >= 2 * 2**30


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


def test_the_exporter_gives_one_series_per_compute_instance_and_gpu_instance_values_once(
    tmp_path: Path,
) -> None:
    clock = Clock(30)
    sim.install(_write(tmp_path, SPLIT), clock=clock, epoch=0)
    collection = Collection(dict.fromkeys(REGISTRY, True), timeout=60, clock=clock)
    try:
        for t in (30, 31, 32):
            clock.now = t
            samples = _scrape(collection.run_cycle())
    finally:
        collection.close()
        sim.uninstall()

    def by_instance(family: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {
            tuple(dict(k)[label] for label in labels): v for k, v in series(samples, family).items()
        }

    devices = ("mig_instance", "mig_compute_instance", "mig_profile")
    sms = by_instance("gpu_mig_multiprocessors", *devices)
    assert sms == {
        ("1", "0", "1c.3g.71gb"): 16,
        ("1", "1", "2c.3g.71gb"): 32,
        ("3", "0", "2g.35gb"): 32,
    }
    # Memory and GPM belong to the GPU instance: one series each, under its own profile.
    total = by_instance("gpu_mig_memory_total_bytes", "mig_instance", "mig_profile")
    assert total == {("1", "3g.71gb"): 71424 * 2**20, ("3", "2g.35gb"): 33280 * 2**20}
    used = by_instance("gpu_mig_memory_used_bytes", "mig_instance", "mig_profile")
    assert set(used) == set(total) and used[("1", "3g.71gb")] >= 13 * 2**30
    active = by_instance("gpu_mig_sm_active_ratio", "mig_instance", "mig_profile")
    assert active == {("1", "3g.71gb"): pytest.approx(0.6), ("3", "2g.35gb"): pytest.approx(0.1)}
    failed = [dict(k) for k, v in series(samples, "gpuload_collector_success").items() if v != 1]
    assert failed == []


def _recorded_listing(capture: Path) -> list[tuple[int, str]]:
    """(MIG device index, profile) from the capture's `nvidia-smi -L` section."""
    lines = capture.read_text().splitlines()
    start = lines.index("# $ nvidia-smi -L")
    listing = []
    for line in lines[start + 1 :]:
        if line.startswith("# ") and "::" in line:
            break
        match = re.match(r"^\s+MIG (\S+)\s+Device\s+(\d+):", line)
        if match:
            listing.append((int(match.group(2)), match.group(1)))
    return listing


def _recorded_table(capture: Path) -> list[tuple[int, int, int, int, int]]:
    """(GI, CI, MIG device, total MiB, SMs) from the first "MIG devices" table of the capture."""
    text = capture.read_text()
    table = text[text.index("| MIG devices:") :].split("\n\n", 1)[0]
    row = re.compile(r"^\|\s+\d+\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s+\d+MiB / (\d+)MiB\s+\|\s+(\d+)\s")
    return [
        tuple(int(group) for group in match.groups())  # type: ignore[misc]
        for match in map(row.match, table.splitlines())
        if match
    ]


@pytest.mark.skipif(not RECORDED_H200.is_file(), reason="needs ../shared/reality (recorded H200)")
def test_the_shipped_h200_mig_scenario_lists_the_recorded_machines_mig_devices() -> None:
    listing = _recorded_listing(RECORDED_H200)
    table = _recorded_table(RECORDED_H200)
    assert [profile for _, profile in listing] == [
        "1c.3g.71gb",
        "2c.3g.71gb",
        "2g.35gb",
        "1g.18gb",
        "1g.18gb",
    ]
    assert len(table) == len(listing)
    scenario = load_scenario("h200-mig")
    assert scenario.driver.version == "590.48.01"
    with _library("h200-mig"):
        parent = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetName(parent) == "NVIDIA H200"
        whole = pynvml.nvmlDeviceGetMemoryInfo(parent, version=pynvml.nvmlMemory_v2)
        power_limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(parent)
        devices = _mig_devices()
    assert whole.total // 2**20 == 143771 and power_limit == 700_000
    assert [(d["index"], str(d["name"]).removeprefix("NVIDIA H200 MIG ")) for d in devices] == (
        listing
    )
    assert [(d["gi"], d["ci"], d["index"], d["memory_mib"], d["sm"]) for d in devices] == table


@pytest.mark.parametrize(
    ("model", "profile", "driver"),
    [("h200-sxm", "3g.40gb", "590.48.01"), ("h100-sxm", "3g.71gb", "550.90.07")],
)
def test_a_profile_of_another_model_is_refused_in_one_line(
    tmp_path: Path, model: str, profile: str, driver: str
) -> None:
    path = _write(
        tmp_path,
        f"""
        driver: {{version: "{driver}", cuda_version: 12040}}
        gpus: [{{model: {model}, mig: [{{profile: {profile}}}]}}]
        phases: [{{duration: 1h}}]
        """,
    )
    with pytest.raises(ScenarioError) as refused:
        load_scenario(path)
    message = str(refused.value)
    assert "\n" not in message
    name = load_scenario("training").gpus[0].model.name if model == "h100-sxm" else "NVIDIA H200"
    assert message.startswith("gpus[0].mig[0].profile: expected one of "), message
    assert message.endswith(f"(the MIG profiles of {name})"), message


def _media_scenario(tmp_path: Path, driver: str) -> Path:
    return _write(
        tmp_path,
        f"""
        driver: {{version: "{driver}", cuda_version: 11040}}
        gpus: [{{model: a100-sxm4-80gb, mig: [{{profile: 1g.10gb+me}}, {{profile: 3g.40gb}}]}}]
        phases: [{{duration: 1h}}]
        """,
    )


def test_a_media_extension_profile_is_refused_on_a_driver_before_its_branch(
    tmp_path: Path,
) -> None:
    # NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 (+me) came with 470.42.01 (nvidia-settings nvml.h).
    with pytest.raises(ScenarioError) as refused:
        load_scenario(_media_scenario(tmp_path, "460.91.03"))
    assert str(refused.value) == (
        "gpus[0].mig[0].profile: 1g.10gb+me needs driver 470.42.01 or later; "
        "the driver is 460.91.03"
    )
    with _library(_media_scenario(tmp_path, "470.42.01")):
        names = [d["name"] for d in _mig_devices()]
    assert names == ["NVIDIA A100-SXM4-80GB MIG 3g.40gb", "NVIDIA A100-SXM4-80GB MIG 1g.10gb+me"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "{profile: 3g.71gb, compute_instances: [2c, 2c]}",
            r"^gpus\[0\]\.mig\[0\]\.compute_instances: the compute instances need 4 compute "
            r"slices; 3g.71gb has 3$",
        ),
        (
            "{profile: 2g.35gb, compute_instances: [1c, 3c]}",
            r"^gpus\[0\]\.mig\[0\]\.compute_instances\[1\]: expected one of 1c, 2c$",
        ),
        (
            "{profile: 2g.35gb, gpu_instance_id: 7}",
            r"^gpus\[0\]\.mig\[0\]\.gpu_instance_id: expected one of 3, 4, 5 "
            r"\(the ids of 2g.35gb\)$",
        ),
    ],
)
def test_compute_instance_layouts_are_validated_by_key_path(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = _write(
        tmp_path,
        f"""
        driver: {{version: "590.48.01", cuda_version: 13010}}
        gpus: [{{model: h200-sxm, mig: [{entry}]}}]
        phases: [{{duration: 1h}}]
        """,
    )
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)
