"""How many GPUs are collected at once, in fast and in slow cycles; when NVML is retried.

Which GPUs were being collected at the same moment is seen at the driver boundary: each GPU's
collection runs from its first NVML call of the cycle to its last, as the simulated library
records them (time, GPU) for every call that names a device handle.
"""

from __future__ import annotations

import logging
import re
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest
from helpers import Clock, exposition_text, parse_metrics, series, value_of

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.session import Backoff
from exporter.sim.library import SimulatedNvml
from exporter.snapshot import Snapshot


def _scenario(tmp_path: Path, gpus: int, latency: str, faults: str = "") -> Path:
    path = tmp_path / "lanes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            name: lanes
            driver: {{version: "550.90.07", cuda_version: 12040, latency: {{default: {latency}}}}}
            gpus:
              - {{model: h100-sxm, count: {gpus}}}
            phases:
              - {{duration: 1h, utilization: 0.5, power: 300W}}
            """
        )
        + textwrap.dedent(faults)
    )
    return path


class _Recorder:
    """Stands in for pynvml.nvmlLib in front of the simulator; notes (time, GPU) of each call.

    With ``gate`` set, each GPU's first call waits at it: a barrier for as many GPUs as the
    test expects inside NVML at once, which holds them there whatever the machine's speed.
    """

    def __init__(self, library: SimulatedNvml) -> None:
        self._library = library
        self.calls: list[tuple[float, int, str]] = []
        self.threads: set[int] = set()  # the threads that called with a device handle
        self.gate: threading.Barrier | None = None
        self.holds: dict[tuple[int, str], threading.Event] = {}  # (GPU, call): wait for it
        self._gated: set[int] = set()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        function = getattr(self._library, name)

        def call(*args: Any) -> Any:
            gpu = self._gpu(args)
            if gpu is not None:
                with self._lock:
                    self.calls.append((time.perf_counter(), gpu, name))
                    self.threads.add(threading.get_ident())
                    gate = self.gate if gpu not in self._gated else None
                    self._gated.add(gpu)
                if gate is not None:
                    gate.wait()  # broken (an error) if the GPUs never all get here
                if (gpu, name) in self.holds:
                    self.holds[gpu, name].wait(60)
            result = function(*args)
            if gpu is not None:
                with self._lock:
                    self.calls.append((time.perf_counter(), gpu, name))
            return result

        return call

    def hold_first_calls(self, gpus: int) -> None:
        """Hold each GPU's next first call until ``gpus`` of them are inside NVML at once."""
        with self._lock:
            self.gate = threading.Barrier(gpus, timeout=60)
            self._gated = set()

    def _gpu(self, args: tuple[Any, ...]) -> int | None:
        if not args or not isinstance(args[0], pynvml.c_nvmlDevice_t):
            return None
        device = self._library.gpu_by_handle(args[0])
        return None if isinstance(device, int) else device.index

    def taken(self) -> list[tuple[float, int, str]]:
        """The calls recorded since the last ask."""
        with self._lock:
            calls, self.calls = self.calls, []
        return calls

    def most_at_once(self) -> int:
        """The most GPUs whose collections overlapped (first to last call) since the last ask."""
        spans: dict[int, list[float]] = {}
        for at, gpu, _ in self.taken():
            span = spans.setdefault(gpu, [at, at])
            span[1] = at
        edges = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
        most = current = 0
        for _, step in edges:
            current += step
            most = max(most, current)
        return most


def _samples(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


@contextmanager
def _recorded(
    scenario: Path,
    timeout: float = 60.0,
    slow_interval: float = 60,
    widen_after: float = 0.005,
) -> Iterator[tuple[_Recorder, Collection]]:
    library = sim.install(scenario)
    recorder = _Recorder(library)
    pynvml.nvmlLib = recorder
    collection = Collection(
        dict.fromkeys(REGISTRY, True),
        timeout=timeout,
        slow_interval=slow_interval,
        widen_after=widen_after,
    )
    try:
        collection.run_cycle()  # start-up: discovery and first reads
        recorder.taken()
        recorder.threads.clear()
        yield recorder, collection
    finally:
        collection.close()
        sim.uninstall()


# How long a lane may run before the rest start, in the tests that count lanes: NVML is never
# slow there, however busy the machine (the default, 5 ms, is a speed setting: see bench/).
_NEVER_WIDENS = 3600.0


def test_two_gpus_are_collected_at_once_while_nvml_answers(tmp_path: Path) -> None:
    with _recorded(_scenario(tmp_path, 8, "0.000025"), widen_after=_NEVER_WIDENS) as (
        recorder,
        collection,
    ):
        overlaps = []
        for _ in range(3):
            samples = _samples(collection.run_cycle())
            overlaps.append(recorder.most_at_once())
    # A GPU starts only once another's collection has returned.
    assert overlaps == [2, 2, 2]
    assert len(series(samples, "gpu_utilization_ratio")) == 8


def test_a_cycle_with_the_slow_reads_due_keeps_two_lanes_while_nvml_answers(
    tmp_path: Path,
) -> None:
    # Slow reads due every cycle: ~4 times a fast cycle's calls per GPU.
    scenario = _scenario(tmp_path, 8, "0.000025")
    with _recorded(scenario, slow_interval=0, widen_after=_NEVER_WIDENS) as (
        recorder,
        collection,
    ):
        overlaps = []
        for _ in range(3):
            collection.run_cycle()
            overlaps.append(recorder.most_at_once())
    assert overlaps == [2, 2, 2]


def test_all_gpus_are_collected_at_once_when_none_returns(tmp_path: Path) -> None:
    # Every GPU's first call waits until all 8 are inside NVML: a cycle that kept to two lanes
    # would never get there (the barrier breaks after 60 s and the GPUs' reads fail).
    with _recorded(_scenario(tmp_path, 8, "0")) as (recorder, collection):
        recorder.hold_first_calls(8)
        samples = _samples(collection.run_cycle())
        overlap = recorder.most_at_once()
    assert overlap == 8
    assert len(series(samples, "gpu_utilization_ratio")) == 8


def test_after_a_widened_cycle_the_same_threads_are_reused(tmp_path: Path) -> None:
    # A cycle where no GPU returns starts all 8, one thread each. Later cycles take threads
    # that are idle: never a new one (at most one thread per GPU, ever), whichever lanes run.
    with _recorded(_scenario(tmp_path, 8, "0.000025")) as (recorder, collection):
        recorder.hold_first_calls(8)
        collection.run_cycle()
        assert recorder.most_at_once() == 8, "the cycle did not widen"
        widened = set(recorder.threads) - {threading.get_ident()}
        recorder.threads.clear()
        for _ in range(5):
            collection.run_cycle()
        later = set(recorder.threads) - {threading.get_ident()}
    assert len(widened) == 8
    assert later and later <= widened, later - widened


def test_a_hung_gpu_holds_one_lane_and_the_others_are_collected_every_cycle(
    tmp_path: Path,
) -> None:
    # GPU 0's power read waits until the test lets it go; each cycle waits for it for the
    # timeout (generous for GPUs that take milliseconds), then reports it stale.
    release = threading.Event()
    with _recorded(_scenario(tmp_path, 4, "0"), timeout=2.0) as (recorder, collection):
        recorder.holds[0, "nvmlDeviceGetPowerUsage"] = release
        try:
            for _ in range(2):
                samples = _samples(collection.run_cycle())
                stale = {dict(k)["gpu"]: v for k, v in series(samples, "gpuload_gpu_stale").items()}
                assert stale == {"0": 1, "1": 0, "2": 0, "3": 0}
                utilization = series(samples, "gpu_utilization_ratio")
                assert sorted(dict(k)["gpu"] for k in utilization) == ["1", "2", "3"]
                assert value_of(samples, "gpuload_nvml_up") == 1
        finally:
            release.set()


def test_a_retry_one_interval_later_is_not_put_off_by_a_cycle_that_came_a_little_early() -> None:
    backoff = Backoff()
    backoff.failed(100.0)  # the first retry is due 1 s later, the next 2 s after that one
    assert not backoff.due(100.85)
    assert backoff.due(100.95)  # the next 1 s cycle, 50 ms early
    backoff.failed(100.95)
    assert not backoff.due(102.0) and backoff.due(102.9)


def test_gpus_not_started_within_the_timeout_are_reported_stale_not_left_out(
    tmp_path: Path,
) -> None:
    # A timeout shorter than any GPU's collection: the lanes never finish in time.
    with _recorded(_scenario(tmp_path, 8, "0"), timeout=0.001) as (_, collection):
        for _ in range(4):
            samples = _samples(collection.run_cycle())
            collected = {dict(k)["gpu"] for k in series(samples, "gpu_utilization_ratio")}
            stale = {
                dict(k)["gpu"] for k, v in series(samples, "gpuload_gpu_stale").items() if v == 1
            }
            # Each GPU is either in the snapshot or said to be stale: none is silently absent.
            assert collected | stale == {str(gpu) for gpu in range(8)}, (collected, stale)
            time.sleep(0.05)


def test_a_lost_gpu_is_retried_when_the_collection_clock_says_so_however_many_cycles_run(
    tmp_path: Path,
) -> None:
    # The clock that schedules retries is the one given (the simulated node's under
    # --simulate): cycles that come while it stands still retry nothing.
    faults = """
        faults:
          - {kind: gpu_lost, gpu: 1, at: 0}
        """
    clock = Clock(5.0)
    sim.install(_scenario(tmp_path, 2, "0", faults), clock=clock, epoch=0)
    collection = Collection(dict.fromkeys(REGISTRY, True), timeout=60, clock=clock)

    def lost_errors(cycles: int) -> float | None:
        for _ in range(cycles):
            samples = _samples(collection.run_cycle())
        return value_of(samples, "gpuload_nvml_errors_total", collector="nvml", error="gpu_is_lost")

    try:
        assert lost_errors(5) == 1
        clock.now = 6.0  # one second later: the first retry
        assert lost_errors(5) == 2
        clock.now = 7.5  # the next is two seconds after it
        assert lost_errors(3) == 2
        clock.now = 8.0
        assert lost_errors(3) == 3
    finally:
        collection.close()
        sim.uninstall()


def test_a_gpu_queued_behind_hung_lanes_is_logged_as_queued_never_with_an_empty_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Both lanes hang in GPU 0's and GPU 1's power read until the test lets them go, and the
    # cycle never widens: GPU 2 is still queued when the timeout passes.
    faults = """
        faults:
          - {kind: hang, gpu: 0, call: nvmlDeviceGetPowerUsage, seconds: 30, at: 0, until: 30}
          - {kind: hang, gpu: 1, call: nvmlDeviceGetPowerUsage, seconds: 30, at: 0, until: 30}
        """
    released = threading.Event()
    clock = Clock(5.0)
    sim.install(
        _scenario(tmp_path, 3, "0", faults),
        clock=clock,
        epoch=0,
        hang=lambda seconds: released.wait(seconds),
    )
    collection = Collection(
        dict.fromkeys(REGISTRY, True), timeout=2.0, clock=clock, widen_after=_NEVER_WIDENS
    )
    caplog.set_level(logging.WARNING, logger="exporter.collection")
    collectors = "|".join(map(re.escape, [*REGISTRY, "field values"]))
    named = re.compile(
        rf"GPU \d: (collector ({collectors}) has not returned"
        r"|collection queued, not started) within"
    )
    try:
        try:
            samples = _samples(collection.run_cycle())
            lines = [r.getMessage() for r in caplog.records if "within 2.0s" in r.getMessage()]
            assert "GPU 2: collection queued, not started within 2.0s" in lines, lines
            # Every line names the collector it waits for, or says the collection has not begun.
            assert all(named.match(line) for line in lines), lines
            stale = {dict(k)["gpu"]: v for k, v in series(samples, "gpuload_gpu_stale").items()}
            assert stale == {"0": 1, "1": 1, "2": 1}
        finally:
            clock.now = 60.0  # the hung calls return into a scenario without the fault
            released.set()
        deadline = time.monotonic() + 30  # a bound on a broken run, not a speed
        while value_of(samples, "gpu_utilization_ratio", **_labels(samples, "2")) is None:
            assert time.monotonic() < deadline, "GPU 2 never collected"
            samples = _samples(collection.run_cycle())
    finally:
        collection.close()
        sim.uninstall()


def _labels(samples: dict, gpu: str) -> dict[str, str]:
    (labels,) = (dict(k) for k in series(samples, "gpu_up") if dict(k)["gpu"] == gpu)
    return labels
