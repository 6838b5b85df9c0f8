"""Deep-signal collectors against the simulated NVML.

GPM, MIG, NVLink, PCIe traffic, XID, ECC and row remapping, processes; each including the
GPUs and drivers that lack the feature.
"""

from __future__ import annotations

import contextlib
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest
from helpers import Clock, exposition_text, parse_metrics, series, value_of

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.nvml import Device
from exporter.snapshot import Snapshot

ALL_ON = {name: True for name in REGISTRY}


def scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


@contextlib.contextmanager
def node(
    scenario: str | Path,
    *,
    at: float = 30,
    options: dict | None = None,
    enabled: dict[str, bool] | None = None,
    clock: Clock | None = None,
) -> Iterator[tuple[Clock, Collection, sim.SimulatedNvml]]:
    clock = clock or Clock(at)
    simulator = sim.install(scenario, clock=clock, epoch=0)
    # Retries and slow reads on the scenario's clock too: nothing waits for real seconds.
    collection = Collection(enabled or ALL_ON, timeout=5, options=options, clock=clock)
    try:
        yield clock, collection, simulator
    finally:
        collection.close()
        sim.uninstall()


def labels_of(samples: dict, gpu: str) -> dict[str, str]:
    (uuid,) = [
        dict(labels)["uuid"] for labels in series(samples, "gpu_up") if dict(labels)["gpu"] == gpu
    ]
    return {"gpu": gpu, "uuid": uuid}


def wait_for(collection: Collection, condition: Callable[[dict], bool]) -> dict:
    """Run cycles until `condition` holds: for what the XID event thread delivers on its own.

    The deadline only stops a broken run from waiting forever: events come within a cycle or two.
    """
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        samples = scrape(collection.run_cycle())
        if condition(samples):
            return samples
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(text))
    return path


MEMORY_BOUND = """
driver: {version: "550.90.07", cuda_version: 12040}
gpus:
  - model: h100-sxm
  - model: a100-sxm4-80gb
phases:
  - duration: 1h
    utilization: 0.98
    sm_active: {pattern: square, min: 0.2, max: 0.4, period: 2}
    dram_active: 0.9
    tensor_active: 0.08
"""


def test_gpm_ratios_are_averages_between_collections(tmp_path: Path) -> None:
    with node(write(tmp_path, MEMORY_BOUND), at=30) as (clock, collection, _):
        first = scrape(collection.run_cycle())
        h100, a100 = labels_of(first, "0"), labels_of(first, "1")
        # One GPM sample only: no interval to average over yet.
        assert value_of(first, "gpu_sm_active_ratio", **h100) is None
        clock.now = 32  # a whole square-wave period later
        samples = scrape(collection.run_cycle())
    assert value_of(samples, "gpu_sm_active_ratio", **h100) == pytest.approx(0.3)
    assert value_of(samples, "gpu_dram_active_ratio", **h100) == pytest.approx(0.9)
    assert value_of(samples, "gpu_tensor_active_ratio", **h100) == pytest.approx(0.08)
    assert value_of(samples, "gpu_utilization_ratio", **h100) == pytest.approx(0.98)
    # An A100 has no GPM: absent, not zero, and gpu_info says which path each GPU took.
    assert value_of(samples, "gpu_sm_active_ratio", **a100) is None
    profiling = {
        dict(labels)["gpu"]: dict(labels)["profiling"] for labels in series(samples, "gpu_info")
    }
    assert profiling == {"0": "gpm", "1": "none"}
    assert value_of(samples, "gpuload_collector_success", collector="gpm") == 1


def test_gpm_samples_are_freed_when_the_daemon_stops(tmp_path: Path) -> None:
    with node(write(tmp_path, MEMORY_BOUND)) as (clock, collection, simulator):
        collection.run_cycle()
        clock.now += 1
        collection.run_cycle()
        assert simulator.gpm_samples.open == 2  # two buffers for the one GPU with GPM
    assert simulator.gpm_samples.open == 0
    assert simulator.gpm_samples.allocated == 2  # allocated once, not per collection


def test_mig_instances_report_memory_and_gpm_without_whole_gpu_utilization() -> None:
    with node("h100-mig", at=300) as (clock, collection, _):
        collection.run_cycle()
        clock.now = 302
        samples = scrape(collection.run_cycle())
    mig_gpu = labels_of(samples, "0")
    assert value_of(samples, "gpu_mig_mode_enabled", **mig_gpu) == 1
    assert value_of(samples, "gpu_mig_mode_enabled", **labels_of(samples, "1")) == 0
    totals = series(samples, "gpu_mig_memory_total_bytes")
    assert sorted(dict(labels)["mig_profile"] for labels in totals) == [
        "2g.20gb",
        "2g.20gb",
        "3g.40gb",
    ]
    instance = {**mig_gpu, "mig_instance": "1", "mig_profile": "3g.40gb"}
    assert value_of(samples, "gpu_mig_sm_active_ratio", **instance) == pytest.approx(0.7)
    assert value_of(samples, "gpu_mig_memory_used_bytes", **instance) >= 30 * 2**30
    # NVML has no whole-GPU utilization in MIG mode: absent, and not an error.
    assert value_of(samples, "gpu_utilization_ratio", **mig_gpu) is None
    assert value_of(samples, "gpuload_collector_success", collector="utilization") == 1


def test_a100_mig_has_seven_instances_and_no_gpm() -> None:
    with node("a100-mig", at=300) as (_, collection, _sim):
        collection.run_cycle()
        samples = scrape(collection.run_cycle())
    gpu0 = labels_of(samples, "0")
    profiles = [
        dict(labels)["mig_profile"]
        for labels in series(samples, "gpu_mig_memory_total_bytes")
        if dict(labels)["gpu"] == "0"
    ]
    assert profiles == ["1g.10gb"] * 7
    assert series(samples, "gpu_mig_sm_active_ratio") == {}
    assert value_of(samples, "gpu_mig_mode_enabled", **gpu0) == 1


def test_nvlink_links_traffic_and_a_link_down() -> None:
    per_link = {"nvlink": {"per_link": True}}
    with node("h100-nvlink", at=60, options=per_link) as (clock, collection, _):
        first = scrape(collection.run_cycle())
        clock.now = 70
        later = scrape(collection.run_cycle())
    gpu5 = labels_of(later, "5")
    up = {
        dict(labels)["link"]: value
        for labels, value in series(later, "gpu_nvlink_link_up").items()
        if dict(labels)["gpu"] == "5"
    }
    assert len(up) == 18
    assert up["3"] == 0 and sum(up.values()) == 17
    sent_before = value_of(first, "gpu_nvlink_link_transmit_bytes_total", **gpu5, link="0")
    sent_after = value_of(later, "gpu_nvlink_link_transmit_bytes_total", **gpu5, link="0")
    assert sent_after > sent_before
    # Hopper counts a link's CRC errors in one field (NVML change log v520->v525): type "all".
    assert value_of(later, "gpu_nvlink_link_crc_errors_total", **gpu5, link="3", type="all") >= 0
    assert value_of(later, "gpuload_collector_success", collector="nvlink") == 1
    # The GPU's totals: the sums of its links, the link that is down named, and only that one.
    for total in ("transmit_bytes", "receive_bytes", "crc_errors", "replay_errors"):
        links = series(later, f"gpu_nvlink_link_{total}_total")
        assert value_of(later, f"gpu_nvlink_{total}_total", **gpu5) == sum(
            value for labels, value in links.items() if dict(labels)["gpu"] == "5"
        )
    assert value_of(later, "gpu_nvlink_links_up", **gpu5) == 17
    assert series(later, "gpu_nvlink_link_down") == {
        tuple(sorted({**gpu5, "link": "3"}.items())): 1.0
    }
    assert value_of(later, "gpu_nvlink_links_up", **labels_of(later, "0")) == 18


def test_nvlink_is_per_gpu_by_default() -> None:
    with node("h100-nvlink", at=60) as (_, collection, _sim):
        samples = scrape(collection.run_cycle())
    names = {name for name, _ in samples}
    assert not {name for name in names if name.startswith("gpu_nvlink_link_")} - {
        "gpu_nvlink_link_down"
    }
    assert len(series(samples, "gpu_nvlink_transmit_bytes_total")) == 8
    assert len(series(samples, "gpu_nvlink_link_down")) == 1


@pytest.mark.parametrize(
    ("scenario", "gpus", "links", "counter_calls_per_link", "state_calls_per_link", "crc_types"),
    # Hopper: link state, replay, recovery and CRC (one count) as field values. Volta on a
    # driver without the fields: all of them per call, CRC as flit and data.
    [("h100-nvlink", 8, 18, 0, 0, 1), ("legacy-v100", 8, 6, 4, 1, 2)],
)
def test_nvlink_state_and_error_counters_use_field_values_where_the_driver_has_them(
    scenario: str,
    gpus: int,
    links: int,
    counter_calls_per_link: int,
    state_calls_per_link: int,
    crc_types: int,
) -> None:
    per_link = {"nvlink": {"per_link": True}}
    with node(scenario, at=7200, options=per_link) as (_, collection, simulator):
        collection.run_cycle()
        before = dict(simulator.calls)
        samples = scrape(collection.run_cycle())
        calls = {name: simulator.calls[name] - before.get(name, 0) for name in simulator.calls}
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpus - 1)
        replay = pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, links - 1, 0)
        recovery = pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, links - 1, 1)
        states = [pynvml.nvmlDeviceGetNvLinkState(handle, link) for link in range(links)]
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == gpus * links * counter_calls_per_link
    assert calls.get("nvmlDeviceGetNvLinkState", 0) == gpus * links * state_calls_per_link
    last = {**labels_of(samples, str(gpus - 1)), "link": str(links - 1)}
    assert value_of(samples, "gpu_nvlink_link_replay_errors_total", **last) == replay
    assert value_of(samples, "gpu_nvlink_link_recovery_errors_total", **last) == recovery
    assert len(series(samples, "gpu_nvlink_link_replay_errors_total")) == gpus * links
    assert len(series(samples, "gpu_nvlink_link_crc_errors_total")) == gpus * links * crc_types
    assert len(series(samples, "gpu_nvlink_link_up")) == gpus * links
    up = [
        value_of(samples, "gpu_nvlink_link_up", **{**last, "link": str(link)})
        for link in range(links)
    ]
    assert up == [1 if state == pynvml.NVML_FEATURE_ENABLED else 0 for state in states]
    assert value_of(samples, "gpuload_collector_success", collector="nvlink") == 1


def test_pcie_cards_have_no_nvlink_series() -> None:
    with node("mixed", at=100) as (_, collection, _sim):
        samples = scrape(collection.run_cycle())
    assert series(samples, "gpu_nvlink_links_up") == {}
    assert value_of(samples, "gpuload_collector_success", collector="nvlink") == 1


def test_pcie_byte_counters_come_from_field_values_in_one_call(tmp_path: Path) -> None:
    # The byte counter fields are R555 and later; 64-bit ones are used as counters.
    scenario = write(
        tmp_path,
        """
        driver: {version: "565.57.01", cuda_version: 12070, pcie_counter_bits: 64}
        gpus:
          - model: h100-sxm
        phases:
          - duration: 1h
            utilization: 0.5
            pcie_rx: 6GB/s
            pcie_tx: 1GB/s
        """,
    )
    with node(scenario, at=60) as (_, collection, simulator):
        samples = scrape(collection.run_cycle())
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        fields = pynvml.nvmlDeviceGetFieldValues(
            handle, [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        )
    gpu0 = labels_of(samples, "0")
    assert value_of(samples, "gpu_pcie_transmit_bytes_total", **gpu0) == fields[0].value.ullVal
    assert value_of(samples, "gpu_pcie_receive_bytes_total", **gpu0) == fields[1].value.ullVal
    assert simulator.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_pcie_traffic_falls_back_to_throughput_integrated_over_time() -> None:
    clock = Clock(60)
    # The fallback integrates KiB/s over the seconds of its clock: the scenario's here.
    with node("legacy-v100", options={"pcie": {"clock": clock}}, clock=clock) as (
        _,
        collection,
        simulator,
    ):
        first = scrape(collection.run_cycle())
        clock.now = 62
        second = scrape(collection.run_cycle())
        # tx and rx, for each of the 8 GPUs, each cycle.
        assert simulator.calls["nvmlDeviceGetPcieThroughput"] == 2 * 8 * 2
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        tx, rx = (
            pynvml.nvmlDeviceGetPcieThroughput(handle, counter)
            for counter in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        )
    gpu0 = labels_of(second, "0")
    assert value_of(first, "gpu_pcie_transmit_bytes_total", **gpu0) == 0
    # The KiB/s read at 62 s, over the 2 s since the first read.
    assert tx > 0 and rx > 0
    assert value_of(second, "gpu_pcie_transmit_bytes_total", **gpu0) == round(tx * 1024 * 2)
    assert value_of(second, "gpu_pcie_receive_bytes_total", **gpu0) == round(rx * 1024 * 2)


def test_xid_79_is_counted_and_the_lost_gpu_keeps_its_identity() -> None:
    with node("fell-off-bus", at=50) as (clock, collection, _):
        before = wait_for(collection, lambda s: len(series(s, "gpu_xid_errors_total")) == 3)
        gpu3 = labels_of(before, "3")
        assert value_of(before, "gpu_last_xid_code", **gpu3) == 0
        clock.now = 65
        after = wait_for(collection, lambda s: value_of(s, "gpu_up", **gpu3) == 0)
        after = wait_for(
            collection, lambda s: value_of(s, "gpu_xid_errors_total", **gpu3, xid="79") == 1
        )
    assert value_of(after, "gpu_last_xid_code", **gpu3) == 79
    assert value_of(after, "gpu_xid_errors_total", **labels_of(after, "1"), xid="13") == 1
    assert any(dict(labels)["uuid"] == gpu3["uuid"] for labels in series(after, "gpu_info"))
    others = [labels for labels, up in series(after, "gpu_up").items() if up == 1]
    assert len(others) == 7
    assert len(series(after, "gpu_utilization_ratio")) == 7


def test_uncorrectable_ecc_with_pending_and_failed_remaps() -> None:
    with node("ecc-remap", at=20) as (clock, collection, _):
        before = scrape(collection.run_cycle())
        gpu1, gpu2 = labels_of(before, "1"), labels_of(before, "2")
        assert value_of(before, "gpu_row_remap_pending", **gpu1) == 0
        clock.now = 120
        after = scrape(collection.run_cycle())
    uncorrected = {"type": "uncorrected", "counter": "volatile"}
    assert value_of(before, "gpu_ecc_errors_total", **gpu1, **uncorrected) == 0
    assert value_of(after, "gpu_ecc_errors_total", **gpu1, **uncorrected) == 1
    assert value_of(after, "gpu_row_remap_pending", **gpu1) == 1
    assert value_of(after, "gpu_remapped_rows", **gpu1, type="uncorrectable") == 1
    assert value_of(after, "gpu_row_remap_failed", **gpu2) == 1
    assert value_of(after, "gpu_ecc_mode_enabled", **gpu1) == 1
    assert series(after, "gpu_retired_pages") == {}


def test_pre_ampere_gpus_report_retired_pages_instead_of_remapped_rows() -> None:
    with node("legacy-v100", at=400) as (_, collection, _sim):
        samples = scrape(collection.run_cycle())
    assert series(samples, "gpu_remapped_rows") == {}
    gpu6 = labels_of(samples, "6")
    retired = value_of(samples, "gpu_retired_pages", **gpu6, cause="single_bit") + value_of(
        samples, "gpu_retired_pages", **gpu6, cause="double_bit"
    )
    assert retired >= 1


MANY_PROCESSES = """
driver: {version: "550.90.07", cuda_version: 12040}
gpus:
  - model: h100-sxm
phases:
  - duration: 1h
    utilization: 0.8
    processes:
      - {name: python big.py, memory: 20GiB}
      - {name: python worker.py, memory: 1GiB, count: 11}
"""


def _processes_scraped(tmp_path: Path, scenario: str, top: int) -> dict:
    """The second cycle's samples (utilization needs a window) with the top `top` processes."""
    with node(write(tmp_path, scenario), options={"processes": {"top": top}}) as (
        clock,
        collection,
        _,
    ):
        collection.run_cycle()
        clock.now += 2
        return scrape(collection.run_cycle())


def test_processes_beyond_the_top_are_summed_under_other(tmp_path: Path) -> None:
    samples = _processes_scraped(tmp_path, MANY_PROCESSES, top=3)
    gpu0 = labels_of(samples, "0")
    assert value_of(samples, "gpu_processes", **gpu0) == 12
    memory = {
        dict(labels)["process"]: value
        for labels, value in series(samples, "gpu_process_memory_used_bytes").items()
    }
    # The biggest, two more, and the remaining nine workers in one row.
    assert len(series(samples, "gpu_process_memory_used_bytes")) == 4
    assert memory["python big.py"] == 20 * 2**30
    assert memory["(other)"] == 9 * 2**30
    utilization = series(samples, "gpu_process_sm_utilization_ratio")
    assert sum(utilization.values()) == pytest.approx(0.8, abs=0.05)


def test_more_processes_than_the_first_list_call_has_room_for(tmp_path: Path) -> None:
    # 40 processes: beyond the 32 entries the first nvmlDeviceGetComputeRunningProcesses_v3 and
    # nvmlDeviceGetProcessUtilization calls make room for, so NVML answers INSUFFICIENT_SIZE.
    scenario = MANY_PROCESSES.replace("count: 11", "count: 39")
    samples = _processes_scraped(tmp_path, scenario, top=50)
    gpu0 = labels_of(samples, "0")
    assert value_of(samples, "gpu_processes", **gpu0) == 40
    memory = series(samples, "gpu_process_memory_used_bytes")
    assert len(memory) == 40
    assert sum(memory.values()) == 20 * 2**30 + 39 * 2**30
    utilization = series(samples, "gpu_process_sm_utilization_ratio")
    assert len(utilization) == 40
    assert sum(utilization.values()) == pytest.approx(0.8, abs=0.05)


@pytest.mark.parametrize("slots", [128, 16])
def test_utilization_samples_take_one_call_and_lose_none_when_the_buffer_is_short(
    slots: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16 slots: fewer than the 120 samples the simulated ring holds, so the first read fills its
    # buffer and is done again the two-call way, as pynvml does it.
    monkeypatch.setattr(sys.modules[Device.__module__], "_SAMPLE_SLOTS", slots)
    with node("h100-nvlink", at=60) as (clock, collection, simulator):
        collection.run_cycle()  # NVML initialised, as the daemon has it
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        device = Device(0, handle)
        _, expected = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        before = simulator.calls["nvmlDeviceGetSamples"]
        everything = device.utilization_samples("gpu", 0)
        first_read = simulator.calls["nvmlDeviceGetSamples"] - before
        clock.now += 1
        newest = max(stamp for stamp, _ in everything)
        before = simulator.calls["nvmlDeviceGetSamples"]
        fresh = device.utilization_samples("gpu", newest)
        second_read = simulator.calls["nvmlDeviceGetSamples"] - before
    assert len(expected) == 120
    assert everything == [(s.timeStamp, float(s.sampleValue.uiVal)) for s in expected]
    assert first_read == (1 if slots > 120 else 3)
    assert len(fresh) == 6 and min(stamp for stamp, _ in fresh) > newest
    assert second_read == 1


def test_a_gpus_field_values_are_read_in_one_call_a_cycle() -> None:
    # NVLink traffic (18 links), PCIe bytes and the memory temperature; with the slow reads,
    # link state and replay/recovery too. The first cycle finds the links, so NVLink reads its
    # traffic and its link health in calls of their own there.
    with node("h100-nvlink", at=60) as (clock, collection, simulator):
        calls = []
        for _ in range(3):
            before = simulator.calls["nvmlDeviceGetFieldValues"]
            samples = scrape(collection.run_cycle())
            calls.append(simulator.calls["nvmlDeviceGetFieldValues"] - before)
            clock.now += 1
        handle = pynvml.nvmlDeviceGetHandleByIndex(7)
        temperature = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert calls == [3 * 8, 8, 8]
    gpu7 = labels_of(samples, "7")
    memory = value_of(samples, "gpu_temperature_celsius", **gpu7, sensor="memory")
    assert memory == temperature[0].value.uiVal
    assert len(series(samples, "gpu_nvlink_transmit_bytes_total")) == 8
    assert value_of(samples, "gpu_nvlink_links_up", **gpu7) == 18
    assert value_of(samples, "gpu_pcie_receive_bytes_total", **gpu7) > 0


def test_a_failed_field_values_call_is_an_error_of_each_collector_that_reads_fields(
    tmp_path: Path,
) -> None:
    scenario = write(
        tmp_path,
        """
        driver: {version: "565.57.01", cuda_version: 12070, pcie_counter_bits: 64}
        gpus:
          - model: h100-sxm
            count: 2
        phases:
          - duration: 1h
            utilization: 0.5
            pcie_tx: 1GB/s
            pcie_rx: 1GB/s
        faults:
          - {kind: error, gpu: 0, call: nvmlDeviceGetFieldValues, error: UNKNOWN, at: 40}
        """,
    )
    with node(scenario, at=30) as (clock, collection, simulator):
        collection.run_cycle()
        clock.now = 50
        before = simulator.calls["nvmlDeviceGetFieldValues"]
        samples = scrape(collection.run_cycle())
        calls = simulator.calls["nvmlDeviceGetFieldValues"] - before
    sick, well = labels_of(samples, "0"), labels_of(samples, "1")
    # One error per read of fields, as when each collector made its own call: NVLink reads its
    # traffic, and its state and error counters (slow reads, due every cycle here).
    for collector, reads in (("temperature", 1), ("pcie", 1), ("nvlink", 2)):
        errors = {"collector": collector, "error": "unknown"}
        assert value_of(samples, "gpuload_nvml_errors_total", **errors) == reads, collector
    # GPU 0 read ahead once and failed; its NVLink error counters fell back to their calls.
    assert calls == 2
    assert value_of(samples, "gpu_temperature_celsius", **sick, sensor="memory") is None
    assert value_of(samples, "gpu_temperature_celsius", **sick, sensor="gpu") is not None
    assert value_of(samples, "gpu_nvlink_replay_errors_total", **sick) is not None
    assert value_of(samples, "gpu_temperature_celsius", **well, sensor="memory") is not None
    assert value_of(samples, "gpu_pcie_transmit_bytes_total", **well) is not None


def test_a_collector_listing_bad_fields_costs_only_the_shared_read() -> None:
    # A collector whose field list cannot be read (a bug): the others still read theirs.
    with node("h100-nvlink", at=60) as (_, collection, _sim):
        collection.run_cycle()
        gpu = collection._session.gpus[0]
        gpu.collectors["temperature"].fields = lambda slow_due: ["not a field"]
        samples = scrape(collection.run_cycle())
    gpu0 = labels_of(samples, "0")
    assert value_of(samples, "gpu_temperature_celsius", **gpu0, sensor="memory") is not None
    assert value_of(samples, "gpu_pcie_transmit_bytes_total", **gpu0) is not None
    assert value_of(samples, "gpu_up", **gpu0) == 1
    assert value_of(samples, "gpuload_collector_success", collector="nvlink") == 1
