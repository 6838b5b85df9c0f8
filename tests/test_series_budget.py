"""The series budget: what each GPU costs a Prometheus, per metrics profile, on every scenario.

Every shipped scenario runs for ten simulated minutes (its faults and events included) with the
real collectors, and each scrape's series are counted per GPU: every series with a `gpu` label.
A GPU in MIG mode is as many GPUs to its users as it has GPU instances (each is allocated on its
own), so its series are counted per GPU instance. docs/fleet.md states the budgets.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest
from helpers import Clock, exposition_text, parse_metrics, simulated_node

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY, Sample
from exporter.collectors.profiles import sample_filter
from exporter.server.dcgm import DcgmView, keeps_sources
from exporter.server.exposition import TEXT, Exposition, ProcessMetrics
from exporter.sim.scenario import SCENARIO_DIR
from exporter.snapshot import Snapshot

SCENARIOS = sorted(path.stem for path in SCENARIO_DIR.glob("*.yaml"))
BUDGET = {"default": 80, "minimal": 25}
# What `metrics.dcgm_compat` may cost on top: at most 30 series per GPU over the default's 80.
DCGM_BUDGET = BUDGET["default"] + 30


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


def series_per_gpu(
    scenario: str | Path, profile: str, *, dcgm: bool = False
) -> dict[tuple[int, str], float]:
    """(scenario second, GPU) -> series per GPU (per GPU instance in MIG mode), each scrape.

    ``dcgm``: with `metrics.dcgm_compat` on, dcgm-exporter's fields and their sources too.
    """
    clock = Clock(0)
    options = {"processes": {"host_pid_namespace": "true"}}
    keep_also = keeps_sources() if dcgm else None
    collection = simulated_node(
        scenario, clock, options=options, profile=profile, keep_also=keep_also
    )
    view = DcgmView("node", gr_engine_fallback=False) if dcgm else None
    exposition = Exposition(ProcessMetrics(), view)
    costs = {}
    try:
        for t in (0, 60, 120, 300, 330, 600):  # before, during and after every scenario's events
            clock.now = t
            samples = parse_metrics(exposition.encode(collection.run_cycle(), TEXT).decode())
            count: Counter[str] = Counter()
            instances: dict[str, set[str]] = defaultdict(set)
            for _, labels in samples:
                named = dict(labels)
                if "gpu" in named:
                    count[named["gpu"]] += 1
                    if "mig_instance" in named:
                        instances[named["gpu"]].add(named["mig_instance"])
            for gpu, n in count.items():
                costs[(t, gpu)] = n / max(1, len(instances[gpu]))
    finally:
        collection.close()
        sim.uninstall()
    return costs


@pytest.mark.parametrize("profile", sorted(BUDGET))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_gpu_keeps_to_its_profiles_budget(scenario: str, profile: str) -> None:
    costs = series_per_gpu(scenario, profile)
    assert costs, "no GPU was counted"
    over = {at: cost for at, cost in costs.items() if cost > BUDGET[profile]}
    assert not over, f"series per GPU over {BUDGET[profile]} at (second, gpu): {over}"


@pytest.mark.parametrize("profile", sorted(BUDGET))
# The most series a GPU has: an H100 with NVLink and GPM, and an H100's MIG instances.
@pytest.mark.parametrize("scenario", ["h100-nvlink", "h100-mig"])
def test_dcgm_compat_costs_at_most_30_series_per_gpu_over_the_default_budget(
    scenario: str, profile: str
) -> None:
    costs = series_per_gpu(scenario, profile, dcgm=True)
    over = {at: cost for at, cost in costs.items() if cost > DCGM_BUDGET}
    assert not over, f"series per GPU over {DCGM_BUDGET} at (second, gpu): {over}"


# A busy inference node: a dozen processes on each GPU, more than `collectors.processes.top`, on
# the scenario with the most series per GPU (an H100 SXM with NVLink, GPM and every sensor).
MANY_PROCESSES = """
driver: {version: "550.90.07", cuda_version: 12040}
gpus:
  - model: h100-sxm
    count: 2
phases:
  - duration: 1h
    utilization: 0.6
    processes:
      - {name: python serve.py, memory: 20GiB}
      - {name: python worker.py, memory: 2GiB, count: 11}
"""


@pytest.mark.parametrize("profile", sorted(BUDGET))
def test_the_budget_holds_with_more_processes_than_are_shown(tmp_path: Path, profile: str) -> None:
    scenario = tmp_path / "many-processes.yaml"
    scenario.write_text(MANY_PROCESSES)
    costs = series_per_gpu(scenario, profile)
    assert max(costs.values()) <= BUDGET[profile], costs


def _series_and_calls(scenario: str, profile: str) -> tuple[set[tuple[str, tuple]], Counter[str]]:
    """The series of a cycle with GPM's second sample in, and the NVML calls that cycle made."""
    clock = Clock(60)
    library = sim.install(scenario, clock=clock, epoch=0, caller="root", sleep=lambda _: None)
    collection = Collection(dict.fromkeys(REGISTRY, True), timeout=60, clock=clock, profile=profile)
    try:
        collection.run_cycle()
        clock.now = 61
        before = Counter(library.calls)
        snapshot = collection.run_cycle()
        calls = Counter(library.calls) - before
    finally:
        collection.close()
        sim.uninstall()
    return set(_scrape(snapshot)), calls


def _families(profile: str) -> set[str]:
    series, _ = _series_and_calls("h100-nvlink", profile)
    return {name for name, labels in series if dict(labels).get("gpu") == "0"}


def test_each_profile_holds_the_last_and_minimal_still_answers_the_questions() -> None:
    minimal, default, full = (_families(p) for p in ("minimal", "default", "full"))
    assert minimal < default < full
    busy = {"gpu_utilization_seconds_total", "gpu_sm_active_seconds_total"}
    starved = {"gpu_idle_seconds_total", "gpu_processes", "gpu_memory_used_bytes"}
    hot = {"gpu_temperature_celsius", "gpu_power_usage_watts", "gpu_clock_event_active"}
    hung = {"gpu_power_limit_watts"}  # GPUJobHung: busy at a fraction of the power limit
    broken = {"gpu_up", "gpuload_gpu_stale", "gpu_ecc_errors_total", "gpu_row_remap_failed"}
    assert busy | starved | hot | hung | broken <= minimal
    # NVLink link by link only on request.
    assert "gpu_nvlink_link_transmit_bytes_total" not in full
    assert "gpu_nvlink_transmit_bytes_total" in default
    assert "gpu_bar1_memory_used_bytes" in full - default
    # The last interval's GPM ratios only in full: their counters are what is read.
    assert "gpu_sm_active_ratio" in full - default
    assert "gpu_sm_active_seconds_total" in default


@pytest.mark.parametrize("scenario", ["h100-nvlink", "a100-mig"])
@pytest.mark.parametrize("profile", sorted(BUDGET))
def test_a_profile_publishes_the_full_profiles_series_it_keeps_without_reading_the_rest(
    scenario: str, profile: str
) -> None:
    families = {family.name: family for spec in REGISTRY.values() for family in spec.families}
    keep = sample_filter(profile)
    assert keep is not None

    def kept(name: str, labels: tuple[tuple[str, str], ...]) -> bool:
        if name not in families:  # the exporter's own series: every profile has them
            return True
        named = dict(labels)
        return keep(Sample(name, 0.0, tuple(named[label] for label in families[name].labels)))

    full, full_calls = _series_and_calls(scenario, "full")
    published, calls = _series_and_calls(scenario, profile)
    assert published == {key for key in full if kept(*key)}
    # The reads whose every sample the profile drops are not made: BAR1, the graphics clock.
    assert full_calls["nvmlDeviceGetBAR1MemoryInfo"] > 0
    assert calls["nvmlDeviceGetBAR1MemoryInfo"] == 0
    assert calls["nvmlDeviceGetClockInfo"] < full_calls["nvmlDeviceGetClockInfo"]
    assert sum(calls.values()) < sum(full_calls.values())
