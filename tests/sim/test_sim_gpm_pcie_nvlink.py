"""GPM metrics, PCIe counters and throughput latency, NVLink: through pynvml's public calls."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from exporter.sim import ScenarioError, install, load_scenario

if TYPE_CHECKING:
    from conftest import ManualClock

Writer = Callable[[dict[str, Any]], Path]

SQUARE = {"pattern": "square", "min": 0.2, "max": 0.8, "period": 10, "duty": 0.5}


def _metrics(sample1: Any, sample2: Any, ids: list[int]) -> list[tuple[int, float]]:
    """(nvmlReturn, value) of each metric between two samples."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = sample1, sample2
    for slot, metric in zip(request.metrics, ids, strict=False):
        slot.metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    return [(m.nvmlReturn, m.value) for m in request.metrics[: len(ids)]]


def _sample_pair(handle: Any, clock: ManualClock, start: float, end: float) -> tuple[Any, Any]:
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    clock.at(start)
    pynvml.nvmlGpmSampleGet(handle, first)
    clock.at(end)
    pynvml.nvmlGpmSampleGet(handle, second)
    return first, second


# -- GPM -------------------------------------------------------------------------------------


def test_gpm_metric_is_the_time_average_of_its_curve(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    base_scenario["phases"][0].update(sm_active=SQUARE, dram_active=0.9, pcie_tx="2MiB/s")
    sim = install(write_scenario(base_scenario), clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    # 2..8 s: high (0.8) from 2 to 5, low (0.2) from 5 to 8: mean 0.5. 2..4 s: all high.
    first, second = _sample_pair(handle, clock, 2.0, 8.0)
    sm, dram, pcie = _metrics(first, second, [2, 10, 20])
    assert sm == (pynvml.NVML_SUCCESS, pytest.approx(50.0))
    assert dram == (pynvml.NVML_SUCCESS, pytest.approx(90.0))
    assert pcie == (pynvml.NVML_SUCCESS, pytest.approx(2.0))
    third = pynvml.nvmlGpmSampleAlloc()
    clock.at(4.0)
    pynvml.nvmlGpmSampleGet(handle, third)
    assert _metrics(first, third, [2])[0][1] == pytest.approx(80.0)
    for sample in (first, second, third):
        pynvml.nvmlGpmSampleFree(sample)
    assert (sim.gpm_samples.allocated, sim.gpm_samples.open) == (3, 0)


def test_gpm_samples_closer_than_100_ms_fail_per_metric(clock: ManualClock) -> None:
    install("training", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first, second = _sample_pair(handle, clock, 10.0, 10.05)
    assert [code for code, _ in _metrics(first, second, [2, 5, 99])] == [
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_NOT_SUPPORTED,  # an id the simulator does not produce
    ]


def test_gpm_defaults_follow_utilization_and_memory_bound_shows_low_sm(
    clock: ManualClock,
) -> None:
    install("memory-bound", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first, second = _sample_pair(handle, clock, 10.0, 11.0)
    (_, sm), (_, tensor), (_, dram) = _metrics(first, second, [2, 5, 10])
    assert (sm, tensor, dram) == (pytest.approx(30), pytest.approx(8), pytest.approx(90))
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu >= 95
    install("saturated", clock=clock)  # no GPM keys: derived from 98.5 % utilization
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first, second = _sample_pair(handle, clock, 10.0, 11.0)
    (_, sm), (_, tensor) = _metrics(first, second, [2, 5])
    assert sm == pytest.approx(0.985 * 80)
    assert tensor == pytest.approx(sm / 2)


def test_gpm_is_deterministic(clock: ManualClock) -> None:
    values = []
    for _ in range(2):
        clock.at(0)  # the scenario starts now, in both runs
        install("h100-nvlink", clock=clock)
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(3)
        first, second = _sample_pair(handle, clock, 100.0, 101.3)
        values.append(_metrics(first, second, [2, 3, 4, 5, 10, 11, 12, 13, 20, 21, 60, 61]))
        pynvml.nvmlShutdown()
    assert values[0] == values[1]
    assert all(code == pynvml.NVML_SUCCESS for code, _ in values[0])


def test_gpm_unsupported_before_hopper_and_on_old_drivers() -> None:
    install("faulty", pinned_time=10.0)
    pynvml.nvmlInit()
    a100 = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(a100, sample)
    pynvml.nvmlGpmSampleFree(sample)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleFree(sample)  # already freed
    install("legacy-v100", pinned_time=10.0)
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlGpmSampleAlloc()


def test_gpm_metrics_get_checks_its_version(clock: ManualClock) -> None:
    install("training", clock=clock)
    pynvml.nvmlInit()
    first, second = _sample_pair(pynvml.nvmlDeviceGetHandleByIndex(0), clock, 1.0, 2.0)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.sample1, request.sample2 = 2, first, second
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(request)


# -- PCIe ------------------------------------------------------------------------------------


def test_pcie_byte_counters_integrate_the_rate(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    base_scenario["phases"][0].update(pcie_tx="1GB/s", pcie_rx={"value": "3GB/s", "noise": "1GB/s"})
    base_scenario["driver"]["pcie_counter_bits"] = 64
    install(write_scenario(base_scenario), clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fields = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
    clock.at(10)
    tx1, rx1 = (f.value.ullVal for f in pynvml.nvmlDeviceGetFieldValues(handle, fields))
    clock.at(12.5)
    tx2, rx2 = (f.value.ullVal for f in pynvml.nvmlDeviceGetFieldValues(handle, fields))
    assert tx2 - tx1 == pytest.approx(2.5e9, abs=1)
    assert rx2 - rx1 == pytest.approx(7.5e9, abs=1)  # the counters ignore the noise


def test_pcie_byte_counters_wrap_at_32_bits_by_default(
    base_scenario: dict[str, Any], write_scenario: Writer, clock: ManualClock
) -> None:
    # nvml.h: "Value can be wrapped"; nvml-facts.md: treat it as a 32-bit counter.
    base_scenario["phases"][0].update(pcie_tx="3GB/s")
    install(write_scenario(base_scenario), clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for second in range(10, 20):
        clock.at(second)
        (field,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])
        seen.append(field.value.ullVal)
    assert max(seen) < 2**32
    assert any(later < earlier for earlier, later in itertools.pairwise(seen))


def test_pcie_throughput_blocks_20_ms_and_calls_overlap_across_threads() -> None:
    # Each call spends its 20 ms at a barrier of all 8: it opens only if no call holds the
    # others out while it waits (a lock held over the latency would break it after 60 s).
    barrier, waited = threading.Barrier(8, timeout=60), []

    def wait_for_the_others(seconds: float) -> None:
        waited.append(seconds)
        barrier.wait()

    install("training", pinned_time=10.0, sleep=wait_for_the_others)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    failures: list[BaseException] = []

    def read(handle: Any) -> None:
        try:
            pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        except BaseException as error:  # noqa: BLE001 (reported below)
            failures.append(error)

    threads = [threading.Thread(target=read, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and waited == [0.02] * 8


def test_latency_is_configurable_per_function(
    base_scenario: dict[str, Any], write_scenario: Writer
) -> None:
    base_scenario["driver"]["latency"] = {"nvmlDeviceGetPcieThroughput": 0, "default": "30ms"}
    waited: list[float] = []
    install(write_scenario(base_scenario), pinned_time=5.0, sleep=waited.append)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    waited.clear()
    pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    assert waited == []
    pynvml.nvmlDeviceGetName(handle)
    assert waited == [0.03]


def test_legacy_driver_falls_back_to_pcie_throughput() -> None:
    install("legacy-v100", pinned_time=10.0)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fields = pynvml.nvmlDeviceGetFieldValues(handle, [197, 198])  # R555 and later (branches)
    assert [f.nvmlReturn for f in fields] == [pynvml.NVML_ERROR_INVALID_ARGUMENT] * 2
    rx = pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    assert rx == pytest.approx(2e9 / 1024, rel=0.25)  # KB/s
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)


# -- NVLink ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "gpu", "links", "version"),
    [("h100-nvlink", 0, 18, 6), ("faulty", 0, 12, 4), ("legacy-v100", 0, 6, 2)],
)
def test_nvlink_links_per_model(scenario: str, gpu: int, links: int, version: int) -> None:
    install(scenario, pinned_time=10.0)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    assert [pynvml.nvmlDeviceGetNvLinkState(handle, link) for link in range(links)] == [1] * links
    assert pynvml.nvmlDeviceGetNvLinkVersion(handle, links - 1) == version
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(handle, links)
    (count,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert count.value.uiVal == links


def test_pcie_cards_have_no_nvlink() -> None:
    install("mixed", pinned_time=10.0)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(handle, 0)
    (field,) = pynvml.nvmlDeviceGetFieldValues(handle, [(138, 0)])
    assert field.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def _link_kib(handle: Any, link: int) -> int:
    (field,) = pynvml.nvmlDeviceGetFieldValues(
        handle, [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)]
    )
    assert field.nvmlReturn == pynvml.NVML_SUCCESS
    return int(field.value.ullVal)


def test_nvlink_traffic_is_split_across_active_links_and_down_links_stop(
    clock: ManualClock,
) -> None:
    install("h100-nvlink", clock=clock)
    pynvml.nvmlInit()
    gpu2, gpu5 = pynvml.nvmlDeviceGetHandleByIndex(2), pynvml.nvmlDeviceGetHandleByIndex(5)
    assert pynvml.nvmlDeviceGetNvLinkState(gpu5, 3) == 0  # nvlink_down: [3]
    clock.at(150)  # GPU 2 link 7 down from 120 to 180 s
    assert pynvml.nvmlDeviceGetNvLinkState(gpu2, 7) == 0
    before = [_link_kib(gpu2, link) for link in (0, 7)]
    clock.at(153)  # one 3 s step averages 0.9 * 2 GB/s + 0.1 * 180 GB/s = 19.8 GB/s
    after = [_link_kib(gpu2, link) for link in (0, 7)]
    assert after[1] == before[1]
    assert (after[0] - before[0]) * 1024 == pytest.approx(3 * 19.8e9 / 17, rel=1e-6)
    clock.at(180)
    assert pynvml.nvmlDeviceGetNvLinkState(gpu2, 7) == 1
    assert _link_kib(gpu5, 3) < _link_kib(gpu5, 4)


def test_nvlink_error_counters_grow_at_their_rates(clock: ManualClock) -> None:
    install("h100-nvlink", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)  # replay: 6 per hour
    replay = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
    clock.at(0)
    start = pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, replay)
    clock.at(3600)
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, replay) - start == 6
    quiet = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(quiet, 0, replay) == 0
    # Hopper lost the per-link CRC counters (NVML change log v520->v525).
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, 5)


def test_nvlink_error_fields_match_the_error_counter_calls(clock: ManualClock) -> None:
    install("h100-nvlink", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)  # replay: 6, recovery: 1 per hour
    clock.at(7200)
    fields = [
        (field, link)
        for field in (
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
        )
        for link in range(18)
    ]
    values = pynvml.nvmlDeviceGetFieldValues(handle, fields)
    assert {value.nvmlReturn for value in values} == {pynvml.NVML_SUCCESS}
    counters = [
        pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)
        for counter in (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
        for link in range(18)
    ]
    assert [value.value.ullVal for value in values] == counters
    assert min(counters[:18]) >= 12
    # Hopper's one CRC count per link (crc_flit: 30 per hour on GPU 5, over 2 hours).
    (crc,) = pynvml.nvmlDeviceGetFieldValues(handle, [(pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 0)])
    assert crc.nvmlReturn == pynvml.NVML_SUCCESS
    assert 60 <= crc.value.ullVal <= 61


def test_nvlink_state_field_matches_the_state_call(clock: ManualClock) -> None:
    install("h100-nvlink", clock=clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)  # link 7 is down from 2 to 3 minutes
    for at, down in ((60, set()), (150, {7})):
        clock.at(at)
        values = pynvml.nvmlDeviceGetFieldValues(
            handle, [(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(18)]
        )
        assert {value.nvmlReturn for value in values} == {pynvml.NVML_SUCCESS}
        states = [pynvml.nvmlDeviceGetNvLinkState(handle, link) for link in range(18)]
        assert [value.value.uiVal for value in values] == states
        assert {link for link, state in enumerate(states) if not state} == down
    (past_the_last,) = pynvml.nvmlDeviceGetFieldValues(
        handle, [(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 18)]
    )
    assert past_the_last.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_older_driver_has_no_nvlink_error_fields_but_has_the_counters() -> None:
    install("legacy-v100", pinned_time=10.0)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    replay, state = pynvml.nvmlDeviceGetFieldValues(
        handle,
        [(pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 0), (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 0)],
    )
    # Ids R520 added: unknown to 470, a per-field INVALID_ARGUMENT.
    assert replay.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert state.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, 0) == 0
    assert pynvml.nvmlDeviceGetNvLinkState(handle, 0) == pynvml.NVML_FEATURE_ENABLED


def test_nvlink_keys_are_validated(base_scenario: dict[str, Any], write_scenario: Writer) -> None:
    base_scenario["gpus"][0]["nvlink_down"] = [18]
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.nvlink_down\[0\]: expected an integer"):
        load_scenario(write_scenario(base_scenario))
    base_scenario["gpus"][0] = {"model": "l4", "count": 2, "nvlink_down": [0]}
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.nvlink_down: NVIDIA L4 has no NVLink"):
        load_scenario(write_scenario(base_scenario))
    del base_scenario["gpus"][0]["nvlink_down"]
    base_scenario["faults"] = [{"kind": "nvlink_down", "gpu": 0, "link": 0}]
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.link: this GPU has no NVLink"):
        load_scenario(write_scenario(base_scenario))


def test_gpm_on_a_pinned_clock_reports_the_curves_at_that_instant(
    base_scenario: dict[str, Any], write_scenario: Writer
) -> None:
    base_scenario["phases"][0]["sm_active"] = SQUARE
    install(write_scenario(base_scenario), pinned_time=7.0)  # low half of the square wave
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, first)
    pynvml.nvmlGpmSampleGet(handle, second)
    assert _metrics(first, second, [2]) == [(pynvml.NVML_SUCCESS, pytest.approx(20.0))]
