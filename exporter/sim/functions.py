"""The NVML C functions the simulator implements, with pynvml's argument conventions.

Each handler receives a :class:`Call` (the simulated library, the GPU the call is about and the
scenario time it reads) followed by the remaining ctypes arguments exactly as pynvml passes them:
outputs as ``byref(...)`` (a CArgObject whose ``_obj`` is the target), string buffers as
``c_char`` arrays, arrays of structs for the two-call size protocols. A handler writes its outputs
and returns an ``nvmlReturn_t``; it reads and writes structs and arrays of records in the driver's
own layout (:mod:`~exporter.sim.records`), checking their version fields as the driver does.
Handlers register themselves under their C names in :data:`FUNCTIONS`;
:class:`~exporter.sim.library.SimulatedNvml` applies faults and dispatches.
This module holds the registry and the core device and system functions; the newer families
(GPM, NVLink, events, memory errors, MIG) register from their own modules with :func:`device`
and :func:`system`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.sim import branches, privileges, records
from exporter.sim.device import SAMPLES_PER_SECOND, MigDevice, RunningProcess, SimulatedGpu
from exporter.sim.features import FEATURE_OF, READINGS, Reading

if TYPE_CHECKING:
    from exporter.sim.library import SimulatedNvml

# nvmlReturn_t values (nvml.h).
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
NO_PERMISSION = 4
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25

# nvmlValueType_t
_UNSIGNED_INT = 1
_UNSIGNED_LONG_LONG = 3

ALL_ONES = 2**64 - 1  # ctypes truncates it to the width of the target field
_ABSURD_TEMPERATURE = 4000

_ERROR_STRINGS = {
    0: "Success",
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    8: "Insufficient External Power",
    9: "Driver Not Loaded",
    10: "Timeout",
    11: "Interrupt Request Issue",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    19: "In use by another client",
    20: "Insufficient Memory",
    21: "No data",
    25: "Argument version mismatch",
    27: "Not Ready",
    28: "GPU not found",
    999: "Unknown Error",
}

INIT_FUNCTIONS = frozenset({"nvmlInitWithFlags", "nvmlInit_v2", "nvmlInit"})


def integer(arg: Any) -> int:
    """The integer behind a ctypes scalar or a plain Python int argument."""
    return int(arg.value) if hasattr(arg, "value") else int(arg)


def target(ref: Any) -> Any:
    """The object behind ``byref(x)`` (a CArgObject whose ``_obj`` is x), or ``ref`` itself."""
    return getattr(ref, "_obj", ref)


def address(pointer: Any) -> int:
    """The address held by a ctypes pointer argument (an opaque handle); 0 for NULL or None."""
    if pointer is None:
        return 0
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def write_pointer(ref: Any, value: int) -> int:
    """Store the fake address ``value`` in the pointer behind ``byref(pointer)``."""
    pointer = target(ref)
    raw = ctypes.c_void_p(value)
    ctypes.memmove(ctypes.addressof(pointer), ctypes.byref(raw), ctypes.sizeof(raw))
    return SUCCESS


def put_string(buffer: Any, size: Any, text: str) -> int:
    """Write ``text`` into a C string buffer of ``size`` bytes, or answer INSUFFICIENT_SIZE."""
    encoded = text.encode()
    if len(encoded) + 1 > integer(size):
        return INSUFFICIENT_SIZE
    buffer.value = encoded
    return SUCCESS


def _c_string(arg: Any) -> str:
    raw = arg.value if hasattr(arg, "value") else arg
    return raw.decode() if isinstance(raw, bytes) else str(raw or "")


@dataclass
class Call:
    """One C function call in progress: the time it reads and where its outputs go."""

    sim: SimulatedNvml
    name: str
    t: float
    gpu: SimulatedGpu | None = None
    sentinel: bool = False
    mig: MigDevice | None = None  # set when the handle is a MIG device's (gpu is its parent)

    @property
    def device(self) -> SimulatedGpu:
        """The GPU the call is about (device functions only)."""
        assert self.gpu is not None, "device function called without a device"
        return self.gpu

    @property
    def now_us(self) -> int:
        """Unix time of the call in microseconds, as NVML timestamps are."""
        return self.sim.unix_us(self.t)

    def value(self, metric: str) -> float:
        """The device's reading of ``metric`` at the call's time."""
        return self.device.value(metric, self.t)

    def put(self, ref: Any, value: float, sentinel: int = ALL_ONES) -> int:
        """Write a measured scalar output (or its sentinel) and return SUCCESS."""
        target(ref).value = sentinel if self.sentinel else round(value)
        return SUCCESS

    def put_record(self, ref: Any, record: ctypes.Structure, **fields: float) -> int:
        """Write the driver's own record, its measured fields set (or sentinels); return SUCCESS.

        The record's bytes go over the caller's struct (`records.write`), whatever its layout.
        """
        for field, value in fields.items():
            setattr(record, field, ALL_ONES if self.sentinel else round(value))
        records.write(ref, record)
        return SUCCESS


Handler = Callable[..., Any]
Locator = Callable[["SimulatedNvml", tuple[Any, ...]], "SimulatedGpu | MigDevice | int"]


def _by_handle(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | MigDevice | int:
    return sim.gpu_by_handle(args[0])


@dataclass(frozen=True)
class Function:
    """A registered C function: its handler and how to find the GPU it is about."""

    handler: Handler
    locate: Locator | None = None  # finds the GPU of a device function; None for system ones
    feature: str | None = None  # the optional GPU feature the call needs (features.FEATURE_OF)
    drop_handle: bool = True  # the handle argument is consumed by the locator
    mig: bool = False  # accepts MIG device handles (others answer NOT_SUPPORTED for them)


FUNCTIONS: dict[str, Function] = {}


def system(*names: str) -> Callable[[Handler], Handler]:
    """Register a handler for system-wide C functions (no device argument)."""

    def register(handler: Handler) -> Handler:
        for name in names:
            FUNCTIONS[name] = Function(handler)
        return handler

    return register


def device(
    *names: str,
    locate: Locator | None = None,
    mig: bool = False,
    keep_handle: bool = False,
) -> Callable[[Handler], Handler]:
    """Register a handler for C functions about one device, found from their first argument.

    ``locate`` replaces the handle lookup (handle-by-index and the like); ``keep_handle`` passes
    the located argument on to the handler as well; ``mig`` lets MIG device handles through. The
    optional feature a function needs is the one :data:`exporter.sim.features.FEATURES` names.
    """

    def register(handler: Handler) -> Handler:
        drop = locate is None and not keep_handle
        for name in names:
            feature = FEATURE_OF.get(name)
            FUNCTIONS[name] = Function(handler, locate or _by_handle, feature, drop, mig)
        return handler

    return register


# ---------------------------------------------------------------------------------------------
# System functions


def error_string(code: Any) -> bytes:
    """The description nvmlErrorString returns for an nvmlReturn_t."""
    return _ERROR_STRINGS.get(integer(code), "Unknown Error").encode()


@system("nvmlErrorString")
def _error_string_handler(call: Call, code: Any) -> Any:
    return error_string(code)


@system("nvmlInitWithFlags", "nvmlInit_v2", "nvmlInit")
def _init(call: Call, *flags: Any) -> int:
    return call.sim.open_session()


@system("nvmlShutdown")
def _shutdown(call: Call) -> int:
    return call.sim.close_session()


@system("nvmlSystemGetDriverVersion")
def _driver_version(call: Call, buffer: Any, size: Any) -> int:
    return put_string(buffer, size, call.sim.scenario.driver.version)


@system("nvmlSystemGetNVMLVersion")
def _nvml_version(call: Call, buffer: Any, size: Any) -> int:
    return put_string(buffer, size, call.sim.scenario.driver.nvml_version)


@system("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def _cuda_version(call: Call, ref: Any) -> int:
    return call.put(ref, call.sim.scenario.driver.cuda_version)


@system("nvmlDeviceGetCount_v2")
def _count(call: Call, ref: Any) -> int:
    target(ref).value = len(call.sim.gpus)
    return SUCCESS


@system("nvmlSystemGetProcessName")
def _process_name(call: Call, pid: Any, buffer: Any, size: Any) -> int:
    wanted = integer(pid)
    for gpu in call.sim.gpus:
        for kind in ("compute", "graphics"):
            for process in gpu.processes(call.t, kind):
                if process.pid == wanted:
                    return put_string(buffer, size, process.name)
    return NOT_FOUND


# ---------------------------------------------------------------------------------------------
# Handles


def _write_handle(call: Call, ref: Any) -> int:
    return write_pointer(ref, call.device.handle_address)


def _locate_index(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    index = integer(args[0])
    return sim.gpus[index] if 0 <= index < len(sim.gpus) else INVALID_ARGUMENT


def _locate_uuid(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    uuid = _c_string(args[0])
    return next((gpu for gpu in sim.gpus if gpu.uuid == uuid), NOT_FOUND)


def _normalise_bus_id(text: str) -> tuple[int, ...] | None:
    try:
        domain, bus, rest = text.strip().split(":")
        slot, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16)
    except ValueError:
        return None


def _locate_pci(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    wanted = _normalise_bus_id(_c_string(args[0]))
    if wanted is None:
        return INVALID_ARGUMENT
    matches = (gpu for gpu in sim.gpus if _normalise_bus_id(gpu.pci_bus_id) == wanted)
    return next(matches, NOT_FOUND)


@device("nvmlDeviceGetHandleByIndex_v2", locate=_locate_index)
@device("nvmlDeviceGetHandleByUUID", locate=_locate_uuid)
@device("nvmlDeviceGetHandleByPciBusId_v2", locate=_locate_pci)
def _handle(call: Call, key: Any, ref: Any) -> int:
    return _write_handle(call, ref)


# ---------------------------------------------------------------------------------------------
# Identity


# The minor number (N of /dev/nvidiaN) as the index: every recorded machine in
# ../shared/reality numbers its single-GPU captures 0 ("Minor Number : 0"), and the driver
# numbers device nodes in PCI bus order, as NVML orders its indices.
@device("nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber")
def _index(call: Call, ref: Any) -> int:
    target(ref).value = call.device.index
    return SUCCESS


@device("nvmlDeviceGetName", mig=True)
def _name(call: Call, buffer: Any, size: Any) -> int:
    name = call.mig.name if call.mig else call.device.model.name
    return put_string(buffer, size, name)


@device("nvmlDeviceGetUUID", mig=True)
def _uuid(call: Call, buffer: Any, size: Any) -> int:
    return put_string(buffer, size, call.mig.uuid if call.mig else call.device.uuid)


@device("nvmlDeviceGetSerial")
def _serial(call: Call, buffer: Any, size: Any) -> int:
    return put_string(buffer, size, call.device.serial)


@device("nvmlDeviceGetVbiosVersion")
def _vbios(call: Call, buffer: Any, size: Any) -> int:
    return put_string(buffer, size, call.device.model.vbios)


@device("nvmlDeviceGetBrand")
def _brand(call: Call, ref: Any) -> int:
    target(ref).value = call.device.model.brand
    return SUCCESS


@device("nvmlDeviceGetArchitecture")
def _architecture(call: Call, ref: Any) -> int:
    target(ref).value = call.device.model.architecture
    return SUCCESS


@device("nvmlDeviceGetCudaComputeCapability")
def _compute_capability(call: Call, major: Any, minor: Any) -> int:
    target(major).value, target(minor).value = call.device.model.compute_capability
    return SUCCESS


@device("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2")
def _pci_info(call: Call, ref: Any) -> int:
    # _v3 writes busIdLegacy and the 32-byte busId; _v2 the older layout, busId only (16 bytes).
    gpu = call.device
    short_id = f"{gpu.pci_domain:04X}:{gpu.pci_bus:02X}:{gpu.pci_device:02X}.0".encode()
    identity = {
        "domain": gpu.pci_domain,
        "bus": gpu.pci_bus,
        "device": gpu.pci_device,
        "pciDeviceId": gpu.model.pci_device_id,
        "pciSubSystemId": gpu.model.pci_subsystem_id,
    }
    if call.name.endswith("_v2"):
        records.write(ref, records.PciInfoV2(busId=short_id, **identity))
    else:
        info = records.PciInfo(busIdLegacy=short_id, busId=gpu.pci_bus_id.encode(), **identity)
        records.write(ref, info)
    return SUCCESS


# ---------------------------------------------------------------------------------------------
# Utilization, memory, PCIe


@device("nvmlDeviceGetUtilizationRates")
def _utilization(call: Call, ref: Any) -> int:
    if call.device.mig:
        # Whole-GPU utilization does not exist in MIG mode; GPM per instance replaces it.
        return NOT_SUPPORTED
    return call.put_record(
        ref,
        records.Utilization(),
        gpu=call.value("utilization") * 100,
        memory=call.value("memory_utilization") * 100,
    )


def _memory(call: Call) -> tuple[int, int, int, int]:
    return call.mig.memory(call.t) if call.mig else call.device.memory(call.t)


@device("nvmlDeviceGetMemoryInfo", mig=True)
def _memory_v1(call: Call, ref: Any) -> int:
    # Version 1 counts the reserved memory as used, which is why v2 exists.
    total, reserved, used, free = _memory(call)
    return call.put_record(ref, records.Memory(), total=total, free=free, used=used + reserved)


@device("nvmlDeviceGetMemoryInfo_v2", mig=True)
def _memory_v2(call: Call, ref: Any) -> int:
    request = records.read(ref, records.MemoryV2)
    if request.version != records.MEMORY_V2:
        # Drivers answer FUNCTION_NOT_FOUND here, not ARGUMENT_VERSION_MISMATCH: nvidia-settings
        # issue 78 (510.39.01, version 2), dxvk-nvapi PR 198 (version 2), lupine PR 366 (0, 2026).
        return FUNCTION_NOT_FOUND
    total, reserved, used, free = _memory(call)
    return call.put_record(ref, request, total=total, reserved=reserved, free=free, used=used)


@device("nvmlDeviceGetBAR1MemoryInfo")
def _bar1(call: Call, ref: Any) -> int:
    gpu = call.device
    phase, _ = gpu.timeline.locate(call.t)
    if "bar1_used" in phase.specs:
        used = min(gpu.model.bar1_total, int(call.value("bar1_used")))
    else:
        processes = len(gpu.processes(call.t, "compute")) + len(gpu.processes(call.t, "graphics"))
        used = min(gpu.model.bar1_total, (2 + 4 * processes) * 2**20)
    return call.put_record(
        ref,
        records.Bar1Memory(),
        bar1Total=gpu.model.bar1_total,
        bar1Used=used,
        bar1Free=gpu.model.bar1_total - used,
    )


def _scalar_device(name: str, read: Callable[[SimulatedGpu], int]) -> None:
    """Register a device function that writes one static integer."""

    def handler(call: Call, ref: Any) -> int:
        target(ref).value = read(call.device)
        return SUCCESS

    device(name)(handler)


_scalar_device("nvmlDeviceGetCurrPcieLinkGeneration", lambda g: g.model.pcie_generation)
_scalar_device("nvmlDeviceGetMaxPcieLinkGeneration", lambda g: g.model.pcie_max_generation)
_scalar_device("nvmlDeviceGetGpuMaxPcieLinkGeneration", lambda g: g.model.pcie_gpu_max_generation)
_scalar_device("nvmlDeviceGetCurrPcieLinkWidth", lambda g: g.model.pcie_width)
_scalar_device("nvmlDeviceGetMaxPcieLinkWidth", lambda g: g.model.pcie_max_width)
_scalar_device("nvmlDeviceGetMemoryBusWidth", lambda g: g.model.memory_bus_width)
_scalar_device("nvmlDeviceGetPersistenceMode", lambda g: int(g.spec.persistence_mode))
_scalar_device("nvmlDeviceGetComputeMode", lambda g: g.spec.compute_mode)
_scalar_device("nvmlDeviceGetDisplayActive", lambda g: int(g.spec.display_active))
_scalar_device("nvmlDeviceGetDisplayMode", lambda g: int(g.spec.display_active))
_scalar_device("nvmlDeviceGetNumFans", lambda g: g.model.fans)


@device("nvmlDeviceGetPcieReplayCounter")
def _replays(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.pcie_replays(call.t))


@device("nvmlDeviceGetPcieThroughput")
def _pcie_throughput(call: Call, counter: Any, ref: Any) -> int:
    metric = {0: "pcie_tx", 1: "pcie_rx"}.get(integer(counter))
    if metric is None:
        return INVALID_ARGUMENT
    # NVML reports KB/s where KB is 1024 bytes.
    return call.put(ref, call.value(metric) / 1024)


# ---------------------------------------------------------------------------------------------
# Temperature, power, energy


def _temperature(call: Call, sensor: int) -> float | None:
    return call.value("temperature") if sensor == 0 else None


@device("nvmlDeviceGetTemperature")
def _temperature_v1(call: Call, sensor: Any, ref: Any) -> int:
    value = _temperature(call, integer(sensor))
    if value is None:
        return INVALID_ARGUMENT
    return call.put(ref, value, sentinel=_ABSURD_TEMPERATURE)


@device("nvmlDeviceGetTemperatureV")
def _temperature_v(call: Call, ref: Any) -> int:
    request = records.read(ref, records.Temperature)
    if request.version != records.TEMPERATURE_V1:
        # nvml.h :1330 "The provided version is invalid/unsupported"; the function's own list of
        # answers omits it, and no report of what drivers answer instead was found.
        return ARGUMENT_VERSION_MISMATCH
    value = _temperature(call, request.sensorType)
    if value is None:
        return INVALID_ARGUMENT
    request.temperature = _ABSURD_TEMPERATURE if call.sentinel else round(value)
    records.write(ref, request)
    return SUCCESS


@device("nvmlDeviceGetTemperatureThreshold")
def _temperature_threshold(call: Call, kind: Any, ref: Any) -> int:
    model = call.device.model
    thresholds = {0: model.temp_shutdown, 1: model.temp_slowdown, 3: model.temp_gpu_max}
    if not call.device.lacks("memory_temperature"):
        thresholds[2] = model.temp_memory_max
    value = thresholds.get(integer(kind))
    if value is None:
        return NOT_SUPPORTED
    return call.put(ref, value)


def _power_mw(call: Call, average: bool) -> float:
    if average:
        return call.device.average("power", call.t) * 1000
    return call.value("power") * 1000


@device("nvmlDeviceGetPowerUsage")
def _power_usage(call: Call, ref: Any) -> int:
    # A 1 s average on Ampere (not GA100) and newer, instantaneous on older GPUs.
    return call.put(ref, _power_mw(call, call.device.model.power_reading == "average"))


@device("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")
def _power_limit(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.model.power_limit * 1000)


@device("nvmlDeviceGetPowerManagementDefaultLimit")
def _power_default_limit(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.model.power_default_limit * 1000)


@device("nvmlDeviceGetPowerManagementLimitConstraints")
def _power_constraints(call: Call, low: Any, high: Any) -> int:
    call.put(low, call.device.model.power_min_limit * 1000)
    return call.put(high, call.device.model.power_max_limit * 1000)


@device("nvmlDeviceGetTotalEnergyConsumption")
def _energy(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.cumulative("power", call.t) * 1000)


# ---------------------------------------------------------------------------------------------
# Clocks, performance state, fans, codecs


_CLOCK_METRICS = {0: "graphics_clock", 1: "sm_clock", 2: "memory_clock", 3: "video_clock"}


@device("nvmlDeviceGetClockInfo")
def _clock(call: Call, kind: Any, ref: Any) -> int:
    metric = _CLOCK_METRICS.get(integer(kind))
    if metric is None:
        return INVALID_ARGUMENT
    return call.put(ref, call.value(metric))


@device("nvmlDeviceGetMaxClockInfo")
def _max_clock(call: Call, kind: Any, ref: Any) -> int:
    model = call.device.model
    maxima = {
        0: model.max_graphics_clock,
        1: model.max_sm_clock,
        2: model.max_memory_clock,
        3: model.max_video_clock,
    }
    value = maxima.get(integer(kind))
    if value is None:
        return INVALID_ARGUMENT
    return call.put(ref, value)


@device(
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)
def _clock_reasons(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.clock_event_reasons(call.t))


@device(
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
)
def _supported_clock_reasons(call: Call, ref: Any) -> int:
    return call.put(ref, 0x1FF)


@device("nvmlDeviceGetPerformanceState", "nvmlDeviceGetPowerState")
def _pstate(call: Call, ref: Any) -> int:
    target(ref).value = 0 if call.device.busy(call.t) else 8
    return SUCCESS


@device("nvmlDeviceGetFanSpeed")
def _fan(call: Call, ref: Any) -> int:
    if not call.device.model.fans:
        return NOT_SUPPORTED
    return call.put(ref, call.value("fan") * 100)


@device("nvmlDeviceGetFanSpeed_v2")
def _fan_v2(call: Call, fan: Any, ref: Any) -> int:
    if not call.device.model.fans:
        return NOT_SUPPORTED
    if not 0 <= integer(fan) < call.device.model.fans:
        return INVALID_ARGUMENT
    return call.put(ref, call.value("fan") * 100)


def _answer(reading: Reading) -> Handler:
    """The handler of a table-driven reading: each output from its scenario metric's curve."""

    def answer(call: Call, *refs: Any) -> int:
        if reading.whole_gpu and call.device.mig:
            return NOT_SUPPORTED
        values = refs[: len(reading.outputs)]
        if reading.period_us is not None:
            target(refs[len(reading.outputs)]).value = reading.period_us
        for ref, output in zip(values, reading.outputs, strict=True):
            call.put(ref, call.value(output.metric) * output.nvml_per_unit)
        return SUCCESS

    return answer


for _reading in READINGS:
    device(_reading.function)(_answer(_reading))


# ---------------------------------------------------------------------------------------------
# Driver model


@device("nvmlDeviceGetDriverModel", "nvmlDeviceGetDriverModel_v2")
def _driver_model(call: Call, current: Any, pending: Any) -> int:
    # WDDM/TCC driver models exist only on Windows; Linux drivers answer NOT_SUPPORTED.
    return NOT_SUPPORTED


# ---------------------------------------------------------------------------------------------
# Processes


def _processes(call: Call, kind: str) -> list[RunningProcess]:
    if not privileges.sees_processes(call.sim.scenario.caller):
        return []
    return (call.mig or call.device).processes(call.t, kind)


def _process_record(call: Call) -> type[ctypes.Structure]:
    """The record this driver writes for the list function called (see `branches`)."""
    if not call.name.endswith(("_v2", "_v3")):
        return records.ProcessInfoV1
    version = branches.parse(call.sim.scenario.driver.version)
    if call.name.endswith("_v3") and branches.EARLY_R535_PROCESS_RECORD.include(version):
        return records.ProcessInfoEarlyR535
    return records.ProcessInfoV2


def _process_list(call: Call, kind: str, count_ref: Any, infos: Any) -> int:
    processes = _processes(call, kind)
    count = target(count_ref)
    capacity = count.value
    count.value = len(processes)
    if infos is None or capacity < len(processes):
        # Size query: SUCCESS with 0 when there is nothing to list, as NVML answers.
        return INSUFFICIENT_SIZE if processes else SUCCESS
    # The driver writes records of its own size, whatever struct the caller declared: a caller
    # whose struct is the wrong size reads garbage from the second record on, as on hardware.
    rows = (_process_record(call) * len(processes))()
    for row, process in zip(rows, processes, strict=True):
        row.pid = process.pid
        row.usedGpuMemory = ALL_ONES if call.sentinel else process.memory
        if hasattr(row, "gpuInstanceId"):
            row.gpuInstanceId = process.gpu_instance_id
            row.computeInstanceId = process.compute_instance_id
    records.write(infos, rows)
    return SUCCESS


@device(
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    mig=True,
)
def _compute_processes(call: Call, count: Any, infos: Any) -> int:
    return _process_list(call, "compute", count, infos)


@device(
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
    mig=True,
)
def _graphics_processes(call: Call, count: Any, infos: Any) -> int:
    return _process_list(call, "graphics", count, infos)


@dataclass(frozen=True)
class _ProcessLoad:
    """One process's utilization sample, in percent."""

    pid: int
    stamp: int
    sm: int
    memory: int
    encoder: int
    decoder: int


def _process_loads(call: Call, last_seen: int) -> list[_ProcessLoad] | int:
    """Per-process utilization at the call's time, or an error code.

    The GPU's utilization is split across its processes in proportion to their ``weight``
    (evenly by default); NOT_FOUND when none of them used an engine or ``last_seen`` is not
    older than now.
    """
    gpu = call.device
    if gpu.mig:
        return NOT_SUPPORTED  # per-process accounting is per MIG instance, not simulated
    processes = gpu.processes(call.t, "compute") + gpu.processes(call.t, "graphics")
    if not processes or call.now_us <= last_seen:
        return NOT_FOUND
    total = sum(process.weight for process in processes)
    loads = [
        _ProcessLoad(
            process.pid,
            call.now_us,
            round(call.value("utilization") * share),
            round(call.value("memory_utilization") * share),
            round(call.value("encoder_utilization") * share),
            round(call.value("decoder_utilization") * share),
        )
        for process in processes
        for share in (100.0 * process.weight / total,)
    ]
    # The driver samples only processes that used an engine; none: NOT_FOUND (nvml-facts.md,
    # "Idle sample rings run dry"; nvml.h: "NVML_ERROR_NOT_FOUND if sample entries are not found").
    busy = [load for load in loads if load.sm or load.memory or load.encoder or load.decoder]
    return busy or NOT_FOUND


def _load_records(record: type[ctypes.Structure], loads: list[_ProcessLoad]) -> Any:
    """The driver's array of ``record`` (nvmlProcessUtilizationSample_t or ..Info_v1_t)."""
    rows = (record * len(loads))()
    for row, load in zip(rows, loads, strict=True):
        row.pid, row.timeStamp = load.pid, load.stamp
        row.smUtil, row.memUtil = load.sm, load.memory
        row.encUtil, row.decUtil = load.encoder, load.decoder
    return rows


@device("nvmlDeviceGetProcessUtilization")
def _process_utilization(call: Call, samples: Any, count_ref: Any, last_seen: Any) -> int:
    loads = _process_loads(call, integer(last_seen))
    if isinstance(loads, int):
        return loads
    count = target(count_ref)
    capacity = count.value
    count.value = len(loads)
    if samples is None or capacity < len(loads):
        return INSUFFICIENT_SIZE
    records.write(samples, _load_records(records.ProcessUtilizationSample, loads))
    return SUCCESS


@device("nvmlDeviceGetProcessesUtilizationInfo")
def _processes_utilization_info(call: Call, ref: Any) -> int:
    info = records.read(ref, records.ProcessesUtilizationInfo)
    if info.version != records.PROCESSES_UTILIZATION_INFO_V1:
        return ARGUMENT_VERSION_MISMATCH  # nvml.h :8590 "If the version ... is invalid"
    loads = _process_loads(call, info.lastSeenTimeStamp)
    if isinstance(loads, int):
        return loads
    capacity = info.processSamplesCount
    info.processSamplesCount = len(loads)
    records.write(ref, info)
    if not info.procUtilArray or capacity < len(loads):
        return INSUFFICIENT_SIZE
    # The caller's array holds `capacity` records of the size its own struct declares for them.
    offset = records.ProcessesUtilizationInfo.procUtilArray.offset
    record_size = records.declared_size(ref, offset, ctypes.sizeof(records.ProcessUtilizationInfo))
    rows = _load_records(records.ProcessUtilizationInfo, loads)
    records.write_at(info.procUtilArray, rows, capacity * record_size)
    return SUCCESS


# ---------------------------------------------------------------------------------------------
# Samples


# nvmlSamplingType_t -> (metric, scale to NVML units, feature needed)
_SAMPLE_TYPES: dict[int, tuple[str, float, str | None]] = {
    0: ("power", 1000.0, None),
    1: ("utilization", 100.0, None),
    2: ("memory_utilization", 100.0, None),
    3: ("encoder_utilization", 100.0, "encoder"),
    4: ("decoder_utilization", 100.0, "decoder"),
    5: ("sm_clock", 1.0, None),
    6: ("memory_clock", 1.0, None),
}


# Utilization the driver samples only while the GPU is not idle: an idle GPU adds no sample and
# the call answers NOT_FOUND (nvml.h: "NVML_ERROR_NOT_FOUND if sample entries are not found";
# rings dry for minutes on an idle GPU, polarsignals/gpu-metrics-agent PR 37). Power and clocks
# keep coming. Idle here: nothing running and the engine at 0%, so a job's troughs are sampled.
_BUSY_ONLY = frozenset(
    {"utilization", "memory_utilization", "encoder_utilization", "decoder_utilization"}
)


def _idle(gpu: SimulatedGpu, metric: str, t: float) -> bool:
    if round(gpu.value(metric, t) * 100):
        return False
    return not gpu.processes(t, "compute") and not gpu.processes(t, "graphics")


@device("nvmlDeviceGetSamples")
def _samples(
    call: Call, sampling_type: Any, last_seen: Any, value_type: Any, count_ref: Any, samples: Any
) -> int:
    kind = _SAMPLE_TYPES.get(integer(sampling_type))
    if kind is None:
        return INVALID_ARGUMENT
    metric, scale, feature = kind
    gpu, sim = call.device, call.sim
    if feature and gpu.lacks(feature):
        return NOT_SUPPORTED
    if gpu.mig and metric in ("utilization", "memory_utilization"):
        return NOT_SUPPORTED
    seen = integer(last_seen)
    fresh = [
        (stamp, k)
        for k in gpu.sample_indices(call.t)
        if (stamp := sim.unix_us(k / SAMPLES_PER_SECOND)) > seen
        and (metric not in _BUSY_ONLY or not _idle(gpu, metric, k / SAMPLES_PER_SECOND))
    ]
    if not fresh:
        return NOT_FOUND
    target(value_type).value = _UNSIGNED_INT
    count = target(count_ref)
    if samples is None:
        count.value = len(fresh)
        return SUCCESS
    # Oldest first, up to the count the caller gives as its array's size; later calls pick up
    # the rest.
    fresh = fresh[: count.value]
    rows = (records.Sample * len(fresh))()
    for row, (stamp, k) in zip(rows, fresh, strict=True):
        row.timeStamp = stamp
        value = gpu.value(metric, k / SAMPLES_PER_SECOND) * scale
        row.sampleValue.uiVal = ALL_ONES if call.sentinel else round(value)
    records.write(samples, rows)
    count.value = len(fresh)
    return SUCCESS


# ---------------------------------------------------------------------------------------------
# Field values


_NVLINK_THROUGHPUT_FIELDS = {138: "nvlink_tx", 139: "nvlink_rx"}
_NVLINK_LINK_COUNT = 91
# NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY / _RECOVERY (scope = link): the same counters as
# nvmlDeviceGetNvLinkErrorCounter's NVML_NVLINK_ERROR_DL_REPLAY (0) / _RECOVERY (1).
_NVLINK_ERROR_FIELDS = {161: 0, 162: 1}
# NVML_FI_DEV_NVLINK_ERROR_DL_CRC (scope = link, "NVLink CRC Error Counter"): NVML's change log
# v520->v525 says Hopper's per-link CRC counters (DL_CRC_FLIT / DL_CRC_DATA) were "removed in
# Hopper, replaced with" it, so on Hopper it counts what those two counted, summed. Before
# Hopper it stays unsupported: nvml.h does not say whether it counts flit CRC, data CRC or both.
_NVLINK_CRC_FIELD = 163
# NVML_FI_DEV_NVLINK_GET_STATE (scope = link): NVML_FEATURE_ENABLED (1) for an active link, as
# nvmlDeviceGetNvLinkState answers; NCCL reads it this way on Hopper.
_NVLINK_STATE_FIELD = 165
_NVLINK_FIELDS = {
    *_NVLINK_THROUGHPUT_FIELDS,
    *_NVLINK_ERROR_FIELDS,
    _NVLINK_CRC_FIELD,
    _NVLINK_LINK_COUNT,
    _NVLINK_STATE_FIELD,
}
# NVML_DEVICE_ARCH_ADA / _HOPPER / _BLACKWELL (nvml.h).
_ADA, _HOPPER, _BLACKWELL = 8, 9, 10
# nvml.h on fields 161-163: "This is unsupported for Blackwell+. Please use
# NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*".
_NOT_ON_BLACKWELL = {*_NVLINK_ERROR_FIELDS, _NVLINK_CRC_FIELD}
# nvmlDeviceGetNvLinkErrorCounter's NVML_NVLINK_ERROR_DL_CRC_FLIT (2) and _CRC_DATA (3).
_NVLINK_CRC_COUNTERS = (2, 3)


def _nvlink_field(gpu: SimulatedGpu, field_id: int, link: int, t: float) -> tuple[int, float] | int:
    """NVLink fields: the link count, or a link's traffic (KiB), errors or state (scope = link)."""
    if gpu.lacks("nvlink"):
        return NOT_SUPPORTED
    if field_id == _NVLINK_LINK_COUNT:
        return _UNSIGNED_INT, gpu.model.nvlink_links
    if field_id in _NVLINK_ERROR_FIELDS and gpu.lacks("nvlink_error_fields"):
        return NOT_SUPPORTED
    if field_id == _NVLINK_STATE_FIELD and gpu.lacks("nvlink_state_field"):
        return NOT_SUPPORTED
    architecture = gpu.model.architecture
    if field_id in _NOT_ON_BLACKWELL and architecture >= _BLACKWELL:
        return NOT_SUPPORTED
    if field_id == _NVLINK_CRC_FIELD and architecture < _HOPPER:
        return NOT_SUPPORTED
    if not 0 <= link < gpu.model.nvlink_links:
        return INVALID_ARGUMENT
    if field_id == _NVLINK_STATE_FIELD:
        return _UNSIGNED_INT, int(gpu.link_up(link, t))
    if field_id in _NVLINK_ERROR_FIELDS:
        return _UNSIGNED_LONG_LONG, gpu.link_errors(link, _NVLINK_ERROR_FIELDS[field_id], t)
    if field_id == _NVLINK_CRC_FIELD:
        crc = sum(gpu.link_errors(link, counter, t) for counter in _NVLINK_CRC_COUNTERS)
        return _UNSIGNED_LONG_LONG, crc
    return _UNSIGNED_LONG_LONG, gpu.link_bytes(_NVLINK_THROUGHPUT_FIELDS[field_id], link, t) / 1024


# NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT (193), _SLOWDOWN_ (194), _MEM_MAX_ (195) and
# _GPU_MAX_ (196): "T.Limit temperature thresholds in degree Celsius", "supported on Ada and
# later" (nvml.h), margins to the max operating temperature, so negative past it. The recorded
# H100 and H200 show "GPU Shutdown T.Limit Temp : -8 C" (the L40S -5 C), "GPU Slowdown T.Limit
# Temp : -2 C", "GPU Max Operating T.Limit Temp : 0 C" and "Memory Max Operating T.Limit Temp :
# 0 C" (N/A on the GDDR L40S) (linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt,
# ..._h200-mig__590.48.01.txt, ..._l40s__595.80.txt). They come with NVML_VALUE_TYPE_SIGNED_INT
# (5), which appeared in the same releases (NS 525.125.06 :528, :1762-1765). Here they follow
# the model's thresholds; all ones in siVal is NVML_VALUE_NOT_AVAILABLE (-1, nvml.h).
_SIGNED_INT = 5
_TLIMIT_FIELDS = range(193, 197)


def _tlimit(gpu: SimulatedGpu, field_id: int) -> tuple[int, float] | int:
    """A T.Limit margin in degrees C (signed), or NOT_SUPPORTED before Ada or without HBM."""
    model = gpu.model
    if model.architecture < _ADA or (field_id == 195 and gpu.lacks("memory_temperature")):
        return NOT_SUPPORTED
    shutdown, slowdown = model.temp_shutdown, model.temp_slowdown
    margins = {193: model.temp_gpu_max - shutdown, 194: model.temp_gpu_max - slowdown}
    return _SIGNED_INT, margins.get(field_id, 0)


def _field(call: Call, field_id: int, scope: int) -> tuple[int, float] | int:
    """(value type, value) of one field id, or the error this GPU answers for it."""
    gpu, t = call.device, call.t
    if not branches.knows_field(call.sim.scenario.driver.version, field_id):
        return INVALID_ARGUMENT  # an id past this branch's NVML_FI_MAX
    if field_id in _NVLINK_FIELDS:
        return _nvlink_field(gpu, field_id, scope, t)
    if field_id in _TLIMIT_FIELDS:
        return _tlimit(gpu, field_id)
    model = gpu.model
    power_limits = {
        187: model.power_min_limit,
        188: model.power_max_limit,
        189: model.power_default_limit,
        190: model.power_limit,
    }
    if field_id == 82 and not gpu.lacks("memory_temperature"):
        return _UNSIGNED_INT, gpu.value("memory_temperature", t)
    if field_id == 83 and not gpu.lacks("energy"):
        return _UNSIGNED_LONG_LONG, gpu.cumulative("power", t) * 1000
    if field_id == 94 and not gpu.lacks("pcie_replay"):
        return _UNSIGNED_INT, gpu.pcie_replays(t)
    if field_id in (185, 186) and not gpu.lacks("power_fields"):
        return _UNSIGNED_INT, _power_mw(call, average=field_id == 185)
    if field_id in power_limits:
        return _UNSIGNED_INT, power_limits[field_id] * 1000
    if field_id in (197, 198) and not gpu.lacks("pcie_counters"):
        sent = gpu.cumulative("pcie_tx" if field_id == 197 else "pcie_rx", t)
        return _UNSIGNED_LONG_LONG, round(sent) % 2**call.sim.scenario.driver.pcie_counter_bits
    return NOT_SUPPORTED


# The nvmlValue_t member of each value type; ctypes truncates ALL_ONES to -1 in siVal.
_VALUE_MEMBERS = {_UNSIGNED_INT: "uiVal", _UNSIGNED_LONG_LONG: "ullVal", _SIGNED_INT: "siVal"}


@device("nvmlDeviceGetFieldValues")
def _field_values(call: Call, count: Any, ref: Any) -> int:
    values = target(ref)
    for slot in values[: integer(count)]:
        slot.timestamp = call.now_us
        slot.latencyUsec = 0
        field = _field(call, slot.fieldId, slot.scopeId)
        if isinstance(field, int):
            # Per-field status: one unsupported field does not fail the call.
            slot.nvmlReturn = field
            continue
        value_type, value = field
        slot.valueType, slot.nvmlReturn = value_type, SUCCESS
        member = _VALUE_MEMBERS.get(value_type, "ullVal")
        setattr(slot.value, member, ALL_ONES if call.sentinel else round(value))
    return SUCCESS
