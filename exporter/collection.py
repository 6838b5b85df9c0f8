"""One collection cycle: read every GPU in parallel and publish an immutable snapshot.

The cycle owns NVML's lifecycle (initialise with backoff, notice lost GPUs and
re-acquire them), runs each GPU's collectors in a worker thread of its own,
waits a bounded time, and publishes what came back as an immutable snapshot.
A GPU whose worker has not finished is reported stale and is not resubmitted
until it finishes, so a wedged driver call never piles up threads.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from exporter import __version__, nvml
from exporter.collectors import REGISTRY, Reader, Sample
from exporter.collectors.profiles import sample_filter
from exporter.nvml import Device, Identity, NvmlError
from exporter.problems import ProblemLog
from exporter.snapshot import (
    BUILD_INFO,
    COLLECTION_DURATION,
    COLLECTOR_DURATION,
    COLLECTOR_EXCEPTIONS,
    COLLECTOR_LAST_SUCCESS,
    COLLECTOR_SUCCESS,
    GPU_INFO,
    GPU_STALE,
    GPU_UP,
    LAST_COLLECTION,
    NVML_ERRORS,
    NVML_REFUSED,
    NVML_UP,
    OWN,
    CollectorRun,
    GpuStatus,
    Layout,
    Snapshot,
)
from exporter.workers import Workers

log = logging.getLogger(__name__)

# Errors after which the whole library must be initialised again.
_REINIT_CODES = {"uninitialized", "driver_not_loaded", "lib_rm_version_mismatch"}
_BACKOFF_START_SECONDS = 1.0
_BACKOFF_MAX_SECONDS = 60.0
_BACKOFF_SLACK_SECONDS = 0.1
# GPUs collected at once while NVML answers fast: each call hands the GIL to another thread,
# and more threads queueing for it cost CPU without shortening the cycle. Once none of them has
# finished for _WIDEN_AFTER seconds (a slow or hung driver), the rest all start: then waiting
# in parallel is what keeps the cycle as short as the slowest GPU.
_LANES = 2
_WIDEN_AFTER = 0.005
# A cycle with the slow reads due makes about four times a fast cycle's calls per GPU.
_SLOW_CYCLE_WORK = 4


class _Backoff:
    """Doubling retry delay, reset on success."""

    def __init__(self) -> None:
        self.delay = _BACKOFF_START_SECONDS
        self.next_attempt = -math.inf  # due at once, whatever the clock reads

    def due(self, now: float) -> bool:
        # Cycles come once per interval, a little early or late: a retry due one interval
        # after a cycle would otherwise wait a whole extra cycle about half of the time.
        return now >= self.next_attempt - _BACKOFF_SLACK_SECONDS

    def failed(self, now: float) -> None:
        self.next_attempt = now + self.delay
        self.delay = min(self.delay * 2, _BACKOFF_MAX_SECONDS)

    def reset(self) -> None:
        self.delay = _BACKOFF_START_SECONDS
        self.next_attempt = -math.inf


@dataclass
class _Gpu:
    index: int
    device: Device | None = None
    identity: Identity | None = None
    collectors: dict[str, Any] = field(default_factory=dict)
    # Reads its device answered NOT_SUPPORTED, skipped until the next slow cycle (`Reader`).
    unsupported: set[Hashable] = field(default_factory=set)
    # (collector, read) that NVML refused (NO_PERMISSION), asked again with the unsupported.
    refused: set[tuple[str, str]] = field(default_factory=set)
    in_flight: Future[list[CollectorRun]] | None = None
    # Where its collection is, for the log: None while queued (submitted, not begun), then the
    # collector it is in, "" once every collector has returned.
    current_collector: str | None = ""
    profiling: str = "none"
    retry: _Backoff = field(default_factory=_Backoff)


def run_collector(
    name: str,
    collect: Callable[[Reader], Iterable[Sample]],
    *,
    slow_due: bool = True,
    device: Device | None = None,
    unsupported: set[Hashable] | None = None,
    gpu: int | None = None,
    labels: tuple[str, ...] = (),
    now: float | None = None,
) -> CollectorRun:
    """Run one collector behind the error boundary: nothing it raises escapes.

    ``gpu`` and ``labels`` (the GPU's identity labels) are put in the run as they are.
    """
    read = Reader(slow_due=slow_due, device=device, unsupported=unsupported, now=now)
    started = time.perf_counter()
    try:
        samples = tuple(collect(read))
        exception = None
    except Exception as error:
        samples = ()
        exception = f"{type(error).__name__}: {error}"
        log.debug("collector %s raised", name, exc_info=True)
    return CollectorRun(
        name=name,
        samples=samples,
        gpu=gpu,
        labels=labels,
        errors=tuple(read.errors),
        invalid=tuple(read.invalid),
        refused=tuple(read.refused),
        exception=exception,
        seconds=time.perf_counter() - started,
    )


class Collection:
    """Runs collection cycles and holds the latest snapshot."""

    def __init__(
        self,
        enabled: Mapping[str, bool],
        *,
        timeout: float,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        slow_interval: float = 0.0,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        widen_after: float = _WIDEN_AFTER,
        profile: str = "full",
    ) -> None:
        # Which of the GPUs' samples are published (exporter/collectors/profiles.py): the daemon
        # passes the configured profile; a Collection made in code publishes all it reads.
        self._keep = sample_filter(profile)
        self._specs = [REGISTRY[name] for name, on in enabled.items() if on and name in REGISTRY]
        self._layout = Layout(self._specs)
        self._options = {
            spec.name: {**spec.options, **(options or {}).get(spec.name, {})}
            for spec in self._specs
        }
        self._node_collectors: dict[str, Any] = {}
        self._timeout = timeout
        # Values that change rarely are read again once per slow interval (0: every cycle).
        self._slow_interval = slow_interval
        self._next_slow = -math.inf
        self._wall_clock = wall_clock
        # Schedules retries and slow reads: the node's time. The simulated node's clock under
        # --simulate, so that a pinned scenario clock repeats the same output (golden files).
        self._clock = clock
        self._widen_after = widen_after
        self._gpus: dict[int, _Gpu] = {}
        self._workers: Workers | None = None
        self._nvml_up = False
        self._init_backoff = _Backoff()
        self._errors: Counter[tuple[str, str]] = Counter()
        self._exceptions: Counter[str] = Counter()
        self._last_success: dict[str, float] = {}
        self._problems = ProblemLog(log)
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()

    @property
    def snapshot(self) -> Snapshot | None:
        """The latest complete snapshot, or None before the first cycle ends."""
        return self._snapshot

    def run_cycle(self) -> Snapshot:
        """Collect once and publish the snapshot. Never raises for NVML trouble."""
        with self._lock:
            started = time.perf_counter()
            now = self._clock()
            if not self._nvml_up and self._init_backoff.due(now):
                self._start_nvml(now)
            runs: list[CollectorRun] = []
            if self._nvml_up:
                slow_due = now >= self._next_slow
                if slow_due:
                    self._next_slow = now + self._slow_interval
                self._reacquire_lost_gpus(now)
                runs = self._collect_all(slow_due)
            snapshot = self._publish(runs, time.perf_counter() - started)
            self._snapshot = snapshot
            return snapshot

    def close(self) -> None:
        """Stop the workers and release NVML, unless a call is still stuck inside it."""
        with self._lock:
            stuck = [gpu.index for gpu in self._gpus.values() if gpu.in_flight is not None]
            if self._workers is not None:
                self._workers.stop()
                self._workers = None
            for gpu in self._gpus.values():
                if gpu.in_flight is None:
                    _close_all(gpu.collectors)
            _close_all(self._node_collectors)
            if self._nvml_up and not stuck:
                self._shutdown_nvml()
            elif stuck:
                # nvmlShutdown while another thread is inside NVML can crash the process.
                log.warning("leaving NVML initialised: calls on GPU %s are still running", stuck)

    # NVML lifecycle

    def _start_nvml(self, now: float) -> None:
        try:
            nvml.init()
            count = nvml.device_count()
        except nvml.LibraryNotFound:
            self._init_failed(
                now,
                "library_not_found",
                "NVML library libnvidia-ml.so.1 not found: "
                "install the NVIDIA driver (or run with --simulate); retrying",
            )
            return
        except NvmlError as error:
            self._init_failed(now, error.name, f"NVML initialisation failed: {error}; retrying")
            return
        self._problems.resolve(("nvml",), "NVML initialised: %d GPUs", count)
        self._nvml_up = True
        self._node_collectors = self._build_collectors("node")
        self._init_backoff.reset()
        known = self._gpus
        self._gpus = {index: known.get(index) or _Gpu(index) for index in range(count)}
        for gpu in self._gpus.values():
            gpu.device = None
            gpu.retry.reset()
        self._workers = Workers(limit=count, name="gpu")

    def _init_failed(self, now: float, error: str, message: str) -> None:
        self._errors[("nvml", error)] += 1
        self._problems.report(("nvml",), "%s", message)
        self._init_backoff.failed(now)

    def _shutdown_nvml(self) -> None:
        try:
            nvml.shutdown()
        except NvmlError as error:
            log.debug("NVML shutdown: %s", error)
        self._nvml_up = False

    def _reinit(self) -> None:
        """Drop every handle and initialise again on the next cycle."""
        if any(gpu.in_flight is not None for gpu in self._gpus.values()):
            return
        log.warning("NVML needs to be initialised again (driver reloaded or lost)")
        for gpu in self._gpus.values():
            _close_all(gpu.collectors)
        _close_all(self._node_collectors)
        if self._workers is not None:
            self._workers.stop()
            self._workers = None
        self._shutdown_nvml()
        self._init_backoff.reset()

    def _reacquire_lost_gpus(self, now: float) -> None:
        for gpu in self._gpus.values():
            if gpu.device is not None or not gpu.retry.due(now):
                continue
            try:
                device = nvml.device(gpu.index)
                identity = device.identity()
            except NvmlError as error:
                self._errors[("nvml", error.name)] += 1
                gpu.retry.failed(now)
                self._problems.report(
                    ("gpu", gpu.index), "GPU %d cannot be reached: %s", gpu.index, error
                )
                continue
            if gpu.identity is not None and gpu.identity.uuid != identity.uuid:
                log.warning(
                    "GPU %d is now %s (was %s)", gpu.index, identity.uuid, gpu.identity.uuid
                )
            gpu.device, gpu.identity = device, identity
            gpu.retry.reset()
            gpu.profiling = self._profiling(device)
            _close_all(gpu.collectors)
            gpu.collectors = self._build_collectors("device")
            gpu.unsupported = set()
            self._problems.resolve(
                ("gpu", gpu.index), "GPU %d (%s) is reporting", gpu.index, identity.uuid
            )
            for label, failure in identity.failed:
                self._errors[("identity", failure.name)] += 1
                log.warning(
                    "GPU %d: reading its %s failed (%s); gpu_info's %s label is empty",
                    gpu.index,
                    label,
                    failure,
                    label,
                )

    def _build_collectors(self, scope: str) -> dict[str, Any]:
        return {
            spec.name: spec.factory(**self._options[spec.name])
            for spec in self._specs
            if spec.scope == scope
        }

    def _profiling(self, device: Device) -> str:
        """Which profiling path `gpu_info` reports: GPM where enabled and supported."""
        if "gpm" not in self._options:
            return "none"
        try:
            return "gpm" if device.gpm_supported() else "none"
        except NvmlError:
            return "none"

    # Collection

    def _collect_all(self, slow_due: bool) -> list[CollectorRun]:
        deadline = time.monotonic() + self._timeout
        # GPUs still stuck in a call from an earlier cycle are waited for, not started again.
        pending: dict[Future[list[CollectorRun]], _Gpu] = {
            gpu.in_flight: gpu for gpu in self._gpus.values() if gpu.in_flight is not None
        }
        queue = [
            gpu for gpu in self._gpus.values() if gpu.device is not None and gpu.in_flight is None
        ]
        running = {self._start(gpu, slow_due, pending) for gpu in queue[:_LANES]}
        del queue[:_LANES]
        node_runs = [
            self._kept(run_collector(name, collector.collect, slow_due=slow_due))
            for name, collector in self._node_collectors.items()
        ]
        widen_after = self._widen_after * (_SLOW_CYCLE_WORK if slow_due else 1)
        while queue:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waited = min(widen_after, left)
            done, running = wait(running, timeout=waited, return_when=FIRST_COMPLETED)
            if done:
                starting, queue = queue[: len(done)], queue[len(done) :]
            elif waited < left:  # none returned for widen_after: a slow or hung driver
                starting, queue = queue, []
            else:  # the timeout passed
                break
            running |= {self._start(gpu, slow_due, pending) for gpu in starting}
        # Past the timeout with GPUs not started (lanes that kept finishing, slowly, or hung):
        # start them now, reported stale rather than left out unseen; what they return is
        # picked up by the next cycle.
        for gpu in queue:
            self._start(gpu, slow_due, {})
            self._problems.report(
                ("stale", gpu.index),
                "GPU %d: collection queued, not started within %.1fs",
                gpu.index,
                self._timeout,
            )
        wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        runs = list(node_runs)
        lost_driver = False
        for future, gpu in pending.items():
            if not future.done():
                self._problems.report(
                    ("stale", gpu.index),
                    "GPU %d: %s within %.1fs",
                    gpu.index,
                    _not_returned(gpu.current_collector),
                    self._timeout,
                )
                continue
            gpu.in_flight = None
            self._problems.resolve(("stale", gpu.index), "GPU %d: collection returned", gpu.index)
            gpu_runs = future.result()
            gpu.refused |= {(run.name, read) for run in gpu_runs for read in run.refused}
            runs.extend(gpu_runs)
            lost_driver |= self._check_lifecycle(gpu, gpu_runs)
        if lost_driver:
            self._reinit()
        return runs

    def _start(
        self, gpu: _Gpu, slow_due: bool, pending: dict[Future[list[CollectorRun]], _Gpu]
    ) -> Future[list[CollectorRun]]:
        assert self._workers is not None
        gpu.current_collector = None  # until its worker begins
        future = gpu.in_flight = self._workers.submit(self._collect_gpu, gpu, slow_due)
        pending[future] = gpu
        return future

    def _kept(self, run: CollectorRun) -> CollectorRun:
        """The run with only the samples of the metrics profile."""
        if self._keep is None:
            return run
        return replace(run, samples=tuple(filter(self._keep, run.samples)))

    def _collect_gpu(self, gpu: _Gpu, slow_due: bool) -> list[CollectorRun]:
        assert gpu.device is not None and gpu.identity is not None
        device, labels = gpu.device, (str(gpu.index), gpu.identity.uuid)
        if slow_due:
            gpu.unsupported = set()  # everything is asked again once per slow interval
            gpu.refused = set()
        fields = _fields_wanted(gpu.collectors, slow_due)
        if fields:
            gpu.current_collector = "field values"
            try:
                device.read_fields_ahead(fields)
            except Exception:  # a malformed field list: each collector reads its own
                log.exception("GPU %d: reading field values ahead failed", gpu.index)
                device.forget_fields_ahead()
        runs = []
        try:
            for name, collector in gpu.collectors.items():
                gpu.current_collector = name
                run = run_collector(
                    name,
                    partial(collector.collect, device),
                    slow_due=slow_due,
                    device=device,
                    unsupported=gpu.unsupported,
                    gpu=gpu.index,
                    labels=labels,
                    now=self._clock(),
                )
                runs.append(self._kept(run))
        finally:
            device.forget_fields_ahead()
        gpu.current_collector = ""
        return runs

    def _check_lifecycle(self, gpu: _Gpu, runs: list[CollectorRun]) -> bool:
        """Mark the GPU lost on a lifecycle error; True when the driver itself went away."""
        lifecycle = [e for run in runs for e in run.errors if e.lifecycle]
        if not lifecycle:
            return False
        error = lifecycle[0]
        if error.name in _REINIT_CODES:
            return True
        gpu.device = None
        _close_all(gpu.collectors)
        gpu.collectors = {}
        gpu.retry.failed(self._clock())
        self._problems.report(
            ("gpu", gpu.index),
            "GPU %d (%s) lost: %s",
            gpu.index,
            gpu.identity.uuid if gpu.identity else "?",
            error,
        )
        return False

    # Publishing

    def _publish(self, runs: list[CollectorRun], cycle_seconds: float) -> Snapshot:
        completed_at = self._wall_clock()
        own = [*self._gpu_samples(), *self._meta_samples(runs, cycle_seconds, completed_at)]
        gpus = tuple(
            GpuStatus(
                index=gpu.index,
                uuid=gpu.identity.uuid if gpu.identity else "",
                name=gpu.identity.name if gpu.identity else "",
                up=gpu.device is not None,
                stale=gpu.in_flight is not None,
            )
            for gpu in self._gpus.values()
            if self._nvml_up  # as the GPU series: none while NVML is down
        )
        return Snapshot(
            gpus,
            self._nvml_up,
            completed_at,
            tuple(runs),
            self._layout,
            CollectorRun(OWN, tuple(own)),
        )

    def _gpu_samples(self) -> Iterator[Sample]:
        if not self._nvml_up:
            # Without NVML nothing is known of any GPU: its series are absent (not gpu_up 0,
            # which would say every GPU fell off the bus; not 1 from before the driver went).
            # gpuload_nvml_up 0 says why.
            return
        info, up, stale = [], [], []
        for gpu in self._gpus.values():
            identity = gpu.identity
            if identity is None:
                # Lost before it could be identified: still say so, without a UUID.
                up.append(Sample(GPU_UP.name, 0, (str(gpu.index), "")))
                continue
            labels = (str(gpu.index), identity.uuid)
            details = (
                identity.name,
                identity.pci_bus_id,
                identity.serial,
                identity.vbios_version,
                gpu.profiling,
            )
            info.append(Sample(GPU_INFO.name, 1, (*labels, *details)))
            up.append(Sample(GPU_UP.name, 1 if gpu.device is not None else 0, labels))
            stale.append(Sample(GPU_STALE.name, 1 if gpu.in_flight is not None else 0, labels))
        yield from info
        yield from up
        yield from stale

    def _meta_samples(
        self, runs: list[CollectorRun], cycle_seconds: float, completed_at: float
    ) -> Iterator[Sample]:
        seconds: defaultdict[str, float] = defaultdict(float)
        for run in runs:
            seconds[run.name] += run.seconds
        failed = self._account(runs)
        stale = {
            gpu.current_collector
            for gpu in self._gpus.values()
            if gpu.in_flight and gpu.current_collector
        }
        success, duration, last_success = [], [], []
        for spec in self._specs:
            ok = spec.name not in failed and spec.name not in stale and self._nvml_up
            if ok:
                self._last_success[spec.name] = completed_at
            success.append(Sample(COLLECTOR_SUCCESS.name, 1 if ok else 0, (spec.name,)))
            duration.append(Sample(COLLECTOR_DURATION.name, seconds[spec.name], (spec.name,)))
            if spec.name in self._last_success:
                when = self._last_success[spec.name]
                last_success.append(Sample(COLLECTOR_LAST_SUCCESS.name, when, (spec.name,)))
        yield from success
        yield from duration
        yield from last_success
        for (collector, error_name), count in sorted(self._errors.items()):
            yield Sample(NVML_ERRORS.name, count, (collector, error_name))
        for (collector, read), gpus in self._refused().items():
            yield Sample(NVML_REFUSED.name, len(gpus), (collector, read))
        for collector, count in sorted(self._exceptions.items()):
            yield Sample(COLLECTOR_EXCEPTIONS.name, count, (collector,))
        yield Sample(NVML_UP.name, 1 if self._nvml_up else 0)
        yield Sample(LAST_COLLECTION.name, completed_at)
        yield Sample(COLLECTION_DURATION.name, cycle_seconds)
        yield Sample(BUILD_INFO.name, 1, (__version__,))

    def _refused(self) -> dict[tuple[str, str], list[int]]:
        """(collector, read) -> the GPUs that refused it; each logged once with what to do."""
        refused: dict[tuple[str, str], list[int]] = defaultdict(list)
        for gpu in self._gpus.values():
            for key in sorted(gpu.refused):
                refused[key].append(gpu.index)
        for (collector, read), gpus in refused.items():
            self._problems.report(
                ("refused", collector, read),
                "collector %s: NVML refused %s to this process on GPU %s (NO_PERMISSION); "
                "the series is absent%s. %s",
                collector,
                read,
                ", ".join(map(str, gpus)),
                _REFUSAL_COSTS.get((collector, read), ""),
                _PERMISSION_HINT,
            )
        return refused

    def _account(self, runs: list[CollectorRun]) -> set[str]:
        """Count errors, log problems once per collector and GPU; return failed collectors."""
        failed: set[str] = set()
        for run in runs:
            unexpected = [e for e in run.errors if not e.lifecycle]
            for error in unexpected:
                self._errors[(run.name, error.name)] += 1
            if run.invalid:
                self._errors[(run.name, "invalid_value")] += len(run.invalid)
            if run.exception:
                self._exceptions[run.name] += 1
            key = ("collector", run.name, run.gpu)
            where = "node" if run.gpu is None else f"GPU {run.gpu}"
            problem = _describe_problem(run, unexpected)
            if problem:
                failed.add(run.name)
                self._problems.report(key, "collector %s on %s: %s", run.name, where, problem)
            else:
                self._problems.resolve(key, "collector %s on %s: recovered", run.name, where)
        return failed


def _fields_wanted(collectors: Mapping[str, Any], slow_due: bool) -> list[Any]:
    """The field values a GPU's collectors will read this cycle, to be read in one call."""
    wanted: list[Any] = []
    for name, collector in collectors.items():
        fields = getattr(collector, "fields", None)
        if fields is None:
            continue
        try:
            wanted += fields(slow_due)
        except Exception:  # then that collector reads its own fields
            log.exception("collector %s: listing its field values failed", name)
    return wanted


def _close_all(collectors: Mapping[str, Any]) -> None:
    """Release what collectors hold (GPM samples, threads); a failure here is only logged."""
    for name, collector in collectors.items():
        close = getattr(collector, "close", None)
        if close is None:
            continue
        try:
            close()
        except NvmlError as error:
            # Expected when the driver or the GPU has gone away, taking the resources with it.
            log.debug("collector %s: releasing its resources: %s", name, error)
        except Exception:  # releasing one collector must not stop the others
            log.warning("collector %s: releasing its resources failed", name, exc_info=True)


# What to change when NVML refuses a read (nvml.h: MIG whole-GPU memory and processes "only if
# the caller has appropriate privileges"; GPM in containers, DCGM issue 214).
# What a refused read costs the alerts, said with the refusal.
_REFUSAL_COSTS = {
    ("mig", "gpm_sample"): (
        ": MIG instances have no SM activity, so GPUMIGUtilizationLow and GPUIdleAllocated"
        " cannot judge them"
    ),
    ("gpm", "gpm_sample"): ": no GPM profiling, so GPUMemoryBandwidthBound cannot fire",
}
_PERMISSION_HINT = (
    "NVML answers it only to a privileged caller: run gpuload as root (Helm: "
    "exporter.securityContext.runAsUser: 0 and runAsNonRoot: false) if you need it"
)


def _not_returned(collector: str | None) -> str:
    """What a GPU's collection that has not returned is waiting on, naming the collector."""
    if collector is None:
        return "collection queued, not started"
    if collector:
        return f"collector {collector} has not returned"
    return "collection has not returned after its last collector"


def _describe_problem(run: CollectorRun, unexpected: list[NvmlError]) -> str:
    if run.exception:
        return f"raised {run.exception}"
    if unexpected:
        return f"NVML error {unexpected[0].name}: {unexpected[0]}"
    if run.invalid:
        return f"implausible values dropped: {', '.join(run.invalid)}"
    return ""
