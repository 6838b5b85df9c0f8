"""The NVML C functions the simulator implements, with pynvml's argument conventions.

Each handler receives a :class:`Call` (the simulated library, the GPU the call is about and the
scenario time it reads) followed by the remaining ctypes arguments exactly as pynvml passes them:
outputs as ``byref(...)`` (a CArgObject whose ``_obj`` is the target), string buffers as
``c_char`` arrays, arrays of structs for the two-call size protocols. A handler writes its outputs
and returns an ``nvmlReturn_t``. Handlers register themselves under their C names in
:data:`FUNCTIONS`; :class:`~exporter.sim.library.SimulatedNvml` applies faults and dispatches.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.sim.device import SAMPLES_PER_SECOND, SimulatedGpu

if TYPE_CHECKING:
    from exporter.sim.library import SimulatedNvml

# nvmlReturn_t values (nvml.h).
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
GPU_IS_LOST = 15

# nvmlValueType_t
_UNSIGNED_INT = 1
_UNSIGNED_LONG_LONG = 3

_ALL_ONES = 2**64 - 1  # ctypes truncates it to the width of the target field
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


def _int(arg: Any) -> int:
    """The integer behind a ctypes scalar or a plain Python int argument."""
    return int(arg.value) if hasattr(arg, "value") else int(arg)


def _target(ref: Any) -> Any:
    """The object behind ``byref(x)`` (a CArgObject whose ``_obj`` is x), or ``ref`` itself."""
    return getattr(ref, "_obj", ref)


def _put_string(buffer: Any, size: Any, text: str) -> int:
    encoded = text.encode()
    if len(encoded) + 1 > _int(size):
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

    def put(self, ref: Any, value: float, sentinel: int = _ALL_ONES) -> int:
        """Write a measured scalar output (or its sentinel) and return SUCCESS."""
        _target(ref).value = sentinel if self.sentinel else round(value)
        return SUCCESS

    def put_fields(self, ref: Any, **fields: float) -> int:
        """Write measured struct fields (or their sentinels) and return SUCCESS."""
        struct = _target(ref)
        for field, value in fields.items():
            setattr(struct, field, _ALL_ONES if self.sentinel else round(value))
        return SUCCESS


Handler = Callable[..., Any]
Locator = Callable[["SimulatedNvml", tuple[Any, ...]], "SimulatedGpu | int"]


def _by_handle(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    return sim.gpu_by_handle(args[0])


@dataclass(frozen=True)
class Function:
    """A registered C function: its handler and how to find the GPU it is about."""

    handler: Handler
    locate: Locator | None = None  # finds the GPU of a device function; None for system ones
    feature: str | None = None  # the optional GPU feature the call needs
    drop_handle: bool = True  # the handle argument is consumed by the locator


FUNCTIONS: dict[str, Function] = {}


def _system(*names: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            FUNCTIONS[name] = Function(handler)
        return handler

    return register


def _device(
    *names: str, feature: str | None = None, locate: Locator | None = None
) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            FUNCTIONS[name] = Function(
                handler, locate or _by_handle, feature, drop_handle=locate is None
            )
        return handler

    return register


# ---------------------------------------------------------------------------------------------
# System functions


def error_string(code: Any) -> bytes:
    """The description nvmlErrorString returns for an nvmlReturn_t."""
    return _ERROR_STRINGS.get(_int(code), "Unknown Error").encode()


@_system("nvmlErrorString")
def _error_string_handler(call: Call, code: Any) -> Any:
    return error_string(code)


@_system("nvmlInitWithFlags", "nvmlInit_v2", "nvmlInit")
def _init(call: Call, *flags: Any) -> int:
    return call.sim.open_session()


@_system("nvmlShutdown")
def _shutdown(call: Call) -> int:
    return call.sim.close_session()


@_system("nvmlSystemGetDriverVersion")
def _driver_version(call: Call, buffer: Any, size: Any) -> int:
    return _put_string(buffer, size, call.sim.scenario.driver.version)


@_system("nvmlSystemGetNVMLVersion")
def _nvml_version(call: Call, buffer: Any, size: Any) -> int:
    return _put_string(buffer, size, call.sim.scenario.driver.nvml_version)


@_system("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def _cuda_version(call: Call, ref: Any) -> int:
    return call.put(ref, call.sim.scenario.driver.cuda_version)


@_system("nvmlDeviceGetCount_v2")
def _count(call: Call, ref: Any) -> int:
    _target(ref).value = len(call.sim.gpus)
    return SUCCESS


@_system("nvmlSystemGetProcessName")
def _process_name(call: Call, pid: Any, buffer: Any, size: Any) -> int:
    wanted = _int(pid)
    for gpu in call.sim.gpus:
        for kind in ("compute", "graphics"):
            for process in gpu.processes(call.t, kind):
                if process.pid == wanted:
                    return _put_string(buffer, size, process.name)
    return NOT_FOUND


# ---------------------------------------------------------------------------------------------
# Handles


def _write_handle(call: Call, ref: Any) -> int:
    pointer = _target(ref)
    address = ctypes.c_void_p(call.device.handle_address)
    ctypes.memmove(ctypes.addressof(pointer), ctypes.byref(address), ctypes.sizeof(address))
    return SUCCESS


def _locate_index(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    index = _int(args[0])
    return sim.gpus[index] if 0 <= index < len(sim.gpus) else INVALID_ARGUMENT


def _locate_uuid(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    uuid = _c_string(args[0])
    return next((gpu for gpu in sim.gpus if gpu.uuid == uuid), NOT_FOUND)


def _normalise_bus_id(text: str) -> tuple[int, ...] | None:
    try:
        domain, bus, rest = text.strip().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


def _locate_pci(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    wanted = _normalise_bus_id(_c_string(args[0]))
    if wanted is None:
        return INVALID_ARGUMENT
    matches = (gpu for gpu in sim.gpus if _normalise_bus_id(gpu.pci_bus_id) == wanted)
    return next(matches, NOT_FOUND)


@_device("nvmlDeviceGetHandleByIndex_v2", locate=_locate_index)
@_device("nvmlDeviceGetHandleByUUID", locate=_locate_uuid)
@_device("nvmlDeviceGetHandleByPciBusId_v2", locate=_locate_pci)
def _handle(call: Call, key: Any, ref: Any) -> int:
    return _write_handle(call, ref)


# ---------------------------------------------------------------------------------------------
# Identity


@_device("nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber")
def _index(call: Call, ref: Any) -> int:
    _target(ref).value = call.device.index
    return SUCCESS


@_device("nvmlDeviceGetName")
def _name(call: Call, buffer: Any, size: Any) -> int:
    return _put_string(buffer, size, call.device.model.name)


@_device("nvmlDeviceGetUUID")
def _uuid(call: Call, buffer: Any, size: Any) -> int:
    return _put_string(buffer, size, call.device.uuid)


@_device("nvmlDeviceGetSerial", feature="serial")
def _serial(call: Call, buffer: Any, size: Any) -> int:
    return _put_string(buffer, size, call.device.serial)


@_device("nvmlDeviceGetVbiosVersion")
def _vbios(call: Call, buffer: Any, size: Any) -> int:
    return _put_string(buffer, size, call.device.model.vbios)


@_device("nvmlDeviceGetBrand")
def _brand(call: Call, ref: Any) -> int:
    _target(ref).value = call.device.model.brand
    return SUCCESS


@_device("nvmlDeviceGetArchitecture")
def _architecture(call: Call, ref: Any) -> int:
    _target(ref).value = call.device.model.architecture
    return SUCCESS


@_device("nvmlDeviceGetCudaComputeCapability")
def _compute_capability(call: Call, major: Any, minor: Any) -> int:
    _target(major).value, _target(minor).value = call.device.model.compute_capability
    return SUCCESS


@_device("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2")
def _pci_info(call: Call, ref: Any) -> int:
    # The v3 struct has busIdLegacy and busId; the v2 layout only busId (16 bytes).
    info, gpu = _target(ref), call.device
    short_id = f"{gpu.pci_domain:04X}:{gpu.pci_bus:02X}:{gpu.pci_device:02X}.0".encode()
    info.busId = gpu.pci_bus_id.encode() if hasattr(info, "busIdLegacy") else short_id
    if hasattr(info, "busIdLegacy"):
        info.busIdLegacy = short_id
    info.domain, info.bus, info.device = gpu.pci_domain, gpu.pci_bus, gpu.pci_device
    info.pciDeviceId = gpu.model.pci_device_id
    info.pciSubSystemId = gpu.model.pci_subsystem_id
    return SUCCESS


# ---------------------------------------------------------------------------------------------
# Utilization, memory, PCIe


@_device("nvmlDeviceGetUtilizationRates")
def _utilization(call: Call, ref: Any) -> int:
    return call.put_fields(
        ref,
        gpu=call.value("utilization") * 100,
        memory=call.value("memory_utilization") * 100,
    )


@_device("nvmlDeviceGetMemoryInfo")
def _memory_v1(call: Call, ref: Any) -> int:
    # Version 1 counts the reserved memory as used, which is why v2 exists.
    total, reserved, used, free = call.device.memory(call.t)
    return call.put_fields(ref, total=total, free=free, used=used + reserved)


@_device("nvmlDeviceGetMemoryInfo_v2")
def _memory_v2(call: Call, ref: Any) -> int:
    total, reserved, used, free = call.device.memory(call.t)
    return call.put_fields(ref, total=total, reserved=reserved, free=free, used=used)


@_device("nvmlDeviceGetBAR1MemoryInfo")
def _bar1(call: Call, ref: Any) -> int:
    gpu = call.device
    processes = len(gpu.processes(call.t, "compute")) + len(gpu.processes(call.t, "graphics"))
    used = min(gpu.model.bar1_total, (2 + 4 * processes) * 2**20)
    return call.put_fields(
        ref, bar1Total=gpu.model.bar1_total, bar1Used=used, bar1Free=gpu.model.bar1_total - used
    )


def _scalar_device(name: str, read: Callable[[SimulatedGpu], int]) -> None:
    """Register a device function that writes one static integer."""

    def handler(call: Call, ref: Any) -> int:
        _target(ref).value = read(call.device)
        return SUCCESS

    _device(name)(handler)


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
_scalar_device("nvmlDeviceIsMigDeviceHandle", lambda g: 0)
_scalar_device("nvmlDeviceGetMaxMigDeviceCount", lambda g: 7 if g.model.mig_capable else 0)


@_device("nvmlDeviceGetPcieReplayCounter", feature="pcie_replay")
def _replays(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.counter(call.device.spec.pcie_replays_per_hour, call.t))


@_device("nvmlDeviceGetPcieThroughput", feature="pcie_throughput")
def _pcie_throughput(call: Call, counter: Any, ref: Any) -> int:
    metric = {0: "pcie_tx", 1: "pcie_rx"}.get(_int(counter))
    if metric is None:
        return INVALID_ARGUMENT
    # NVML reports KB/s where KB is 1024 bytes.
    return call.put(ref, call.value(metric) / 1024)


# ---------------------------------------------------------------------------------------------
# Temperature, power, energy


def _temperature(call: Call, sensor: int) -> float | None:
    return call.value("temperature") if sensor == 0 else None


@_device("nvmlDeviceGetTemperature")
def _temperature_v1(call: Call, sensor: Any, ref: Any) -> int:
    value = _temperature(call, _int(sensor))
    if value is None:
        return INVALID_ARGUMENT
    return call.put(ref, value, sentinel=_ABSURD_TEMPERATURE)


@_device("nvmlDeviceGetTemperatureV")
def _temperature_v(call: Call, ref: Any) -> int:
    struct = _target(ref)
    value = _temperature(call, int(struct.sensorType))
    if value is None:
        return INVALID_ARGUMENT
    struct.temperature = _ABSURD_TEMPERATURE if call.sentinel else round(value)
    return SUCCESS


@_device("nvmlDeviceGetTemperatureThreshold")
def _temperature_threshold(call: Call, kind: Any, ref: Any) -> int:
    model = call.device.model
    thresholds = {0: model.temp_shutdown, 1: model.temp_slowdown, 3: model.temp_gpu_max}
    if not call.device.lacks("memory_temperature"):
        thresholds[2] = model.temp_memory_max
    value = thresholds.get(_int(kind))
    if value is None:
        return NOT_SUPPORTED
    return call.put(ref, value)


def _power_mw(call: Call, average: bool) -> float:
    if average:
        return call.device.average("power", call.t) * 1000
    return call.value("power") * 1000


@_device("nvmlDeviceGetPowerUsage")
def _power_usage(call: Call, ref: Any) -> int:
    # A 1 s average on Ampere (not GA100) and newer, instantaneous on older GPUs.
    return call.put(ref, _power_mw(call, call.device.model.power_reading == "average"))


@_device("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")
def _power_limit(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.model.power_limit * 1000)


@_device("nvmlDeviceGetPowerManagementDefaultLimit")
def _power_default_limit(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.model.power_default_limit * 1000)


@_device("nvmlDeviceGetPowerManagementLimitConstraints")
def _power_constraints(call: Call, low: Any, high: Any) -> int:
    call.put(low, call.device.model.power_min_limit * 1000)
    return call.put(high, call.device.model.power_max_limit * 1000)


@_device("nvmlDeviceGetTotalEnergyConsumption", feature="energy")
def _energy(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.cumulative("power", call.t) * 1000)


# ---------------------------------------------------------------------------------------------
# Clocks, performance state, fans, codecs


_CLOCK_METRICS = {0: "graphics_clock", 1: "sm_clock", 2: "memory_clock", 3: "video_clock"}


@_device("nvmlDeviceGetClockInfo")
def _clock(call: Call, kind: Any, ref: Any) -> int:
    metric = _CLOCK_METRICS.get(_int(kind))
    if metric is None:
        return INVALID_ARGUMENT
    return call.put(ref, call.value(metric))


@_device("nvmlDeviceGetMaxClockInfo")
def _max_clock(call: Call, kind: Any, ref: Any) -> int:
    model = call.device.model
    maxima = {
        0: model.max_graphics_clock,
        1: model.max_sm_clock,
        2: model.max_memory_clock,
        3: model.max_video_clock,
    }
    value = maxima.get(_int(kind))
    if value is None:
        return INVALID_ARGUMENT
    return call.put(ref, value)


@_device(
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    feature="clock_event_reasons",
)
def _clock_reasons(call: Call, ref: Any) -> int:
    return call.put(ref, call.device.clock_event_reasons(call.t))


@_device(
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    feature="clock_event_reasons",
)
def _supported_clock_reasons(call: Call, ref: Any) -> int:
    return call.put(ref, 0x1FF)


@_device("nvmlDeviceGetPerformanceState", "nvmlDeviceGetPowerState")
def _pstate(call: Call, ref: Any) -> int:
    _target(ref).value = 0 if call.device.busy(call.t) else 8
    return SUCCESS


@_device("nvmlDeviceGetFanSpeed")
def _fan(call: Call, ref: Any) -> int:
    if not call.device.model.fans:
        return NOT_SUPPORTED
    return call.put(ref, call.value("fan") * 100)


@_device("nvmlDeviceGetFanSpeed_v2")
def _fan_v2(call: Call, fan: Any, ref: Any) -> int:
    if not call.device.model.fans:
        return NOT_SUPPORTED
    if not 0 <= _int(fan) < call.device.model.fans:
        return INVALID_ARGUMENT
    return call.put(ref, call.value("fan") * 100)


_CODEC_PERIOD_US = 167_000


@_device("nvmlDeviceGetEncoderUtilization", feature="encoder")
def _encoder(call: Call, ref: Any, period: Any) -> int:
    _target(period).value = _CODEC_PERIOD_US
    return call.put(ref, call.value("encoder_utilization") * 100)


@_device("nvmlDeviceGetDecoderUtilization", feature="decoder")
def _decoder(call: Call, ref: Any, period: Any) -> int:
    _target(period).value = _CODEC_PERIOD_US
    return call.put(ref, call.value("decoder_utilization") * 100)


# ---------------------------------------------------------------------------------------------
# ECC and MIG


@_device("nvmlDeviceGetEccMode", feature="ecc")
def _ecc_mode(call: Call, current: Any, pending: Any) -> int:
    _target(current).value = 1
    _target(pending).value = 1
    return SUCCESS


@_device("nvmlDeviceGetTotalEccErrors", feature="ecc")
def _ecc_errors(call: Call, error_type: Any, counter_type: Any, ref: Any) -> int:
    spec = call.device.spec
    rate = {0: spec.ecc_corrected_per_hour, 1: spec.ecc_uncorrected_per_hour}.get(_int(error_type))
    if rate is None or _int(counter_type) not in (0, 1):
        return INVALID_ARGUMENT
    return call.put(ref, call.device.counter(rate, call.t))


@_device("nvmlDeviceGetDriverModel", "nvmlDeviceGetDriverModel_v2")
def _driver_model(call: Call, current: Any, pending: Any) -> int:
    # WDDM/TCC driver models exist only on Windows; Linux drivers answer NOT_SUPPORTED.
    return NOT_SUPPORTED


@_device("nvmlDeviceGetMigMode")
def _mig_mode(call: Call, current: Any, pending: Any) -> int:
    if not call.device.model.mig_capable:
        return NOT_SUPPORTED
    _target(current).value = 0
    _target(pending).value = 0
    return SUCCESS


# ---------------------------------------------------------------------------------------------
# Processes


def _process_list(call: Call, kind: str, count_ref: Any, infos: Any) -> int:
    processes = call.device.processes(call.t, kind)
    count = _target(count_ref)
    capacity = count.value
    count.value = len(processes)
    if infos is None or capacity < len(processes):
        # Size query: SUCCESS with 0 when there is nothing to list, as NVML answers.
        return INSUFFICIENT_SIZE if processes else SUCCESS
    for slot, process in zip(infos, processes, strict=False):
        slot.pid = process.pid
        slot.usedGpuMemory = _ALL_ONES if call.sentinel else process.memory
        slot.gpuInstanceId = 0xFFFFFFFF  # not in a MIG instance
        slot.computeInstanceId = 0xFFFFFFFF
    return SUCCESS


@_device("nvmlDeviceGetComputeRunningProcesses_v3")
def _compute_processes(call: Call, count: Any, infos: Any) -> int:
    return _process_list(call, "compute", count, infos)


@_device("nvmlDeviceGetGraphicsRunningProcesses_v3")
def _graphics_processes(call: Call, count: Any, infos: Any) -> int:
    return _process_list(call, "graphics", count, infos)


@_device("nvmlDeviceGetProcessUtilization", feature="process_utilization")
def _process_utilization(call: Call, samples: Any, count_ref: Any, last_seen: Any) -> int:
    gpu = call.device
    processes = gpu.processes(call.t, "compute") + gpu.processes(call.t, "graphics")
    if not processes or call.now_us <= _int(last_seen):
        return NOT_FOUND
    count = _target(count_ref)
    capacity = count.value
    count.value = len(processes)
    if samples is None or capacity < len(processes):
        return INSUFFICIENT_SIZE
    share = 100.0 / len(processes)
    for slot, process in zip(samples, processes, strict=False):
        slot.pid, slot.timeStamp = process.pid, call.now_us
        slot.smUtil = round(call.value("utilization") * share)
        slot.memUtil = round(call.value("memory_utilization") * share)
        slot.encUtil = round(call.value("encoder_utilization") * share)
        slot.decUtil = round(call.value("decoder_utilization") * share)
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


@_device("nvmlDeviceGetSamples", feature="samples")
def _samples(
    call: Call, sampling_type: Any, last_seen: Any, value_type: Any, count_ref: Any, samples: Any
) -> int:
    kind = _SAMPLE_TYPES.get(_int(sampling_type))
    if kind is None:
        return INVALID_ARGUMENT
    metric, scale, feature = kind
    gpu, sim = call.device, call.sim
    if feature and gpu.lacks(feature):
        return NOT_SUPPORTED
    seen = _int(last_seen)
    fresh = [
        (stamp, k)
        for k in gpu.sample_indices(call.t)
        if (stamp := sim.unix_us(k / SAMPLES_PER_SECOND)) > seen
    ]
    if not fresh:
        return NOT_FOUND
    _target(value_type).value = _UNSIGNED_INT
    count = _target(count_ref)
    if samples is None:
        count.value = len(fresh)
        return SUCCESS
    # Oldest first, up to the caller's array; later calls pick up the rest.
    fresh = fresh[: min(count.value, len(samples))]
    for slot, (stamp, k) in zip(samples, fresh, strict=False):
        slot.timeStamp = stamp
        value = gpu.value(metric, k / SAMPLES_PER_SECOND) * scale
        slot.sampleValue.uiVal = _ALL_ONES if call.sentinel else round(value)
    count.value = len(fresh)
    return SUCCESS


# ---------------------------------------------------------------------------------------------
# Field values


def _field(call: Call, field_id: int) -> tuple[int, float] | None:
    """(value type, value) of one field id, or None when this GPU does not support it."""
    gpu, t = call.device, call.t
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
        return _UNSIGNED_INT, gpu.counter(gpu.spec.pcie_replays_per_hour, t)
    if field_id in (185, 186) and not gpu.lacks("power_fields"):
        return _UNSIGNED_INT, _power_mw(call, average=field_id == 185)
    if field_id in power_limits:
        return _UNSIGNED_INT, power_limits[field_id] * 1000
    if field_id in (197, 198) and not gpu.lacks("pcie_counters"):
        return _UNSIGNED_LONG_LONG, gpu.cumulative("pcie_tx" if field_id == 197 else "pcie_rx", t)
    return None


@_device("nvmlDeviceGetFieldValues")
def _field_values(call: Call, count: Any, ref: Any) -> int:
    values = _target(ref)
    for slot in values[: _int(count)]:
        slot.timestamp = call.now_us
        slot.latencyUsec = 0
        field = _field(call, slot.fieldId)
        if field is None:
            # Per-field status: one unsupported field does not fail the call.
            slot.nvmlReturn = NOT_SUPPORTED
            continue
        value_type, value = field
        slot.valueType, slot.nvmlReturn = value_type, SUCCESS
        member = "uiVal" if value_type == _UNSIGNED_INT else "ullVal"
        setattr(slot.value, member, _ALL_ONES if call.sentinel else round(value))
    return SUCCESS


FUNCTION_NAMES: frozenset[str] = frozenset(FUNCTIONS)
"""Every NVML C function the simulator implements."""
