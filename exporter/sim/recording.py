"""`gpuload sim record`: what a node's NVML answered, written as a scenario the simulator serves.

The recorder (:mod:`~exporter.sim.recorder`) reads every GPU once through :mod:`exporter.nvml`;
this module turns the answers into a scenario of the existing format (see
:mod:`~exporter.sim.scenario`), so that ``gpuload serve --simulate FILE`` shows what gpuload
showed on that node:

- ``driver``: the versions, and under ``lacks`` every function the simulator models that the
  library does not export.
- one GPU entry per GPU, ``model`` the models.yaml profile with the GPU's PCI device id, else its
  name, else (no profile matches) the one whose MIG table holds the GPU's instances and whose name
  shares the most words with the GPU's, the first in models.yaml order on a tie. The choice then
  only decides what NVML cannot tell (idle clocks, curve shapes, architecture): every static value
  read is written as a model key (name, VBIOS, PCI ids, memory and BAR1 totals, PCIe link, power
  limits, maximum clocks, temperature thresholds, fans, NVLink links, the opt-in ``features``
  GPM, row remapping and retired pages), with ``uuid``, ``serial``, ``pci_bus_id`` and
  ``nvlink_down``; ``ecc_enabled: false`` where ECC is off, ``pcie_replays`` the replay
  counter as read (when not 0), and under ``has`` each feature the model lacks that the GPU
  answered for.
- the moving values (utilization, memory used, BAR1 used, PCIe throughput, temperatures, power,
  clocks, clock event reasons, fan, GPM activity) as constant ``overrides``, ``memory_free``
  too where it is not total - reserved - used, with the processes (PID, name, memory; graphics
  ones typed so). A GPU in MIG mode gets its ``mig`` list instead of whole-GPU memory used and
  processes: each GPU instance with its profile, id, memory total and used, GPM activity and
  compute instances (``<n>c``) with their processes.
- each error answer as a fault without a window: ``{kind: not_supported, gpu, calls}``, ``{kind:
  error, gpu, call, error}``, ``{kind: sentinel, gpu, call}`` for NVML's "unavailable" value,
  ``gpu_lost``; not the NOT_SUPPORTED of the ECC counts of a GPU with ECC off, which
  ``ecc_enabled: false`` gives. A call that failed for some arguments only (one threshold kind,
  one NVLink counter) is not a fault: where a feature explains it, the GPU ``lacks`` the
  feature, else a comment says so. Per-field answers of nvmlDeviceGetFieldValues become
  ``lacks`` too (NOT_SUPPORTED for field 82: ``memory_temperature``; 197/198: ``pcie_counters``;
  NVLink error and state fields); INVALID_ARGUMENT, an id the driver does not know, follows from
  the driver version. NO_PERMISSION where only the privileged get an answer (GPM samples; a MIG
  GPU's whole-GPU memory and processes) sets ``caller: unprivileged`` instead, when no such call
  succeeded.
- memory repair as ``ecc_uncorrectable`` faults (uncorrectable rows remapped, pending, done or
  failed; double-bit retired pages) and each pending XID event as an ``xid`` fault.

What the format cannot hold is written as comments at the top: counter values (ECC, NVLink
errors, energy: the format has rates), correctable remapped rows, answers that differ by
argument.

Masking (the default; ``--no-mask`` keeps everything as read): GPU UUIDs become
``GPU-00000000-0000-0000-0000-<index>`` and serials ``masked-<index>``, so GPUs stay distinct
and the same node records the same file, while nothing of the real identifiers is kept (no
hash either: it would let two reports be matched). Process names keep the program's file name
only (``/home/alice/venv/bin/python train.py --token x`` becomes ``python``): paths and
arguments carry user, project and secret names. PCI bus ids and PIDs are kept: they locate a
GPU and a process on the node and identify nobody.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pynvml
import yaml

from exporter import __version__
from exporter.nvml import LibraryNotFound, NvmlError, RemappedRows
from exporter.sim.features import FEATURES, KINDS
from exporter.sim.recorder import (
    SENTINEL,
    SUCCESS,
    GpuInstanceReading,
    GpuReading,
    NodeReading,
    ProcessReading,
    read_node,
)
from exporter.sim.scenario import (
    CLOCK_EVENT_REASONS,
    MIG_PROFILES,
    GpuModel,
    ScenarioError,
    gpu_models,
    parse_scenario,
)

_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
_ERROR_NAMES = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_")
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}

# Refused to a caller without privileges (exporter/sim/privileges.py has the sources): GPM
# samples on any GPU, whole-GPU memory and process lists on a GPU in MIG mode.
_ROOT_ONLY = frozenset({"nvmlGpmSampleGet", "nvmlGpmMigSampleGet"})
_MIG_ROOT_ONLY = frozenset(
    {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        *(
            f"nvmlDeviceGet{kind}RunningProcesses{version}"
            for kind in ("Compute", "Graphics")
            for version in ("", "_v2", "_v3")
        ),
    }
)

# A call that answered NOT_SUPPORTED for one argument only, and the feature behind it.
_ARGUMENT_FEATURES = {
    ("nvmlDeviceGetTemperatureThreshold", "temp_memory_max"): "memory_temperature"
}
# Field values (as the recorder names them) behind a feature a GPU may lack.
_FIELD_FEATURES = {
    "memory_temperature": ("memory_temperature",),
    "pcie_counters": ("pcie_tx_bytes", "pcie_rx_bytes"),
    "nvlink_error_fields": ("nvlink_replay", "nvlink_recovery"),
    "nvlink_state_field": ("nvlink_state",),
}
# The call whose success shows a GPU has a feature a model may list under `lacks`: the first
# that needs it (exporter/sim/features.py).
_FEATURE_CALLS = {feature.name: feature.functions[0] for feature in FEATURES if feature.functions}

# The GPU UUIDs a scenario takes (NVML's form).
_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# The overrides written for a GPU in MIG mode: its memory and processes are its instances'.
_WHOLE_GPU_ONLY = ("memory_used", "processes")


def masked_uuid(index: int) -> str:
    """The UUID a recording gives GPU ``index`` in place of its own."""
    return f"GPU-00000000-0000-0000-0000-{index:012x}"


def masked_serial(index: int) -> str:
    """The serial number a recording gives GPU ``index`` in place of its own."""
    return f"masked-{index}"


def masked_process_name(name: str) -> str:
    """A process name reduced to its program's file name: ``/usr/bin/python3 x.py`` -> python3."""
    words = name.split()
    program = PurePosixPath(words[0]).name if words else ""
    return program or "(unknown)"


@dataclass
class Recording:
    """A recorded node as a scenario document, the comments that go with it, and a summary."""

    document: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    faults: int = 0


class _Hex(int):
    """An integer written in hex, as models.yaml writes PCI device ids."""


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper with `_Hex` written as 0x... ."""


_Dumper.add_representer(
    _Hex, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:int", f"0x{value:08X}")
)


def _size(number: int) -> str:
    return f"{number // 2**20}MiB" if number % 2**20 == 0 else f"{number}B"


def _watts(number: float) -> str:
    return f"{round(number, 3)}W"


def _fraction(number: float) -> float:
    return round(min(1.0, max(0.0, number)), 6)


def _error_name(code: int) -> str:
    return _ERROR_NAMES.get(code, "UNKNOWN")


# ---------------------------------------------------------------------------------------------
# The caller


def _caller(node: NodeReading) -> str:
    """``unprivileged`` when the driver refused what only the privileged get, and gave none."""
    refused = granted = False
    for gpu in node.gpus:
        in_mig = gpu.mig is not None
        for call, by_argument in gpu.answers.items():
            if call not in _ROOT_ONLY and not (in_mig and call in _MIG_ROOT_ONLY):
                continue
            # A MIG device's own memory and processes are given to anyone.
            codes = [
                code
                for argument, code in by_argument.items()
                if call in _ROOT_ONLY or argument == ""
            ]
            refused |= _NO_PERMISSION in codes
            granted |= SUCCESS in codes
    return "unprivileged" if refused and not granted else "root"


def _explained_by_caller(caller: str, gpu: GpuReading, call: str, argument: str) -> bool:
    if caller == "root":
        return False
    return call in _ROOT_ONLY or (gpu.mig is not None and argument == "" and call in _MIG_ROOT_ONLY)


# ---------------------------------------------------------------------------------------------
# Models


def _name_words(name: str) -> set[str]:
    return set(name.lower().replace("-", " ").split())


def _closest_model(gpu: GpuReading, fallback: str) -> tuple[str, str]:
    """The models.yaml key for ``gpu`` and, when none matches it, a note saying so.

    A GPU that could not be read at all gets ``fallback``: the model most of the others have.
    """
    models = gpu_models()
    if gpu.lost is not None and not gpu.static:
        call, error = gpu.lost
        return fallback, f"could not be read ({error.name} at {call}): recorded as {fallback}"
    profiles = {instance.profile for instance in gpu.mig or ()}

    def holds_profiles(key: str) -> bool:
        table = MIG_PROFILES.get(models[key].mig_profiles, {})
        return profiles <= set(table)

    name = gpu.static.get("name", "")
    device_id = gpu.static.get("pci_device_id")
    for key, model in models.items():
        if (model.pci_device_id == device_id or model.name == name) and holds_profiles(key):
            return key, ""
    candidates = [key for key in models if holds_profiles(key)] or list(models)
    words = _name_words(name)
    best = max(candidates, key=lambda key: len(words & _name_words(models[key].name)))
    shown = f"0x{device_id:08X}" if isinstance(device_id, int) else "unknown"
    return best, (
        f"no model of models.yaml has PCI device id {shown} or the name {name!r}: recorded as "
        f"{best}, every value NVML gave written over the model's"
    )


# ---------------------------------------------------------------------------------------------
# GPU entries


class _GpuWriter:
    """Turns one GPU's answers into its scenario entry, its faults and its notes."""

    def __init__(self, gpu: GpuReading, caller: str, mask: bool, fallback: str) -> None:
        self.gpu = gpu
        self.caller = caller
        self.mask = mask
        self.fallback = fallback
        self.notes: list[str] = []
        self.faults: list[dict[str, Any]] = []
        self.lacks: set[str] = set()

    def note(self, text: str) -> None:
        """Add a comment line about this GPU."""
        self.notes.append(f"GPU {self.gpu.index}: {text}")

    def entry(self) -> tuple[dict[str, Any], str]:
        """The GPU's entry and its model key."""
        gpu = self.gpu
        key, note = _closest_model(gpu, self.fallback)
        if note:
            self.note(note)
        model = gpu_models()[key]
        entry: dict[str, Any] = {"model": key}
        if gpu.lost is not None:
            self._lost()
        entry.update(self._identity())
        entry.update(self._static(model))
        self._answers()
        self._fields()
        self._memory_repair()
        self.faults += [{"kind": "xid", "gpu": gpu.index, "code": code} for code in gpu.xids]
        self.faults += [
            {"kind": "hang", "gpu": gpu.index, "call": call, "seconds": round(seconds, 1)}
            for call, seconds in sorted(gpu.slow.items())
        ]
        if gpu.lost is None or gpu.static:
            entry["features"] = sorted(self._features())
        lacks = self.lacks - model.lacks
        if lacks:
            entry["lacks"] = sorted(lacks)
        has = [feature for feature in sorted(model.lacks) if self._has(feature)]
        if has:
            entry["has"] = has
        overrides = self._overrides(self._moving(), gpu.processes)
        if gpu.mig is not None:
            overrides = {k: v for k, v in overrides.items() if k not in _WHOLE_GPU_ONLY}
            mig = [self._gpu_instance(instance) for instance in gpu.mig]
            if mig:
                entry["mig"] = mig
            else:
                self.note("MIG mode is on with no instance: recorded with MIG off")
        if overrides:
            entry["overrides"] = overrides
        return entry, key

    def _lost(self) -> None:
        assert self.gpu.lost is not None
        call, error = self.gpu.lost
        if error.code == pynvml.NVML_ERROR_GPU_IS_LOST:
            self.faults.append({"kind": "gpu_lost", "gpu": self.gpu.index})
        elif call:
            error_name = _error_name(error.code)
            self.faults.append(
                {"kind": "error", "gpu": self.gpu.index, "call": call, "error": error_name}
            )
        else:
            self.note(f"reading stopped at {error}")

    def _identity(self) -> dict[str, Any]:
        static, index = self.gpu.static, self.gpu.index
        identity: dict[str, Any] = {}
        if "name" in static:
            identity["name"] = static["name"]
        uuid = static.get("uuid")
        if uuid is not None and not self.mask and not _UUID.match(uuid):
            self.note(f"its UUID {uuid!r} is not of the form the format takes: masked")
        if uuid is not None:
            identity["uuid"] = uuid if not self.mask and _UUID.match(uuid) else masked_uuid(index)
        if static.get("serial"):
            identity["serial"] = masked_serial(index) if self.mask else static["serial"]
        if static.get("pci_bus_id"):
            identity["pci_bus_id"] = static["pci_bus_id"]
        if static.get("vbios"):
            identity["vbios"] = static["vbios"]
        return identity

    def _static(self, model: GpuModel) -> dict[str, Any]:
        static, gpu = self.gpu.static, self.gpu
        values: dict[str, Any] = {}
        for key in ("pci_device_id", "pci_subsystem_id"):
            if key in static:
                values[key] = _Hex(static[key])
        if "memory_total" in static:
            values["memory_total"] = _size(static["memory_total"])
            # Without nvmlDeviceGetMemoryInfo_v2 the reserved memory is counted as used.
            values["memory_reserved"] = _size(static["memory_reserved"] or 0)
        if "bar1_total" in static:
            values["bar1_total"] = _size(static["bar1_total"])
        for key in ("pcie_generation", "pcie_max_generation", "pcie_width", "pcie_max_width"):
            if key in static:
                values[key] = static[key]
        for key in ("power_limit", "power_default_limit", "power_min_limit", "power_max_limit"):
            if key in static:
                values[key] = _watts(static[key])
        for key in ("max_graphics_clock", "max_sm_clock", "max_memory_clock"):
            if key in static:
                values[key] = static[key]
        for key in ("temp_shutdown", "temp_slowdown", "temp_gpu_max", "temp_memory_max"):
            if key in static:
                values[key] = static[key]
        if gpu.has_fan is not None:
            values["fans"] = max(1, model.fans) if gpu.has_fan else 0
        if gpu.nvlink_links is not None:
            values["nvlink_links"] = gpu.nvlink_links
            if gpu.nvlink_down:
                values["nvlink_down"] = gpu.nvlink_down
        if gpu.ecc_enabled is False:
            values["ecc_enabled"] = False
        if gpu.counters.get("PCIe replays"):
            values["pcie_replays"] = gpu.counters["PCIe replays"]
        counters = ", ".join(
            f"{name} {count}"
            for name, count in gpu.counters.items()
            if count and name != "PCIe replays"
        )
        if counters:
            self.note(f"counters (the format has rates, not counts): {counters}")
        return values

    def _features(self) -> set[str]:
        gpu = self.gpu
        features = {"gpm"} if gpu.gpm_supported else set()
        if gpu.remapped_rows is not None:
            features.add("row_remapping")
        if gpu.retired_pages or gpu.retirement_pending is not None:
            features.add("retired_pages")
        return features

    def _has(self, feature: str) -> bool:
        if feature in _FIELD_FEATURES:
            answers = [
                a for name in _FIELD_FEATURES[feature] for a in self.gpu.fields.get(name, [])
            ]
            return bool(answers) and all(a.status == SUCCESS for a in answers)
        call = _FEATURE_CALLS.get(feature)
        codes = self.gpu.answers.get(call or "", {}).values()
        return bool(codes) and all(code == SUCCESS for code in codes)

    def _moving(self) -> dict[str, Any]:
        """The GPU's moving values; memory free only where the replay would not derive it."""
        readings = dict(self.gpu.readings)
        if readings.get("memory_free") == self._derived_free():
            readings.pop("memory_free", None)
        return readings

    def _derived_free(self) -> int | None:
        """Memory free as the replay derives it: total - reserved - used.

        A GPU in MIG mode replays as used what its instances use.
        """
        gpu, static = self.gpu, self.gpu.static
        used = gpu.readings.get("memory_used")
        if gpu.mig is not None:
            instances = [instance.memory_used for instance in gpu.mig]
            if not instances or None in instances:
                return None
            used = sum(u for u in instances if u is not None)
        if used is None or "memory_total" not in static:
            return None
        return int(static["memory_total"] - (static["memory_reserved"] or 0) - used)

    # -- answers -> faults ---------------------------------------------------------------------

    def _answers(self) -> None:
        not_supported = []
        for call, by_argument in sorted(self.gpu.answers.items()):
            failing = {
                argument: code
                for argument, code in by_argument.items()
                if code != SUCCESS
                and not (
                    code == _NO_PERMISSION
                    and _explained_by_caller(self.caller, self.gpu, call, argument)
                )
            }
            if not failing:
                continue
            codes = set(failing.values())
            if len(failing) == len(by_argument) and len(codes) == 1:
                code = codes.pop()
                if self._ecc_off_explains(call, code):
                    continue
                if code == _NOT_SUPPORTED:
                    not_supported.append(call)
                else:
                    self.faults.append(self._fault(call, code))
                continue
            for argument, code in sorted(failing.items()):
                feature = _ARGUMENT_FEATURES.get((call, argument))
                if code == _NOT_SUPPORTED and feature:
                    self.lacks.add(feature)
                    continue
                shown = "the unavailable value" if code == SENTINEL else _error_name(code)
                self.note(
                    f"{call} answered {shown} for {argument or 'the GPU'}, not for its other "
                    "arguments: no fault written"
                )
        if not_supported:
            self.faults.insert(
                0, {"kind": "not_supported", "gpu": self.gpu.index, "calls": not_supported}
            )

    def _ecc_off_explains(self, call: str, code: int) -> bool:
        # With ECC off the driver has no counts: `ecc_enabled: false` replays that answer.
        return (
            self.gpu.ecc_enabled is False
            and call == "nvmlDeviceGetTotalEccErrors"
            and code == _NOT_SUPPORTED
        )

    def _fault(self, call: str, code: int) -> dict[str, Any]:
        index = self.gpu.index
        if code == SENTINEL:
            return {"kind": "sentinel", "gpu": index, "call": call}
        return {"kind": "error", "gpu": index, "call": call, "error": _error_name(code)}

    def _fields(self) -> None:
        fields = self.gpu.fields
        for feature, names in _FIELD_FEATURES.items():
            answers = [answer for name in names for answer in fields.get(name, [])]
            if answers and all(answer.status == _NOT_SUPPORTED for answer in answers):
                self.lacks.add(feature)
        for name, answers in fields.items():
            statuses = Counter(answer.status for answer in answers)
            odd = {s for s in statuses if s not in (SUCCESS, _NOT_SUPPORTED, _INVALID_ARGUMENT)}
            if odd:
                shown = ", ".join(sorted(_error_name(s) for s in odd))
                self.note(f"field {name} answered {shown}")
            if any(a.status == SUCCESS and a.value is None for a in answers):
                self.note(f"field {name} answered the unavailable value")
            if len(statuses) > 1:
                shown = ", ".join(f"{_error_name(s) if s else 'SUCCESS'}" for s in statuses)
                self.note(f"field {name} answered differently by link: {shown}")

    def _memory_repair(self) -> None:
        gpu, index = self.gpu, self.gpu.index
        rows = gpu.remapped_rows
        if rows is not None:
            self._remapped(rows)
            return
        double_bit = gpu.retired_pages.get("double_bit", 0)
        if double_bit:
            self.faults.append({"kind": "ecc_uncorrectable", "gpu": index, "count": double_bit})
            if gpu.retirement_pending is False:
                self.note("retired pages are not pending: the replay shows them pending")
        elif gpu.retirement_pending:
            self.note("a page retirement is pending with no double-bit page: not replayed")
        if gpu.retired_pages.get("single_bit"):
            self.note(f"{gpu.retired_pages['single_bit']} single-bit retired pages: not replayed")

    def _remapped(self, rows: RemappedRows) -> None:
        index = self.gpu.index
        if rows.uncorrectable or rows.pending:
            self.faults.append(
                {
                    "kind": "ecc_uncorrectable",
                    "gpu": index,
                    "count": max(1, rows.uncorrectable),
                    "remap": "pending" if rows.pending else "done",
                }
            )
        if rows.failed:
            self.faults.append(
                {"kind": "ecc_uncorrectable", "gpu": index, "count": 1, "remap": "failed"}
            )
        if rows.correctable:
            self.note(f"{rows.correctable} correctable rows remapped: not replayed")

    # -- readings -> overrides -----------------------------------------------------------------

    def _overrides(
        self, readings: dict[str, Any], processes: Iterable[ProcessReading]
    ) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        for name, value in readings.items():
            if name in ("memory_used", "memory_free", "bar1_used"):
                overrides[name] = _size(value)
            elif name in ("pcie_tx", "pcie_rx"):
                overrides[name] = f"{value}B/s"
            elif name == "power":
                overrides[name] = _watts(value)
            elif name == "clock_event_reasons":
                overrides[name] = self._reasons(value)
            elif (
                name in ("temperature", "memory_temperature")
                or name.endswith("_clock")
                or KINDS.get(name) == "number"
            ):
                overrides[name] = value
            else:
                overrides[name] = _fraction(value)
        listed = [self._process(p) for p in processes]
        if listed:
            overrides["processes"] = listed
        return overrides

    def _reasons(self, mask: int) -> list[str]:
        names = [name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit]
        unknown = mask & ~sum(CLOCK_EVENT_REASONS.values())
        if unknown:
            self.note(f"clock event reasons 0x{unknown:x} have no name in the format: left out")
        return names

    def _process(self, process: ProcessReading) -> dict[str, Any]:
        name = masked_process_name(process.name) if self.mask else process.name or "(unknown)"
        if process.memory is None:
            self.note(f"process {process.pid}: NVML does not tell its memory: recorded as 0")
        entry: dict[str, Any] = {"name": name, "memory": _size(process.memory or 0)}
        entry["pid"] = process.pid
        if process.kind != "compute":
            entry["type"] = process.kind
        return entry

    def _gpu_instance(self, instance: GpuInstanceReading) -> dict[str, Any]:
        entry: dict[str, Any] = {"profile": instance.profile}
        entry["gpu_instance_id"] = instance.gpu_instance
        if instance.memory_total is not None:
            entry["memory_total"] = _size(instance.memory_total)
        readings = dict(instance.readings)
        if instance.memory_used is not None:
            readings["memory_used"] = instance.memory_used
        computes = instance.compute_instances
        whole = len(computes) == 1 and computes[0].slices == instance.compute_slices
        processes = computes[0].processes if whole else []
        overrides = self._overrides(readings, processes)
        if overrides:
            entry["overrides"] = overrides
        if whole:
            return entry
        ids = [c.compute_instance for c in computes]
        if ids != list(range(len(ids))):
            self.note(
                f"MIG {instance.gpu_instance}: compute instance ids {ids} replay as "
                f"0..{len(ids) - 1}"
            )
        entry["compute_instances"] = [
            {"profile": f"{c.slices}c", **self._compute_processes(c.processes)} for c in computes
        ]
        return entry

    def _compute_processes(self, processes: list[ProcessReading]) -> dict[str, Any]:
        if not processes:
            return {}
        return {"processes": [self._process(p) for p in processes]}


# ---------------------------------------------------------------------------------------------
# The node


def scenario_from(node: NodeReading, *, mask: bool, function_names: Iterable[str]) -> Recording:
    """The scenario document of a recorded node (see the module docstring for the mapping)."""
    caller = _caller(node)
    recording = Recording(document={}, notes=list(node.notes))
    read = [_closest_model(gpu, "")[0] for gpu in node.gpus if gpu.static]
    fallback = Counter(read).most_common(1)[0][0] if read else next(iter(gpu_models()))
    gpus, faults = [], []
    buses = {gpu.static["pci_bus_id"] for gpu in node.gpus if gpu.static.get("pci_bus_id")}
    for gpu in node.gpus:
        writer = _GpuWriter(gpu, caller, mask, fallback)
        entry, key = writer.entry()
        if "pci_bus_id" not in entry:
            # The scenario's default bus of this index may be another GPU's: take a free one.
            bus = next(b for b in range(0xFF, 0, -1) if f"00000000:{b:02X}:00.0" not in buses)
            entry["pci_bus_id"] = f"00000000:{bus:02X}:00.0"
            buses.add(entry["pci_bus_id"])
        gpus.append(entry)
        faults += writer.faults
        recording.notes += writer.notes
        recording.models.append(key)
    lacks = sorted(set(function_names) - node.exported)
    if "nvmlDeviceGetMemoryInfo_v2" in lacks:
        recording.notes.insert(
            0, "the driver has no nvmlDeviceGetMemoryInfo_v2: reserved memory is counted as used"
        )
    driver: dict[str, Any] = {
        "version": node.driver_version,
        "cuda_version": node.cuda_version,
        "nvml_version": node.nvml_version,
    }
    if lacks:
        driver["lacks"] = lacks
    shown = ", ".join(f"{n}x {key}" for key, n in Counter(recording.models).items())
    document: dict[str, Any] = {
        "description": f"Recorded by gpuload sim record: {shown or 'no GPU'} on driver "
        f"{node.driver_version}",
        "loop": False,
    }
    if caller != "root":
        document["caller"] = caller
    document["driver"] = driver
    document["gpus"] = gpus
    document["phases"] = [{"name": "recorded", "duration": "1h"}]
    if faults:
        document["faults"] = faults
    recording.document = document
    recording.faults = len(faults)
    return recording


def render(recording: Recording, *, mask: bool) -> str:
    """The scenario as YAML, after comments saying what it is and what it could not hold."""
    identifiers = (
        "masked: GPU UUIDs and serial numbers are made up, numbered by GPU index; process "
        "names keep the program's file name only; PCI bus ids and PIDs are as read"
        if mask
        else "as read (--no-mask)"
    )
    paragraphs = [
        f"Recorded by `gpuload sim record` (gpuload {__version__}): each GPU's NVML answers, "
        "read once. Serve it with `gpuload serve --simulate FILE`. Moving values (utilization, "
        "memory used, temperatures, power, clocks, fan, GPM) hold what the driver answered at "
        "that moment; errors are faults without a time window.",
        f"Identifiers {identifiers}.",
    ]
    lines = [line for text in paragraphs for line in textwrap.wrap(text, 96)]
    if recording.notes:
        lines.append("Not written as such (the format has no place for it):")
        for note in recording.notes:
            lines += textwrap.wrap(note, 96, initial_indent="  ", subsequent_indent="    ")
    header = "".join(f"# {line}\n" for line in lines)
    body = yaml.dump(
        recording.document,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=None,
        width=100,
        allow_unicode=True,
    )
    return header + body


def check(text: str) -> str:
    """Empty when ``text`` is a valid scenario, else the problem, naming the key."""
    try:
        parse_scenario(yaml.safe_load(text), default_name="recorded")
    except ScenarioError as error:
        return str(error)
    return ""


def record_command(output: str | None, *, mask: bool) -> int:
    """`gpuload sim record`: read the node, write the scenario to ``output`` or stdout.

    Returns 0, 1 when the recording is written but is not a valid scenario (a value outside
    what the simulator accepts: the message names the key), or 2 when NVML cannot be read.
    """
    from exporter.sim.library import FUNCTION_NAMES

    try:
        node = read_node(FUNCTION_NAMES)
    except LibraryNotFound:
        print(
            "gpuload sim record: no NVIDIA driver library (libnvidia-ml.so.1) here: install the "
            "NVIDIA driver, or record a simulated node with `gpuload sim exec`",
            file=sys.stderr,
        )
        return 2
    except NvmlError as error:
        print(f"gpuload sim record: NVML could not be read: {error}", file=sys.stderr)
        return 2
    recording = scenario_from(node, mask=mask, function_names=FUNCTION_NAMES)
    text = render(recording, mask=mask)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()  # before the summary on stderr, where both go to one terminal
    else:
        try:
            with open(output, "w", encoding="utf-8") as stream:
                stream.write(text)
        except OSError as error:
            print(f"gpuload sim record: cannot write {output}: {error.strerror}", file=sys.stderr)
            return 2
    where = os.path.abspath(output) if output else "stdout"
    models = ", ".join(f"{n}x {key}" for key, n in Counter(recording.models).items())
    print(
        f"gpuload sim record: {len(recording.models)} GPUs ({models or 'none'}), driver "
        f"{node.driver_version}, {recording.faults} faults, {len(recording.notes)} notes, "
        f"identifiers {'masked' if mask else 'kept'} -> {where}",
        file=sys.stderr,
    )
    problem = check(text)
    if problem:
        print(
            f"gpuload sim record: the recording is not a valid scenario: {problem}", file=sys.stderr
        )
        return 1
    return 0
