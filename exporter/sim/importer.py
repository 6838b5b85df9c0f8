"""``gpuload sim import``: a scenario from what ``nvidia-smi`` printed on a real machine.

The readers in :mod:`exporter.sim.nvsmi` find the values; this module maps them onto the scenario
format (:mod:`exporter.sim.scenario`), adding as little to it as it can:

- the GPU entry starts from the closest ``models.yaml`` entry (the one with the recorded PCI
  device id, else the recorded name, else a base per architecture, :data:`ARCHITECTURE_BASES`)
  and every recorded static value overrides that model's key (name, memory, BAR1, PCIe link,
  power limits, maximum clocks, thresholds, fans, NVLink links);
- values that move (utilization, memory and BAR1 used, temperatures, power, clocks, fan, PCIe
  throughput, clock event reasons, processes) become the GPU entry's ``overrides``, each a
  constant at the recorded value, without noise;
- what nvidia-smi printed as ``N/A``, ``[N/A]`` or ``Not Supported`` becomes that function
  answering NOT_SUPPORTED for that GPU: the model's feature list (``lacks``, and ``has`` for a
  feature the base model lacks but the recording shows), ``fans: 0``, or else a
  ``not_supported`` fault without a window; ``Insufficient Permissions`` becomes an ``error``
  fault answering NO_PERMISSION;
- a capture bundle's ``nvml-symbols`` section sets ``driver.lacks``: every simulated function
  the recorded library does not export.

nvidia-smi prints memory in whole MiB, each figure rounded on its own, so total, reserved, used
and free need not add up (the recorded H100 prints 81559 = 479 + 0 + 81081 - 1). The import
places each byte count within half a MiB of its printed figure so that all four round back to
what was printed (:func:`fit_memory`); the same holds for the MIG instances of a GPU and its
whole-GPU ``used``.

Values nvidia-smi prints that the simulator would otherwise derive are set as printed: BAR1 in
use (``bar1_used``), the PCIe replay count (``pcie_replays``), ECC off (``ecc_enabled``), a MIG
instance's memory where it is not its profile's share (``memory_total``), and free memory
(``memory_free``) where the printed figures are further apart than rounding explains.

What the recording holds but the scenario format cannot express (a non-zero ECC count, a
pending row remap, a T.Limit offset the model cannot give) is reported as a note; a field the
import does not read is listed with ``--verbose``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from exporter.sim.features import FEATURES, READINGS
from exporter.sim.library import FUNCTION_NAMES
from exporter.sim.nvsmi import (
    NO_PERMISSION,
    NOT_SUPPORTED,
    Field,
    RecordedGpu,
    RecordedMigDevice,
    RecordedProcess,
    Recording,
    RecordingError,
    read_recording,
)
from exporter.sim.scenario import (
    ARCHITECTURES,
    BRANDS,
    CLOCK_EVENT_REASONS,
    COMPUTE_MODES,
    MIG_PROFILES,
    OPT_IN_FEATURES,
    GpuModel,
    ScenarioError,
    gpu_models,
    mig_instance_ids,
    mig_instance_memory,
    parse_scenario,
)

__all__ = ["ARCHITECTURE_BASES", "STATES", "Imported", "RecordingError", "import_file", "render"]

STATES = ("idle", "load")

# The models.yaml entry an unknown GPU starts from, by architecture: PCIe cards without NVLink
# where the architecture has one, so that nothing the recording cannot say is switched on.
ARCHITECTURE_BASES = {
    "kepler": "p100-pcie-16gb",
    "maxwell": "p100-pcie-16gb",
    "pascal": "p100-pcie-16gb",
    "volta": "v100-sxm2-32gb",
    "turing": "t4",
    "ampere": "rtx-a6000",
    "ada": "l4",
    "hopper": "h100-pcie",
    "blackwell": "h100-pcie",
}

# The NVML calls behind each optional feature, for a NO_PERMISSION answer.
_FEATURE_CALLS = {feature.name: feature.functions for feature in FEATURES}

# Byte counts are placed on 1/16 MiB steps: short, exact decimals in the YAML.
_STEPS = 16
_LEEWAY = 7  # steps a figure may move: 7/16 MiB rounds back to the MiB nvidia-smi printed


@dataclass
class Imported:
    """A scenario document made from a recording, and what the import could not carry over."""

    document: dict[str, Any]
    base_models: list[str]
    notes: list[str]
    ignored: list[str]
    source: str
    state: str | None


# ---------------------------------------------------------------------------------------------
# Values


def _mib(value: Field, name: str) -> float:
    return value.number(name, "MiB")


def _fraction(value: Field, name: str) -> float:
    percent = value.number(name, "%")
    if not 0 <= percent <= 100:
        raise value.fail(name, "a percentage 0..100 like '37 %'")
    return percent / 100


def _watts(value: Field, name: str) -> float:
    return value.number(name, "W")


def _celsius(value: Field, name: str) -> float:
    return value.number(name, "C")


def _whole_celsius(value: Field, name: str) -> int:
    return round(_celsius(value, name))


def _mhz(value: Field, name: str) -> int:
    return round(value.number(name, "MHz"))


class _Hex(int):
    """An id the YAML writes in hexadecimal, as nvidia-smi prints it (0x233010DE)."""


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing :class:`_Hex` ids in hexadecimal."""


_Dumper.add_representer(
    _Hex, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:int", f"0x{value:08X}")
)


def _hex(value: Field, name: str) -> int:
    """``0x233010DE`` (CSV, text) or ``233010DE`` (XML)."""
    try:
        return _Hex(int(value.text.strip(), 16))
    except ValueError:
        raise value.fail(name, "a hexadecimal id like 0x233010DE") from None


def _decimal(number: float) -> str:
    """A reading as nvidia-smi prints it, at most two decimals: 69.85, 700."""
    return f"{number:.2f}".rstrip("0").rstrip(".")


def _lanes(value: Field, name: str) -> int:
    return value.integer(name, "x")


def _kib_per_second(value: Field, name: str) -> float:
    return value.number(name, "KB/s")


_ON = {"enabled", "yes", "active", "on"}
_OFF = {"disabled", "no", "not active", "off", "none"}


def _switch(value: Field, name: str) -> bool:
    text = " ".join(value.text.split()).lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise value.fail(name, "Enabled or Disabled (Yes or No, Active or Not Active)")


def _version(value: Field) -> str:
    # `610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]`.
    return value.text.split("[")[0].strip()


def _cuda_version(value: Field) -> int:
    text = _version(value)
    match = re.match(r"^(\d+)\.(\d+)$", text)
    if not match:
        raise value.fail("CUDA Version", "a version like '12.4'")
    return int(match.group(1)) * 1000 + int(match.group(2)) * 10


def _megabytes(units: int) -> str:
    """A byte count on 1/16 MiB steps, as the scenario format writes sizes."""
    whole, part = divmod(units, _STEPS)
    return f"{whole}MiB" if not part else f"{units / _STEPS}MiB"


def fit_memory(
    total: float | None, reserved: float | None, used: float | None, free: float | None
) -> tuple[int | None, int | None, int | None, bool]:
    """Byte counts (in 1/16 MiB steps) for total, reserved, used that round to what was printed.

    NVML's free is total - reserved - used; nvidia-smi rounds each to whole MiB on its own, so
    the printed free can differ from that by one. Each count may move up to 7/16 MiB, which
    still rounds back to its printed MiB, so that free does too. Returns the steps and whether
    it fits; when the printed figures are two or more MiB apart it does not, and they are
    returned as printed.
    """
    steps = [None if v is None else round(v * _STEPS) for v in (total, reserved, used)]
    t, r, u = steps
    if free is None or t is None or u is None:
        return t, r, u, True
    gap = t - (r or 0) - u - round(free * _STEPS)
    moves = range(-_LEEWAY, _LEEWAY + 1)
    # The smallest residual, then the smallest moves.
    residual, _, dt, dr = min(
        (abs(gap + dt - dr), abs(dt) + abs(dr), dt, dr)
        for dt in moves
        for dr in (moves if r is not None else (0,))
    )
    if residual > _LEEWAY:
        return t, r, u, False  # as printed: free is given on its own
    return t + dt, None if r is None else r + dr, u, True


# ---------------------------------------------------------------------------------------------
# Mapping one GPU


def choose_model(fields: Mapping[str, Field]) -> tuple[str, str]:
    """The models.yaml entry to start from, and why: device id, name, or architecture."""
    models = gpu_models()
    device_id = fields.get("pci_device_id")
    if device_id is not None and device_id.missing is None:
        number = _hex(device_id, "PCI device id")
        for key, model in models.items():
            if model.pci_device_id == number:
                return key, f"PCI device id {number:#010X}"
    name = fields.get("name")
    if name is not None:
        for key, model in models.items():
            if model.name == name.text.strip():
                return key, "product name"
    architecture = _architecture(fields.get("architecture"))
    if architecture in ARCHITECTURE_BASES:
        return ARCHITECTURE_BASES[architecture], f"architecture {architecture}"
    return "l4", "no product, device id or architecture known: the default base"


def _architecture(value: Field | None) -> str | None:
    if value is None or value.missing:
        return None
    word = value.text.strip().split(" ")[0].lower()
    return word if word in ARCHITECTURES else None


class _GpuImport:
    """Builds one GPU entry (and its faults) from a recorded GPU."""

    def __init__(self, gpu: RecordedGpu, index: int, notes: list[str]) -> None:
        self.gpu = gpu
        # A value redacted before the file was shared is unknown: the model's, with a note.
        self.fields = {key: found for key, found in gpu.fields.items() if not found.redacted}
        for key, found in gpu.fields.items():
            if found.redacted:
                notes.append(f"{found.where}: {key} is redacted ({found.text.strip()!r}): unknown")
        self.index = index
        self.notes = notes
        self.model_key, self.model_reason = choose_model(self.fields)
        self.model: GpuModel = gpu_models()[self.model_key]
        self.entry: dict[str, Any] = {"model": self.model_key}
        self.overrides: dict[str, Any] = {}
        self.lacks: set[str] = set()
        self.has: set[str] = set()
        self.faults: list[dict[str, Any]] = []
        self.mig: list[dict[str, Any]] = []
        self.gpu_memory = self.model.memory_total  # bytes: the recorded total, once read

    # -- helpers ------------------------------------------------------------------------------

    def field(self, key: str) -> Field | None:
        return self.fields.get(key)

    def value(self, key: str) -> Field | None:
        """The field when it holds a value (not N/A)."""
        found = self.fields.get(key)
        return None if found is None or found.missing else found

    def note(self, where: str, message: str) -> None:
        self.notes.append(f"{where}: {message}")

    def unsupported(self, calls: Iterable[str], found: Field) -> None:
        """The driver answers what nvidia-smi's N/A or Insufficient Permissions says."""
        if found.missing == NO_PERMISSION:
            faults = [
                {"kind": "error", "gpu": self.index, "call": call, "error": NO_PERMISSION}
                for call in calls
            ]
        else:
            faults = [{"kind": "not_supported", "gpu": self.index, "calls": list(calls)}]
        # Several printed values of one feature refused alike make its faults once.
        self.faults += [fault for fault in faults if fault not in self.faults]

    def feature(self, name: str, found: Field | None) -> bool:
        """Set feature ``name`` from whether the recording has a value for it."""
        if found is None:
            return False
        if found.missing == NO_PERMISSION:
            self.unsupported(_FEATURE_CALLS[name], found)
            return False
        if found.missing == NOT_SUPPORTED:
            self.lacks.add(name)
            return False
        if name in self.model_lacks:
            self.has.add(name)
        return True

    @property
    def model_lacks(self) -> frozenset[str]:
        return self.model.lacks | (OPT_IN_FEATURES - self.model.features)

    def set_model(self, key: str, found: Field | None, convert: Callable[[Field], Any]) -> None:
        if found is not None and found.missing is None:
            self.entry[key] = convert(found)

    @property
    def in_mig(self) -> bool:
        return bool(self.gpu.mig_devices)

    # -- the entry ----------------------------------------------------------------------------

    def build(self) -> dict[str, Any]:
        self.identity()
        self.memory()
        self.pcie()
        self.utilization()
        self.temperature()
        self.power()
        self.clocks()
        self.fan()
        self.memory_errors()
        self.mig_devices()
        self.processes()
        self.nvlink()
        if self.lacks:
            self.entry["lacks"] = sorted(self.lacks)
        if self.has:
            self.entry["has"] = sorted(self.has)
        if self.mig:
            self.entry["mig"] = self.mig
        self.entry["overrides"] = self.overrides
        return self.entry

    def identity(self) -> None:
        name = self.value("name")
        if name is not None:
            self.entry["name"] = name.text.strip()
        brand = self.value("brand")
        if brand is not None:
            key = "_".join(brand.text.lower().split())
            if key in BRANDS:
                self.entry["brand"] = key
            else:
                self.note(brand.where, f"brand {brand.text!r} is not one the simulator knows")
        architecture = _architecture(self.value("architecture"))
        if architecture is not None:
            self.entry["architecture"] = architecture
        self.set_model("compute_capability", self.value("compute_capability"), lambda f: f.text)
        uuid = self.value("uuid")
        if uuid is not None:
            if re.match(r"^GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", uuid.text.strip()):
                self.entry["uuid"] = uuid.text.strip()
            else:
                self.note(uuid.where, f"UUID {uuid.text!r} kept out: not GPU-xxxxxxxx-... (hex)")
        serial = self.field("serial")
        if self.feature("serial", serial) and serial is not None:
            self.entry["serial"] = serial.text.strip()
        bus = self.value("pci_bus_id")
        if bus is not None:
            self.entry["pci_bus_id"] = bus.text.strip()
        for key in ("pci_device_id", "pci_subsystem_id"):
            self.set_model(key, self.value(key), partial(_hex, name=key))
        vbios = self.field("vbios")
        if vbios is not None and vbios.missing:
            self.unsupported(("nvmlDeviceGetVbiosVersion",), vbios)
        self.set_model("vbios", self.value("vbios"), lambda f: f.text.strip())
        for key in ("persistence_mode", "display_active"):
            self.set_model(key, self.value(key), partial(_switch, name=key))
        mode = self.value("compute_mode")
        if mode is not None:
            key = "_".join(mode.text.lower().split())
            if key in COMPUTE_MODES:
                self.entry["compute_mode"] = key
            else:
                raise mode.fail("compute mode", "Default, Exclusive_Process or Prohibited")

    def memory(self) -> None:
        fields = {k: self.value(f"memory_{k}") for k in ("total", "reserved", "used", "free")}
        numbers = {k: None if f is None else _mib(f, f"memory {k}") for k, f in fields.items()}
        used = numbers["used"]
        if self.in_mig:
            used = None  # the instances' sum, placed with them (mig_devices)
        total, reserved, used_steps, fits = fit_memory(
            numbers["total"], numbers["reserved"], used, None if self.in_mig else numbers["free"]
        )
        if not fits and fields["free"] is not None:
            # More than rounding apart (2 MiB on three recorded XML files): the printed free.
            self.overrides["memory_free"] = f"{round(_mib(fields['free'], 'memory free'))}MiB"
        if total is not None:
            self.entry["memory_total"] = _megabytes(total)
            self.gpu_memory = total * 2**20 // _STEPS
        if reserved is not None:
            self.entry["memory_reserved"] = _megabytes(reserved)
        if used_steps is not None:
            self.overrides["memory_used"] = _megabytes(used_steps)
        self._absent_memory(
            "memory_total", ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2")
        )
        bar1_total = self.value("bar1_total")
        if bar1_total is not None:
            self.entry["bar1_total"] = f"{round(_mib(bar1_total, 'BAR1 total'))}MiB"
        bar1_used = self.value("bar1_used")
        if bar1_used is not None:
            self.overrides["bar1_used"] = f"{round(_mib(bar1_used, 'BAR1 used'))}MiB"
        self._absent_memory("bar1_total", ("nvmlDeviceGetBAR1MemoryInfo",))

    def _absent_memory(self, key: str, calls: tuple[str, ...]) -> None:
        found = self.field(key)
        if found is not None and found.missing:
            self.unsupported(calls, found)

    def pcie(self) -> None:
        links = {
            "pcie_generation": "nvmlDeviceGetCurrPcieLinkGeneration",
            "pcie_max_generation": "nvmlDeviceGetMaxPcieLinkGeneration",
            "pcie_gpu_max_generation": "nvmlDeviceGetGpuMaxPcieLinkGeneration",
            "pcie_width": "nvmlDeviceGetCurrPcieLinkWidth",
            "pcie_max_width": "nvmlDeviceGetMaxPcieLinkWidth",
        }
        for key, call in links.items():
            found = self.field(key)
            if found is None:
                continue
            if found.missing:
                self.unsupported((call,), found)
            elif key.endswith("width"):
                self.entry[key] = _lanes(found, key)
            else:
                self.entry[key] = found.integer(key)
        if "pcie_max_generation" in self.entry and "pcie_gpu_max_generation" not in self.entry:
            # Old reports print one maximum: the GPU's own is at least the link's.
            generation = max(self.entry["pcie_max_generation"], self.model.pcie_gpu_max_generation)
            self.entry["pcie_gpu_max_generation"] = generation
        self.feature("pcie_replay", self.field("pcie_replays"))
        replays = self.value("pcie_replays")
        if replays is not None and replays.integer("PCIe replays"):
            self.entry["pcie_replays"] = replays.integer("PCIe replays")
        for key in ("pcie_tx", "pcie_rx"):
            rate = self.value(key)
            if rate is not None:
                # NVML's KB/s are KiB/s (nvmlDeviceGetPcieThroughput).
                self.overrides[key] = f"{_decimal(_kib_per_second(rate, key))}KiB/s"

    def utilization(self) -> None:
        names = {
            "utilization": ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetSamples"),
            "memory_utilization": ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetSamples"),
        }
        for key, calls in names.items():
            found = self.field(key)
            if found is None:
                continue
            if found.missing:
                # In MIG mode the simulator answers NOT_SUPPORTED already, as the driver does.
                if not self.in_mig and key == "utilization":
                    self.unsupported(calls, found)
                continue
            self.overrides[key] = _fraction(found, key)
        self.readings()

    def readings(self) -> None:
        """The table-driven readings (exporter/sim/features.py), each value as printed."""
        for reading in READINGS:
            for output in reading.outputs:
                found = self.field(output.metric)
                if reading.whole_gpu and self.in_mig and found is not None and found.missing:
                    continue  # the simulator answers NOT_SUPPORTED in MIG mode already
                if not self.feature(reading.feature, found) or found is None:
                    continue
                if output.printed.unit == "%":
                    self.overrides[output.metric] = _fraction(found, output.metric)
                else:
                    number = found.number(output.metric, output.printed.unit)
                    self.overrides[output.metric] = number / output.nvml_per_unit

    def temperature(self) -> None:
        core = self.field("temperature")
        if core is not None:
            if core.missing:
                self.unsupported(("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"), core)
            else:
                self.overrides["temperature"] = _celsius(core, "GPU temperature")
        memory = self.field("memory_temperature")
        if memory is not None and memory.missing == NO_PERMISSION:
            self.note(
                memory.where,
                "memory temperature refused: field 82 cannot be refused alone; left unsupported",
            )
            self.lacks.add("memory_temperature")
        elif self.feature("memory_temperature", memory) and memory is not None:
            self.overrides["memory_temperature"] = _celsius(memory, "memory temperature")
        for key in ("temp_shutdown", "temp_slowdown", "temp_gpu_max", "temp_memory_max"):
            self.set_model(key, self.value(key), partial(_whole_celsius, name=key))
        shutdown, slowdown = self.field("temp_shutdown"), self.field("temp_slowdown")
        if shutdown is not None and slowdown is not None and shutdown.missing and slowdown.missing:
            self.unsupported(("nvmlDeviceGetTemperatureThreshold",), shutdown)
        self._tlimits()

    def _tlimits(self) -> None:
        """Absolute thresholds from T.Limit offsets, where only those are printed.

        nvidia-smi prints the thresholds of the recorded Ada and Hopper GPUs as offsets from the
        maximum operating temperature (T.Limit) only; the simulator answers fields 193-196 as
        ``temp_gpu_max - threshold`` (exporter.sim.functions), so the thresholds are set to give
        back the printed offsets, from the model's ``temp_gpu_max``.
        """
        gpu_max = self.entry.get("temp_gpu_max", self.model.temp_gpu_max)
        for key in ("shutdown", "slowdown"):
            offset = self.value(f"tlimit_{key}")
            if offset is not None and f"temp_{key}" not in self.entry:
                self.entry[f"temp_{key}"] = round(gpu_max - _celsius(offset, f"T.Limit {key}"))
        for key in ("tlimit_gpu_max", "tlimit_memory_max"):
            offset = self.value(key)
            if offset is not None and _celsius(offset, key) != 0:
                self.note(offset.where, f"{key} offset {offset.text!r}: the simulator answers 0")

    def power(self) -> None:
        draw = self._power_draw()
        if draw is not None:
            if draw.missing:
                self.unsupported(("nvmlDeviceGetPowerUsage",), draw)
            else:
                self.overrides["power"] = f"{_decimal(_watts(draw, 'power draw'))}W"
        limits = {
            "power_limit": ("nvmlDeviceGetEnforcedPowerLimit",),
            "power_default_limit": ("nvmlDeviceGetPowerManagementDefaultLimit",),
            "power_min_limit": ("nvmlDeviceGetPowerManagementLimitConstraints",),
            "power_max_limit": ("nvmlDeviceGetPowerManagementLimitConstraints",),
        }
        for key, calls in limits.items():
            found = self.field(key)
            if found is None:
                continue
            if found.missing:
                if key == "power_limit":
                    self.unsupported(calls, found)
                continue
            self.entry[key] = f"{_decimal(_watts(found, key))}W"

    def _power_draw(self) -> Field | None:
        """What nvmlDeviceGetPowerUsage answered.

        ``power.draw`` where printed; else the 1 s average on Ampere (not GA100) and newer, the
        instant reading before (nvml-facts.md).
        """
        draw = self.field("power_draw")
        if draw is not None:
            return draw
        average, instant = self.field("power_draw_average"), self.field("power_draw_instant")
        architecture = self.entry.get("architecture") or _arch_name(self.model.architecture)
        name = self.entry.get("name", self.model.name)
        averaged = ARCHITECTURES.get(architecture, 0) >= ARCHITECTURES["ampere"]
        first, second = (
            (average, instant) if averaged and "A100" not in name else (instant, average)
        )
        if first is not None and first.missing is None:
            return first
        return second if second is not None and second.missing is None else first or second

    def clocks(self) -> None:
        current = ("graphics_clock", "sm_clock", "memory_clock", "video_clock")
        missing = [self.field(k) for k in current if self.field(k) is not None]
        for key in current:
            found = self.value(key)
            if found is not None:
                self.overrides[key] = _mhz(found, key)
        if missing and all(f is not None and f.missing for f in missing):
            assert missing[0] is not None
            self.unsupported(("nvmlDeviceGetClockInfo",), missing[0])
        maxima = ("max_graphics_clock", "max_sm_clock", "max_memory_clock", "max_video_clock")
        for key in maxima:
            self.set_model(key, self.value(key), partial(_mhz, name=key))
        recorded = [self.field(k) for k in maxima if self.field(k) is not None]
        if recorded and all(f is not None and f.missing for f in recorded):
            assert recorded[0] is not None
            self.unsupported(("nvmlDeviceGetMaxClockInfo",), recorded[0])
        self._reasons()

    def _reasons(self) -> None:
        mask = self.field("reason_mask")
        if mask is not None:
            if not self.feature("clock_event_reasons", mask):
                return
            bits = mask.integer("clocks event reasons")
        else:
            reasons = {r: self.field(f"reason.{r}") for r in CLOCK_EVENT_REASONS}
            recorded = {r: f for r, f in reasons.items() if f is not None}
            if not recorded:
                return
            # Supported where any reason has a value; else what the first one says.
            values = [f for f in recorded.values() if not f.missing]
            if not self.feature("clock_event_reasons", (values or list(recorded.values()))[0]):
                return
            bits = 0
            for reason, found in recorded.items():
                if found.missing is None and _switch(found, f"clock event reason {reason}"):
                    bits |= CLOCK_EVENT_REASONS[reason]
        names = [name for name, bit in CLOCK_EVENT_REASONS.items() if bits & bit]
        unknown = bits & ~sum(CLOCK_EVENT_REASONS.values())
        if unknown and mask is not None:
            self.note(mask.where, f"clock event reason bits {unknown:#x} unknown to the simulator")
        self.overrides["clock_event_reasons"] = names

    def fan(self) -> None:
        found = self.field("fan")
        if found is None:
            return
        if found.missing == NO_PERMISSION:
            self.unsupported(("nvmlDeviceGetFanSpeed", "nvmlDeviceGetFanSpeed_v2"), found)
            return
        if found.missing:
            self.entry["fans"] = 0  # NVML answers NOT_SUPPORTED for a GPU without fans
            return
        self.entry["fans"] = max(1, self.model.fans)
        self.overrides["fan"] = _fraction(found, "fan speed")

    def memory_errors(self) -> None:
        mode = self.field("ecc_mode")
        if self.feature("ecc", mode) and mode is not None:
            enabled = _switch(mode, "ECC mode")
            if not enabled:
                self.entry["ecc_enabled"] = False
            counts = [
                self.field(f"ecc.{t}.{c}")
                for t in ("corrected", "uncorrected")
                for c in ("volatile", "aggregate")
            ]
            present = [f for f in counts if f is not None]
            if enabled and present and all(f.missing for f in present):
                self.unsupported(("nvmlDeviceGetTotalEccErrors",), present[0])
            for found in present:
                if found.missing is None and found.integer("ECC errors"):
                    self.note(
                        found.where,
                        "a non-zero ECC error count: the scenario format "
                        "holds rates, not counts; not reproduced",
                    )
        remapping = ("correctable", "uncorrectable", "pending", "failure")
        self._repair("row_remapping", tuple(f"remapped_{key}" for key in remapping))
        retirement = ("retired_single_bit", "retired_double_bit", "retired_pending")
        self._repair("retired_pages", retirement)

    def _repair(self, feature: str, keys: tuple[str, ...]) -> None:
        """Row remapping or page retirement: supported where any of its fields has a value."""
        found = [f for f in (self.field(k) for k in keys) if f is not None]
        if not found:
            return
        values = [f for f in found if not f.missing]
        self.feature(feature, (values or found)[0])
        for value in values:
            text = value.text.strip().lower()
            if text not in ("0", "no"):
                self.note(
                    value.where,
                    f"{feature} shows {value.text.strip()!r}: the scenario "
                    "format starts every GPU with no repairs; not reproduced",
                )

    def mig_devices(self) -> None:
        mode = self.field("mig_mode")
        if mode is not None and mode.missing and self.model.mig_capable:
            self.unsupported(("nvmlDeviceGetMigMode",), mode)
        if mode is not None and not mode.missing and not self.model.mig_capable:
            self.note(
                mode.where,
                f"MIG mode {mode.text.strip()!r} but the base model "
                f"{self.model_key} has no MIG: NVML answers NOT_SUPPORTED here",
            )
        if not self.gpu.mig_devices:
            return
        if not self.model.mig_capable:
            self.note(
                self.gpu.where, f"MIG devices left out: no MIG profile table for {self.model_key}"
            )
            self.gpu.mig_devices = []
            return
        instances: dict[int, list[RecordedMigDevice]] = {}
        for device in sorted(
            self.gpu.mig_devices, key=lambda d: (d.gpu_instance, d.compute_instance)
        ):
            instances.setdefault(device.gpu_instance, []).append(device)
        used_steps = self._instance_memory(instances)
        for (instance, devices), used in zip(instances.items(), used_steps, strict=True):
            profile = self._instance_profile(devices)
            entry: dict[str, Any] = {"profile": profile, "gpu_instance_id": instance}
            spec = MIG_PROFILES[self.model.mig_profiles][profile]
            printed = round(devices[0].memory_total)
            if round(mig_instance_memory(spec, self.gpu_memory) / 2**20) != printed:
                entry["memory_total"] = f"{printed}MiB"
            slices = [self._compute_slices(d, profile) for d in devices]
            whole = MIG_PROFILES[self.model.mig_profiles][profile].compute_slices
            if len(devices) > 1 or slices[0] != whole:
                entry["compute_instances"] = [f"{n}c" for n in slices]
            overrides: dict[str, Any] = {}
            if used is not None:
                overrides["memory_used"] = _megabytes(used)
            entry["overrides"] = overrides
            self.mig.append(entry)

    def _instance_memory(
        self, instances: Mapping[int, list[RecordedMigDevice]]
    ) -> list[int | None]:
        """Each GPU instance's used memory, placed so that they add up to the GPU's printed used.

        Each may move up to 7/16 MiB (it still rounds to its printed MiB).
        """
        printed = []
        for devices in instances.values():
            used = devices[0].memory_used
            printed.append(
                None
                if used is None or used.missing
                else round(_mib(used, "MIG memory used") * _STEPS)
            )
        whole = self.value("memory_used")
        known = [p for p in printed if p is not None]
        if whole is None or len(known) != len(printed) or not known:
            return printed
        remaining = round(_mib(whole, "memory used") * _STEPS) - sum(known)
        placed = []
        for k, steps in enumerate(known):
            move = max(-_LEEWAY, min(_LEEWAY, round(remaining / (len(known) - k))))
            placed.append(steps + move)
            remaining -= move
        if abs(remaining) > _LEEWAY:
            self.note(
                whole.where,
                "whole-GPU memory used differs from its MIG instances' sum "
                "by more than nvidia-smi's rounding: not reproduced",
            )
        self._whole_memory(sum(placed))
        return list(placed)

    def _whole_memory(self, used: int) -> None:
        """Place total and reserved so that free rounds to what was printed, given ``used``."""
        fields = {k: self.value(f"memory_{k}") for k in ("total", "reserved", "free")}
        numbers = {k: None if f is None else _mib(f, f"memory {k}") for k, f in fields.items()}
        total, reserved, _, fits = fit_memory(
            numbers["total"], numbers["reserved"], used / _STEPS, numbers["free"]
        )
        if total is not None:
            self.entry["memory_total"] = _megabytes(total)
            self.gpu_memory = total * 2**20 // _STEPS
        if reserved is not None:
            self.entry["memory_reserved"] = _megabytes(reserved)
        if not fits and fields["free"] is not None:
            # More than rounding apart (2 MiB on three recorded XML files): the printed free.
            self.overrides["memory_free"] = f"{round(_mib(fields['free'], 'memory free'))}MiB"

    def _instance_profile(self, devices: list[RecordedMigDevice]) -> str:
        """The GPU instance's profile: from ``nvidia-smi -L``, else its id, memory and SMs.

        Without ``-L`` (XML, a bare ``-q``), the profiles placed at the instance's id are
        candidates; the one closest in memory, then in compute slices, is taken.
        """
        table = MIG_PROFILES[self.model.mig_profiles]
        first = devices[0]
        named = first.profile
        if named is not None:
            profile = re.sub(r"^\d+c\.", "", named)
            if profile in table:
                return profile
        sms = sum(d.multiprocessors or 0 for d in devices)
        per_slice = _sms_per_slice(self.model)
        gpu_memory = self.gpu_memory
        candidates = [
            (
                abs(mig_instance_memory(spec, gpu_memory) / 2**20 - first.memory_total),
                abs(spec.compute_slices - sms // per_slice) if sms else 0,
                name,
            )
            for name, spec in table.items()
            if first.gpu_instance in mig_instance_ids(spec) and "+" not in name
        ]
        if not candidates:
            raise RecordingError(
                f"{first.where}: GPU instance id {first.gpu_instance}: expected an id of the "
                f"{self.model_key} MIG profiles ({', '.join(table)})"
            )
        return min(candidates)[2]

    def _compute_slices(self, device: RecordedMigDevice, profile: str) -> int:
        whole = MIG_PROFILES[self.model.mig_profiles][profile].compute_slices
        if device.profile is not None:
            match = re.match(r"^(\d+)c\.", device.profile)
            return int(match.group(1)) if match else whole
        per_slice = _sms_per_slice(self.model)
        if device.multiprocessors:
            return max(1, min(whole, device.multiprocessors // per_slice))
        return whole

    def processes(self) -> None:
        if self.gpu.processes is None:
            return  # not recorded (a --query-gpu CSV): the model's defaults
        entries: list[tuple[RecordedProcess, dict[str, Any]]] = []
        for process in self.gpu.processes:
            memory = process.memory
            if memory is None or memory.missing:
                self.note(process.where, f"process {process.pid}: used memory not printed; 0")
                size = "0MiB"
            else:
                size = f"{round(_mib(memory, 'used GPU memory'))}MiB"
            kinds = {"C": ["compute"], "G": ["graphics"], "C+G": ["compute", "graphics"]}.get(
                process.kind.upper().replace(" ", "")
            )
            if kinds is None:
                raise RecordingError(
                    f"{process.where}: process type {process.kind!r}: expected C, G or C+G"
                )
            for kind in kinds:
                body = {
                    "name": process.name or str(process.pid),
                    "memory": size,
                    "pid": process.pid,
                    "type": kind,
                }
                entries.append((process, body))
        if not self.mig:
            self.overrides["processes"] = [body for _, body in entries]
            return
        for process, body in entries:
            self._place_in_instance(process, body)

    def _place_in_instance(self, process: RecordedProcess, body: dict[str, Any]) -> None:
        entry = next((e for e in self.mig if e["gpu_instance_id"] == process.gpu_instance), None)
        if entry is None:
            self.note(process.where, f"process {process.pid} in no recorded MIG instance: left out")
            return
        layout = entry.get("compute_instances")
        if layout is None:
            entry["overrides"].setdefault("processes", []).append(body)
            return
        ci = process.compute_instance or 0
        if not 0 <= ci < len(layout):
            self.note(
                process.where,
                f"process {process.pid}: compute instance {ci} not recorded: left out",
            )
            return
        slot = layout[ci]
        if isinstance(slot, str):
            slot = layout[ci] = {"profile": slot}
        slot.setdefault("processes", []).append(body)

    def nvlink(self) -> None:
        record = self.gpu.nvlink
        if record is None:
            return
        if record.links:
            self.entry["nvlink_links"] = len(record.links)
            down = [k for k, up in enumerate(record.links) if not up]
            if down:
                self.entry["nvlink_down"] = down
            if not self.model.nvlink_version:
                self.note(record.where, "NVLink version not recorded: the base model has none")
            return
        note = record.note.lower()
        if "mig mode" in note:
            # "Nvlink queries are not supported for Devices in MIG mode": as exporter/sim/
            # scenarios/h200-mig.yaml reads the recorded H200.
            self.lacks.add("nvlink")
        elif "does not have or support" in note:
            self.entry["nvlink_links"] = 0
        elif note:
            self.note(record.where, f"NVLink: {record.note!r}; the link count is not recorded")


def _sms_per_slice(model: GpuModel) -> int:
    """SMs per MIG compute slice, as exporter.sim.mig counts them (A100 14, H100 and H200 16)."""
    return 16 if model.architecture >= ARCHITECTURES["hopper"] else 14


def _arch_name(number: int) -> str:
    return next((name for name, value in ARCHITECTURES.items() if value == number), "")


def _driver(recording: Recording, notes: list[str]) -> dict[str, Any]:
    if recording.driver_version is None or recording.driver_version.missing:
        raise RecordingError(f"{recording.name}: no driver version: expected one")
    driver: dict[str, Any] = {"version": _version(recording.driver_version)}
    if recording.cuda_version is not None and not recording.cuda_version.missing:
        driver["cuda_version"] = _cuda_version(recording.cuda_version)
    else:
        driver["cuda_version"] = 12000
        notes.append(f"{recording.name}: no CUDA version printed: 12.0 assumed")
    if recording.symbols is not None:
        lacks = sorted(FUNCTION_NAMES - recording.symbols)
        if lacks:
            driver["lacks"] = lacks
    return driver


def import_recording(recording: Recording, gpu: int | None = None) -> Imported:
    """Map a :class:`Recording` onto a scenario document (validated by the scenario loader)."""
    notes: list[str] = []
    chosen = recording.gpus
    if gpu is not None:
        if not 0 <= gpu < len(recording.gpus):
            raise RecordingError(
                f"{recording.name}: --gpu {gpu}: expected 0..{len(recording.gpus) - 1} "
                f"(the recording has {len(recording.gpus)} GPUs)"
            )
        chosen = [recording.gpus[gpu]]
    entries, faults, bases = [], [], []
    for position, recorded in enumerate(chosen):
        builder = _GpuImport(recorded, position, notes)
        entries.append(builder.build())
        faults.extend(builder.faults)
        bases.append(f"{builder.model_key} ({builder.model_reason})")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(recording.name).stem)
    names = ", ".join(dict.fromkeys(e.get("name", e["model"]) for e in entries))
    state = f", {recording.state}" if recording.state else ""
    document: dict[str, Any] = {
        "name": stem,
        "description": f"{names} as recorded in {Path(recording.name).name}{state}",
        "driver": _driver(recording, notes),
        "gpus": entries,
        "phases": [{"name": "recorded", "duration": "1h"}],
    }
    if faults:
        document["faults"] = faults
    ignored = [
        f"{source.where}: {path}"
        for recorded in recording.gpus
        for source in recorded.sources
        for path in source.unasked()
    ]
    try:
        parse_scenario(document, default_name=stem)
    except ScenarioError as error:
        raise RecordingError(
            f"{recording.name}: the imported scenario is not valid: {error}"
        ) from None
    return Imported(document, bases, notes, ignored, recording.name, recording.state)


def import_file(path: str | Path, state: str = "load", gpu: int | None = None) -> Imported:
    """Read ``path`` (XML, -q text, query-gpu CSV or a capture bundle) into a scenario.

    Raises:
        RecordingError: the file cannot be read, or a value is not what nvidia-smi prints; the
            message is one line naming the file, the line or element, and what was expected.
    """
    if state not in STATES:
        raise RecordingError(f"--state {state}: expected one of {', '.join(STATES)}")
    return import_recording(read_recording(Path(path), state), gpu)


def render(imported: Imported) -> str:
    """The scenario as YAML, with a header saying where it came from."""
    state = f" (state {imported.state})" if imported.state else ""
    header = [
        f"# Imported by `gpuload sim import` from {Path(imported.source).name}{state}.",
        "# Base model per GPU (every recorded value overrides it): "
        + "; ".join(imported.base_models),
        "# Moving values are constants at the recorded values; N/A answers NOT_SUPPORTED.",
    ]
    header += [f"# Note: {note}" for note in imported.notes]
    body = yaml.dump(
        imported.document, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=100
    )
    return "\n".join(header) + "\n" + body


def import_command(
    file: str, state: str, gpu: int | None, output: str | None, verbose: bool
) -> int:
    """``gpuload sim import``: the scenario on stdout or in ``output``; 2 on a bad recording."""
    try:
        imported = import_file(file, state, gpu)
    except RecordingError as error:
        print(f"gpuload sim import: {error}", file=sys.stderr)
        return 2
    text = render(imported)
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as error:
            print(f"gpuload sim import: {output}: cannot write: {error.strerror}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    for note in imported.notes:
        print(f"gpuload sim import: note: {note}", file=sys.stderr)
    if verbose:
        for field_path in imported.ignored:
            print(f"gpuload sim import: ignored: {field_path}", file=sys.stderr)
    return 0
