"""Reading a node's NVML answers once, for `gpuload sim record` (see `exporter.sim.recording`).

Every read goes through :mod:`exporter.nvml`, so the recorder runs against the real driver (and,
under ``gpuload sim exec``, against the simulated one). For each GPU it calls every NVML function
gpuload's collectors use, plus the few static values the scenario format holds and gpuload does
not otherwise read (power limit range and default, PCI device ids, the GPU-max and memory-max
temperature thresholds, graphics processes). For each call it keeps what the driver answered:
the value, or the error code, per argument (a clock type, a threshold kind, an NVLink link...).
Which C functions the library exports is asked for every name the simulator models.

Deliberately not read: the counters' history (ECC errors, PCIe replays, NVLink errors, energy
and byte counters are kept as their values at the moment read: the scenario format holds rates,
and a starting value for the PCIe replay counter only) and XIDs from before the recording (an
event set sees only what happens while it is registered: the recorder drains what is pending
once and does not wait).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pynvml

from exporter import nvml
from exporter.nvml import Device, GpmSampler, MigDevice, NvmlError, ValueUnavailable
from exporter.sim.features import READINGS

T = TypeVar("T")

SUCCESS = 0
SENTINEL = -1  # the call succeeded with NVML's all-ones "unavailable" value (or an absurd one)
# A call that takes this long is recorded as hung for that long: gpuload's collection times out
# sooner (80 % of its 1 s interval by default) and reports the GPU stale.
SLOW_CALL = 1.0

# GPM needs its two samples more than 100 ms apart.
_GPM_INTERVAL = 0.12
# At most this many pending XID events are drained.
_MAX_EVENTS = 256

_THRESHOLDS = {
    "temp_shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    "temp_slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    "temp_gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
    "temp_memory_max": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
}
_NVLINK_COUNTERS = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}
# Field ids the collectors read once per GPU (scope 0) and per NVLink link (scope = link).
GPU_FIELDS = {
    "memory_temperature": pynvml.NVML_FI_DEV_MEMORY_TEMP,
    "pcie_tx_bytes": pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    "pcie_rx_bytes": pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
}
LINK_FIELDS = {
    "nvlink_tx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    "nvlink_rx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    "nvlink_replay": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    "nvlink_recovery": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    "nvlink_crc": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    "nvlink_state": pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
}
_COMPUTE_SLICES = re.compile(r"^(\d+)c\.")
_GPU_INSTANCE_SLICES = re.compile(r"^(\d+)g\.")


def plausible_celsius(celsius: int) -> bool:
    """Whether a temperature is one a sensor gives, as gpuload's temperature collector judges."""
    return 0 <= celsius < 150


@dataclass
class ProcessReading:
    """A process as NVML listed it: PID, name, memory (None where NVML cannot tell) and kind."""

    pid: int
    name: str
    memory: int | None
    kind: str = "compute"


@dataclass
class ComputeInstanceReading:
    """One MIG device: a compute instance, its compute slices and its processes."""

    compute_instance: int
    slices: int
    processes: list[ProcessReading] = field(default_factory=list)


@dataclass
class GpuInstanceReading:
    """One MIG GPU instance: its id, profile, memory, GPM fractions, compute instances."""

    gpu_instance: int
    profile: str
    compute_slices: int
    compute_instances: list[ComputeInstanceReading]
    memory_used: int | None = None
    memory_total: int | None = None
    readings: dict[str, float] = field(default_factory=dict)


@dataclass
class GpuReading:
    """What one GPU answered.

    ``static`` holds values that do not change while the GPU runs (named as models.yaml and the
    GPU entries of a scenario name them), ``readings`` the moving values at the moment read (as
    the scenario's metric names), ``answers`` each C function's answer per argument: SUCCESS,
    SENTINEL or an NVML error code.
    """

    index: int
    static: dict[str, Any] = field(default_factory=dict)
    readings: dict[str, Any] = field(default_factory=dict)
    answers: dict[str, dict[str, int]] = field(default_factory=dict)
    fields: dict[str, list[nvml.FieldAnswer]] = field(default_factory=dict)
    processes: list[ProcessReading] = field(default_factory=list)
    mig: list[GpuInstanceReading] | None = None
    counters: dict[str, int] = field(default_factory=dict)
    nvlink_links: int | None = None
    nvlink_down: list[int] = field(default_factory=list)
    gpm_supported: bool = False
    has_fan: bool | None = None
    ecc_enabled: bool | None = None
    remapped_rows: nvml.RemappedRows | None = None
    retired_pages: dict[str, int] = field(default_factory=dict)
    retirement_pending: bool | None = None
    # The call whose error ended the reading (the handle or identity could not be read, or the
    # GPU went away), and the error.
    lost: tuple[str, NvmlError] | None = None
    xids: list[int] = field(default_factory=list)
    slow: dict[str, float] = field(default_factory=dict)  # call -> seconds, for `SLOW_CALL`


@dataclass
class NodeReading:
    """What the whole node answered: driver versions, exported functions and each GPU."""

    driver_version: str
    cuda_version: int
    nvml_version: str
    exported: frozenset[str]
    gpus: list[GpuReading]
    notes: list[str] = field(default_factory=list)


class _GpuRecorder:
    """Reads one GPU, keeping each C function's answer in a `GpuReading`."""

    def __init__(self, reading: GpuReading, device: Device, exported: frozenset[str]) -> None:
        self.reading = reading
        self.device = device
        self.exported = exported

    def answer(self, call: str, argument: str, code: int) -> None:
        """Keep ``code`` as ``call``'s answer for ``argument`` (the first error wins)."""
        by_argument = self.reading.answers.setdefault(call, {})
        if by_argument.get(argument, SUCCESS) == SUCCESS:
            by_argument[argument] = code

    def read(
        self,
        call: str,
        read: Callable[[], T],
        argument: str = "",
        valid: Callable[[T], bool] | None = None,
    ) -> T | None:
        """``read()``, its answer kept under ``call``; None when it failed or is not exported.

        A value ``valid`` rejects counts as NVML's "unavailable" one, as gpuload's collectors
        take it. A call that took `SLOW_CALL` seconds or more is kept in ``slow``. Lifecycle
        errors (the GPU or the driver went away) are raised: nothing more can be read.
        """
        if call not in self.exported:
            return None
        started = time.monotonic()
        try:
            value = read()
        except ValueUnavailable:
            self.answer(call, argument, SENTINEL)
            return None
        except NvmlError as error:
            if error.lifecycle:
                raise
            self.answer(call, argument, error.code)
            return None
        finally:
            took = time.monotonic() - started
            if took >= SLOW_CALL:
                self.reading.slow[call] = max(took, self.reading.slow.get(call, 0.0))
        if valid is not None and not valid(value):
            self.answer(call, argument, SENTINEL)
            return None
        self.answer(call, argument, SUCCESS)
        return value

    def newest(self, *calls: str) -> str:
        """The first of ``calls`` the driver exports: the one gpuload's reader calls."""
        return next((call for call in calls if call in self.exported), calls[-1])

    @property
    def memory_call(self) -> str:
        """The memory function `Device.memory` calls on this driver."""
        return self.newest("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo")

    def process_call(self, kind: str) -> str:
        """The process-list function `Device.compute_processes` (or graphics) calls."""
        name = f"nvmlDeviceGet{kind.title()}RunningProcesses"
        return self.newest(f"{name}_v3", f"{name}_v2", name)

    # -- the reads, one area each -------------------------------------------------------------

    def identity(self) -> None:
        """Name, UUID, PCI bus id and device ids, serial and VBIOS."""
        identity = self.device.identity()
        for call in ("nvmlDeviceGetUUID", "nvmlDeviceGetName"):
            self.answer(call, "", SUCCESS)
        static = self.reading.static
        static.update(name=identity.name, uuid=identity.uuid)
        failed = dict(identity.failed)
        for key, call in (
            ("pci_bus_id", "nvmlDeviceGetPciInfo_v3"),
            ("serial", "nvmlDeviceGetSerial"),
            ("vbios_version", "nvmlDeviceGetVbiosVersion"),
        ):
            value = getattr(identity, key)
            if key in failed:
                self.answer(call, "", failed[key].code)
            elif not value:
                self.answer(call, "", pynvml.NVML_ERROR_NOT_SUPPORTED)
            else:
                self.answer(call, "", SUCCESS)
                static["vbios" if key == "vbios_version" else key] = value
        ids = self.read("nvmlDeviceGetPciInfo_v3", self.device.pci_device_ids)
        if ids is not None:
            static["pci_device_id"], static["pci_subsystem_id"] = ids

    def memory(self) -> None:
        """Frame buffer and BAR1 memory."""
        info = self.read(self.memory_call, self.device.memory)
        if info is not None:
            self.reading.static.update(memory_total=info.total, memory_reserved=info.reserved)
            self.reading.readings["memory_used"] = info.used
            self.reading.readings["memory_free"] = info.free
        bar1 = self.read("nvmlDeviceGetBAR1MemoryInfo", self.device.bar1_memory)
        if bar1 is not None:
            self.reading.static["bar1_total"] = bar1.total
            self.reading.readings["bar1_used"] = bar1.used

    def utilization(self) -> None:
        """Engine utilization and the sample ring."""
        device, readings = self.device, self.reading.readings
        rates = self.read("nvmlDeviceGetUtilizationRates", device.utilization)
        if rates is not None:
            readings["utilization"] = rates.gpu_percent / 100
            readings["memory_utilization"] = rates.memory_percent / 100
        for kind, metric in (("gpu", "utilization"), ("memory", "memory_utilization")):
            samples = self.read(
                "nvmlDeviceGetSamples", partial(device.utilization_samples, kind, 0), kind
            )
            if samples and metric not in readings:
                # The newest sample, where the instant reading failed.
                readings[metric] = samples[-1][1] / 100

    def table_readings(self) -> None:
        """The table-driven readings (exporter/sim/features.py), in scenario units."""
        for reading in READINGS:
            answer = self.read(reading.function, getattr(self.device, reading.method))
            if answer is None:
                continue
            values = answer if isinstance(answer, tuple) else (answer,)
            for output, value in zip(reading.outputs, values, strict=True):
                self.reading.readings[output.metric] = value / output.nvml_per_unit

    def pcie(self) -> None:
        """PCIe link, replays and throughput."""
        device, static = self.device, self.reading.static
        for key, call, read in (
            ("pcie_generation", "CurrPcieLinkGeneration", device.pcie_link_generation),
            ("pcie_max_generation", "MaxPcieLinkGeneration", device.pcie_link_max_generation),
            ("pcie_width", "CurrPcieLinkWidth", device.pcie_link_width),
            ("pcie_max_width", "MaxPcieLinkWidth", device.pcie_link_max_width),
        ):
            value = self.read(f"nvmlDeviceGet{call}", read)
            if value is not None:
                static[key] = value
        replays = self.read("nvmlDeviceGetPcieReplayCounter", device.pcie_replay_count)
        if replays is not None:
            self.reading.counters["PCIe replays"] = replays
        for direction in ("tx", "rx"):
            kib = self.read(
                "nvmlDeviceGetPcieThroughput",
                partial(device.pcie_throughput_kib_per_second, direction),
                direction,
            )
            if kib is not None:
                self.reading.readings[f"pcie_{direction}"] = kib * 1024

    def temperature(self) -> None:
        """Core temperature and the four thresholds."""
        call = self.newest("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
        value = self.read(call, self.device.temperature_celsius, valid=plausible_celsius)
        if value is not None:
            self.reading.readings["temperature"] = value
        for key, kind in _THRESHOLDS.items():
            threshold = self.read(
                "nvmlDeviceGetTemperatureThreshold",
                partial(self.device.temperature_threshold_celsius, kind),
                key,
                valid=plausible_celsius,
            )
            if threshold is not None:
                self.reading.static[key] = threshold

    def power(self) -> None:
        """Draw, limits and the energy counter."""
        device, static = self.device, self.reading.static
        usage = self.read("nvmlDeviceGetPowerUsage", device.power_usage_milliwatts)
        if usage is not None:
            self.reading.readings["power"] = usage / 1000
        for key, call, read in (
            ("power_limit", "EnforcedPowerLimit", device.power_limit_milliwatts),
            (
                "power_default_limit",
                "PowerManagementDefaultLimit",
                device.power_default_limit_milliwatts,
            ),
        ):
            value = self.read(f"nvmlDeviceGet{call}", read)
            if value is not None:
                static[key] = value / 1000
        limits = self.read(
            "nvmlDeviceGetPowerManagementLimitConstraints", device.power_limit_range_milliwatts
        )
        if limits is not None:
            static["power_min_limit"], static["power_max_limit"] = (v / 1000 for v in limits)
        energy = self.read("nvmlDeviceGetTotalEnergyConsumption", device.energy_millijoules)
        if energy is not None:
            self.reading.counters["energy (J)"] = energy // 1000

    def clocks(self) -> None:
        """Current and maximum clocks, and the clock event reasons."""
        device = self.device
        for clock in ("graphics", "sm", "memory"):
            current = self.read(
                "nvmlDeviceGetClockInfo",
                partial(device.clock_mhz, clock),
                clock,
            )
            if current is not None:
                self.reading.readings[f"{clock}_clock"] = current
            highest = self.read(
                "nvmlDeviceGetMaxClockInfo",
                partial(device.max_clock_mhz, clock),
                clock,
            )
            if highest is not None:
                self.reading.static[f"max_{clock}_clock"] = highest
        call = self.newest(
            "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        reasons = self.read(call, device.clock_event_reasons)
        if reasons is not None:
            self.reading.readings["clock_event_reasons"] = reasons

    def fan(self) -> None:
        """Fan speed; passively cooled GPUs answer NOT_SUPPORTED."""
        percent = self.read("nvmlDeviceGetFanSpeed", self.device.fan_speed_percent)
        self.reading.has_fan = percent is not None
        if percent is not None:
            self.reading.readings["fan"] = percent / 100

    def nvlink(self) -> None:
        """Links (asked until NVML says there is no such link), their state and error counters."""
        device, links = self.device, []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = device.nvlink_active(link)
            except NvmlError as error:
                if error.lifecycle:
                    raise
                if link == 0:  # past the last link is INVALID_ARGUMENT, not an answer to keep
                    self.answer("nvmlDeviceGetNvLinkState", "", error.code)
                break
            self.answer("nvmlDeviceGetNvLinkState", "", SUCCESS)
            links.append(link)
            if not active:
                self.reading.nvlink_down.append(link)
        self.reading.nvlink_links = len(links)
        for name, counter in _NVLINK_COUNTERS.items():
            total = 0
            for link in links:
                count = self.read(
                    "nvmlDeviceGetNvLinkErrorCounter",
                    partial(device.nvlink_error_count, link, counter),
                    name,
                )
                total += count or 0
            answers = self.reading.answers.get("nvmlDeviceGetNvLinkErrorCounter", {})
            if links and answers.get(name) == SUCCESS:
                self.reading.counters[f"NVLink {name} errors"] = total

    def fields(self) -> None:
        """The field values the collectors read, each with its own status."""
        keys: list[tuple[str, int, int]] = [(name, fid, 0) for name, fid in GPU_FIELDS.items()]
        for link in range(self.reading.nvlink_links or 0):
            keys += [(name, fid, link) for name, fid in LINK_FIELDS.items()]
        answers = self.read(
            "nvmlDeviceGetFieldValues",
            lambda: self.device.field_answers([(fid, scope) for _, fid, scope in keys]),
        )
        if answers is None:
            return
        for (name, _, _), answer in zip(keys, answers, strict=True):
            self.reading.fields.setdefault(name, []).append(answer)
        memory = self.reading.fields["memory_temperature"][0]
        celsius = memory.value if memory.status == SUCCESS else None
        if celsius is not None and plausible_celsius(celsius):
            self.reading.readings["memory_temperature"] = celsius

    def memory_errors(self) -> None:
        """ECC mode and counts, remapped rows, retired pages."""
        device = self.device
        self.reading.ecc_enabled = self.read("nvmlDeviceGetEccMode", device.ecc_mode_enabled)
        for kind, error_type in (
            ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            for scope, counter in (
                ("volatile", pynvml.NVML_VOLATILE_ECC),
                ("aggregate", pynvml.NVML_AGGREGATE_ECC),
            ):
                count = self.read(
                    "nvmlDeviceGetTotalEccErrors",
                    partial(device.ecc_error_count, error_type, counter),
                    f"{kind} {scope}",
                )
                if count is not None:
                    self.reading.counters[f"ECC {kind} {scope}"] = count
        self.reading.remapped_rows = self.read("nvmlDeviceGetRemappedRows", device.remapped_rows)
        for cause, number in (
            ("single_bit", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            ("double_bit", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        ):
            pages = self.read(
                "nvmlDeviceGetRetiredPages",
                partial(device.retired_page_count, number),
                cause,
            )
            if pages is not None:
                self.reading.retired_pages[cause] = pages
        self.reading.retirement_pending = self.read(
            "nvmlDeviceGetRetiredPagesPendingStatus", device.retired_pages_pending
        )

    def processes(self, device: Device, argument: str = "") -> list[ProcessReading]:
        """The compute and graphics processes of the GPU or of one MIG device, named."""
        found = []
        for kind in ("compute", "graphics"):
            read = device.compute_processes if kind == "compute" else device.graphics_processes
            listed = self.read(self.process_call(kind), read, argument) or []
            found += [
                ProcessReading(p.pid, nvml.process_name(p.pid), p.used_bytes, kind) for p in listed
            ]
        return found

    def process_utilization(self) -> None:
        """Per-process utilization: its answer only (the format splits the GPU's evenly)."""
        self.read("nvmlDeviceGetProcessUtilization", lambda: self.device.process_utilization(0))

    def mig(self) -> None:
        """MIG mode and, in MIG mode, each GPU instance with its compute instances."""
        device = self.device
        enabled = self.read("nvmlDeviceGetMigMode", device.mig_mode_enabled)
        if not enabled:
            return
        devices = self.read("nvmlDeviceGetMigDeviceHandleByIndex", device.mig_devices) or []
        by_instance: dict[int, list[MigDevice]] = {}
        for mig in devices:
            by_instance.setdefault(mig.gpu_instance, []).append(mig)
        instances = []
        for gpu_instance, members in sorted(by_instance.items()):
            members.sort(key=lambda m: m.compute_instance)
            profile = members[0].gpu_instance_profile
            match = _GPU_INSTANCE_SLICES.match(profile)
            whole = int(match.group(1)) if match else 0
            where = f"MIG {gpu_instance}"
            info = self.read(self.memory_call, members[0].device.memory, where)
            computes = []
            for mig in members:
                prefix = _COMPUTE_SLICES.match(mig.profile)
                slices = int(prefix.group(1)) if prefix else whole
                found = self.processes(mig.device, f"{where}/{mig.compute_instance}")
                computes.append(ComputeInstanceReading(mig.compute_instance, slices, found))
            instances.append(
                GpuInstanceReading(
                    gpu_instance,
                    profile,
                    whole,
                    computes,
                    memory_used=None if info is None else info.used,
                    memory_total=None if info is None else info.total,
                )
            )
        self.reading.mig = instances

    def gpm_support(self) -> None:
        """Whether the GPU has GPM (Hopper and newer)."""
        supported = self.read("nvmlGpmQueryDeviceSupport", self.device.gpm_supported)
        self.reading.gpm_supported = bool(supported)


@dataclass
class _GpmTarget:
    """A GPM sampler and where its fractions go: the GPU's readings or a GPU instance's."""

    recorder: _GpuRecorder
    gpu_instance: int | None
    readings: dict[str, Any]
    sampler: GpmSampler | None = None

    @property
    def call(self) -> str:
        """The C function that takes this target's samples."""
        return "nvmlGpmSampleGet" if self.gpu_instance is None else "nvmlGpmMigSampleGet"

    @property
    def argument(self) -> str:
        """The target's argument in the GPU's answers."""
        return "" if self.gpu_instance is None else f"MIG {self.gpu_instance}"

    def allocate(self) -> None:
        """Allocate the sampler (two nvmlGpmSampleAlloc buffers)."""
        device = self.recorder.device
        self.sampler = self.recorder.read(
            "nvmlGpmSampleAlloc", lambda: device.gpm_sampler(self.gpu_instance), self.argument
        )


def _gpm(targets: list[_GpmTarget]) -> None:
    """Two GPM samples per target, one interval apart for all of them, then free them."""
    for target in targets:
        target.allocate()
    live = [t for t in targets if t.sampler is not None]
    try:
        for target in live:
            assert target.sampler is not None
            if target.recorder.read(target.call, target.sampler.take, target.argument) is None:
                target.sampler.free()
                target.sampler = None
        if any(t.sampler is not None for t in live):
            time.sleep(_GPM_INTERVAL)
        for target in live:
            if target.sampler is None:
                continue
            metrics = target.recorder.read(target.call, target.sampler.take, target.argument)
            for name, percent in (metrics or {}).items():
                target.readings[name] = min(1.0, max(0.0, percent / 100))
    finally:
        for target in live:
            if target.sampler is not None:
                target.sampler.free()


def _xids(recorders: list[_GpuRecorder]) -> None:
    """Register every GPU for XID events and drain the pending ones, without waiting."""
    devices = [r.device for r in recorders]
    events = nvml.XidEventSet(devices)
    try:
        by_index = {r.reading.index: r for r in recorders}
        for recorder in recorders:
            registered = recorder.reading.index in events.registered
            code = SUCCESS if registered else pynvml.NVML_ERROR_NOT_SUPPORTED
            recorder.answer("nvmlDeviceRegisterEvents", "", code)
        for _ in range(_MAX_EVENTS):
            event = events.wait(0)
            if event is None:
                break
            if event.gpu in by_index:
                by_index[event.gpu].reading.xids.append(event.xid)
    finally:
        events.free()


def read_node(function_names: Iterable[str]) -> NodeReading:
    """Initialise NVML, read every GPU once, shut NVML down.

    ``function_names``: the C functions to ask the library about (the simulator's list).

    Raises:
        LibraryNotFound: no NVIDIA driver library on this machine.
        NvmlError: NVML did not initialise or the GPU count could not be read.
    """
    nvml.init()
    try:
        return _read_initialised(function_names)
    finally:
        nvml.shutdown()


def _read_initialised(function_names: Iterable[str]) -> NodeReading:
    info = nvml.driver_info()
    exported = nvml.exported_functions(function_names)
    node = NodeReading(
        driver_version=info.driver_version,
        cuda_version=nvml.cuda_driver_version(),
        nvml_version=info.nvml_version,
        exported=exported,
        gpus=[],
    )
    recorders = []
    for index in range(nvml.device_count()):
        reading = GpuReading(index)
        node.gpus.append(reading)
        try:
            device = nvml.device(index)
        except NvmlError as error:
            reading.lost = ("nvmlDeviceGetHandleByIndex_v2", error)
            continue
        recorder = _GpuRecorder(reading, device, exported)
        try:
            recorder.identity()
        except NvmlError as error:
            reading.lost = ("nvmlDeviceGetUUID", error)
            continue
        try:
            _read_gpu(recorder)
        except NvmlError as error:  # a lifecycle error: the GPU or the driver went away
            reading.lost = ("", error)
            continue
        recorders.append(recorder)
    targets = []
    for recorder in recorders:
        reading = recorder.reading
        if not reading.gpm_supported:
            continue
        targets.append(_GpmTarget(recorder, None, reading.readings))
        targets += [
            _GpmTarget(recorder, instance.gpu_instance, instance.readings)
            for instance in reading.mig or ()
        ]
    _gpm(targets)
    try:
        _xids(recorders)
    except NvmlError as error:
        node.notes.append(f"XID events could not be read: {error}")
    return node


def _read_gpu(recorder: _GpuRecorder) -> None:
    recorder.memory()
    recorder.utilization()
    recorder.table_readings()
    recorder.pcie()
    recorder.temperature()
    recorder.power()
    recorder.clocks()
    recorder.fan()
    recorder.nvlink()
    recorder.fields()
    recorder.memory_errors()
    recorder.reading.processes = recorder.processes(recorder.device)
    recorder.process_utilization()
    recorder.mig()
    recorder.gpm_support()
