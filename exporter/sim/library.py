"""The simulated NVML C library: an object that stands in for ``pynvml.nvmlLib``.

pynvml looks up each C function with ``getattr(nvmlLib, "nvmlDeviceGet...")`` and calls it with
ctypes arguments: handles as ``c_nvmlDevice_t`` pointers, outputs as ``byref(...)`` or arrays,
strings as ``c_char`` buffers. :class:`SimulatedNvml` answers those calls from a scenario, so
pynvml's own marshalling, version fallbacks and ``NVMLError_*`` classes run unchanged on machines
without a GPU:

- a function the simulated driver lacks is absent (``getattr`` raises AttributeError and pynvml
  raises ``NVMLError_FunctionNotFound``), as with an older driver;
- a feature the simulated GPU lacks answers ``NVML_ERROR_NOT_SUPPORTED``, as an older GPU does;
- calls before ``nvmlInit*`` (or after the last ``nvmlShutdown``) answer ``UNINITIALIZED``.

Faults from the scenario apply per call, checked in this order: ``driver_not_loaded`` (every
call but nvmlErrorString answers DRIVER_NOT_LOADED), ``gpu_lost`` (every call on that GPU,
getting its handle included, answers GPU_IS_LOST), ``hang`` (the call sleeps, holding no lock),
``not_supported``, ``error``, then ``sentinel``: the call succeeds but its measured outputs are
NVML's "unavailable" all-ones value of their C type (0xFFFFFFFF for unsigned int, -1 for int,
2**64-1 for unsigned long long), except the temperature calls, which report an absurd 4000 C.
Process lists under a sentinel report ``usedGpuMemory`` as unavailable (pynvml turns it into None).

MIG device handles (of GPUs the scenario puts in MIG mode) reach only the functions that accept
them; the others answer NOT_SUPPORTED, and faults of the parent GPU apply to them.

Latency: a call that passes the faults sleeps for its ``driver.latency`` (20 ms for
nvmlDeviceGetPcieThroughput by default) before its handler reads the time, holding no lock, so
calls on other GPUs and threads overlap as they do with the real library.

The C functions live in :mod:`~exporter.sim.functions` and, by family, in
:mod:`~exporter.sim.gpm`, :mod:`~exporter.sim.nvlink`, :mod:`~exporter.sim.events`,
:mod:`~exporter.sim.memory_errors` and :mod:`~exporter.sim.mig`; importing them registers them.
"""

from __future__ import annotations

import collections
import ctypes
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from exporter.sim import branches, events, gpm, memory_errors, mig, nvlink, privileges
from exporter.sim.device import HANDLE_BASE, HANDLE_STRIDE, MigDevice, SimulatedGpu
from exporter.sim.events import EventSets
from exporter.sim.functions import (
    DRIVER_NOT_LOADED,
    FUNCTIONS,
    GPU_IS_LOST,
    INIT_FUNCTIONS,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_SUPPORTED,
    SUCCESS,
    UNINITIALIZED,
    Call,
    Function,
    error_string,
)
from exporter.sim.gpm import GpmSamples
from exporter.sim.model import Fault, Scenario

__all__ = ["FUNCTION_NAMES", "CFunction", "SimulatedNvml"]

_FAMILIES = (events, gpm, memory_errors, mig, nvlink)  # imported for their registrations

FUNCTION_NAMES: frozenset[str] = frozenset(FUNCTIONS)
"""Every NVML C function the simulator implements."""


class CFunction:
    """A callable C function of the simulated library; pynvml may set ``restype`` on it."""

    restype: Any = None
    argtypes: Any = None

    def __init__(self, sim: SimulatedNvml, name: str) -> None:
        self._sim = sim
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        """Call the C function with ctypes arguments; returns an nvmlReturn_t."""
        started = time.thread_time()
        try:
            return self._sim.call(self.__name__, args)
        finally:
            self._sim.charge(time.thread_time() - started)

    def __repr__(self) -> str:
        return f"<simulated NVML function {self.__name__}>"


class SimulatedNvml:
    """A scenario-driven stand-in for the NVML shared library, installed as ``pynvml.nvmlLib``.

    Readings are a deterministic function of (scenario, seed, elapsed), where elapsed is
    ``clock() - epoch`` or ``pinned_time`` when given. A call under a ``hang`` fault hands its
    seconds to ``hang``: ``time.sleep``, or a test's own wait that ends when the test says so.
    ``calls`` counts calls per C function; ``cpu_seconds`` is the CPU time the calls took on
    their callers' threads: the simulator's own cost inside the process that loads it, which the
    benchmark sets apart from gpuload's.
    Instances are thread-safe: readings are pure and the mutable state is behind a lock.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        epoch: float | None = None,
        clock: Callable[[], float] = time.time,
        pinned_time: float | None = None,
        seed: int | None = None,
        hang: Callable[[float], object] = time.sleep,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.scenario = scenario
        self.clock = clock
        # A test with a hand-moved clock ends a hang itself rather than after real seconds.
        self.hang = hang
        # How a call spends its latency: a test that watches calls overlap passes its own.
        self.sleep = sleep
        self.epoch = clock() if epoch is None else float(epoch)
        self.pinned_time = pinned_time
        self.seed = scenario.seed if seed is None else seed
        self.calls: collections.Counter[str] = collections.Counter()
        self.cpu_seconds = 0.0
        self._lock = threading.Lock()
        self._sessions = 0
        reloads = tuple(
            f.until for f in scenario.faults if f.kind == "driver_not_loaded" and f.until < math.inf
        )
        lifetimes = scenario.kubernetes.pid_lifetimes() if scenario.kubernetes else None
        self.gpus = [
            SimulatedGpu(
                spec, self.seed, scenario.driver.uptime, reloads, scenario.faults, lifetimes
            )
            for spec in scenario.gpus
        ]
        self.gpm_samples = GpmSamples()
        self.event_sets = EventSets(scenario.faults)
        self._fault_kinds = frozenset(fault.kind for fault in scenario.faults)
        # What this driver branch exports (`branches`), less what the scenario strips.
        self.lacks = scenario.driver.lacks | branches.lacks_functions(scenario.driver.version)
        self._functions = {
            name: CFunction(self, name) for name in FUNCTIONS if name not in self.lacks
        }

    def __getattr__(self, name: str) -> CFunction:
        # Only reached for names that are not ordinary attributes: the C functions.
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"simulated NVML has no function {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.__dict__.get("_functions", {})})

    # -- time --------------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds of scenario time now."""
        if self.pinned_time is not None:
            return self.pinned_time
        return self.clock() - self.epoch

    def settle_events(self) -> None:
        """Wait until the threads waiting on event sets have handled every event due by now.

        For a hand-moved clock (the doctor's, a test's): the next cycle then counts the events
        of its time, whatever this machine's speed.
        """
        events.settle(self)

    def unix_us(self, t: float) -> int:
        """Unix microseconds of elapsed scenario time ``t``."""
        return round((self.epoch + t) * 1e6)

    # -- devices -----------------------------------------------------------------------------

    def gpu_by_handle(self, handle: Any) -> SimulatedGpu | MigDevice | int:
        """The GPU or MIG device a handle points to, or INVALID_ARGUMENT."""
        address = ctypes.cast(handle, ctypes.c_void_p).value if handle is not None else None
        offset = (address or 0) - HANDLE_BASE
        index = offset // HANDLE_STRIDE - 1
        if not 0 <= index < len(self.gpus):
            return INVALID_ARGUMENT
        gpu, slot = self.gpus[index], offset % HANDLE_STRIDE - 1
        if slot < 0:
            return gpu
        return gpu.mig[slot] if slot < len(gpu.mig) else INVALID_ARGUMENT

    def _window(self, kind: str, gpu: SimulatedGpu | None, name: str, t: float) -> list[Fault]:
        if kind not in self._fault_kinds:  # every call asks for six kinds; most scenarios have none
            return []
        index = gpu.index if gpu is not None else None
        return [
            fault
            for fault in self.scenario.faults
            if fault.kind == kind
            and fault.active(t)
            and (fault.gpu is None or fault.gpu == index)
            and (kind in ("gpu_lost", "driver_not_loaded") or name in fault.calls)
        ]

    # -- dispatch ----------------------------------------------------------------------------

    def charge(self, seconds: float) -> None:
        """Add one call's CPU time to ``cpu_seconds``."""
        with self._lock:
            self.cpu_seconds += seconds

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        """Run C function ``name`` with its ctypes arguments; return its nvmlReturn_t."""
        with self._lock:
            self.calls[name] += 1
        if name == "nvmlErrorString":
            # Answers even without a session or a driver, like the real library.
            return error_string(args[0])
        t = self.elapsed()
        if self._window("driver_not_loaded", None, name, t):
            return DRIVER_NOT_LOADED
        if name not in INIT_FUNCTIONS and name != "nvmlShutdown" and not self._sessions:
            return UNINITIALIZED
        function = FUNCTIONS[name]
        call = Call(self, name, t)
        if function.locate is not None:
            located = function.locate(self, args)
            if isinstance(located, int):
                return located
            if isinstance(located, MigDevice):
                call.gpu, call.mig = located.parent, located
            else:
                call.gpu = located
            if function.drop_handle:
                args = args[1:]
        return self._run(function, call, args)

    def _run(self, function: Function, call: Call, args: tuple[Any, ...]) -> int:
        """Apply the scenario's faults to one call, then run its handler."""
        if call.gpu is not None and self._window("gpu_lost", call.gpu, call.name, call.t):
            return GPU_IS_LOST
        if call.gpu is not None and privileges.refused(
            self.scenario.caller,
            call.name,
            mig_enabled=bool(call.gpu.mig),
            on_mig_handle=call.mig is not None,
        ):
            return NO_PERMISSION
        hangs = self._window("hang", call.gpu, call.name, call.t)
        if hangs:
            # No lock is held here, so a hung call stalls only its own caller.
            self.hang(max(f.seconds for f in hangs))
            call.t = self.elapsed()
        if self._window("not_supported", call.gpu, call.name, call.t):
            return NOT_SUPPORTED
        errors = self._window("error", call.gpu, call.name, call.t)
        if errors:
            return errors[0].error
        if call.gpu is not None and function.feature and call.gpu.lacks(function.feature):
            return NOT_SUPPORTED
        if call.mig is not None and not function.mig:
            return NOT_SUPPORTED
        call.sentinel = bool(self._window("sentinel", call.gpu, call.name, call.t))
        delay = self.scenario.driver.latency_of(call.name)
        if delay:
            self.sleep(delay)
            call.t = self.elapsed()
        return function.handler(call, *args)

    def open_session(self) -> int:
        """nvmlInit*: count one more session."""
        with self._lock:
            self._sessions += 1
        return SUCCESS

    def close_session(self) -> int:
        """nvmlShutdown: end one session, UNINITIALIZED when none is open."""
        with self._lock:
            if not self._sessions:
                return UNINITIALIZED
            self._sessions -= 1
        return SUCCESS
