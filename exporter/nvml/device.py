"""Typed readers for one GPU: each method is one NVML call.

Values come back in NVML's own units (MiB is never used by NVML: memory is in
bytes, power in milliwatts, energy in millijoules, clocks in MHz, utilization in
percent); the collectors convert them to Prometheus base units. Every method
raises `NotSupported` when the value does not exist on this GPU, including
when NVML answers with its all-ones "unavailable" sentinel, and `NvmlError`
for anything else.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pynvml

from exporter.nvml.errors import NotSupported, NvmlError, ValueUnavailable, translated
from exporter.nvml.gpm import GpmSampler

_UINT_UNAVAILABLE = 0xFFFFFFFF
_ULONGLONG_UNAVAILABLE = 0xFFFFFFFFFFFFFFFF
# NVML_VALUE_NOT_AVAILABLE (nvml.h): the same all-ones bits, read as a signed number.
_SIGNED_UNAVAILABLE = -1

CLOCK_TYPES = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
}


@dataclass(frozen=True)
class Identity:
    """What identifies a GPU and does not change while it is present."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str
    vbios_version: str
    # (label, error) of each optional read that failed: its label is left empty.
    failed: tuple[tuple[str, NvmlError], ...] = dataclasses.field(default=(), compare=False)


@dataclass(frozen=True)
class Utilization:
    """Percent of the last sample period that a kernel / the memory controller was busy."""

    gpu_percent: int
    memory_percent: int


class EncoderStats(NamedTuple):
    """The video encoder's sessions, with their average frame rate and latency (µs) over all."""

    sessions: int
    average_fps: int
    average_latency_us: int


@dataclass(frozen=True)
class MemoryInfo:
    """Frame buffer memory in bytes; `reserved` is None on drivers without the v2 call."""

    total: int
    used: int
    free: int
    reserved: int | None


@dataclass(frozen=True)
class Bar1Memory:
    """BAR1 (host-mapped) memory in bytes."""

    total: int
    used: int


@dataclass(frozen=True)
class RemappedRows:
    """Row remapping state (nvmlDeviceGetRemappedRows)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class FieldAnswer:
    """One field's answer as the driver gave it: its status and, on success, its number.

    ``value`` is None when the status is not success, and when NVML answered success with
    its all-ones "unavailable" value.
    """

    status: int
    value: int | None


@dataclass(frozen=True)
class ProcessMemory:
    """A process using the GPU; `used_bytes` is None where the driver cannot tell (WDDM)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class ProcessUtilization:
    """One per-process utilization sample, percent over NVML's sample period."""

    pid: int
    timestamp_us: int
    sm_percent: int
    memory_percent: int


@dataclass(frozen=True)
class MigDevice:
    """One MIG device, which is one compute instance of a GPU instance, and its handle.

    ``profile`` is the device's as NVML names it: ``1c.3g.71gb`` for a compute instance of 1 of
    its GPU instance's 3 compute slices, ``3g.71gb`` for a whole one. The compute instances of a
    GPU instance share its memory and its GPM readings.
    """

    gpu_instance: int
    profile: str
    device: Device
    compute_instance: int = 0
    multiprocessors: int | None = None  # its SMs; None where NVML does not say

    @property
    def gpu_instance_profile(self) -> str:
        """The GPU instance's profile: ``3g.71gb`` for ``1c.3g.71gb``."""
        return _COMPUTE_SLICES_PREFIX.sub("", self.profile)


@dataclass(frozen=True)
class GpuInstanceInfo:
    """A MIG GPU instance's profile and where it sits (nvmlGpuInstanceGetInfo).

    ``profile_id`` is the id ``nvidia-smi mig -lgip`` lists (19 for 1g.10gb, 0 for 7g.80gb);
    ``placement_start`` and ``placement_size`` count the GPU's memory slices, as
    ``nvidia-smi mig -lgipp`` does.
    """

    profile_id: int
    placement_start: int
    placement_size: int


_SAMPLE_TYPES = {
    "gpu": pynvml.NVML_GPU_UTILIZATION_SAMPLES,
    "memory": pynvml.NVML_MEMORY_UTILIZATION_SAMPLES,
}
# NVML names a MIG device "<GPU name> MIG <profile>": 1g.10gb, 1c.3g.71gb, 1g.18gb+me, and in
# R575+ 1g.24gb-me or 1g.24gb+me.all (nvidia-smi -L and the MIG user guide's profile tables).
_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")
_COMPUTE_SLICES_PREFIX = re.compile(r"^\d+c\.")


def _mig_profile(name: str) -> str:
    match = _MIG_PROFILE.search(name)
    return match.group(1) if match else ""


# Room for this many entries in a list call's first try: one call where pynvml's wrappers make
# two (the count, then the list). NVML answers INSUFFICIENT_SIZE, with the count, when more exist.
_LIST_SLOTS = 32
# The same for utilization samples: NVML's ring holds about 100 (~16 s at 6 per second).
_SAMPLE_SLOTS = 128


def _listed(name: str, entry: type[ctypes.Structure], call: Callable[..., int]) -> list[Any]:
    """The entries of NVML list function `name`; `call(function, entries, count_ref)` calls it."""
    function = pynvml._nvmlGetFunctionPointer(name)
    count = ctypes.c_uint(_LIST_SLOTS)
    while True:
        entries = (entry * count.value)()
        status = call(function, entries, ctypes.byref(count))
        if status != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            break
        count.value = count.value * 2 + 5  # room for those that start meanwhile, as pynvml does
    pynvml._nvmlCheckReturn(status)
    return list(entries[: count.value])


def _checked(value: int, what: str, sentinel: int = _UINT_UNAVAILABLE) -> int:
    if value == sentinel:
        raise ValueUnavailable(what)
    return value


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Device:
    """One GPU, addressed by its NVML handle. Thread-safe: NVML itself is."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self._handle = handle
        # The process-list function and record this driver has, found on the first read.
        self._process_list: tuple[str, type[ctypes.Structure]] | None = None
        # nvmlDeviceGetSamples buffer sizes by sample type, where the driver asked for more.
        self._sample_slots: dict[int, int] = {}
        # This cycle's fields, read in one call (`read_fields_ahead`): the values, or the error.
        self._fields_ahead: dict[tuple[int, int], Any] | NvmlError | None = None
        self._fields_ahead_keys: frozenset[tuple[int, int]] = frozenset()

    @property
    def handle(self) -> Any:
        """The NVML handle, for the other readers of the nvml package (events, GPM)."""
        return self._handle

    def identity(self) -> Identity:
        """Read the GPU's identity. UUID and name are required; the rest may be empty.

        Real drivers answer UNKNOWN or NO_PERMISSION for the serial, PCI info or VBIOS of some
        GPUs: that label is left empty and the error kept in ``failed``, never raised, so that
        the GPU (and the node) still reports. Lifecycle errors are raised: the GPU is gone.
        """
        with translated():
            uuid = _text(pynvml.nvmlDeviceGetUUID(self._handle))
            name = _text(pynvml.nvmlDeviceGetName(self._handle))
        failed: list[tuple[str, NvmlError]] = []

        def optional(label: str, read: Callable[[], Any]) -> str:
            try:
                with translated():
                    return _text(read())
            except NotSupported:
                return ""  # consumer GPUs have no serial: empty, not missing
            except NvmlError as error:
                if error.lifecycle:
                    raise
                failed.append((label, error))
                return ""

        handle = self._handle
        return Identity(
            index=self.index,
            uuid=uuid,
            name=name,
            pci_bus_id=optional("pci_bus_id", lambda: pynvml.nvmlDeviceGetPciInfo(handle).busId),
            serial=optional("serial", lambda: pynvml.nvmlDeviceGetSerial(handle)),
            vbios_version=optional(
                "vbios_version", lambda: pynvml.nvmlDeviceGetVbiosVersion(handle)
            ),
            failed=tuple(failed),
        )

    def pci_device_ids(self) -> tuple[int, int]:
        """(PCI device id, PCI subsystem id) from nvmlDeviceGetPciInfo, e.g. 0x233010DE."""
        with translated():
            info = pynvml.nvmlDeviceGetPciInfo(self._handle)
        return int(info.pciDeviceId), int(info.pciSubSystemId)

    def utilization(self) -> Utilization:
        """nvmlDeviceGetUtilizationRates: percent busy over the last sample period."""
        with translated():
            rates = pynvml.nvmlDeviceGetUtilizationRates(self._handle)
        return Utilization(
            gpu_percent=_checked(rates.gpu, "utilization.gpu"),
            memory_percent=_checked(rates.memory, "utilization.memory"),
        )

    def encoder_utilization_percent(self) -> int:
        """nvmlDeviceGetEncoderUtilization: percent the video encoder was busy."""
        with translated():
            percent, _period_us = pynvml.nvmlDeviceGetEncoderUtilization(self._handle)
        return _checked(percent, "encoder utilization")

    def decoder_utilization_percent(self) -> int:
        """nvmlDeviceGetDecoderUtilization: percent the video decoder was busy."""
        with translated():
            percent, _period_us = pynvml.nvmlDeviceGetDecoderUtilization(self._handle)
        return _checked(percent, "decoder utilization")

    def encoder_stats(self) -> EncoderStats:
        """nvmlDeviceGetEncoderStats: the video encoder's sessions and their averages."""
        with translated():
            sessions, fps, latency_us = pynvml.nvmlDeviceGetEncoderStats(self._handle)
        return EncoderStats(
            sessions=_checked(sessions, "encoder.stats.sessionCount"),
            average_fps=_checked(fps, "encoder.stats.averageFps"),
            average_latency_us=_checked(latency_us, "encoder.stats.averageLatency"),
        )

    def memory(self) -> MemoryInfo:
        """Frame buffer memory; the v2 call (from R510) adds `reserved` and a correct `used`."""
        with translated():
            try:
                info = pynvml.nvmlDeviceGetMemoryInfo(self._handle, version=pynvml.nvmlMemory_v2)
                reserved: int | None = int(info.reserved)
            except pynvml.NVMLError_FunctionNotFound:
                info = pynvml.nvmlDeviceGetMemoryInfo(self._handle)
                reserved = None
        total = _checked(info.total, "memory.total", _ULONGLONG_UNAVAILABLE)
        return MemoryInfo(total=total, used=int(info.used), free=int(info.free), reserved=reserved)

    def bar1_memory(self) -> Bar1Memory:
        """nvmlDeviceGetBAR1MemoryInfo, in bytes."""
        with translated():
            info = pynvml.nvmlDeviceGetBAR1MemoryInfo(self._handle)
        total = _checked(info.bar1Total, "bar1.total", _ULONGLONG_UNAVAILABLE)
        return Bar1Memory(total=total, used=int(info.bar1Used))

    def pcie_link_generation(self) -> int:
        """NvmlDeviceGetCurrPcieLinkGeneration (drops when the GPU idles to save power)."""
        with translated():
            return _checked(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(self._handle), "pcie.gen")

    def pcie_link_max_generation(self) -> int:
        """nvmlDeviceGetMaxPcieLinkGeneration: the best the GPU and its slot can do together."""
        with translated():
            value = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(self._handle)
        return _checked(value, "pcie.gen.max")

    def pcie_link_width(self) -> int:
        """nvmlDeviceGetCurrPcieLinkWidth, in lanes."""
        with translated():
            return _checked(pynvml.nvmlDeviceGetCurrPcieLinkWidth(self._handle), "pcie.width")

    def pcie_link_max_width(self) -> int:
        """nvmlDeviceGetMaxPcieLinkWidth, in lanes."""
        with translated():
            return _checked(pynvml.nvmlDeviceGetMaxPcieLinkWidth(self._handle), "pcie.width.max")

    def pcie_replay_count(self) -> int:
        """nvmlDeviceGetPcieReplayCounter: link-level retransmissions since driver load."""
        with translated():
            return _checked(pynvml.nvmlDeviceGetPcieReplayCounter(self._handle), "pcie.replay")

    def temperature_celsius(self) -> int:
        """GPU core temperature: nvmlDeviceGetTemperatureV, the old call on old drivers."""
        with translated():
            try:
                value = pynvml.nvmlDeviceGetTemperatureV(self._handle, pynvml.NVML_TEMPERATURE_GPU)
            except pynvml.NVMLError_FunctionNotFound:
                value = pynvml.nvmlDeviceGetTemperature(self._handle, pynvml.NVML_TEMPERATURE_GPU)
        return _checked(value, "temperature.gpu")

    def memory_temperature_celsius(self) -> int:
        """HBM temperature from field NVML_FI_DEV_MEMORY_TEMP (data-centre GPUs only)."""
        return self._field_value(pynvml.NVML_FI_DEV_MEMORY_TEMP, "temperature.memory")

    def temperature_threshold_celsius(self, threshold: int) -> int:
        """NvmlDeviceGetTemperatureThreshold for one NVML_TEMPERATURE_THRESHOLD_* kind."""
        with translated():
            value = pynvml.nvmlDeviceGetTemperatureThreshold(self._handle, threshold)
        return _checked(value, "temperature threshold")

    def power_usage_milliwatts(self) -> int:
        """nvmlDeviceGetPowerUsage: a 1 s average on Ampere and newer, instant before."""
        with translated():
            return _checked(pynvml.nvmlDeviceGetPowerUsage(self._handle), "power.draw")

    def power_limit_milliwatts(self) -> int:
        """nvmlDeviceGetEnforcedPowerLimit: the limit the GPU actually obeys."""
        with translated():
            return _checked(pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle), "power.limit")

    def power_default_limit_milliwatts(self) -> int:
        """nvmlDeviceGetPowerManagementDefaultLimit: the limit the GPU ships with."""
        with translated():
            value = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(self._handle)
        return _checked(value, "power.default_limit")

    def power_limit_range_milliwatts(self) -> tuple[int, int]:
        """nvmlDeviceGetPowerManagementLimitConstraints: the lowest and highest settable limit."""
        with translated():
            low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(self._handle)
        return _checked(low, "power.min_limit"), _checked(high, "power.max_limit")

    def energy_millijoules(self) -> int:
        """nvmlDeviceGetTotalEnergyConsumption: energy since the driver was loaded (Volta+)."""
        with translated():
            value = pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        return _checked(value, "energy", _ULONGLONG_UNAVAILABLE)

    def clock_mhz(self, clock: str) -> int:
        """NvmlDeviceGetClockInfo for `graphics`, `sm` or `memory`."""
        with translated():
            value = pynvml.nvmlDeviceGetClockInfo(self._handle, CLOCK_TYPES[clock])
        return _checked(value, f"clocks.{clock}")

    def max_clock_mhz(self, clock: str) -> int:
        """NvmlDeviceGetMaxClockInfo for `graphics`, `sm` or `memory`."""
        with translated():
            value = pynvml.nvmlDeviceGetMaxClockInfo(self._handle, CLOCK_TYPES[clock])
        return _checked(value, f"clocks.max.{clock}")

    def clock_event_reasons(self) -> int:
        """Bitmask of why clocks are held down; older drivers only have the "throttle" name."""
        with translated():
            try:
                value = pynvml.nvmlDeviceGetCurrentClocksEventReasons(self._handle)
            except pynvml.NVMLError_FunctionNotFound:
                value = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(self._handle)
        return _checked(value, "clocks_event_reasons", _ULONGLONG_UNAVAILABLE)

    def fan_speed_percent(self) -> int:
        """nvmlDeviceGetFanSpeed: intended fan speed; passively cooled GPUs do not support it."""
        with translated():
            return _checked(pynvml.nvmlDeviceGetFanSpeed(self._handle), "fan.speed")

    def _field_value(self, field_id: int, what: str) -> int:
        (value,) = self.field_values([field_id])
        if value is None:
            raise ValueUnavailable(what)
        return value

    def field_values(self, fields: Sequence[int | tuple[int, int]]) -> list[int | None]:
        """Several field values (ids or (id, scope) pairs) in one nvmlDeviceGetFieldValues call.

        Field calls report a status per field: an unsupported or unavailable field
        comes back as None without failing the others. Another per-field error
        is raised as `NvmlError`. Fields read ahead by `read_fields_ahead` are served
        from that call.
        """
        keys = _field_keys(fields)
        ahead = self._fields_ahead
        if isinstance(ahead, NvmlError):
            if self._fields_ahead_keys.issuperset(keys):
                raise ahead
        elif ahead is not None and all(key in ahead for key in keys):
            return _values_of([ahead[key] for key in keys])
        with translated():
            return _values_of(_get_field_values(self._handle, keys))

    def field_answers(self, fields: Sequence[int | tuple[int, int]]) -> list[FieldAnswer]:
        """Each field's status and number, in one nvmlDeviceGetFieldValues call, read now.

        Unlike `field_values`, which folds every kind of absence into None, this keeps the
        status the driver gave each field (NOT_SUPPORTED, INVALID_ARGUMENT for an id it does
        not know, ...). The call's own failure is raised as `NvmlError`.
        """
        with translated():
            results = _get_field_values(self._handle, _field_keys(fields))
        answers = []
        for field in results:
            status = int(field.nvmlReturn)
            value = _field_number(field) if status == pynvml.NVML_SUCCESS else None
            if value == _sentinel_for(field.valueType):
                value = None
            answers.append(FieldAnswer(status, value))
        return answers

    def read_fields_ahead(self, fields: Sequence[int | tuple[int, int]]) -> None:
        """Read `fields` in one call now, for the `field_values` calls of this cycle.

        Collectors that each read a few fields then share one nvmlDeviceGetFieldValues call.
        A failed call is kept too, and raised to each reader of those fields, as its own
        call would have been. Only the GPU's own worker thread reads ahead, and it ends
        with `forget_fields_ahead`.
        """
        keys = list(dict.fromkeys(_field_keys(fields)))
        self._fields_ahead_keys = frozenset(keys)
        try:
            with translated():
                results = _get_field_values(self._handle, keys)
        except NvmlError as error:
            self._fields_ahead = error
            return
        self._fields_ahead = dict(zip(keys, results, strict=True))

    def forget_fields_ahead(self) -> None:
        """Read fields from NVML again (see `read_fields_ahead`)."""
        self._fields_ahead = None
        self._fields_ahead_keys = frozenset()

    def utilization_samples(self, kind: str, since_us: int) -> list[tuple[int, float]]:
        """(timestamp µs, percent) samples newer than `since_us`; `kind` is gpu or memory.

        NVML keeps a ring of samples taken every 1/6 s to 1 s depending on the product;
        an empty list means no new sample since `since_us`.
        """
        try:
            with translated():
                value_type, samples = self._samples(_SAMPLE_TYPES[kind], since_us)
        except NotSupported as error:
            if error.code == pynvml.NVML_ERROR_NOT_FOUND:
                return []
            raise
        return [
            (int(sample.timeStamp), float(_sample_number(sample.sampleValue, value_type)))
            for sample in samples
        ]

    def _samples(self, sample_type: int, since_us: int) -> tuple[int, list[Any]]:
        """Read nvmlDeviceGetSamples in one call where pynvml's wrapper makes two (count, read).

        A buffer that comes back full may have left samples out: that read is done again the
        two-call way, and the buffer keeps the larger size the driver gave.
        """
        function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        value_type, count = ctypes.c_uint(0), ctypes.c_uint(0)
        fixed = (ctypes.c_uint(sample_type), ctypes.c_ulonglong(since_us), ctypes.byref(value_type))

        def fill(capacity: int) -> Any:
            samples = (_Sample * capacity)()
            count.value = capacity
            pynvml._nvmlCheckReturn(function(self._handle, *fixed, ctypes.byref(count), samples))
            return samples

        capacity = self._sample_slots.get(sample_type, _SAMPLE_SLOTS)
        samples = fill(capacity)
        if count.value >= capacity:
            pynvml._nvmlCheckReturn(function(self._handle, *fixed, ctypes.byref(count), None))
            capacity = self._sample_slots[sample_type] = max(count.value, capacity)
            samples = fill(capacity)
        return value_type.value, list(samples[: count.value])

    def pcie_throughput_kib_per_second(self, direction: str) -> int:
        """PCIe tx or rx KiB/s (nvmlDeviceGetPcieThroughput): blocks for its 20 ms window."""
        counter = (
            pynvml.NVML_PCIE_UTIL_TX_BYTES if direction == "tx" else pynvml.NVML_PCIE_UTIL_RX_BYTES
        )
        with translated():
            value = pynvml.nvmlDeviceGetPcieThroughput(self._handle, counter)
        return _checked(value, f"pcie.{direction}")

    def nvlink_active(self, link: int) -> bool:
        """nvmlDeviceGetNvLinkState: True while the link is up."""
        with translated():
            return bool(pynvml.nvmlDeviceGetNvLinkState(self._handle, link))

    def nvlink_error_count(self, link: int, counter: int) -> int:
        """One NVML_NVLINK_ERROR_DL_* counter of a link (nvmlDeviceGetNvLinkErrorCounter)."""
        with translated():
            value = pynvml.nvmlDeviceGetNvLinkErrorCounter(self._handle, link, counter)
        return _checked(value, "nvlink error counter", _ULONGLONG_UNAVAILABLE)

    def ecc_mode_enabled(self) -> bool:
        """nvmlDeviceGetEccMode: whether ECC is currently on."""
        with translated():
            current, _pending = pynvml.nvmlDeviceGetEccMode(self._handle)
        return bool(current)

    def ecc_error_count(self, error_type: int, counter: int) -> int:
        """ECC errors of a type and counter kind (nvmlDeviceGetTotalEccErrors)."""
        with translated():
            value = pynvml.nvmlDeviceGetTotalEccErrors(self._handle, error_type, counter)
        return _checked(value, "ecc errors", _ULONGLONG_UNAVAILABLE)

    def remapped_rows(self) -> RemappedRows:
        """Row remapping state (nvmlDeviceGetRemappedRows; Ampere and newer data-centre GPUs)."""
        with translated():
            correctable, uncorrectable, pending, failed = pynvml.nvmlDeviceGetRemappedRows(
                self._handle
            )
        return RemappedRows(int(correctable), int(uncorrectable), bool(pending), bool(failed))

    def retired_page_count(self, cause: int) -> int:
        """How many pages nvmlDeviceGetRetiredPages lists for a cause (pre-Ampere GPUs)."""
        with translated():
            return len(pynvml.nvmlDeviceGetRetiredPages(self._handle, cause))

    def retired_pages_pending(self) -> bool:
        """nvmlDeviceGetRetiredPagesPendingStatus: a retirement waits for the next reset."""
        with translated():
            return bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(self._handle))

    def compute_processes(self) -> list[ProcessMemory]:
        """nvmlDeviceGetComputeRunningProcesses: PIDs (host namespace) and their memory.

        The newest of _v3, _v2 and v1 that the driver exports, read with the record size that
        driver writes (a wrong size reads garbage from the second process on).
        """
        if self._process_list is None:
            self._process_list = _process_list_function()
        return self._processes(*self._process_list)

    def graphics_processes(self) -> list[ProcessMemory]:
        """nvmlDeviceGetGraphicsRunningProcesses: the graphics contexts (Xorg, a desktop).

        The same version of the list function as `compute_processes`, with the same record.
        """
        if self._process_list is None:
            self._process_list = _process_list_function()
        name, record = self._process_list
        return self._processes(name.replace("Compute", "Graphics"), record)

    def _processes(self, name: str, record: type[ctypes.Structure]) -> list[ProcessMemory]:
        with translated():
            processes = _listed(
                name,
                record,
                lambda function, entries, count: function(self._handle, count, entries),
            )
        return [
            ProcessMemory(
                int(p.pid),
                None if p.usedGpuMemory == _ULONGLONG_UNAVAILABLE else int(p.usedGpuMemory),
            )
            for p in processes
        ]

    def process_utilization(self, since_us: int) -> list[ProcessUtilization]:
        """Per-process samples newer than `since_us` (nvmlDeviceGetProcessUtilization)."""
        try:
            with translated():
                samples = _listed(
                    "nvmlDeviceGetProcessUtilization",
                    pynvml.c_nvmlProcessUtilizationSample_t,
                    lambda function, entries, count: function(
                        self._handle, entries, count, ctypes.c_ulonglong(since_us)
                    ),
                )
        except NotSupported as error:
            if error.code == pynvml.NVML_ERROR_NOT_FOUND:
                return []
            raise
        return [
            ProcessUtilization(int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil))
            for s in samples
        ]

    def minor_number(self) -> int:
        """nvmlDeviceGetMinorNumber: N of the GPU's device node /dev/nvidiaN."""
        with translated():
            return int(pynvml.nvmlDeviceGetMinorNumber(self._handle))

    def mig_mode_enabled(self) -> bool:
        """nvmlDeviceGetMigMode: whether the GPU is partitioned into MIG instances now."""
        with translated():
            current, _pending = pynvml.nvmlDeviceGetMigMode(self._handle)
        return current == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_devices(self) -> list[MigDevice]:
        """The MIG devices present (one per compute instance), skipping empty slots."""
        with translated():
            slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(self._handle)
        found = []
        for slot in range(slots):
            try:
                with translated():
                    handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(self._handle, slot)
                    instance = int(pynvml.nvmlDeviceGetGpuInstanceId(handle))
                    compute = int(pynvml.nvmlDeviceGetComputeInstanceId(handle))
                    name = _text(pynvml.nvmlDeviceGetName(handle))
            except NvmlError as error:
                if error.code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            found.append(
                MigDevice(
                    instance,
                    _mig_profile(name),
                    Device(self.index, handle),
                    compute,
                    _multiprocessors(handle),
                )
            )
        return found

    def gpu_instance_info(self, gpu_instance: int) -> GpuInstanceInfo:
        """nvmlDeviceGetGpuInstanceById, nvmlGpuInstanceGetInfo: one MIG GPU instance's profile.

        NVML lists it for a privileged user only (nvml.h: "Requires privileged user").
        """
        with translated():
            handle = pynvml.nvmlDeviceGetGpuInstanceById(self._handle, gpu_instance)
            info = pynvml.nvmlGpuInstanceGetInfo(handle)
        return GpuInstanceInfo(
            int(info.profileId), int(info.placement.start), int(info.placement.size)
        )

    def gpm_supported(self) -> bool:
        """nvmlGpmQueryDeviceSupport: GPU performance monitoring (Hopper and newer)."""
        try:
            with translated():
                return bool(pynvml.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice)
        except NotSupported:
            return False

    def gpm_sampler(self, gpu_instance: int | None = None) -> GpmSampler:
        """A GPM sampler for this GPU, or for one of its MIG GPU instances."""
        return GpmSampler(self._handle, gpu_instance)


def _multiprocessors(mig_handle: Any) -> int | None:
    """nvmlDeviceGetAttributes_v2: a MIG device's SMs, None where NVML does not say."""
    try:
        with translated():
            return int(pynvml.nvmlDeviceGetAttributes_v2(mig_handle).multiprocessorCount)
    except NotSupported:
        return None


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t (nvml.h), which pynvml no longer declares: what v1 writes."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoEarlyR535(ctypes.Structure):
    """The 32-byte record early R535 drivers (before 535.98) wrote from _v3."""

    _fields_ = [
        *pynvml.c_nvmlProcessInfo_v2_t._fields_,
        ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
    ]


def _process_list_function() -> tuple[str, type[ctypes.Structure]]:
    """The newest process-list function this driver exports and the record it writes."""
    for name, record in (
        ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.c_nvmlProcessInfo_v3_t),
        ("nvmlDeviceGetComputeRunningProcesses_v2", pynvml.c_nvmlProcessInfo_v2_t),
    ):
        try:
            pynvml._nvmlGetFunctionPointer(name)
        except pynvml.NVMLError_FunctionNotFound:
            continue
        if name.endswith("_v3") and _early_r535(_text(pynvml.nvmlSystemGetDriverVersion())):
            return name, _ProcessInfoEarlyR535
        return name, record
    return "nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1


def _early_r535(driver_version: str) -> bool:
    numbers = tuple(int(part) for part in re.findall(r"\d+", driver_version)[:2])
    return (535, 43) <= numbers < (535, 98)  # 535.43.02-535.86.05 (NS src/nvml.h :285-296)


class _FieldValue(ctypes.Structure):
    """pynvml's c_nvmlFieldValue_t, same layout, without its per-attribute Python hooks.

    Those hooks turn bytes into str on every read and write; a field value has no bytes,
    and ~6 hooked accesses per field, for every field every cycle, were most of the call's CPU.
    """

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


class _Sample(ctypes.Structure):
    """pynvml's c_nvmlSample_t without its per-attribute hooks (see `_FieldValue`)."""

    _fields_ = pynvml.c_nvmlSample_t._fields_


def _get_field_values(handle: Any, fields: Sequence[tuple[int, int]]) -> Any:
    """pynvml.nvmlDeviceGetFieldValues, filling an array of `_FieldValue`."""
    values = (_FieldValue * len(fields))()
    for slot, field in zip(values, fields, strict=True):
        slot.fieldId, slot.scopeId = field
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    pynvml._nvmlCheckReturn(function(handle, ctypes.c_int32(len(fields)), ctypes.byref(values)))
    return values


def _field_keys(fields: Sequence[int | tuple[int, int]]) -> list[tuple[int, int]]:
    """(field id, scope) of each field; a bare id has scope 0."""
    return [field if isinstance(field, tuple) else (field, 0) for field in fields]


def _values_of(results: Sequence[Any]) -> list[int | None]:
    """Each field's number; None for an absent one; another per-field error is raised."""
    values: list[int | None] = []
    for field in results:
        status = field.nvmlReturn
        if status != pynvml.NVML_SUCCESS:  # the check raises; success, most fields, is free
            if status == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                values.append(None)  # an id this driver does not know (past its NVML_FI_MAX)
                continue
            try:
                with translated():
                    pynvml._nvmlCheckReturn(status)
            except NotSupported:
                values.append(None)
                continue
        value = _field_number(field)
        values.append(None if value == _sentinel_for(field.valueType) else value)
    return values


def _field_number(field: Any) -> int:
    value_type = field.valueType
    if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return int(field.value.dVal)
    if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(field.value.uiVal)
    if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(field.value.ulVal)
    if value_type == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(field.value.sllVal)
    if value_type == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return int(field.value.siVal)
    return int(field.value.ullVal)


def _sample_number(value: Any, value_type: int) -> float:
    if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(value.dVal)
    if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(value.ullVal)
    if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(value.ulVal)
    return float(value.uiVal)


def _sentinel_for(value_type: int) -> int:
    if value_type in (pynvml.NVML_VALUE_TYPE_SIGNED_INT, pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG):
        return _SIGNED_UNAVAILABLE  # `_field_number` reads siVal / sllVal as signed
    if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return _UINT_UNAVAILABLE
    return _ULONGLONG_UNAVAILABLE
