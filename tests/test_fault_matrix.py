"""The fault matrix: each fault injected into a real `gpuload serve`, watched from outside.

Every case is one daemon on 127.0.0.1, all started at once by the module fixture (so the file
takes as long as the longest case, ~25 s, not the sum). A watcher thread per daemon scrapes
`/metrics` every 200 ms from the start and reads the process's RSS and thread count from
/proc/PID/status; each test then checks its case's whole timeline and log:

- what the metrics show while the fault lasts and after it;
- what the log says, counted after many collection cycles: a problem is logged when it starts and
  when it ends, never once per cycle (the collect interval is 250 ms, so a per-cycle line would
  show up dozens of times);
- that scrapes keep succeeding and `gpuload_last_collection_timestamp_seconds` keeps advancing
  (scrape latency is recorded but not asserted: this is a shared 2-core machine);
- that memory and threads stay flat (see `assert_flat` for the tolerances).

Faults are scheduled in each case's scenario (written to the test's tmp folder) at seconds after
a shared epoch; `FAULTS_AT` leaves room for eight daemons to start on a busy machine. The matrix
with the log lines is in docs/reliability.md.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from helpers import Daemon, parse_metrics, series, start_daemon, value_of
from kubelet_helpers import FakeKubelet, Pod, short_socket_dir

from exporter import nvml, sim

INTERVAL = "250ms"
# Seconds after the epoch when the faults start: every daemon is up and warm by then.
FAULTS_AT = 10.0
# The late driver loads then: after every daemon has started (startup takes up to ~7 s here).
DRIVER_LOADS_AT = 12.0
WATCH_EVERY = 0.2
# Memory may grow this much between warm-up and the end: see assert_flat.
RSS_TOLERANCE = 8 * 2**20
# Threads may differ by this much: one HTTP request thread may be finishing when /proc is read.
THREAD_TOLERANCE = 1

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
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
]


@dataclass(frozen=True)
class Observation:
    """One scrape by the watcher, with the process's memory and threads right after it."""

    at: float  # seconds after the epoch
    samples: dict | None  # None when the scrape failed
    seconds: float
    rss: int
    threads: int


@dataclass
class Case:
    """One daemon under one fault, and what its watcher has seen."""

    name: str
    daemon: Daemon
    epoch: float
    observations: list[Observation] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def wait_until(self, at: float) -> None:
        """Block until the watcher has observed up to `at` seconds after the epoch."""
        deadline = time.monotonic() + at + 30
        while not self.observations or self.observations[-1].at < at:
            assert self.daemon.process.poll() is None, f"daemon died:\n{self.daemon.log()}"
            assert time.monotonic() < deadline, "the watcher fell behind"
            time.sleep(0.05)

    def between(self, start: float, end: float = float("inf")) -> list[Observation]:
        return [o for o in self.observations if start <= o.at < end]

    def samples_between(self, start: float, end: float = float("inf")) -> list[dict]:
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
    while not case.stop.is_set() and case.daemon.process.poll() is None:
        started = time.perf_counter()
        try:
            answer = session.get(url, timeout=5)
            samples = parse_metrics(answer.text) if answer.status_code == 200 else None
        except requests.RequestException:
            samples = None
        seconds = time.perf_counter() - started
        try:
            rss, threads = _status(case.daemon.process.pid)
        except OSError:
            return
        case.observations.append(
            Observation(time.time() - case.epoch, samples, seconds, rss, threads)
        )
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


@pytest.fixture(scope="module")
def cases(
    tmp_path_factory: pytest.TempPathFactory, kubelet: FakeKubelet
) -> Iterator[dict[str, Case]]:
    folder = tmp_path_factory.mktemp("faults")
    at = FAULTS_AT
    scenarios = {
        "driver_late": _scenario(
            folder,
            "driver-late",
            "gpus: [{model: l4, count: 2}]\n" + STEADY + "faults:\n"
            f"  - {{kind: driver_not_loaded, at: 0, until: {DRIVER_LOADS_AT}}}\n",
        ),
        "driver_reload": _scenario(
            folder,
            "driver-reload",
            # H100s: their GPM sample buffers must be released quietly when the driver goes.
            "gpus: [{model: h100-pcie, count: 2}]\n" + STEADY + "faults:\n"
            f"  - {{kind: driver_not_loaded, at: {at + 1}, until: {at + 3}}}\n",
        ),
        "gpu_lost": _scenario(
            folder,
            "gpu-lost",
            "gpus: [{model: l4, count: 3}]\n" + STEADY + "faults:\n"
            f"  - {{kind: gpu_lost, gpu: 1, at: {at}, until: {at + 3}}}\n",
        ),
        "hang": _scenario(
            folder,
            "hang",
            "gpus: [{model: l4, count: 3}]\n" + STEADY + "faults:\n"
            "  - {kind: hang, gpu: 1, call: nvmlDeviceGetPowerUsage, seconds: 30,"
            f" at: {at}, until: {at + 0.5}}}\n",
        ),
        "not_supported": _scenario(
            folder,
            "lacks-everything",
            LACKS_EVERYTHING + STEADY,
            driver=DRIVER.replace("}", f", lacks: [{', '.join(DRIVER_LACKS)}]}}"),
        ),
        "sentinel": _scenario(
            folder,
            "sentinel",
            # RTX A6000s: they have a fan, whose reading gets the sentinel too.
            "gpus: [{model: rtx-a6000, count: 2}]\n"
            + STEADY
            + "faults:\n"
            + "".join(f"  - {{kind: sentinel, gpu: 0, call: {c}}}\n" for c in SENTINEL_CALLS),
        ),
        "event_thread": _scenario(
            folder,
            "event-thread",
            "gpus: [{model: l4, count: 2}]\n" + STEADY + "faults:\n"
            "  - {kind: error, call: nvmlEventSetWait_v2, error: UNKNOWN,"
            f" at: {at}, until: {at + 2}}}\n"
            f"  - {{kind: xid, gpu: 1, code: 48, at: {at + 4}}}\n",
        ),
        "pod_resources": _scenario(folder, "pods", "gpus: [{model: l4, count: 2}]\n" + STEADY),
    }
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
        **{name: ("--simulate", path, *common) for name, path in scenarios.items()},
    }
    arguments["pod_resources"] += ("--config", str(kubernetes_config))
    with ThreadPoolExecutor(len(arguments)) as pool:
        started = {
            name: pool.submit(start_daemon, *args, wait_ready=False)
            for name, args in arguments.items()
        }
        running = {name: Case(name, future.result(), epoch) for name, future in started.items()}
    watchers = [
        threading.Thread(target=_watch, args=(case,), daemon=True) for case in running.values()
    ]
    for watcher in watchers:
        watcher.start()
    yield running
    for case in running.values():
        case.stop.set()
        if case.daemon.process.poll() is None:
            case.daemon.process.kill()
            case.daemon.process.wait()
    for watcher in watchers:
        watcher.join(timeout=5)


def assert_flat(
    case: Case, since: float, until: float = float("inf"), *, extra_threads: int = 0
) -> None:
    """Memory and threads after `since` (warm-up done) stay where they were at `since`.

    RSS: up to RSS_TOLERANCE (8 MiB) of growth. A small node's snapshot is ~50-150 kB, so a leak
    of one snapshot, or one thread stack, per 250 ms cycle would exceed it within the ~40-60
    cycles watched; what legitimately grows is bounded: the local alert history fills towards its
    cap (POINTS per series), and CPython keeps freed arenas. Threads: never more than at warm-up
    plus `extra_threads` (a fault that by design holds one, e.g. a worker stuck in a hung call)
    plus THREAD_TOLERANCE, at every observation, not only at the end: a pile-up would show.
    """
    observed = case.between(since, until)
    assert len(observed) >= 10, "too few observations to judge"
    baseline = observed[0]
    grown = observed[-1].rss - baseline.rss
    assert grown <= RSS_TOLERANCE, f"RSS grew {grown / 2**20:.1f} MiB after warm-up"
    most = max(o.threads for o in observed)
    latencies = sorted(o.seconds for o in observed)
    # Shown with `pytest -s`: the figures of docs/reliability.md.
    print(
        f"{case.name}: RSS {baseline.rss / 2**20:.1f} -> "
        f"{observed[-1].rss / 2**20:.1f} MiB, threads {baseline.threads} -> "
        f"{observed[-1].threads} (max {most}), scrape median "
        f"{latencies[len(latencies) // 2] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )
    assert most <= baseline.threads + extra_threads + THREAD_TOLERANCE, (
        f"threads went from {baseline.threads} to {most}"
    )


def assert_collecting(case: Case, start: float, end: float = float("inf")) -> None:
    """Every scrape succeeded and the last-collection timestamp kept advancing."""
    stamps = [
        value_of(samples, "gpuload_last_collection_timestamp_seconds")
        for samples in case.samples_between(start, end)
    ]
    assert all(stamp is not None for stamp in stamps)
    distinct = sorted(set(stamps))
    assert stamps == sorted(stamps), "the last-collection timestamp went back"
    # At 250 ms per cycle, one new collection per ~second at the very least.
    assert len(distinct) >= (min(end, case.observations[-1].at) - start) / 1.0


def gpu(samples: dict, index: int) -> dict[str, str]:
    """The gpu/uuid labels of GPU `index` (from gpu_info, which a lost GPU keeps)."""
    for labels in series(samples, "gpu_info"):
        if dict(labels)["gpu"] == str(index):
            return {"gpu": str(index), "uuid": dict(labels)["uuid"]}
    raise AssertionError(f"GPU {index} has no gpu_info")


def test_library_missing_keeps_serving_and_says_once_what_to_install(cases) -> None:
    case = cases["library_missing"]
    case.wait_until(FAULTS_AT + 6)
    for samples in case.samples_between(0):
        assert value_of(samples, "gpuload_nvml_up") == 0
        assert series(samples, "gpu_up") == {}
    last = case.samples_between(FAULTS_AT + 5)[-1]
    # Retried with backoff (1, 2, 4, 8 s...), counted each time...
    attempts = value_of(
        last, "gpuload_nvml_errors_total", collector="nvml", error="library_not_found"
    )
    assert attempts is not None and attempts >= 4
    # ...and said once, with what to do.
    assert case.count("libnvidia-ml.so.1 not found") == 1
    assert case.count("install the NVIDIA driver") == 1
    assert case.count("Traceback") == 0
    assert_collecting(case, 2.0)
    assert_flat(case, FAULTS_AT - 2)


def test_init_failing_until_the_driver_loads_then_metrics_appear(cases) -> None:
    case = cases["driver_late"]
    # Initialisation is retried with backoff (1, 2, 4, 8 s): up within 8 s of the driver.
    case.wait_until(DRIVER_LOADS_AT + 12)
    down = case.samples_between(0, DRIVER_LOADS_AT)
    for samples in down:
        assert value_of(samples, "gpuload_nvml_up") == 0
        assert series(samples, "gpu_up") == {}
    attempts = value_of(
        down[-1], "gpuload_nvml_errors_total", collector="nvml", error="driver_not_loaded"
    )
    assert attempts is not None and attempts >= 2
    for samples in case.samples_between(DRIVER_LOADS_AT + 9):
        assert value_of(samples, "gpuload_nvml_up") == 1
        assert len(series(samples, "gpu_utilization_ratio")) == 2
    assert case.count("NVML initialisation failed: Driver Not Loaded") == 1, case.daemon.log()
    assert case.count("NVML initialised: 2 GPUs") == 1
    assert case.count("Traceback") == 0
    assert_collecting(case, 2.0)
    # Flat while retrying, and flat again once the GPUs' workers exist.
    assert_flat(case, 4.0, DRIVER_LOADS_AT)
    up = next(o.at for o in case.observations if o.samples and series(o.samples, "gpu_up"))
    assert_flat(case, up + 1)


def test_driver_reload_mid_run_is_initialised_again_and_logged_once(cases) -> None:
    case = cases["driver_reload"]
    case.wait_until(FAULTS_AT + 10)
    at = FAULTS_AT
    before = case.samples_between(at - 2, at + 1)
    assert all(value_of(s, "gpuload_nvml_up") == 1 for s in before)
    during = case.samples_between(at + 1.5, at + 3)
    assert all(value_of(s, "gpuload_nvml_up") == 0 for s in during)
    assert all(series(s, "gpu_utilization_ratio") == {} for s in during)
    # The failed initialisations are counted, one per backoff attempt.
    attempts = value_of(
        during[-1], "gpuload_nvml_errors_total", collector="nvml", error="driver_not_loaded"
    )
    assert attempts is not None and attempts >= 2
    for samples in case.samples_between(at + 8):
        assert value_of(samples, "gpuload_nvml_up") == 1
        assert len(series(samples, "gpu_utilization_ratio")) == 2
        assert all(v == 1 for v in series(samples, "gpu_up").values())
    # Logged when it started and when it ended, not per cycle or per retry.
    assert case.count("NVML needs to be initialised again") == 1, case.daemon.log()
    assert case.count("NVML initialisation failed: Driver Not Loaded") == 1
    assert case.count("NVML initialised: 2 GPUs") == 1
    # The GPM buffers went with the driver: releasing them is not a warning with a traceback.
    assert case.count("releasing its resources failed") == 0
    assert case.count("Traceback") == 0
    assert_collecting(case, at - 2)
    assert_flat(case, at - 2)


def test_lost_gpu_reports_up_0_keeps_the_others_and_comes_back(cases) -> None:
    case = cases["gpu_lost"]
    case.wait_until(FAULTS_AT + 9)
    at = FAULTS_AT
    during = case.samples_between(at + 0.7, at + 3)
    for samples in during:
        lost = gpu(samples, 1)  # identity kept while lost
        assert value_of(samples, "gpu_up", **lost) == 0
        assert value_of(samples, "gpu_utilization_ratio", **lost) is None
        for healthy in (0, 2):
            assert value_of(samples, "gpu_utilization_ratio", **gpu(samples, healthy)) == 0.6
        # Losing a GPU is gpu_up's news, not a collector failure.
        assert all(v == 1 for v in series(samples, "gpuload_collector_success").values())
    # Re-acquired with backoff (1, 2, 4 s after the loss) once the GPU is back.
    back = case.samples_between(at + 8)
    assert all(value_of(s, "gpu_up", **gpu(s, 1)) == 1 for s in back)
    assert all(value_of(s, "gpu_utilization_ratio", **gpu(s, 1)) == 0.6 for s in back)
    assert len(case.matching(r"GPU 1 \(GPU-\S+\) lost: GPU is lost")) == 1
    assert case.count("GPU 1 cannot be reached") <= 1
    assert len(case.matching(r"GPU 1 \(GPU-\S+\) is reporting")) == 1
    assert_collecting(case, at - 2)
    assert_flat(case, at - 2)


def test_hung_call_marks_one_gpu_stale_while_the_others_and_scrapes_go_on(cases) -> None:
    case = cases["hang"]
    case.wait_until(FAULTS_AT + 10)
    at = FAULTS_AT
    stuck = case.samples_between(at + 1, at + 10)
    for samples in stuck:
        assert value_of(samples, "gpuload_gpu_stale", **gpu(samples, 1)) == 1
        assert value_of(samples, "gpu_utilization_ratio", **gpu(samples, 1)) is None
        for healthy in (0, 2):
            assert value_of(samples, "gpuload_gpu_stale", **gpu(samples, healthy)) == 0
            assert value_of(samples, "gpu_utilization_ratio", **gpu(samples, healthy)) == 0.6
    # The other GPUs are collected every interval: the timestamp advances throughout the hang.
    assert_collecting(case, at + 1, at + 10)
    latencies = sorted(o.seconds for o in case.between(at + 1, at + 10))
    print(f"scrape latency during the hang: median {latencies[len(latencies) // 2] * 1000:.1f} ms")
    # Said once, not once per cycle that the GPU stays stuck (~36 cycles here).
    assert case.count("GPU 1: collector power has not returned within") == 1
    # At most one worker per GPU however long the call hangs: the stuck one is not resubmitted.
    assert_flat(case, at - 2, extra_threads=0)


def test_every_optional_call_not_supported_is_absence_not_failure(cases) -> None:
    case = cases["not_supported"]
    case.wait_until(FAULTS_AT + 4)
    for samples in case.samples_between(3.0):
        assert all(v == 1 for v in series(samples, "gpuload_collector_success").values())
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
        # What the oldest path still answers is there.
        assert len(series(samples, "gpu_utilization_ratio")) == 2
        assert len(series(samples, "gpu_memory_used_bytes")) == 2
        assert len(series(samples, "gpu_temperature_celsius")) == 2
    # Not supported is a normal answer: nothing to warn about.
    assert case.matching(r"WARNING exporter\.") == []
    assert_collecting(case, 3.0)
    assert_flat(case, FAULTS_AT - 2)


def test_sentinel_and_absurd_values_never_become_samples(cases) -> None:
    case = cases["sentinel"]
    case.wait_until(FAULTS_AT + 4)
    absurd = {4000.0, 2**32 - 1, (2**32 - 1) / 1000, (2**32 - 1) * 1e6, (2**32 - 1) / 100}
    for samples in case.samples_between(3.0):
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
            assert value_of(samples, family, **well, **labels) is not None, family
    first, last = case.samples_between(3.0)[0], case.samples_between(3.0)[-1]
    # The absurd temperature is counted as an invalid value, every cycle.
    invalid = [
        value_of(s, "gpuload_nvml_errors_total", collector="temperature", error="invalid_value")
        or 0
        for s in (first, last)
    ]
    assert invalid[1] > invalid[0] > 0
    # Logged once: the collector and the dropped reading named.
    assert case.count("collector temperature on GPU 0: implausible values dropped") == 1
    assert case.count("temperature.gpu=4000") == 1
    assert len(case.matching(r"WARNING exporter\.")) == len(
        {
            dict(labels)["collector"]
            for labels in series(last, "gpuload_nvml_errors_total")
            if dict(labels)["error"] == "invalid_value"
        }
    )
    assert_collecting(case, 3.0)
    assert_flat(case, FAULTS_AT - 2)


def test_event_thread_failure_is_reported_and_the_thread_restarted(cases) -> None:
    case = cases["event_thread"]
    case.wait_until(FAULTS_AT + 7)
    at = FAULTS_AT
    assert all(
        value_of(s, "gpuload_collector_success", collector="xid") == 1
        for s in case.samples_between(at - 2, at)
    )
    during = case.samples_between(at + 0.5, at + 2)
    assert any(value_of(s, "gpuload_collector_success", collector="xid") == 0 for s in during)
    failures = value_of(
        case.samples_between(at + 2.5)[0],
        "gpuload_nvml_errors_total",
        collector="xid",
        error="unknown",
    )
    assert failures is not None and failures >= 2
    # Restarted once the error stops: an XID after the window is counted.
    after = case.samples_between(at + 6)
    for samples in after:
        assert value_of(samples, "gpuload_collector_success", collector="xid") == 1
        assert value_of(samples, "gpu_xid_errors_total", **gpu(samples, 1), xid="48") == 1
        assert value_of(samples, "gpu_last_xid_code", **gpu(samples, 1)) == 48
    # Other collectors never noticed.
    assert all(
        value_of(s, "gpuload_collector_success", collector="power") == 1
        for s in case.samples_between(3.0)
    )
    assert case.count("collector xid on node: NVML error unknown") == 1
    assert case.count("collector xid on node: recovered") == 1
    assert case.count("GPU 1 reported XID 48") == 1
    # A new event thread per failed cycle, each gone before the next: no pile-up.
    assert_flat(case, at - 2)
    assert_collecting(case, 3.0)


def test_pod_resources_socket_disappearing_reports_0_once_and_gpus_go_on(
    cases, kubelet: FakeKubelet
) -> None:
    case = cases["pod_resources"]
    case.wait_until(FAULTS_AT - 1)
    ready = case.samples_between(FAULTS_AT - 3)
    assert value_of(ready[-1], "gpuload_kubernetes_pod_resources_up") == 1
    assert len(series(ready[-1], "gpu_pod_info")) == 1
    # The socket goes first (as when the kubelet restarts), then the kubelet itself.
    kubelet.socket_path.unlink()
    gone = time.time() - case.epoch
    case.wait_until(gone + 1)
    kubelet.stop()
    case.wait_until(gone + 4)
    # Within a refresh (250 ms) or two the exporter says the kubelet is gone...
    for samples in case.samples_between(gone + 1):
        assert value_of(samples, "gpuload_kubernetes_pod_resources_up") == 0
        assert len(series(samples, "gpu_utilization_ratio")) == 2
    # ...and drops the pod labels once the last answer is three refreshes old.
    assert all(series(s, "gpu_pod_info") == {} for s in case.samples_between(gone + 2))
    assert case.count("collector kubernetes: the kubelet's pod-resources socket") == 1
    assert case.count("its socket is gone; GPUs keep reporting") == 1
    assert case.count("Traceback") == 0
    assert_collecting(case, gone)
    assert_flat(case, FAULTS_AT - 3)
