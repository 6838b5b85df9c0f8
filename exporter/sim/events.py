"""Simulated NVML events: event sets, registration and waiting for XID errors.

The scenario's ``xid`` faults (gpu, at, code) are critical XID events and its
``ecc_uncorrectable`` faults double-bit ECC events. An event set delivers each event of the GPUs
and types registered with it once, in time order, as soon as the scenario time reaches it: with a
real-time clock the event arrives when its time comes; with a pinned or hand-moved clock every
event at or before the current time that the set has not delivered yet arrives on the next wait.
A set sees its GPUs' events from elapsed 0, as if it had been registered when the scenario
started, so a pinned clock still shows past events.

nvmlEventSetWait_v2 polls every few milliseconds without holding any lock other calls need and
answers NVML_ERROR_TIMEOUT once ``timeout_ms`` of real time has passed with nothing to deliver,
so a thread blocked in it returns within its timeout and can be stopped.

On a GPU in MIG mode an application's XID (see `INSTANCE_XIDS`) belongs to a MIG instance: its
event carries that instance's gpuInstanceId and computeInstanceId (nvml.h, nvmlEventData_t: "If
MIG is enabled and nvmlEventTypeXidCriticalError event is attributable to a GPU instance ...";
0xFFFFFFFF otherwise), and only a privileged caller receives it (`privileges`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.sim import privileges, records
from exporter.sim.device import MigDevice
from exporter.sim.functions import (
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    TIMEOUT,
    Call,
    address,
    device,
    integer,
    system,
    target,
    write_pointer,
)
from exporter.sim.model import Fault

if TYPE_CHECKING:
    from exporter.sim.library import SimulatedNvml

# nvmlEventType bits
SINGLE_BIT_ECC = 0x1
DOUBLE_BIT_ECC = 0x2
PSTATE = 0x4
XID_CRITICAL_ERROR = 0x8
CLOCK = 0x10

_NOT_IN_MIG = 0xFFFFFFFF
# XIDs raised on an application's channel: the "application errors" of NVIDIA's
# k8s-device-plugin (health.go: 13, 31, 43, 45, 68), which the kernel driver reports with the
# channel's partition (open-gpu-kernel-modules krcErrorSendEventNotifications_KERNEL passes
# partitionAttributionId to gpuNotifySubDeviceEvent). A scenario does not say which instance
# ran the application: the simulator gives them to the GPU's first MIG instance. Other XIDs
# (48, 79, 94, ...) affect the whole device.
INSTANCE_XIDS = frozenset({13, 31, 43, 45, 68})
_POLL_SECONDS = 0.005

_SET_BASE = 0x6E7800000000
_SET_STRIDE = 0x40


@dataclass(frozen=True)
class Event:
    """One event of the scenario: when, on which GPU, its type and its data (the XID)."""

    at: float
    gpu: int
    kind: int
    data: int


# Whether the caller receives an event (see `privileges.sees_instance_events`).
Visible = Callable[[Event], bool]


@dataclass
class _EventSet:
    masks: dict[int, int] = field(default_factory=dict)  # GPU index -> registered types
    delivered: set[Event] = field(default_factory=set)
    # A wait returned an event and its caller has not waited again: it is still handling it.
    handling: bool = False


def scenario_events(faults: tuple[Fault, ...]) -> list[Event]:
    """The events a scenario's faults raise, in time order (then GPU order)."""
    events = []
    for fault in faults:
        if fault.gpu is None:
            continue
        if fault.kind == "xid":
            events.append(Event(fault.at, fault.gpu, XID_CRITICAL_ERROR, fault.code))
        elif fault.kind == "ecc_uncorrectable":
            events.append(Event(fault.at, fault.gpu, DOUBLE_BIT_ECC, 0))
    return sorted(events, key=lambda e: (e.at, e.gpu, e.kind, e.data))


class EventSets:
    """The event sets created on one simulated library, thread-safe."""

    def __init__(self, faults: tuple[Fault, ...]) -> None:
        self.events = scenario_events(faults)
        self._lock = threading.Lock()
        self._sets: dict[int, _EventSet] = {}
        self._created = 0

    @property
    def open(self) -> int:
        """How many event sets exist (created and not freed)."""
        with self._lock:
            return len(self._sets)

    def create(self) -> int:
        """Create an empty event set and return its address."""
        with self._lock:
            self._created += 1
            handle = _SET_BASE + self._created * _SET_STRIDE
            self._sets[handle] = _EventSet()
        return handle

    def free(self, handle: int) -> bool:
        """Free an event set; False when it does not exist."""
        with self._lock:
            return self._sets.pop(handle, None) is not None

    def register(self, handle: int, gpu: int, kinds: int) -> bool:
        """Add event types of one GPU to a set; False when the set does not exist."""
        with self._lock:
            event_set = self._sets.get(handle)
            if event_set is None:
                return False
            event_set.masks[gpu] = event_set.masks.get(gpu, 0) | kinds
        return True

    def _pending(
        self, event_set: _EventSet, visible: Visible, until: float = math.inf
    ) -> Iterator[Event]:
        """The set's registered, undelivered ``visible`` events at or before ``until``, in order.

        Called with the lock held.
        """
        for event in self.events:
            if event.at > until:
                return
            wanted = event_set.masks.get(event.gpu, 0) & event.kind
            if wanted and event not in event_set.delivered and visible(event):
                yield event

    def awaiting(self, handle: int, visible: Visible = lambda event: True) -> bool:
        """Whether the set has any ``visible`` event still to deliver, now or later."""
        with self._lock:
            event_set = self._sets.get(handle)
            return (
                event_set is not None and next(self._pending(event_set, visible), None) is not None
            )

    def settled(self, now: float, visible: Visible = lambda event: True) -> bool:
        """Whether every set has delivered its events up to ``now`` and its waiter handled them.

        A hand-moved clock waits for this before a collection (`SimulatedNvml.settle_events`),
        so that the cycle at a time counts the events of that time on any machine, not those a
        busy machine's event thread happened to take by then.
        """
        with self._lock:
            return not any(
                event_set.handling or next(self._pending(event_set, visible, now), None)
                for event_set in self._sets.values()
            )

    def waiting(self, handle: int) -> None:
        """A thread waits on the set again: whatever it took before is handled."""
        with self._lock:
            event_set = self._sets.get(handle)
            if event_set is not None:
                event_set.handling = False

    def take(
        self, handle: int, now: float, visible: Visible = lambda event: True
    ) -> Event | bool | None:
        """The set's next undelivered ``visible`` event at or before ``now`` (marked delivered).

        Returns None when there is none yet and False when the set does not exist.
        """
        with self._lock:
            event_set = self._sets.get(handle)
            if event_set is None:
                return False
            event = next(self._pending(event_set, visible, now), None)
            if event is not None:
                event_set.delivered.add(event)
                event_set.handling = True
            return event


def _supported(call: Call) -> int:
    kinds = XID_CRITICAL_ERROR | PSTATE | CLOCK
    return kinds if call.device.lacks("ecc") else kinds | SINGLE_BIT_ECC | DOUBLE_BIT_ECC


@system("nvmlEventSetCreate")
def _create(call: Call, ref: Any) -> int:
    return write_pointer(ref, call.sim.event_sets.create())


@system("nvmlEventSetFree")
def _free(call: Call, handle: Any) -> int:
    return SUCCESS if call.sim.event_sets.free(address(handle)) else INVALID_ARGUMENT


@device("nvmlDeviceGetSupportedEventTypes")
def _supported_types(call: Call, ref: Any) -> int:
    target(ref).value = _supported(call)
    return SUCCESS


@device("nvmlDeviceRegisterEvents")
def _register(call: Call, kinds: Any, handle: Any) -> int:
    wanted = integer(kinds)
    if wanted & ~_supported(call):
        return NOT_SUPPORTED
    registered = call.sim.event_sets.register(address(handle), call.device.index, wanted)
    return SUCCESS if registered else INVALID_ARGUMENT


def instance_of(sim: SimulatedNvml, event: Event) -> MigDevice | None:
    """The MIG instance an event belongs to; None for one that affects the whole GPU."""
    instances = sim.gpus[event.gpu].mig
    if event.kind == XID_CRITICAL_ERROR and event.data in INSTANCE_XIDS and instances:
        return instances[0]
    return None


def visible_to(sim: SimulatedNvml) -> Visible:
    """Which events the scenario's caller receives (a MIG instance's only when privileged)."""
    privileged = privileges.sees_instance_events(sim.scenario.caller)
    return lambda event: privileged or instance_of(sim, event) is None


def settle(sim: SimulatedNvml, timeout: float = 30.0) -> None:
    """Wait until the waiting threads have taken and handled every event due by now.

    Bounded: a set nobody waits on any more (its thread died) is given up after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    visible = visible_to(sim)
    while not sim.event_sets.settled(sim.elapsed(), visible) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS / 5)


@system("nvmlEventSetWait_v2")
def _wait(call: Call, handle: Any, ref: Any, timeout_ms: Any) -> int:
    sets, sim = call.sim.event_sets, call.sim
    visible = visible_to(sim)
    sets.waiting(address(handle))
    deadline = time.monotonic() + integer(timeout_ms) / 1000
    while True:
        event = sets.take(address(handle), sim.elapsed(), visible)
        if event is False:
            return INVALID_ARGUMENT
        if isinstance(event, Event):
            return _write_event(call, ref, event)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return TIMEOUT
        # Polled while an event may still come (the scenario clock may be a test's); with none
        # left, the wait blocks for its whole timeout, as the driver's does, costing no CPU.
        more = sets.awaiting(address(handle), visible)
        time.sleep(min(_POLL_SECONDS, remaining) if more else remaining)


def _write_event(call: Call, ref: Any, event: Event) -> int:
    instance = instance_of(call.sim, event)
    data = records.EventData(
        device=call.sim.gpus[event.gpu].handle_address,
        eventType=event.kind,
        eventData=event.data,
        gpuInstanceId=_NOT_IN_MIG if instance is None else instance.gpu_instance_id,
        computeInstanceId=_NOT_IN_MIG if instance is None else instance.compute_instance_id,
    )
    records.write(ref, data)
    return SUCCESS
