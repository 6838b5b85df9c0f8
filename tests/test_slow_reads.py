"""Values that change rarely are read once per slow interval and served in between."""

from __future__ import annotations

import contextlib
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from helpers import Clock, exposition_text, parse_metrics, series, value_of

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.sim.library import SimulatedNvml
from exporter.snapshot import Snapshot

ALL_ON = {name: True for name in REGISTRY}

# R565: the first release with nvmlDeviceGetTemperatureV, which FAST_CALLS names.
SCENARIO = """
name: slow-reads
driver: {version: "565.57.01", cuda_version: 12070}
loop: false
gpus:
  - model: h100-sxm
    nvlink_errors_per_hour: {replay: 3600, recovery: 0, crc_flit: 7200, crc_data: 0}
phases:
  - duration: 1h
    utilization: 0.5
    power: 300W
"""

# The C functions behind the slow reads: limits, maxima, error counters, remapping, versions.
# (NVLink link states come with the field values, a call every cycle also makes.)
SLOW_CALLS = {
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetMigMode",
}
FAST_CALLS = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetClockInfo"}


def _value(samples: dict, name: str, **labels: str) -> float | None:
    """GPU 0's value of ``name`` (its uuid added to ``labels``)."""
    (uuid,) = [dict(key)["uuid"] for key in series(samples, "gpu_up")]
    return value_of(samples, name, gpu="0", uuid=uuid, **labels)


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


@contextlib.contextmanager
def _cycles(
    tmp_path: Path, slow_interval: float, faults: str = ""
) -> Iterator[tuple[Clock, SimulatedNvml, Collection]]:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(SCENARIO) + textwrap.dedent(faults))
    clock = Clock(5)
    library = sim.install(path, clock=clock, epoch=0)
    # The slow interval is counted on the scenario's clock: it passes when the test moves it.
    collection = Collection(ALL_ON, timeout=5, slow_interval=slow_interval, clock=clock)
    try:
        yield clock, library, collection
    finally:
        collection.close()
        sim.uninstall()


def _calls_per_cycle(library: SimulatedNvml, collection: Collection) -> Counter[str]:
    before = Counter(library.calls)
    collection.run_cycle()
    return Counter(library.calls) - before


def test_slow_values_are_read_once_and_served_again_until_the_interval_passes(
    tmp_path: Path,
) -> None:
    with _cycles(tmp_path, slow_interval=3600) as (clock, library, collection):
        first = _calls_per_cycle(library, collection)
        assert set(first) >= SLOW_CALLS
        at_start = _scrape(collection.snapshot)
        clock.now += 60  # an hour's worth of errors per minute: the counters moved
        later = _calls_per_cycle(library, collection)
        assert not SLOW_CALLS & set(later), later
        assert set(later) >= FAST_CALLS
        served = _scrape(collection.snapshot)
    # Every series is still there (GPM adds its own from the second cycle), the slow ones with
    # the values read first.
    assert set(at_start) <= set(served)
    assert _value(served, "gpu_nvlink_crc_errors_total") == _value(
        at_start, "gpu_nvlink_crc_errors_total"
    )
    assert _value(served, "gpu_power_limit_watts") == 700


def test_slow_values_are_read_again_once_the_interval_has_passed(tmp_path: Path) -> None:
    with _cycles(tmp_path, slow_interval=30) as (clock, library, collection):
        collection.run_cycle()
        before = _value(_scrape(collection.snapshot), "gpu_nvlink_replay_errors_total")
        clock.now += 60
        calls = _calls_per_cycle(library, collection)
        after = _value(_scrape(collection.snapshot), "gpu_nvlink_replay_errors_total")
    assert set(calls) >= SLOW_CALLS
    assert before is not None and after is not None and after > before


def test_a_failed_slow_read_is_retried_on_the_next_cycle(tmp_path: Path) -> None:
    with _cycles(
        tmp_path,
        slow_interval=3600,
        faults="""
        faults:
          - {kind: error, gpu: 0, call: nvmlDeviceGetEnforcedPowerLimit, error: UNKNOWN,
             at: 0, until: 10}
        """,
    ) as (clock, _library, collection):
        failed = _scrape(collection.run_cycle())
        clock.now = 20
        retried = _scrape(collection.run_cycle())
    assert _value(failed, "gpu_power_limit_watts") is None
    assert _value(retried, "gpu_power_limit_watts") == 700


# No fan (SXM boards) and no video encoder (H100): NVML answers NOT_SUPPORTED.
UNSUPPORTED_ON_H100 = {"nvmlDeviceGetFanSpeed", "nvmlDeviceGetEncoderUtilization"}


def test_reads_answered_not_supported_are_asked_again_only_once_per_slow_interval(
    tmp_path: Path,
) -> None:
    with _cycles(tmp_path, slow_interval=3600) as (clock, library, collection):
        first = _calls_per_cycle(library, collection)
        clock.now += 1
        later = _calls_per_cycle(library, collection)
    assert set(first) >= UNSUPPORTED_ON_H100 | FAST_CALLS
    assert not UNSUPPORTED_ON_H100 & set(later), later
    # The decoder, which the H100 has, is read every cycle.
    assert set(later) >= FAST_CALLS | {"nvmlDeviceGetDecoderUtilization"}


def test_a_value_that_was_not_supported_returns_at_the_next_slow_cycle(tmp_path: Path) -> None:
    with _cycles(
        tmp_path,
        slow_interval=30,
        faults="""
        faults:
          - {kind: not_supported, calls: [nvmlDeviceGetPowerUsage], at: 0, until: 10}
          - {kind: error, call: nvmlDeviceGetTemperatureV, error: NO_DATA, at: 0, until: 10}
        """,
    ) as (clock, library, collection):
        absent = _scrape(collection.run_cycle())  # at 5 s: the next slow cycle is at 35 s
        clock.now = 20  # both faults are over
        temperature_calls = library.calls["nvmlDeviceGetTemperatureV"]
        not_yet = _scrape(collection.run_cycle())
        # NO_DATA means "nothing right now": asked again at once, unlike NOT_SUPPORTED.
        assert library.calls["nvmlDeviceGetTemperatureV"] == temperature_calls + 1
        clock.now = 36
        back = _scrape(collection.run_cycle())
    assert _value(absent, "gpu_power_usage_watts") is None
    assert _value(not_yet, "gpu_power_usage_watts") is None
    assert _value(not_yet, "gpu_temperature_celsius", sensor="gpu") is not None
    assert _value(back, "gpu_power_usage_watts") == 300
