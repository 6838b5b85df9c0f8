"""While the driver is gone (reloaded mid-run), the GPUs' series are absent, not frozen at up.

The shipped `faulty` scenario reloads the driver (every call answers DRIVER_NOT_LOADED) for ten
seconds. The collection runs on the scenario's clock, moved by hand, and each snapshot is
scraped through the daemon's real registry.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import Clock, exposition_text, parse_metrics, series, simulated_node, value_of

from exporter import sim
from exporter.collection import Collection
from exporter.sim.scenario import Fault, load_scenario
from exporter.snapshot import Snapshot

GPUS = 4  # the faulty scenario's A100s
PER_GPU = ("gpu_up", "gpu_info", "gpuload_gpu_stale", "gpu_utilization_ratio")


def _outage() -> Fault:
    (fault,) = (f for f in load_scenario("faulty").faults if f.kind == "driver_not_loaded")
    return fault


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


@pytest.fixture
def node() -> Iterator[tuple[Clock, Collection]]:
    clock = Clock(_outage().at - 10)
    collection = simulated_node("faulty", clock)
    try:
        yield clock, collection
    finally:
        collection.close()
        sim.uninstall()


def test_gpu_series_are_absent_while_the_driver_is_gone_and_back_after(node) -> None:
    clock, collection = node
    outage = _outage()
    before = _scrape(collection.run_cycle())
    assert value_of(before, "gpuload_nvml_up") == 1
    for name in PER_GPU:
        assert len(series(before, name)) == GPUS, name
    assert set(series(before, "gpu_up").values()) == {1}
    assert len(collection.snapshot.gpus) == GPUS  # the landing and status pages' GPUs

    # The cycle that finds the driver gone, then one that fails to initialise NVML again.
    for t in (outage.at + 1, outage.until - 1):
        clock.now = t
        during = _scrape(collection.run_cycle())
        assert value_of(during, "gpuload_nvml_up") == 0, t
        for name in PER_GPU:
            assert series(during, name) == {}, (t, name)
        assert collection.snapshot.gpus == ()

    clock.now = outage.until + 1  # the driver is back and the retry is due
    after = _scrape(collection.run_cycle())
    assert value_of(after, "gpuload_nvml_up") == 1
    for name in PER_GPU:
        assert len(series(after, name)) == GPUS, name
    assert set(series(after, "gpu_up").values()) == {1}
    assert set(series(after, "gpuload_gpu_stale").values()) == {0}
    assert [gpu.up for gpu in collection.snapshot.gpus] == [True] * GPUS
