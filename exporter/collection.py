"""Collection: each cycle's readings published as an immutable snapshot, with gpuload's own.

Three jobs, three modules: `exporter.session` keeps NVML and the GPUs (initialise with
backoff, notice lost GPUs, acquire them again), `exporter.cycle` runs the collectors of one
cycle within its timeout, and this module runs cycles and publishes what came back, with the
self-metrics (collector success and duration, NVML errors and refusals, GPU up and stale).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from exporter import __version__
from exporter.collectors import REGISTRY, Sample
from exporter.collectors.profiles import sample_filter
from exporter.cycle import WIDEN_AFTER, Cycle
from exporter.nvml import NvmlError
from exporter.problems import ProblemLog
from exporter.session import Session
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

log = logging.getLogger(__name__)


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
        widen_after: float = WIDEN_AFTER,
        profile: str = "full",
        keep_also: Callable[[Sample], bool] | None = None,
    ) -> None:
        """``keep_also``: samples published whatever the profile (`profiles.sample_filter`)."""
        self._specs = [REGISTRY[name] for name, on in enabled.items() if on and name in REGISTRY]
        self._layout = Layout(self._specs)
        self._options = {
            spec.name: {**spec.options, **(options or {}).get(spec.name, {})}
            for spec in self._specs
        }
        self._timeout = timeout
        # Values that change rarely are read again once per slow interval (0: every cycle).
        self._slow_interval = slow_interval
        self._next_slow = -math.inf
        self._wall_clock = wall_clock
        # Schedules retries and slow reads: the node's time. The simulated node's clock under
        # --simulate, so that a pinned scenario clock repeats the same output (golden files).
        self._clock = clock
        self._errors: Counter[tuple[str, str]] = Counter()
        self._exceptions: Counter[str] = Counter()
        self._last_success: dict[str, float] = {}
        self._problems = ProblemLog(log)
        self._session = Session(
            self._build_collectors,
            gpm="gpm" in self._options,
            clock=clock,
            errors=self._errors,
            problems=self._problems,
        )
        self._cycle = Cycle(
            self._session,
            timeout=timeout,
            # Which of the GPUs' samples are published (exporter/collectors/profiles.py): the
            # daemon passes the configured profile; a Collection made in code publishes all.
            keep=sample_filter(profile, keep_also),
            clock=clock,
            problems=self._problems,
            widen_after=widen_after,
        )
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
            self._session.open(now)
            runs: list[CollectorRun] = []
            if self._session.up:
                slow_due = now >= self._next_slow
                if slow_due:
                    self._next_slow = now + self._slow_interval
                self._session.reacquire_lost_gpus(now)
                runs = self._cycle.run(slow_due)
            snapshot = self._publish(runs, time.perf_counter() - started)
            self._snapshot = snapshot
            return snapshot

    def close(self) -> None:
        """Stop the workers and release NVML, unless a call is still stuck inside it."""
        with self._lock:
            self._session.close()

    def _build_collectors(self, scope: str) -> dict[str, Any]:
        return {
            spec.name: spec.factory(**self._options[spec.name])
            for spec in self._specs
            if spec.scope == scope
        }

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
            for gpu in self._session.gpus.values()
            if self._session.up  # as the GPU series: none while NVML is down
        )
        return Snapshot(
            gpus,
            self._session.up,
            completed_at,
            tuple(runs),
            self._layout,
            CollectorRun(OWN, tuple(own)),
        )

    def _gpu_samples(self) -> Iterator[Sample]:
        if not self._session.up:
            # Without NVML nothing is known of any GPU: its series are absent (not gpu_up 0,
            # which would say every GPU fell off the bus; not 1 from before the driver went).
            # gpuload_nvml_up 0 says why.
            return
        info, up, stale = [], [], []
        for gpu in self._session.gpus.values():
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
            for gpu in self._session.gpus.values()
            if gpu.in_flight and gpu.current_collector
        }
        success, duration, last_success = [], [], []
        for spec in self._specs:
            ok = spec.name not in failed and spec.name not in stale and self._session.up
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
        yield Sample(NVML_UP.name, 1 if self._session.up else 0)
        yield Sample(LAST_COLLECTION.name, completed_at)
        yield Sample(COLLECTION_DURATION.name, cycle_seconds)
        yield Sample(BUILD_INFO.name, 1, (__version__,))

    def _refused(self) -> dict[tuple[str, str], list[int]]:
        """(collector, read) -> the GPUs that refused it; each logged once with what to do."""
        refused: dict[tuple[str, str], list[int]] = defaultdict(list)
        for gpu in self._session.gpus.values():
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


def _describe_problem(run: CollectorRun, unexpected: list[NvmlError]) -> str:
    if run.exception:
        return f"raised {run.exception}"
    if unexpected:
        return f"NVML error {unexpected[0].name}: {unexpected[0]}"
    if run.invalid:
        return f"implausible values dropped: {', '.join(run.invalid)}"
    return ""
