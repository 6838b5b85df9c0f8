"""The fault matrix: each fault injected into a real `gpuload serve`, watched from outside.

Every case is one daemon on 127.0.0.1, all started at once by the module fixture (so the file
takes as long as the longest case, not the sum). A watcher thread per daemon scrapes `/metrics`
every 200 ms from the start and reads the process's RSS and thread count from /proc/PID/status;
each test then checks its case's whole timeline and log:

- what the metrics show before the fault, from the first scrape that shows it until the first
  that shows it over, and after: the tests wait for each of those scrapes (the effect shows and
  clears on the daemon's own schedule, a collection cycle or a backoff later) instead of
  expecting it by a given second;
- what the log says, counted after many collection cycles: a problem is logged when it starts and
  when it ends, never once per cycle (the collect interval is 250 ms, so a per-cycle line would
  show up dozens of times);
- that scrapes keep succeeding and collection never stalls behind a fault (scrape latency is
  recorded but not asserted: this is a shared 2-core machine);
- that memory and threads stay flat (see `assert_flat` for the bounds).

Faults are scheduled in each case's scenario (written to the test's tmp folder) at seconds after
a shared epoch. The daemons must be warm (several scrapes and collection cycles seen) a few
seconds before the faults start; where starting them took longer than that on a busy machine, the
fixture starts them all again with the faults twice as late. The matrix with the log lines is in
docs/reliability.md.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from helpers import Daemon, parse_metrics, series, start_daemon, value_of

from exporter import nvml, sim
from tools.kubelet import FakeKubelet, Pod, short_socket_dir

INTERVAL = "250ms"
# Seconds after the epoch when the faults start, at the first start of the daemons (twice as
# late at each start again, see `cases`).
FAULTS_AT = 10.0
START_TRIES = 3
# Warm: this many successful scrapes showing this many collection cycles, this long before the
# faults, so that each case has a healthy stretch to compare with.
WARM_SCRAPES = 8
WARM_CYCLES = 5
WARM_LEAD = 3.0
# The late driver loads this long after the faults start.
DRIVER_LOADS_AFTER = 2.0
WATCH_EVERY = 0.2
# The longest a test waits for an effect its fault will bring: it normally comes within a cycle
# or a backoff (at most 16 s here), so reaching this deadline is a defect, not a slow machine.
EFFECT_DEADLINE = 45.0
# At every scrape the last collection is at most this old: a cycle waiting for a hung call would
# stall for the hang's 30 s. Cycles normally complete every 250 ms.
STALL_LIMIT = 10.0
# Memory may grow this much between warm-up and the end: see assert_flat.
RSS_TOLERANCE = 8 * 2**20
# Judged over at least this many scrapes where a test can wait for them.
FLAT_OBSERVATIONS = 10
# Collection's initialisation backoff: 1 s, doubling; a retry may come this early.
BACKOFF_START = 1.0
BACKOFF_SLACK = 0.1

DRIVER = 'driver: {version: "550.90.07", cuda_version: 12040}\n'
STEADY = "phases: [{duration: 1h, utilization: 0.6, memory_used: 20GiB}]\n"

# Everything optional that an L4 could lack, and the driver functions behind optional values
# (an old driver): every collector must still succeed, with those series simply absent.
LACKS_EVERYTHING = """
gpus:
  - model: l4
    count: 2
    lacks: [memory_temperature, energy, encoder, decoder, clock_event_reasons, ecc,
            pcie_throughput, pcie_counters, pcie_replay, power_fields, samples, serial,
            process_utilization, gpm, events, nvlink, row_remapping, retired_pages]
"""
DRIVER_LACKS = [
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetProcessUtilization",
    "nvmlGpmQueryDeviceSupport",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlEventSetWait_v2",
]

# Calls answered with NVML's "unavailable" all-ones value (an absurd 4000 C for temperatures).
SENTINEL_CALLS = [
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetFieldValues",  # energy (field 83) and the memory temperature among them
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
]

Samples = dict


@dataclass(frozen=True)
class Observation:
    """One scrape by the watcher, with the process's memory and threads right after it."""

    at: float  # seconds after the epoch
    samples: Samples | None  # None when the scrape failed
    seconds: float
    rss: int
    threads: int


@dataclass
class Case:
    """One daemon under one fault, and what its watcher has seen."""

    name: str
    daemon: Daemon
    epoch: float
    at: float  # when the faults start, seconds after the epoch
    gpus: int
    observations: list[Observation] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    warm_at: float = float("inf")

    def alive(self) -> None:
        assert self.daemon.process.poll() is None, f"daemon died:\n{self.daemon.log()}"

    def wait_until(self, at: float) -> None:
        """Block until the watcher has observed up to `at` seconds after the epoch."""
        deadline = time.monotonic() + max(0.0, at - self.now()) + 30
        while not self.observations or self.observations[-1].at < at:
            self.alive()
            assert time.monotonic() < deadline, "the watcher fell behind"
            time.sleep(0.05)

    def wait_for(
        self, condition: Callable[[Samples], bool], *, since: float, what: str
    ) -> Observation:
        """The first scrape from `since` on whose samples meet `condition`, waiting for it."""
        deadline = time.monotonic() + max(0.0, since - self.now()) + EFFECT_DEADLINE
        checked = 0
        while True:
            observed = self.observations[checked:]
            checked += len(observed)
            for observation in observed:
                if observation.at < since:
                    continue
                assert observation.samples is not None, f"scrape failed at {observation.at}"
                if condition(observation.samples):
                    return observation
            self.alive()
            assert time.monotonic() < deadline, f"{self.name}: no scrape showed {what}"
            time.sleep(0.05)

    def wait_observed(self, since: float, count: int) -> None:
        """Block until the watcher has made `count` observations from `since` on."""
        self.wait_until(since)
        deadline = time.monotonic() + 30
        while len(self.between(since)) < count:
            self.alive()
            assert time.monotonic() < deadline, "the watcher fell behind"
            time.sleep(0.05)

    def now(self) -> float:
        return time.time() - self.epoch

    def between(self, start: float, end: float = float("inf")) -> list[Observation]:
        return [o for o in self.observations if start <= o.at < end]

    def samples_between(self, start: float, end: float = float("inf")) -> list[Samples]:
        observed = self.between(start, end)
        assert observed, f"no observation between {start} and {end}"
        failed = [o.at for o in observed if o.samples is None]
        assert not failed, f"scrapes failed at {failed}"
        return [o.samples for o in observed if o.samples is not None]

    def count(self, text: str) -> int:
        """How many log lines contain `text`."""
        return sum(text in line for line in self.daemon.lines)

    def matching(self, pattern: str) -> list[str]:
        return [line for line in self.daemon.lines if re.search(pattern, line)]

    def problems(self) -> list[str]:
        """The warnings logged, less a collection late on a loaded machine (which is true)."""
        return [line for line in self.matching(r"WARNING exporter\.") if not _LATE.search(line)]


# A collection that did not finish within the collection timeout: the daemon says so whenever
# the machine is slow, whatever the fault under test.
_LATE = re.compile(
    r"exporter\.collection: GPU \d+: (collector \w+ has not returned|collection "
    r"(has not returned after its last collector|queued, not started)) within"
)


def _status(pid: int) -> tuple[int, int]:
    rss = threads = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def _watch(case: Case) -> None:
    session = requests.Session()
    url = case.daemon.url + "metrics"
    scrapes, cycles = 0, set()
    while not case.stop.is_set() and case.daemon.process.poll() is None:
        started = time.perf_counter()
        try:
            answer = session.get(url, timeout=10)
            samples = parse_metrics(answer.text) if answer.status_code == 200 else None
        except requests.RequestException:
            samples = None
        seconds = time.perf_counter() - started
        try:
            rss, threads = _status(case.daemon.process.pid)
        except OSError:
            return
        at = time.time() - case.epoch
        if samples is not None and case.warm_at == float("inf"):
            scrapes += 1
            cycles.add(value_of(samples, "gpuload_last_collection_timestamp_seconds"))
            if scrapes >= WARM_SCRAPES and len(cycles - {None}) >= WARM_CYCLES:
                case.warm_at = at
        case.observations.append(Observation(at, samples, seconds, rss, threads))
        case.stop.wait(WATCH_EVERY)


def _scenario(folder: Path, name: str, text: str, driver: str = DRIVER) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\n{driver}{text}")
    return str(path)


def _first_uuid(scenario: str) -> str:
    sim.install(scenario, pinned_time=0)
    nvml.init()
    try:
        return nvml.device(0).identity().uuid
    finally:
        nvml.shutdown()
        sim.uninstall()


@pytest.fixture(scope="module")
def kubelet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKubelet]:
    folder = tmp_path_factory.mktemp("kubernetes")
    scenario = _scenario(folder, "pods", "gpus: [{model: l4, count: 2}]\n" + STEADY)
    uuid = _first_uuid(scenario)
    sockets = short_socket_dir()
    server = FakeKubelet(
        sockets / "kubelet.sock", [Pod("ml", "train-0", {"main": [("nvidia.com/gpu", [uuid])]})]
    ).start()
    yield server
    server.stop()
    shutil.rmtree(sockets, ignore_errors=True)


def _scenarios(folder: Path, at: float) -> dict[str, tuple[str, int]]:
    """Each case's scenario file, with its faults at `at` seconds, and its number of GPUs."""
    loads = at + DRIVER_LOADS_AFTER
    return {
        "driver_late": (
            _scenario(
                folder,
                "driver-late",
                "gpus: [{model: l4, count: 2}]\n" + STEADY + "faults:\n"
                f"  - {{kind: driver_not_loaded, at: 0, until: {loads}}}\n",
            ),
            2,
        ),
        "driver_reload": (
            _scenario(
                folder,
                "driver-reload",
                # H100s: their GPM sample buffers must be released quietly when the driver goes.
                "gpus: [{model: h100-pcie, count: 2}]\n" + STEADY + "faults:\n"
                f"  - {{kind: driver_not_loaded, at: {at + 1}, until: {at + 5}}}\n",
            ),
            2,
        ),
        "gpu_lost": (
            _scenario(
                folder,
                "gpu-lost",
                "gpus: [{model: l4, count: 3}]\n" + STEADY + "faults:\n"
                f"  - {{kind: gpu_lost, gpu: 1, at: {at}, until: {at + 4}}}\n",
            ),
            3,
        ),
        "hang": (
            _scenario(
                folder,
                "hang",
                # Calls entering the window hang 30 s each; the window is long enough that a
                # cycle's power read lands in it however the cycles fall.
                "gpus: [{model: l4, count: 3}]\n" + STEADY + "faults:\n"
                "  - {kind: hang, gpu: 1, call: nvmlDeviceGetPowerUsage, seconds: 30,"
                f" at: {at}, until: {at + 20}}}\n",
            ),
            3,
        ),
        "not_supported": (
            _scenario(
                folder,
                "lacks-everything",
                LACKS_EVERYTHING + STEADY,
                driver=DRIVER.replace("}", f", lacks: [{', '.join(DRIVER_LACKS)}]}}"),
            ),
            2,
        ),
        "sentinel": (
            _scenario(
                folder,
                "sentinel",
                # RTX A6000s: they have a fan, whose reading gets the sentinel too.
                "gpus: [{model: rtx-a6000, count: 2}]\n"
                + STEADY
                + "faults:\n"
                + "".join(f"  - {{kind: sentinel, gpu: 0, call: {c}}}\n" for c in SENTINEL_CALLS),
            ),
            2,
        ),
        "event_thread": (
            _scenario(
                folder,
                "event-thread",
                "gpus: [{model: l4, count: 2}]\n" + STEADY + "faults:\n"
                "  - {kind: error, call: nvmlEventSetWait_v2, error: UNKNOWN,"
                f" at: {at}, until: {at + 4}}}\n"
                f"  - {{kind: xid, gpu: 1, code: 48, at: {at + 6}}}\n",
            ),
            2,
        ),
        "pod_resources": (
            _scenario(folder, "pods", "gpus: [{model: l4, count: 2}]\n" + STEADY),
            2,
        ),
    }


def _start_cases(folder: Path, kubelet: FakeKubelet, at: float) -> dict[str, Case]:
    """Start every case's daemon and its watcher, the faults `at` seconds after now."""
    scenarios = _scenarios(folder, at)
    kubernetes_config = folder / "kubernetes.yaml"
    kubernetes_config.write_text(
        "collectors:\n  kubernetes:\n"
        f"    socket: {kubelet.socket_path}\n    refresh: 250ms\n    timeout: 500ms\n"
    )
    epoch = time.time()
    common = ("--collect.interval", INTERVAL, "--sim.epoch", f"{epoch:.3f}")
    arguments: dict[str, tuple[str, ...]] = {
        # No --simulate: this machine has no NVIDIA driver, so libnvidia-ml.so.1 is missing.
        "library_missing": ("--collect.interval", INTERVAL),
        **{name: ("--simulate", path, *common) for name, (path, _) in scenarios.items()},
    }
    arguments["pod_resources"] += ("--config", str(kubernetes_config))
    gpus = {name: count for name, (_, count) in scenarios.items()}
    with ThreadPoolExecutor(len(arguments)) as pool:
        started = {
            name: pool.submit(start_daemon, *args, wait_ready=False)
            for name, args in arguments.items()
        }
        running = {
            name: Case(name, future.result(), epoch, at, gpus.get(name, 0))
            for name, future in started.items()
        }
    for case in running.values():
        threading.Thread(target=_watch, args=(case,), daemon=True).start()
    return running


def _warm_in_time(running: dict[str, Case]) -> bool:
    """Wait until every daemon is warm; False once one was not warm by WARM_LEAD before `at`."""
    while True:
        for case in running.values():
            case.alive()
        if all(case.warm_at <= case.at - WARM_LEAD for case in running.values()):
            return True
        if any(case.now() > case.at - WARM_LEAD + 1 for case in running.values()):
            return False
        time.sleep(0.05)


def _stop_cases(running: dict[str, Case]) -> None:
    for case in running.values():
        case.stop.set()
        if case.daemon.process.poll() is None:
            case.daemon.process.kill()
            case.daemon.process.wait()


@pytest.fixture(scope="module")
def cases(
    tmp_path_factory: pytest.TempPathFactory, kubelet: FakeKubelet
) -> Iterator[dict[str, Case]]:
    running: dict[str, Case] = {}
    try:
        for attempt in range(START_TRIES):
            folder = tmp_path_factory.mktemp("faults")
            running = _start_cases(folder, kubelet, FAULTS_AT * 2**attempt)
            if _warm_in_time(running):
                break
            # Starting took too long for the faults to come after a warm-up: start again.
            _stop_cases(running)
        else:
            raise AssertionError(
                f"the daemons were not warm {WARM_LEAD:g} s before their faults in "
                f"{START_TRIES} starts: "
                + ", ".join(f"{n}: {c.warm_at}" for n, c in running.items())
            )
        yield running
    finally:
        _stop_cases(running)


def most_attempts(seconds: float) -> int:
    """The most initialisations a backoff of 1, 2, 4... s allows within `seconds`.

    Without backoff a failing initialisation would be tried every 250 ms cycle, four a second.
    """
    attempts, waited, delay = 1, 0.0, BACKOFF_START
    while waited + delay - BACKOFF_SLACK <= seconds:
        waited += delay - BACKOFF_SLACK
        attempts += 1
        delay *= 2
    return attempts


def assert_flat(
    case: Case, since: float, until: float = float("inf"), *, extra_threads: int = 0
) -> None:
    """Memory and threads from `since` (after warm-up) to `until` stay where they were at first.

    RSS: up to RSS_TOLERANCE (8 MiB) of growth. A small node's snapshot is ~50-150 kB, so a leak
    of one snapshot, or one thread stack, per 250 ms cycle would exceed it within the ~40-60
    cycles watched; what legitimately grows is bounded and grows no faster on a slow machine: the
    local alert history fills towards its cap (POINTS per series), and CPython keeps freed arenas.

    Threads: never more, at any observation, than at the first plus what the design allows to
    come later: each GPU's collection worker (a worker starts only when the others are busy, so
    a slow cycle may start one after warm-up), one forwarded request being served while /proc is
    read, and `extra_threads` (a fault that by design holds one). A thread per cycle that piles
    up (a stuck call resubmitted, an event thread never joined) exceeds it within a few cycles.
    """
    since = max(since, case.warm_at)
    if until == float("inf"):
        case.wait_observed(since, FLAT_OBSERVATIONS)
    observed = case.between(since, until)
    assert len(observed) >= 2, "too few observations to judge"
    baseline = observed[0]
    grown = observed[-1].rss - baseline.rss
    most = max(o.threads for o in observed)
    latencies = sorted(o.seconds for o in observed)
    # Shown with `pytest -s`: the figures of docs/reliability.md.
    print(
        f"{case.name}: RSS {baseline.rss / 2**20:.1f} -> "
        f"{observed[-1].rss / 2**20:.1f} MiB, threads {baseline.threads} -> "
        f"{observed[-1].threads} (max {most}), scrape median "
        f"{latencies[len(latencies) // 2] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )
    assert grown <= RSS_TOLERANCE, f"RSS grew {grown / 2**20:.1f} MiB after warm-up"
    allowed = baseline.threads + case.gpus + 1 + extra_threads
    assert most <= allowed, f"threads went from {baseline.threads} to {most} (at most {allowed})"


def assert_collecting(case: Case, start: float, end: float = float("inf")) -> None:
    """Every scrape succeeded, and showed a collection newer than STALL_LIMIT, never older."""
    stamps = []
    for observation in case.between(start, end):
        assert observation.samples is not None, f"scrape failed at {observation.at}"
        stamp = value_of(observation.samples, "gpuload_last_collection_timestamp_seconds")
        assert stamp is not None, f"no collection timestamp at {observation.at}"
        age = observation.at - (stamp - case.epoch)
        assert age <= STALL_LIMIT, (
            f"at {observation.at:.1f} s the last collection was {age:.1f} s old"
        )
        stamps.append(stamp)
    assert stamps, f"no observation between {start} and {end}"
    assert stamps == sorted(stamps), "the last-collection timestamp went back"
    assert stamps[-1] > stamps[0], "no collection during the window"


def gpu(samples: Samples, index: int) -> dict[str, str]:
    """The gpu/uuid labels of GPU `index` (from gpu_info, which a lost GPU keeps)."""
    for labels in series(samples, "gpu_info"):
        if dict(labels)["gpu"] == str(index):
            return {"gpu": str(index), "uuid": dict(labels)["uuid"]}
    raise AssertionError(f"GPU {index} has no gpu_info")


def stale(samples: Samples, index: int) -> float | None:
    """1 while GPU `index`'s collection has not returned within the collection timeout."""
    return value_of(samples, "gpuload_gpu_stale", **gpu(samples, index))


def reads_or_late(samples: Samples, index: int, utilization: float) -> bool:
    """GPU `index` shows `utilization`, or is stale: its cycle was late on a busy machine."""
    shown = value_of(samples, "gpu_utilization_ratio", **gpu(samples, index))
    return shown == utilization or stale(samples, index) == 1


def collectors_succeed_or_late(samples: Samples, gpus: int) -> bool:
    """Every collector succeeded, or a GPU is stale: the collector its cycle is late in is 0."""
    if all(value == 1 for value in series(samples, "gpuload_collector_success").values()):
        return True
    return any(stale(samples, index) == 1 for index in range(gpus))


def _nvml_up(samples: Samples) -> float | None:
    return value_of(samples, "gpuload_nvml_up")


def _init_errors(samples: Samples, error: str) -> float:
    return value_of(samples, "gpuload_nvml_errors_total", collector="nvml", error=error) or 0


def test_library_missing_keeps_serving_and_says_once_what_to_install(cases) -> None:
    case = cases["library_missing"]
    # Retried with backoff (1, 2, 4, 8 s...), counted each time: the fourth ~7 s after the first.
    case.wait_for(
        lambda s: _init_errors(s, "library_not_found") >= 4, since=0, what="a fourth attempt"
    )
    for observation in case.between(0):
        samples = observation.samples
        assert samples is not None, f"scrape failed at {observation.at}"
        assert _nvml_up(samples) == 0
        assert series(samples, "gpu_up") == {}
        # ...and not more often: the daemon started after the epoch.
        assert _init_errors(samples, "library_not_found") <= most_attempts(observation.at)
    # ...and said once, with what to do.
    assert case.count("libnvidia-ml.so.1 not found") == 1
    assert case.count("install the NVIDIA driver") == 1
    assert case.count("Traceback") == 0
    assert_collecting(case, case.warm_at)
    assert_flat(case, case.warm_at)


def test_init_failing_until_the_driver_loads_then_metrics_appear(cases) -> None:
    case = cases["driver_late"]
    loads = case.at + DRIVER_LOADS_AFTER

    def up(samples: Samples) -> bool:
        return _nvml_up(samples) == 1 and len(series(samples, "gpu_utilization_ratio")) == 2

    # Initialisation is retried with backoff (1, 2, 4, 8 s): up at the first retry after loading.
    first_up = case.wait_for(up, since=0, what="the GPUs once the driver loads")
    assert first_up.at >= loads, "initialised before the driver loaded"
    down = case.samples_between(0, loads)
    for samples in down:
        assert _nvml_up(samples) == 0
        assert series(samples, "gpu_up") == {}
    # Warm (several cycles, a second or more of them) WARM_LEAD before the faults, so retried by
    # the time the driver loads; every attempt counted, none more often than the backoff allows.
    assert _init_errors(down[-1], "driver_not_loaded") >= 2
    for observation in case.between(0, first_up.at):
        assert observation.samples is not None
        assert _init_errors(observation.samples, "driver_not_loaded") <= most_attempts(
            observation.at
        )
    case.wait_until(first_up.at + 3)
    for samples in case.samples_between(first_up.at):
        assert up(samples)
    assert case.count("NVML initialisation failed: Driver Not Loaded") == 1, case.daemon.log()
    assert case.count("NVML initialised: 2 GPUs") == 1
    assert case.count("Traceback") == 0
    assert_collecting(case, case.warm_at)
    # Flat while retrying, and flat again once the GPUs' workers exist.
    assert_flat(case, case.warm_at, loads)
    assert_flat(case, first_up.at + 1)


def test_driver_reload_mid_run_is_initialised_again_and_logged_once(cases) -> None:
    case = cases["driver_reload"]
    gone, back = case.at + 1, case.at + 5
    down = case.wait_for(lambda s: _nvml_up(s) == 0, since=gone, what="NVML down")
    up = case.wait_for(lambda s: _nvml_up(s) == 1, since=down.at, what="NVML up again")
    assert up.at >= back, "initialised again while the driver was gone"
    assert all(_nvml_up(s) == 1 for s in case.samples_between(case.warm_at, gone))
    during = case.samples_between(down.at, up.at)
    assert all(_nvml_up(s) == 0 for s in during)
    assert all(series(s, "gpu_utilization_ratio") == {} for s in during)
    # Nothing is known of any GPU without NVML: not up (frozen from before), not lost.
    for name in ("gpu_up", "gpu_info", "gpuload_gpu_stale"):
        assert all(series(s, name) == {} for s in during), name
    # The failed initialisations are counted, one per backoff attempt (not one per cycle).
    attempts = _init_errors(during[-1], "driver_not_loaded")
    assert 1 <= attempts <= most_attempts(up.at - gone)
    case.wait_until(up.at + 3)
    for samples in case.samples_between(up.at):
        assert _nvml_up(samples) == 1
        assert len(series(samples, "gpu_utilization_ratio")) == 2
        assert all(v == 1 for v in series(samples, "gpu_up").values())
    # Logged when it started and when it ended, not per cycle or per retry.
    assert case.count("NVML needs to be initialised again") == 1, case.daemon.log()
    assert case.count("NVML initialisation failed: Driver Not Loaded") == 1
    assert case.count("NVML initialised: 2 GPUs") == 1
    # The GPM buffers went with the driver: releasing them is not a warning with a traceback.
    assert case.count("releasing its resources failed") == 0
    assert case.count("Traceback") == 0
    assert_collecting(case, case.warm_at)
    assert_flat(case, case.warm_at)


def test_lost_gpu_reports_up_0_keeps_the_others_and_comes_back(cases) -> None:
    case = cases["gpu_lost"]
    at, over = case.at, case.at + 4

    def gpu1_up(samples: Samples) -> float | None:
        return value_of(samples, "gpu_up", **gpu(samples, 1))

    lost = case.wait_for(lambda s: gpu1_up(s) == 0, since=at, what="GPU 1 lost")
    # Re-acquired with backoff (1, 2, 4 s after the loss) once the GPU is back.
    back = case.wait_for(lambda s: gpu1_up(s) == 1, since=lost.at, what="GPU 1 back")
    assert back.at >= over, "GPU 1 reported up while it was lost"
    assert all(gpu1_up(s) == 1 for s in case.samples_between(case.warm_at, at))
    for samples in case.samples_between(lost.at, back.at):
        lost_gpu = gpu(samples, 1)  # identity kept while lost
        assert value_of(samples, "gpu_up", **lost_gpu) == 0
        assert value_of(samples, "gpu_utilization_ratio", **lost_gpu) is None
        for healthy in (0, 2):
            assert reads_or_late(samples, healthy, 0.6)
        # Losing a GPU is gpu_up's news, not a collector failure.
        assert collectors_succeed_or_late(samples, case.gpus)
    case.wait_until(back.at + 3)
    for samples in case.samples_between(back.at):
        assert value_of(samples, "gpu_up", **gpu(samples, 1)) == 1
        assert reads_or_late(samples, 1, 0.6)
    assert len(case.matching(r"GPU 1 \(GPU-\S+\) lost: GPU is lost")) == 1
    assert case.count("GPU 1 cannot be reached") <= 1
    assert len(case.matching(r"GPU 1 \(GPU-\S+\) is reporting")) == 1
    assert_collecting(case, case.warm_at)
    assert_flat(case, case.warm_at)


def test_hung_call_marks_one_gpu_stale_while_the_others_and_scrapes_go_on(cases) -> None:
    case = cases["hang"]
    # The hung call lasts 30 s: stale from the first cycle that meets it to the end of the watch.
    watched = case.at + 15

    def utilization(samples: Samples, index: int) -> float | None:
        return value_of(samples, "gpu_utilization_ratio", **gpu(samples, index))

    stuck = case.wait_for(lambda s: stale(s, 1) == 1, since=case.at, what="GPU 1 stale")
    case.wait_until(watched)
    # Before the hang GPU 1 shows its reading, or is stale only in a cycle late on a busy machine.
    for samples in case.samples_between(case.warm_at, case.at):
        assert reads_or_late(samples, 1, 0.6)
    stuck_samples = case.samples_between(stuck.at, watched)
    for samples in stuck_samples:
        assert stale(samples, 1) == 1
        assert utilization(samples, 1) is None
        for healthy in (0, 2):
            assert reads_or_late(samples, healthy, 0.6)
    # The hang does not spread: the other GPUs are read fresh through it.
    for healthy in (0, 2):
        assert any(
            stale(samples, healthy) == 0 and utilization(samples, healthy) == 0.6
            for samples in stuck_samples
        ), f"GPU {healthy} never read fresh during GPU 1's hang"
    # The other GPUs are collected every interval: the timestamp advances throughout the hang.
    assert_collecting(case, case.warm_at, watched)
    latencies = sorted(o.seconds for o in case.between(stuck.at, watched))
    print(f"scrape latency during the hang: median {latencies[len(latencies) // 2] * 1000:.1f} ms")
    # Said once, not once per cycle that the GPU stays stuck (dozens of cycles here); a cycle
    # late before the hang on a busy machine is its own episode, said when it starts and ends.
    assert case.count("GPU 1: collector power has not returned within") >= 1
    late = case.matching(r"GPU 1: (collector \w+ has not|collection (queued|has not))")
    assert len(late) - case.count("GPU 1: collection returned") in (0, 1)
    # At most one worker per GPU however long the call hangs: the stuck one is not resubmitted.
    assert_flat(case, case.warm_at, watched)


def test_every_optional_call_not_supported_is_absence_not_failure(cases) -> None:
    case = cases["not_supported"]
    case.wait_until(case.at)
    for samples in case.samples_between(case.warm_at):
        assert collectors_succeed_or_late(samples, case.gpus)
        assert series(samples, "gpuload_nvml_errors_total") == {}
        assert series(samples, "gpuload_collector_exceptions_total") == {}
        for absent in (
            "gpu_energy_consumption_joules_total",
            "gpu_encoder_utilization_ratio",
            "gpu_clock_event_active",
            "gpu_ecc_errors_total",
            "gpu_pcie_transmit_bytes_total",
            "gpu_pcie_replay_errors_total",
            "gpu_xid_errors_total",
            "gpu_sm_active_ratio",
            "gpu_remapped_rows",
            "gpu_memory_reserved_bytes",
        ):
            assert series(samples, absent) == {}, absent
        # What the oldest path still answers is there, for each GPU not late on a busy machine.
        late = sum(stale(samples, index) == 1 for index in (0, 1))
        assert len(series(samples, "gpu_utilization_ratio")) + late == 2
        assert len(series(samples, "gpu_memory_used_bytes")) + late == 2
        assert len(series(samples, "gpu_temperature_celsius")) + late == 2
    # Not supported is a normal answer: nothing to warn about.
    assert case.problems() == []
    assert_collecting(case, case.warm_at)
    assert_flat(case, case.warm_at)


def test_sentinel_and_absurd_values_never_become_samples(cases) -> None:
    case = cases["sentinel"]

    def invalid(samples: Samples) -> float:
        errors = {"collector": "temperature", "error": "invalid_value"}
        return value_of(samples, "gpuload_nvml_errors_total", **errors) or 0

    # The absurd temperature is counted as an invalid value, every cycle.
    first = case.samples_between(case.warm_at)[0]
    assert invalid(first) > 0
    case.wait_for(lambda s: invalid(s) > invalid(first), since=case.warm_at, what="more invalid")
    case.wait_until(case.at)
    absurd = {4000.0, 2**32 - 1, (2**32 - 1) / 1000, (2**32 - 1) * 1e6, (2**32 - 1) / 100}
    observed = case.samples_between(case.warm_at)
    for samples in observed:
        assert not [key for key, value in samples.items() if value in absurd]
        sick, well = gpu(samples, 0), gpu(samples, 1)
        for family, labels in (
            ("gpu_temperature_celsius", {"sensor": "gpu"}),
            ("gpu_power_usage_watts", {}),
            ("gpu_clock_hertz", {"clock": "sm"}),
            ("gpu_energy_consumption_joules_total", {}),
            ("gpu_fan_speed_ratio", {}),
        ):
            assert value_of(samples, family, **sick, **labels) is None, family
            # The healthy GPU's reading is there, unless its cycle was late on a busy machine.
            read = value_of(samples, family, **well, **labels)
            assert read is not None or stale(samples, 1) == 1, family
    # Logged once: the collector and the dropped reading named.
    assert case.count("collector temperature on GPU 0: implausible values dropped") == 1
    assert case.count("temperature.gpu=4000") == 1
    assert len(case.problems()) == len(
        {
            dict(labels)["collector"]
            for labels in series(observed[-1], "gpuload_nvml_errors_total")
            if dict(labels)["error"] == "invalid_value"
        }
    )
    assert_collecting(case, case.warm_at)
    assert_flat(case, case.warm_at)


def test_event_thread_failure_is_reported_and_the_thread_restarted(cases) -> None:
    case = cases["event_thread"]
    at, errors_end = case.at, case.at + 4

    def xid_success(samples: Samples) -> float | None:
        return value_of(samples, "gpuload_collector_success", collector="xid")

    def xid_48(samples: Samples) -> float | None:
        return value_of(samples, "gpu_xid_errors_total", **gpu(samples, 1), xid="48")

    assert all(xid_success(s) == 1 for s in case.samples_between(case.warm_at, at))
    case.wait_for(lambda s: xid_success(s) == 0, since=at, what="the xid collector failing")
    # Restarted once the error stops: the XID 2 s after the window is counted, by the thread
    # that no error ends any more, so every scrape from then on shows the collector well.
    counted = case.wait_for(lambda s: xid_48(s) == 1, since=errors_end, what="XID 48 counted")
    assert counted.samples is not None
    # A new event thread per failed cycle, each failure counted: the window lasts ~16 cycles.
    failures = value_of(
        counted.samples, "gpuload_nvml_errors_total", collector="xid", error="unknown"
    )
    assert failures is not None and failures >= 2
    case.wait_until(counted.at + 2)
    for samples in case.samples_between(counted.at):
        assert xid_success(samples) == 1
        assert xid_48(samples) == 1
        assert value_of(samples, "gpu_last_xid_code", **gpu(samples, 1)) == 48
    # Other collectors never noticed.
    assert all(
        value_of(s, "gpuload_collector_success", collector="power") == 1
        for s in case.samples_between(case.warm_at)
    )
    assert case.count("collector xid on node: NVML error unknown") == 1
    assert case.count("collector xid on node: recovered") == 1
    assert case.count("GPU 1 reported XID 48") == 1
    # A new event thread per failed cycle, each gone before the next: no pile-up.
    assert_flat(case, case.warm_at)
    assert_collecting(case, case.warm_at)


def test_pod_resources_socket_disappearing_reports_0_once_and_gpus_go_on(
    cases, kubelet: FakeKubelet
) -> None:
    case = cases["pod_resources"]

    def kubelet_up(samples: Samples) -> float | None:
        return value_of(samples, "gpuload_kubernetes_pod_resources_up")

    case.wait_for(
        lambda s: kubelet_up(s) == 1 and len(series(s, "gpu_pod_info")) == 1,
        since=0,
        what="the pod's labels",
    )
    # The socket goes first (as when the kubelet restarts), then the kubelet itself.
    kubelet.socket_path.unlink()
    gone = case.now()
    # Within a refresh (250 ms) or two the exporter says the kubelet is gone...
    down = case.wait_for(lambda s: kubelet_up(s) == 0, since=gone, what="the kubelet gone")
    kubelet.stop()
    # ...and drops the pod labels once the last answer is three refreshes old.
    dropped = case.wait_for(
        lambda s: series(s, "gpu_pod_info") == {}, since=down.at, what="the pod labels dropped"
    )
    case.wait_until(dropped.at + 2)
    for samples in case.samples_between(down.at):
        assert kubelet_up(samples) == 0
        late = sum(stale(samples, index) == 1 for index in (0, 1))
        assert len(series(samples, "gpu_utilization_ratio")) + late == 2
    assert all(series(s, "gpu_pod_info") == {} for s in case.samples_between(dropped.at))
    # Reported once when it went; a slow answer before it (a loaded machine) is reported too,
    # and resolved when the kubelet answered again, or said again as gone when it did not (a
    # problem's changed message is said anew): never once per refresh.
    reports = case.count("collector kubernetes: the kubelet's pod-resources socket")
    assert reports - case.count("collector kubernetes: the kubelet answers again") in (1, 2)
    assert case.count("its socket is gone; GPUs keep reporting") == 1
    assert case.count("Traceback") == 0
    assert_collecting(case, case.warm_at)
    assert_flat(case, case.warm_at)
