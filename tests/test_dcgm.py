"""dcgm-exporter's fields (`metrics.dcgm_compat`): its names, types, units and labels.

The fields are written from the snapshot of the simulated NVML, on a clock the test moves; every
value is compared with gpuload's own family in the same snapshot after the unit conversion that
dcgm-exporter's default-counters.csv (`../shared/dcgm/`, read where present) states.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import ROOT, Clock, gpuload, parse_metrics, simulated_node
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter import config, sim
from exporter.cli import build_parser
from exporter.collectors import Sample
from exporter.server.dcgm import FIELDS, LABEL_FIELDS, NOT_SERVED, DcgmView, keeps_sources
from exporter.server.exposition import OPENMETRICS, TEXT, Exposition
from exporter.snapshot import CollectorRun, Snapshot

SHARED = ROOT.parent / "shared" / "dcgm"
COUNTERS = SHARED / "default-counters.csv"
needs_shared = pytest.mark.skipif(
    not COUNTERS.exists(), reason=f"dcgm-exporter's files are not at {SHARED}"
)
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION"}
MIB = 2**20
NO_VIDEO = {"DCGM_FI_DEV_ENC_UTIL"}


def default_set() -> dict[str, tuple[str, str]]:
    """Every uncommented row of default-counters.csv: field -> (Prometheus type, help)."""
    rows = {}
    with COUNTERS.open(encoding="utf-8") as lines:
        for row in csv.reader(line for line in lines if line.strip() and line[0] != "#"):
            name, kind, help_text = (cell.strip() for cell in row[:3])
            rows[name] = (kind, ",".join(row[2:]).strip() if len(row) > 3 else help_text)
    return rows


@functools.cache
def snapshots(scenario: str, *, profile: str = "default") -> tuple[Snapshot, Snapshot]:
    """Two snapshots of ``scenario`` 10 scenario seconds apart, with the DCGM sources kept.

    Snapshots never change once made, so the tests share them.
    """
    clock = Clock(60)
    collection = simulated_node(scenario, clock, profile=profile, keep_also=keeps_sources())
    try:
        collection.run_cycle()
        clock.now = 61
        first = collection.run_cycle()
        clock.now = 71
        return first, collection.run_cycle()
    finally:
        collection.close()
        sim.uninstall()


def written(view: DcgmView, *shots: Snapshot, form: str = TEXT) -> str:
    """The last snapshot's exposition with the DCGM fields, every snapshot written in turn."""
    exposition = Exposition(dcgm=view)
    return [exposition.encode(shot, form).decode() for shot in shots][-1]


def dcgm_series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for (name, labels), value in parse_metrics(text).items():
        if name.startswith("DCGM_"):
            # prometheus_client's text parser names a counter's samples <name>_total.
            name = name.removesuffix("_total")
            found.setdefault(name, []).append((dict(labels), value))
    return found


def view(**settings: object) -> DcgmView:
    return DcgmView("gpu-node-7", gr_engine_fallback=bool(settings.get("fallback", False)))


@needs_shared
def test_every_row_of_the_default_set_is_served_or_said_why_not() -> None:
    rows = default_set()
    served = {field.name for field in FIELDS}
    assert set(rows) == served | set(NOT_SERVED) | set(LABEL_FIELDS)
    assert not served & set(NOT_SERVED)
    doc = (ROOT / "docs" / "migrating-from-dcgm-exporter.md").read_text(encoding="utf-8")
    for name in rows:
        assert f"`{name}`" in doc, f"{name} is not in the migration doc"


@needs_shared
def test_names_types_and_help_are_dcgm_exporters_in_both_formats() -> None:
    rows = default_set()
    first, second = snapshots("h100-nvlink")
    dcgm = view()
    text = written(dcgm, first, second)
    # An H100 has every field but the video encoder's: it has none (NVML answers N/A).
    shown = [field for field in FIELDS if field.name not in NO_VIDEO]
    for field in shown:
        kind, help_text = rows[field.name]
        assert f"# TYPE {field.name} {kind}\n" in text
        assert f"# HELP {field.name} {help_text}\n" in text
        assert f"\n{field.name}{{" in text, f"{field.name} has no series on an H100"
    openmetrics = Exposition(dcgm=dcgm).encode(second, OPENMETRICS).decode()
    parsed = {family.name: family for family in text_string_to_metric_families(openmetrics)}
    for field in shown:
        family = parsed[field.name]
        assert family.type == ("gauge" if field.kind == "gauge" else "unknown")
        assert {sample.name for sample in family.samples} == {field.name}
    for exposed in (text, openmetrics):
        names = {line.split("{")[0] for line in exposed.splitlines() if line.startswith("DCGM_")}
        assert names == {field.name for field in shown}


# DCGM field -> (gpuload sample, its selecting labels, gpuload's value -> DCGM's unit).
CONVERSIONS: dict[str, tuple[str, dict[str, str], Callable[[float], float]]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_clock_hertz", {"clock": "sm"}, lambda v: v / 1e6),
    "DCGM_FI_DEV_MEM_CLOCK": ("gpu_clock_hertz", {"clock": "memory"}, lambda v: v / 1e6),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpu_temperature_celsius", {"sensor": "memory"}, float),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", {"sensor": "gpu"}, float),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_usage_watts", {}, float),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "gpu_energy_consumption_joules_total",
        {},
        lambda v: v * 1000,
    ),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpu_pcie_replay_errors_total", {}, float),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_ratio", {}, lambda v: v * 100),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_utilization_ratio", {}, lambda v: v * 100),
    "DCGM_FI_DEV_ENC_UTIL": ("gpu_encoder_utilization_ratio", {}, lambda v: v * 100),
    "DCGM_FI_DEV_DEC_UTIL": ("gpu_decoder_utilization_ratio", {}, lambda v: v * 100),
    "DCGM_FI_DEV_XID_ERRORS": ("gpu_last_xid_code", {}, float),
    "DCGM_FI_DEV_FB_FREE": ("gpu_memory_free_bytes", {}, lambda v: float(int(v // MIB))),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes", {}, lambda v: float(int(v // MIB))),
    "DCGM_FI_DEV_FB_RESERVED": ("gpu_memory_reserved_bytes", {}, lambda v: float(int(v // MIB))),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "gpu_remapped_rows",
        {"type": "uncorrectable"},
        float,
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows", {"type": "correctable"}, float),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gpu_row_remap_failed", {}, float),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gpu_graphics_active_ratio", {}, float),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpu_tensor_active_ratio", {}, float),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpu_dram_active_ratio", {}, float),
}
# The per-second fields: DCGM's unit from the counters' increase over the two snapshots.
RATES: dict[str, tuple[tuple[str, ...], float]] = {
    "DCGM_FI_PROF_PCIE_TX_BYTES": (("gpu_pcie_transmit_bytes_total",), 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (("gpu_pcie_receive_bytes_total",), 1.0),
    # KiB/s / 1000, as DCGM computes field 449 (DcgmCacheManager.cpp).
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (
        ("gpu_nvlink_transmit_bytes_total", "gpu_nvlink_receive_bytes_total"),
        1 / 1024 / 1000,
    ),
}


def own(snapshot: Snapshot, name: str, gpu: str, **select: str) -> float | None:
    for sample, pairs, value in snapshot.series():
        labels = dict(pairs)
        if (
            sample == name
            and labels.get("gpu") == gpu
            and "mig_instance" not in labels
            and all(labels.get(key) == wanted for key, wanted in select.items())
        ):
            return value
    return None


def test_the_conversion_table_covers_every_served_field() -> None:
    assert set(CONVERSIONS) | set(RATES) == {field.name for field in FIELDS}


@pytest.mark.parametrize("profile", ["default", "minimal"])
def test_values_are_gpuloads_own_from_the_same_snapshot_in_dcgms_units(profile: str) -> None:
    first, second = snapshots("h100-nvlink", profile=profile)
    found = dcgm_series(written(view(), first, second))
    checked = 0
    for name, series in found.items():
        for labels, value in series:
            gpu = labels["gpu"]
            if name in RATES:
                sources, scale = RATES[name]
                increase = sum(
                    (own(second, s, gpu) or 0.0) - (own(first, s, gpu) or 0.0) for s in sources
                )
                seconds = second.completed_at - first.completed_at
                assert value == pytest.approx(increase / seconds * scale), (name, gpu)
            else:
                source, select, convert = CONVERSIONS[name]
                expected = own(second, source, gpu, **select)
                assert expected is not None, (name, source)
                assert value == pytest.approx(convert(expected)), (name, gpu)
            checked += 1
    # 8 GPUs, every field but the encoder's and decoder's (NVML answers N/A on an H100).
    assert len(found) >= len(FIELDS) - 2
    assert checked >= 8 * (len(FIELDS) - 2)


def test_labels_are_dcgm_exporters_and_no_others() -> None:
    _, second = snapshots("mixed")
    found = dcgm_series(written(view(), second))
    for name, series in found.items():
        for labels, _ in series:
            assert set(labels) == DCGM_LABELS | {"Hostname"}, name
            assert labels["device"] == f"nvidia{labels['gpu']}"
            assert labels["Hostname"] == "gpu-node-7"
            assert labels["UUID"].startswith("GPU-") and labels["modelName"]
            assert labels["DCGM_FI_DRIVER_VERSION"] == "525.147.05"


def test_gpus_without_gpm_have_no_profiling_fields_unless_approximated() -> None:
    _, second = snapshots("mixed")
    gpm = {labels["gpu"] for labels, _ in series_of(second, "gpu_info") if labels["profiling"]}
    plain = written(view(), second)
    approximated = written(view(fallback=True), second)
    for name, series in dcgm_series(plain).items():
        if name.startswith("DCGM_FI_PROF_"):
            assert {labels["gpu"] for labels, _ in series} <= gpm, name
    engine = dcgm_series(approximated)["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert {labels["gpu"] for labels, _ in engine} == {str(gpu) for gpu in range(8)}
    for labels, value in engine:
        if labels["gpu"] not in gpm:
            assert value == own(second, "gpu_utilization_ratio", labels["gpu"])
    tensor = dcgm_series(approximated)["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert {labels["gpu"] for labels, _ in tensor} <= gpm


def series_of(snapshot: Snapshot, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for sample, pairs, value in snapshot.series():
        labels = dict(pairs)
        if sample == name:
            if name == "gpu_info" and labels["profiling"] != "gpm":
                labels["profiling"] = ""
            found.append((labels, value))
    return found


def with_pods(snapshot: Snapshot, *samples: Sample) -> Snapshot:
    """The snapshot with the kubernetes collector's samples (the kubelet's allocations)."""
    return replace(snapshot, runs=(*snapshot.runs, CollectorRun("kubernetes", samples)))


def test_a_gpu_one_container_holds_carries_its_pod_and_mig_instances_theirs() -> None:
    first, second = snapshots("h100-mig")
    uuid = {labels["gpu"]: labels["uuid"] for labels, _ in series_of(second, "gpu_info")}
    info = "gpu_pod_info"
    pods = (
        Sample(info, 1, ("0", uuid["0"], "train-0", "ml", "main", "")),
        Sample(info, 1, ("1", uuid["1"], "notebook", "research", "jupyter", "1")),
    )
    found = dcgm_series(written(view(), with_pods(first, *pods), with_pods(second, *pods)))
    pod_keys = {"pod", "namespace", "container"}
    for labels, _ in found["DCGM_FI_DEV_GPU_TEMP"]:
        held = labels["gpu"] == "0"
        assert (pod_keys <= set(labels)) == held, labels
    instances = [labels for labels, _ in found["DCGM_FI_DEV_FB_USED"] if "GPU_I_ID" in labels]
    assert instances, "no MIG instance series"
    for labels in instances:
        assert labels["GPU_I_PROFILE"]
        held = (labels["gpu"], labels["GPU_I_ID"]) == ("1", "1")
        assert (labels.get("pod") == "notebook") == held, labels
    assert all(
        set(labels) - pod_keys <= DCGM_LABELS | {"Hostname", "GPU_I_ID", "GPU_I_PROFILE"}
        for labels in instances
    )


def test_a_shared_gpu_gives_each_container_its_measured_share_not_a_copy() -> None:
    first, second = snapshots("h100-nvlink")
    uuid = own_uuid(second, "3")
    holders = [("train-0", "ml", "main"), ("serve-1", "web", "api"), ("idle-2", "ml", "main")]
    info = [Sample("gpu_pod_info", 1, ("3", uuid, *holder, "")) for holder in holders]

    def shares(seconds: tuple[float, float], memory: tuple[int, int]) -> list[Sample]:
        return [
            *info,
            *(
                Sample("gpu_pod_utilization_seconds_total", busy, ("3", uuid, *holder))
                for busy, holder in zip(seconds, holders, strict=False)
            ),
            *(
                Sample("gpu_pod_memory_used_bytes", used, ("3", uuid, *holder))
                for used, holder in zip(memory, holders, strict=False)
            ),
        ]

    before = with_pods(first, *shares((10.0, 20.0), (4 * MIB, 2 * MIB)))
    after = with_pods(second, *shares((13.0, 21.0), (4 * MIB, 2 * MIB)))
    found = dcgm_series(written(view(), before, after))

    def on_gpu3(name: str) -> dict[str, float]:
        return {
            labels.get("pod", ""): value for labels, value in found[name] if labels["gpu"] == "3"
        }

    engine = on_gpu3("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    device = own(second, "gpu_graphics_active_ratio", "3")
    assert engine[""] == device
    # 3 of the 4 SM seconds were train-0's, 1 serve-1's, none idle-2's: they add up to the GPU.
    assert engine["train-0"] == pytest.approx(device * 0.75)
    assert engine["serve-1"] == pytest.approx(device * 0.25)
    assert engine["idle-2"] == 0
    assert on_gpu3("DCGM_FI_DEV_FB_USED") == {
        "": (own(second, "gpu_memory_used_bytes", "3") or math.nan) // MIB,
        "train-0": 4,
        "serve-1": 2,
        "idle-2": 0,
    }
    # What is not usage is the device's alone: no copy per pod.
    assert set(on_gpu3("DCGM_FI_DEV_GPU_TEMP")) == {""}


def test_a_shared_gpu_without_measured_shares_carries_no_pod() -> None:
    first, second = snapshots("h100-nvlink")
    uuid = own_uuid(second, "3")
    info = [
        Sample("gpu_pod_info", 1, ("3", uuid, "a", "ml", "main", "")),
        Sample("gpu_pod_info", 1, ("3", uuid, "b", "ml", "main", "")),
    ]
    found = dcgm_series(written(view(), with_pods(first, *info), with_pods(second, *info)))
    for name, series in found.items():
        for labels, _ in series:
            assert "pod" not in labels, name


def own_uuid(snapshot: Snapshot, gpu: str) -> str:
    return next(
        labels["uuid"] for labels, _ in series_of(snapshot, "gpu_info") if labels["gpu"] == gpu
    )


def test_the_host_label_is_configurable_and_a_bad_name_stops_the_start() -> None:
    _, second = snapshots("h100-nvlink")
    renamed = DcgmView("n1", host_label="hostname", gr_engine_fallback=False)
    for series in dcgm_series(written(renamed, second)).values():
        for labels, _ in series:
            assert labels["hostname"] == "n1" and "Hostname" not in labels
    result = gpuload("serve", "--metrics.dcgm-compat", "--metrics.dcgm-hostname-label", "host-name")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--metrics.dcgm-hostname-label: 'host-name' is not valid: expected a label name" in (
        result.stderr
    )
    with pytest.raises(config.ConfigError, match="another label of dcgm-exporter's"):
        config.load(flags={"metrics.dcgm_hostname_label": "UUID"})


def test_the_switch_is_off_by_default_and_a_flag_alone_turns_it_on(tmp_path: Path) -> None:

    assert config.load().metrics.dcgm_compat is False
    assert config.load(flags={"metrics.dcgm_compat": "true"}).metrics.dcgm_compat is True
    settings = tmp_path / "gpuload.yaml"
    settings.write_text("metrics:\n  dcgm_compat: true\n  dcgm_hostname_label: hostname\n")
    loaded = config.load(file=settings)
    assert loaded.metrics.dcgm_compat and loaded.metrics.dcgm_hostname_label == "hostname"
    assert config.load(environ={"GPULOAD_METRICS_DCGM_COMPAT": "1"}).metrics.dcgm_compat

    args = build_parser().parse_args(["serve", "--metrics.dcgm-compat"])
    assert vars(args)["metrics.dcgm_compat"] == "true"


def test_the_last_xid_is_zero_before_any() -> None:
    _, second = snapshots("h100-nvlink")
    xids = dcgm_series(written(view(), second))["DCGM_FI_DEV_XID_ERRORS"]
    assert {value for _, value in xids} == {0.0}
    assert not any(math.isnan(value) for _, value in xids)
