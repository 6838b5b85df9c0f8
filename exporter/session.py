"""NVML's lifecycle on a node: initialise with backoff, acquire each GPU, notice what is lost.

A GPU that answers a lifecycle error (lost, gone) is dropped and acquired again with its own
backoff; a driver that went away (uninitialised, unloaded, a version mismatch) takes every
handle with it, and NVML is initialised again on the next cycle.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from exporter import nvml
from exporter.nvml import Device, Identity, NvmlError
from exporter.problems import ProblemLog
from exporter.snapshot import CollectorRun
from exporter.workers import Workers

log = logging.getLogger(__name__)

# Errors after which the whole library must be initialised again.
_REINIT_CODES = {"uninitialized", "driver_not_loaded", "lib_rm_version_mismatch"}
_BACKOFF_START_SECONDS = 1.0
_BACKOFF_MAX_SECONDS = 60.0
_BACKOFF_SLACK_SECONDS = 0.1


class Backoff:
    """Doubling retry delay, reset on success."""

    def __init__(self) -> None:
        self.delay = _BACKOFF_START_SECONDS
        self.next_attempt = -math.inf  # due at once, whatever the clock reads

    def due(self, now: float) -> bool:
        """Whether the next attempt may run at ``now``."""
        # Cycles come once per interval, a little early or late: a retry due one interval
        # after a cycle would otherwise wait a whole extra cycle about half of the time.
        return now >= self.next_attempt - _BACKOFF_SLACK_SECONDS

    def failed(self, now: float) -> None:
        """An attempt failed at ``now``: wait twice as long as last time, up to a minute."""
        self.next_attempt = now + self.delay
        self.delay = min(self.delay * 2, _BACKOFF_MAX_SECONDS)

    def reset(self) -> None:
        """An attempt succeeded: the next failure waits the shortest delay again."""
        self.delay = _BACKOFF_START_SECONDS
        self.next_attempt = -math.inf


@dataclass
class Gpu:
    """One GPU of the node, by index: its handle (None while lost) and its collection's state."""

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
    retry: Backoff = field(default_factory=Backoff)


class Session:
    """The NVML session and the node's GPUs, shared by every cycle (under the cycle's lock)."""

    def __init__(
        self,
        build_collectors: Callable[[str], dict[str, Any]],
        *,
        gpm: bool,
        clock: Callable[[], float],
        errors: Counter[tuple[str, str]],
        problems: ProblemLog,
    ) -> None:
        # A fresh set of collectors for a scope ("node" or "device"), made at each acquisition.
        self._build_collectors = build_collectors
        self._gpm = gpm  # whether `gpu_info` may report GPM profiling
        self._clock = clock
        self._errors = errors  # (where, error name) -> count: gpuload_nvml_errors_total
        self._problems = problems
        self.gpus: dict[int, Gpu] = {}
        self.node_collectors: dict[str, Any] = {}
        self.workers: Workers | None = None
        self.up = False
        self._backoff = Backoff()

    def open(self, now: float) -> None:
        """Initialise NVML when it is down and its retry is due."""
        if not self.up and self._backoff.due(now):
            self._start_nvml(now)

    def close(self) -> None:
        """Stop the workers and release NVML, unless a call is still stuck inside it."""
        stuck = [gpu.index for gpu in self.gpus.values() if gpu.in_flight is not None]
        if self.workers is not None:
            self.workers.stop()
            self.workers = None
        for gpu in self.gpus.values():
            if gpu.in_flight is None:
                close_all(gpu.collectors)
        close_all(self.node_collectors)
        if self.up and not stuck:
            self._shutdown_nvml()
        elif stuck:
            # nvmlShutdown while another thread is inside NVML can crash the process.
            log.warning("leaving NVML initialised: calls on GPU %s are still running", stuck)

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
        self.up = True
        self.node_collectors = self._build_collectors("node")
        self._backoff.reset()
        known = self.gpus
        self.gpus = {index: known.get(index) or Gpu(index) for index in range(count)}
        for gpu in self.gpus.values():
            gpu.device = None
            gpu.retry.reset()
        self.workers = Workers(limit=count, name="gpu")

    def _init_failed(self, now: float, error: str, message: str) -> None:
        self._errors[("nvml", error)] += 1
        self._problems.report(("nvml",), "%s", message)
        self._backoff.failed(now)

    def _shutdown_nvml(self) -> None:
        try:
            nvml.shutdown()
        except NvmlError as error:
            log.debug("NVML shutdown: %s", error)
        self.up = False

    def reinit(self, error: str) -> None:
        """Drop every handle and initialise again on the next cycle (unless a call is stuck).

        `error` is what the GPUs answered (driver_not_loaded, uninitialized): counted once here,
        so that a driver gone for less than a retry still leaves its trace in the counter.
        """
        if any(gpu.in_flight is not None for gpu in self.gpus.values()):
            return
        self._errors[("nvml", error)] += 1
        log.warning("NVML needs to be initialised again (driver reloaded or lost)")
        for gpu in self.gpus.values():
            close_all(gpu.collectors)
        close_all(self.node_collectors)
        if self.workers is not None:
            self.workers.stop()
            self.workers = None
        self._shutdown_nvml()
        self._backoff.reset()

    def reacquire_lost_gpus(self, now: float) -> None:
        """Acquire each GPU without a handle whose retry is due: handle, identity, collectors."""
        for gpu in self.gpus.values():
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
            close_all(gpu.collectors)
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

    def check_lifecycle(self, gpu: Gpu, runs: list[CollectorRun]) -> str | None:
        """Mark the GPU lost on a lifecycle error; the error's name when the driver went away.

        A lost GPU is counted once here, and once per failed retry: a loss shorter than the
        first retry still shows in gpuload_nvml_errors_total.
        """
        lifecycle = [e for run in runs for e in run.errors if e.lifecycle]
        if not lifecycle:
            return None
        error = lifecycle[0]
        if error.name in _REINIT_CODES:
            return error.name
        self._errors[("nvml", error.name)] += 1
        gpu.device = None
        close_all(gpu.collectors)
        gpu.collectors = {}
        gpu.retry.failed(self._clock())
        self._problems.report(
            ("gpu", gpu.index),
            "GPU %d (%s) lost: %s",
            gpu.index,
            gpu.identity.uuid if gpu.identity else "?",
            error,
        )
        return None

    def _profiling(self, device: Device) -> str:
        """Which profiling path `gpu_info` reports: GPM where enabled and supported."""
        if not self._gpm:
            return "none"
        try:
            return "gpm" if device.gpm_supported() else "none"
        except NvmlError:
            return "none"


def close_all(collectors: Mapping[str, Any]) -> None:
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
