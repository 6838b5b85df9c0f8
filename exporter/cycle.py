"""One collection cycle's work: every GPU's collectors in worker threads, within a timeout.

GPUs start two at a time while NVML answers fast, and all at once when it stalls. A GPU whose
worker has not finished by the timeout is reported stale and is not started again until it
finishes, so a wedged driver call never piles up threads; what it returns is picked up by a
later cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import replace
from functools import partial
from typing import Any

from exporter.collectors import Reader, Sample
from exporter.nvml import Device
from exporter.problems import ProblemLog
from exporter.session import Gpu, Session
from exporter.snapshot import CollectorRun

log = logging.getLogger(__name__)

# GPUs collected at once while NVML answers fast: each call hands the GIL to another thread,
# and more threads queueing for it cost CPU without shortening the cycle. Once none of them has
# finished for WIDEN_AFTER seconds (a slow or hung driver), the rest all start: then waiting
# in parallel is what keeps the cycle as short as the slowest GPU.
_LANES = 2
WIDEN_AFTER = 0.005
# A cycle with the slow reads due makes about four times a fast cycle's calls per GPU.
_SLOW_CYCLE_WORK = 4


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
    keep: Callable[[Sample], bool] | None = None,
) -> CollectorRun:
    """Run one collector behind the error boundary: nothing it raises escapes.

    ``gpu`` and ``labels`` (the GPU's identity labels) are put in the run as they are. ``keep``
    (the metrics profile) lets the collector skip reads it would only drop.
    """
    read = Reader(slow_due=slow_due, device=device, unsupported=unsupported, now=now, keep=keep)
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


class Cycle:
    """Runs the collectors of the session's node and GPUs once per call."""

    def __init__(
        self,
        session: Session,
        *,
        timeout: float,
        keep: Callable[[Sample], bool] | None,
        clock: Callable[[], float],
        problems: ProblemLog,
        widen_after: float = WIDEN_AFTER,
    ) -> None:
        self._session = session
        self._timeout = timeout
        # Which samples are published (the metrics profile); None: all.
        self._keep = keep
        self._clock = clock
        self._problems = problems
        self._widen_after = widen_after

    def run(self, slow_due: bool) -> list[CollectorRun]:
        """Every GPU's and the node's runs that returned within the timeout."""
        deadline = time.monotonic() + self._timeout
        # GPUs still stuck in a call from an earlier cycle are waited for, not started again.
        pending: dict[Future[list[CollectorRun]], Gpu] = {
            gpu.in_flight: gpu for gpu in self._session.gpus.values() if gpu.in_flight is not None
        }
        queue = [
            gpu
            for gpu in self._session.gpus.values()
            if gpu.device is not None and gpu.in_flight is None
        ]
        running = {self._start(gpu, slow_due, pending) for gpu in queue[:_LANES]}
        del queue[:_LANES]
        node_runs = [
            self._kept(run_collector(name, collector.collect, slow_due=slow_due, keep=self._keep))
            for name, collector in self._session.node_collectors.items()
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
        lost_driver: str | None = None
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
            lost_driver = self._session.check_lifecycle(gpu, gpu_runs) or lost_driver
        if lost_driver:
            self._session.reinit(lost_driver)
        return runs

    def _start(
        self, gpu: Gpu, slow_due: bool, pending: dict[Future[list[CollectorRun]], Gpu]
    ) -> Future[list[CollectorRun]]:
        assert self._session.workers is not None
        gpu.current_collector = None  # until its worker begins
        future = gpu.in_flight = self._session.workers.submit(self._collect_gpu, gpu, slow_due)
        pending[future] = gpu
        return future

    def _kept(self, run: CollectorRun) -> CollectorRun:
        """The run with only the samples of the metrics profile."""
        if self._keep is None:
            return run
        return replace(run, samples=tuple(filter(self._keep, run.samples)))

    def _collect_gpu(self, gpu: Gpu, slow_due: bool) -> list[CollectorRun]:
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
                    keep=self._keep,
                )
                runs.append(self._kept(run))
        finally:
            device.forget_fields_ahead()
        gpu.current_collector = ""
        return runs


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


def _not_returned(collector: str | None) -> str:
    """What a GPU's collection that has not returned is waiting on, naming the collector."""
    if collector is None:
        return "collection queued, not started"
    if collector:
        return f"collector {collector} has not returned"
    return "collection has not returned after its last collector"
