"""Scenario files for the simulated NVML: schema, strict validation and per-GPU resolution.

A scenario is a YAML document describing one node: its driver, its GPUs (profiles from
``models.yaml`` with per-GPU overrides), load phases over time and faults. Loading validates every
key and value and reports problems as :class:`ScenarioError` naming the key path, for example
``gpus[1].phases[0].utilization: expected a number 0..1 or a pattern mapping``. The result is an
immutable :class:`Scenario` whose GPUs carry fully resolved value curves in absolute units (bytes,
watts, degrees C, MHz, bytes per second, utilization fractions).

Format (every key is optional unless marked required)::

    name: training                    # defaults to the file name
    description: one line shown by `gpuload sim list`
    seed: 0                           # default seed for noise, UUIDs, serials and PIDs
    loop: true                        # after the last phase: start again (true) or hold it (false)
    caller: root                      # or unprivileged, unprivileged-no-host-pid (see `privileges`)
    driver:                           # required
      version: "550.90.07"            # required
      cuda_version: 12040             # required
      nvml_version: "12.550.90.07"    # default "<cuda major>.<version>"
      lacks: [nvmlDeviceGetTemperatureV]   # C functions this driver does not export
      uptime: 3d                      # time since driver load at elapsed 0 (energy counter base)
      pcie_counter_bits: 32           # width at which fields 197/198 wrap: 32 (default) or 64
      latency: {default: 0, nvmlDeviceGetPcieThroughput: 20ms}   # how long calls block (these
                                      # are the defaults; see DEFAULT_LATENCY)
    gpus:                             # required
      - model: h100-sxm               # required: a key of models.yaml
        count: 8                      # entries expand to consecutive GPU indices
        lacks: [energy]               # features added to the model's list (see FEATURES)
        has: [encoder]                # features taken off the model's list (opt-in ones added)
        overrides: {utilization: 0.5} # metric specs applied on top of every phase
        phases: [...]                 # replaces the node phases for these GPUs
        <any models.yaml key>         # e.g. power_limit: 500W
        uuid / serial / pci_bus_id    # identity overrides (only when count is 1)
        pcie_replays_per_hour / ecc_corrected_per_hour / ecc_uncorrected_per_hour
        pcie_replays: 9               # the replay counter at elapsed 0 (default 0)
        compute_mode: default | exclusive_process | prohibited
        persistence_mode: true
        display_active: false
        ecc_enabled: true             # ECC mode; false: GetEccMode says disabled, counts N/A
        nvlink_down: [3]              # links that are down for the whole scenario
        nvlink_errors_per_hour: {replay: 2, recovery: 0, crc_flit: 10, crc_data: 0, ecc_data: 0}
        mig:                          # MIG mode with these GPU instances (models with MIG only)
          - {profile: 1g.10gb, count: 7, overrides: {utilization: 0.4}}
          - profile: 3g.40gb          # a profile of the model's table (MIG_PROFILES)
            gpu_instance_id: 2        # default: the first free id of the profile's placements
            compute_instances: [1c, {profile: 2c, processes: [...]}]   # default: one, whole
            memory_total: 40192MiB    # default: the profile's share of the GPU's memory
    phases:                           # required unless every GPU entry has its own
      - name: steady
        duration: 10m                 # seconds or a duration string (ms, s, m, h, d)
        utilization: 0.9              # a value spec, see below
        clock_event_reasons: [sw_power_cap]
        processes: [{name: python train.py, memory: 60GiB, count: 1, type: compute}]
                                      # pid: 4242 gives the first PID (default: from the seed);
                                      # weight: 2 takes twice the share of the GPU's utilization
                                      # in per-process utilization (default 1: even shares)
    faults: [{kind: gpu_lost, gpu: 3, at: 60, until: 120}, ...]
    kubernetes: {node: gpu-node-7, pods: [...]}   # the node's pods (exporter/sim/pods.py)

Fault kinds: ``gpu_lost`` (gpu), ``not_supported`` (calls), ``error`` (call, error), ``sentinel``
(call), ``driver_not_loaded``, ``hang`` (call, seconds), ``nvlink_down`` (gpu, link) all take an
``at``/``until`` window; ``xid`` (gpu, code) and ``ecc_uncorrectable`` (gpu, count, remap:
pending|failed|done, default pending) happen once, at ``at``, and their effects last.

Models declare the opt-in features (:data:`OPT_IN_FEATURES`) under ``features``, their NVLink
under ``nvlink_links``/``nvlink_version`` and their MIG profile table under ``mig_profiles``; a GPU
entry's ``lacks`` removes any feature.

A MIG GPU instance is split into compute instances of ``<n>c`` compute slices each (together at
most the instance's); each compute instance is one MIG device. Processes listed by a compute
instance run in it; the GPU instance's own (its overrides' or the phases') run in its first
compute instance when none lists any. Memory, load and GPM belong to the GPU instance.

A value spec is a constant or a mapping ``{pattern: sawtooth|square|sine, min, max, period,
duty (square), noise}``, ``{pattern: ramp, start, end, period, noise}`` or ``{value, noise}``.
Units per metric are in :data:`METRICS`; metrics left out are derived from utilization (see
:func:`_derive_defaults`), except two: ``memory_free`` left out is total - reserved - used, and
``bar1_used`` left out is 2 MiB plus 4 MiB per process.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from exporter.names import GPM_METRICS
from exporter.sim import branches
from exporter.sim.curves import Phase, Process, Timeline, ValueSpec
from exporter.sim.features import FEATURES as FEATURE_TABLE
from exporter.sim.features import KINDS, OUTPUTS
from exporter.sim.library import FUNCTION_NAMES
from exporter.sim.model import (
    ARCHITECTURES,
    CLOCK_EVENT_REASONS,
    DEFAULT_LATENCY,
    MIG_PROFILES,
    NVLINK_ERROR_COUNTERS,
    OPT_IN_FEATURES,
    DriverSpec,
    Fault,
    GpuModel,
    GpuSpec,
    MigInstanceSpec,
    MigProfile,
    Scenario,
)
from exporter.sim.pods import parse_kubernetes
from exporter.sim.schema import (
    ScenarioError,
    _boolean,
    _choice,
    _duration,
    _fail,
    _integer,
    _is_number,
    _list,
    _mapping,
    _number,
    _string,
)

SCENARIO_DIR = Path(__file__).parent / "scenarios"
MODELS_FILE = Path(__file__).parent / "models.yaml"


# Metric name -> kind of quantity it accepts; the kind decides units and validation.
METRICS: dict[str, str] = {
    "utilization": "fraction",
    "memory_utilization": "fraction",
    "memory_used": "memory",
    "pcie_tx": "rate",
    "pcie_rx": "rate",
    "temperature": "celsius",
    "memory_temperature": "celsius",
    "power": "power",
    "sm_clock": "mhz",
    "graphics_clock": "mhz",
    "memory_clock": "mhz",
    "video_clock": "mhz",
    "fan": "fraction",
    # Activity fractions that GPM (Hopper and newer) reports; derived from utilization by default.
    **dict.fromkeys(GPM_METRICS, "fraction"),
    # NVLink traffic of the whole GPU, split evenly across its active links.
    "nvlink_tx": "rate",
    "nvlink_rx": "rate",
    # The metrics of the table-driven NVML readings (exporter/sim/features.py).
    **KINDS,
    # BAR1 memory in use (a fraction: of the BAR1 aperture), as nvidia-smi prints it: 1 MiB idle
    # and 19819 MiB under load on the recorded H100, 143157 MiB on the H200 in MIG mode.
    "bar1_used": "memory",
    # Free frame buffer memory where it is not total - reserved - used (nvidia-smi's figures for
    # nvidia-smi-xml/a10g.xml, quadro-p2000-v12.xml and rtx-3060-v12.xml are 2 MiB off it).
    "memory_free": "memory",
}

_KIND_HELP = {
    "fraction": "a number 0..1",
    "memory": "a number 0..1 (fraction of total memory) or a size like '40GiB'",
    "power": "a number 0..1.5 (fraction of the power limit) or watts like '350W'",
    "rate": "a rate like '2.5GB/s' or a number of bytes per second",
    "celsius": "a number 0..200 (degrees C)",
    "mhz": "a number 0..20000 (MHz)",
    "number": "a number 0..20000 in the metric's unit (exporter/sim/features.py)",
}

# Optional GPU features a model or GPU entry may list under `lacks`; the simulator answers
# NVML_ERROR_NOT_SUPPORTED for the calls (or field values) behind each (exporter/sim/features.py).
FEATURES: dict[str, str] = {feature.name: feature.description for feature in FEATURE_TABLE}

# GPU instance ids NVML gives the placements of each (compute, memory) slice shape, in order
# (nvidia-smi mig -lgi on A100 and H100; the recorded H200 has 3g.71gb at 2, 2g.35gb at 3 and
# 1g.18gb at 9 and 10).
_MIG_INSTANCE_IDS: dict[tuple[int, int], tuple[int, ...]] = {
    (7, 8): (0,),
    (4, 4): (1,),
    (3, 4): (1, 2),
    (2, 2): (3, 4, 5),
    (1, 2): (3, 4, 5, 6),
    (1, 1): (7, 8, 9, 10, 11, 12, 13),
}
_MIG_MEMORY_SHARE = 0.975
# Compute slices of the compute instance profiles (nvml.h NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
# ... _8_SLICE: 1, 2, 3, 4, 6, 7 and 8); a scenario names them `1c`, `2c`, ...
_COMPUTE_INSTANCE_SLICES = (1, 2, 3, 4, 6, 7, 8)

# Profile variants that came with a driver release: the NVML_GPU_INSTANCE_PROFILE_* constant
# behind them first appears in nvidia-settings' src/nvml.h (NS) at that release's tag.
_MEDIA_EXTENSIONS = branches.Releases(
    (((470, 42, 1), None),),
    "+me: NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, NS 470.42.01 :7321 (MIG user guide: "
    "'only available starting with R470 drivers')",
)
_MEDIA_CHOICE = branches.Releases(
    (((570, 169), None),),
    "-me, +me.all: NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME / _ALL_ME, NS 570.169 :10882/:10888 "
    "and every R575 from 575.51.02 :11470/:11476; absent in 570.153.02",
)
_MIG_SUFFIX_RELEASES = {"+me": _MEDIA_EXTENSIONS, "-me": _MEDIA_CHOICE, "+me.all": _MEDIA_CHOICE}
# One compute slice with two memory slices (1g.20gb, 1g.35gb).
_TWICE_THE_MEMORY = branches.Releases(
    (((525, 53), None),),
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, NS 525.53 :8252; absent in 520.56.06",
)
_MIG_SUFFIX = re.compile(r"^\d+g\.\d+gb(.*)$")


def mig_instance_memory(profile: MigProfile, gpu_memory: int) -> int:
    """The bytes NVML reports for a GPU instance of ``profile`` on a GPU of ``gpu_memory``."""
    if profile.memory_mib:
        return profile.memory_mib * 2**20
    share = profile.memory_slices * gpu_memory / 8 * _MIG_MEMORY_SHARE
    return int(share // 2**20) * 2**20


def mig_instance_ids(profile: MigProfile) -> tuple[int, ...]:
    """The GPU instance ids NVML gives the placements of ``profile``, in order."""
    return _MIG_INSTANCE_IDS[(profile.compute_slices, profile.memory_slices)]


def mig_placement_starts(compute_slices: int, memory_slices: int) -> tuple[int, ...]:
    """The memory slices a GPU instance of this shape may start at, in order.

    As ``nvidia-smi mig -lgipp`` lists them (MIG user guide, "List the possible placements"):
    ``{0,1,2,3,4,5,6}:1`` for 1g.10gb, ``{0,2,4,6}:2`` for 1g.20gb, ``{0,2,4}:2`` for 2g.20gb,
    ``{0,4}:4`` for 3g.40gb, ``{0}:4`` for 4g.40gb, ``{0}:8`` for 7g.80gb: a multiple of the
    instance's memory slices, within the GPU's 8 memory and 7 compute slices.
    """
    return tuple(
        start
        for start in range(0, 8, memory_slices)
        if start + memory_slices <= 8 and start + compute_slices <= 7
    )


def _placement_starts(instances: Mapping[int, MigInstanceSpec]) -> dict[int, int]:
    """Each GPU instance's placement start, by GPU instance id, in a layout where none overlap.

    The k-th id of a shape in `_MIG_INSTANCE_IDS` is the one NVML gives its k-th placement: the
    recorded H200's 3g.71gb (id 2), 2g.35gb (3) and 1g.18gb (9, 10) start at memory slices 4, 0, 2
    and 3, side by side. Each instance tries its id's placement first, then the others in order,
    and the first layout in which no two share a memory or a compute slice wins (the simulator
    counts an instance's compute slices from its start too, as `mig_placement_starts` keeps them
    within 7). Instances that fit no such layout keep their ids' placements.
    """
    order = sorted(instances)
    shapes = {gi: (instances[gi].compute_slices, instances[gi].memory_slices) for gi in order}

    def preferred(gi: int) -> list[int]:
        starts = mig_placement_starts(*shapes[gi])
        ids = _MIG_INSTANCE_IDS[shapes[gi]]
        first = starts[ids.index(gi)] if gi in ids else starts[0]
        return [first, *(start for start in starts if start != first)]

    def place(k: int, memory: frozenset[int], compute: frozenset[int]) -> list[int] | None:
        if k == len(order):
            return []
        compute_slices, memory_slices = shapes[order[k]]
        for start in preferred(order[k]):
            taking = frozenset(range(start, start + memory_slices))
            computing = frozenset(range(start, start + compute_slices))
            if taking & memory or computing & compute:
                continue
            rest = place(k + 1, memory | taking, compute | computing)
            if rest is not None:
                return [start, *rest]
        return None

    starts = place(0, frozenset(), frozenset()) or [preferred(gi)[0] for gi in order]
    return dict(zip(order, starts, strict=True))


def mig_profile_releases(name: str, profile: MigProfile) -> branches.Releases | None:
    """The driver releases that have MIG profile ``name``; None: every release simulated."""
    suffix = _MIG_SUFFIX.sub(r"\1", name)
    if suffix in _MIG_SUFFIX_RELEASES:
        return _MIG_SUFFIX_RELEASES[suffix]
    if (profile.compute_slices, profile.memory_slices) == (1, 2):
        return _TWICE_THE_MEMORY
    return None


BRANDS = {
    "quadro": 1,
    "tesla": 2,
    "geforce": 5,
    "titan": 6,
    "quadro_rtx": 12,
    "nvidia_rtx": 13,
    "nvidia": 14,
}

COMPUTE_MODES = {"default": 0, "prohibited": 2, "exclusive_process": 3}

FAULT_KINDS = (
    "gpu_lost",
    "not_supported",
    "error",
    "sentinel",
    "driver_not_loaded",
    "hang",
    "nvlink_down",
    "xid",
    "ecc_uncorrectable",
)
# Faults that happen at one moment and leave lasting effects: they take no `until`.
_INSTANT_FAULTS = ("xid", "ecc_uncorrectable")
REMAP_OUTCOMES = ("pending", "failed", "done")

# Bus numbers of a DGX H100's eight GPUs; further GPUs continue upwards.
_DEFAULT_BUSES = (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)

_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)/s\s*$")
_WATTS_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*W\s*$")
_PCI_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# ---------------------------------------------------------------------------------------------
# Primitive validators: each takes the raw value and its key path and returns the clean value.


def _size(value: object, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise _fail(path, "expected a size like '80GiB' or a number of bytes")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def _watts(value: object, path: str) -> float:
    if _is_number(value) and float(value) >= 0:  # type: ignore[arg-type]
        return float(value)  # type: ignore[arg-type]
    match = _WATTS_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise _fail(path, "expected watts like '700W'")
    return float(match.group(1))


def _features(value: object, path: str) -> frozenset[str]:
    names = _list(value, path)
    for i, name in enumerate(names):
        _choice(name, f"{path}[{i}]", FEATURES)
    return frozenset(names)


def _opt_in_features(value: object, path: str) -> frozenset[str]:
    names = _list(value, path)
    for i, name in enumerate(names):
        _choice(name, f"{path}[{i}]", OPT_IN_FEATURES)
    return frozenset(names)


def _function_names(value: object, path: str) -> frozenset[str]:
    names = _list(value, path)
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in FUNCTION_NAMES:
            raise _fail(f"{path}[{i}]", "expected the name of a simulated NVML C function")
    return frozenset(names)


# ---------------------------------------------------------------------------------------------
# Value specs


def _scalar(value: object, kind: str) -> tuple[float, str] | None:
    """Parse one quantity of ``kind``; return (value, unit) or None when it does not fit."""
    if isinstance(value, str):
        regex = {"memory": _SIZE_RE, "rate": _RATE_RE, "power": _WATTS_RE}.get(kind)
        match = regex.match(value) if regex else None
        if not match:
            return None
        factor = 1 if kind == "power" else _SIZE_UNITS[match.group(2)]
        return float(match.group(1)) * factor, ""
    if not _is_number(value):
        return None
    number = float(value)  # type: ignore[arg-type]
    limits = {"fraction": 1, "memory": 1, "power": 1.5, "rate": math.inf, "celsius": 200}
    if not 0 <= number <= limits.get(kind, 20000):
        return None
    return number, "fraction" if kind in ("memory", "power") else ""


def _quantity(value: object, path: str, kind: str) -> tuple[float, str]:
    parsed = _scalar(value, kind)
    if parsed is None:
        raise _fail(path, f"expected {_KIND_HELP[kind]}")
    return parsed


_PATTERN_KEYS = {
    "constant": ({"pattern", "value", "noise"}, {"value"}),
    "sawtooth": ({"pattern", "min", "max", "period", "noise"}, {"min", "max", "period"}),
    "square": ({"pattern", "min", "max", "period", "duty", "noise"}, {"min", "max", "period"}),
    "sine": ({"pattern", "min", "max", "period", "noise"}, {"min", "max", "period"}),
    "ramp": ({"pattern", "start", "end", "period", "noise"}, {"start", "end", "period"}),
}


def _value_spec(value: object, path: str, kind: str) -> ValueSpec:
    """Parse a metric's value spec: a constant quantity or a pattern mapping."""
    if not isinstance(value, dict):
        parsed = _scalar(value, kind)
        if parsed is None:
            raise _fail(path, f"expected {_KIND_HELP[kind]} or a pattern mapping")
        return ValueSpec.constant(parsed[0], unit=parsed[1])
    pattern = value.get("pattern", "constant")
    _choice(pattern, f"{path}.pattern", _PATTERN_KEYS)
    allowed, required = _PATTERN_KEYS[pattern]
    _mapping(value, path, allowed, required)
    low_key, high_key = {"constant": ("value", "value"), "ramp": ("start", "end")}.get(
        pattern, ("min", "max")
    )
    low, unit = _quantity(value[low_key], f"{path}.{low_key}", kind)
    high, high_unit = _quantity(value[high_key], f"{path}.{high_key}", kind)
    noise, noise_unit = _quantity(value.get("noise", 0), f"{path}.noise", kind)
    if high_unit != unit:
        raise _fail(f"{path}.{high_key}", f"must use the same unit as {low_key}")
    if noise and noise_unit != unit:
        raise _fail(f"{path}.noise", f"must use the same unit as {low_key}")
    period = 1.0
    if "period" in value:
        period = _duration(value["period"], f"{path}.period")
        if period <= 0:
            raise _fail(f"{path}.period", "must be greater than zero")
    duty = _number(value.get("duty", 0.5), f"{path}.duty", 0, 1)
    return ValueSpec(pattern, low, high, period=period, duty=duty, noise=noise, unit=unit)


_PROCESS_TYPES = ("compute", "graphics")


def _processes(value: object, path: str) -> tuple[Process, ...]:
    processes = []
    for i, entry in enumerate(_list(value, path)):
        where = f"{path}[{i}]"
        allowed = {"name", "memory", "count", "type", "pid", "weight"}
        _mapping(entry, where, allowed, {"name", "memory"})
        memory, unit = _quantity(entry["memory"], f"{where}.memory", "memory")
        pid = entry.get("pid")
        processes.append(
            Process(
                name=_string(entry["name"], f"{where}.name"),
                memory=memory,
                memory_unit=unit,
                count=_integer(entry.get("count", 1), f"{where}.count", 1, 64),
                kind=_choice(entry.get("type", "compute"), f"{where}.type", _PROCESS_TYPES),
                pid=None if pid is None else _integer(pid, f"{where}.pid", 1, 4_000_000),
                weight=_weight(entry.get("weight", 1), f"{where}.weight"),
            )
        )
    return tuple(processes)


def _weight(value: object, path: str) -> float:
    weight = _number(value, path, 0, 1e6)
    if weight <= 0:
        raise _fail(path, "expected a number greater than 0 (the process's share of the load)")
    return weight


def _reasons(value: object, path: str) -> int:
    mask = 0
    for i, name in enumerate(_list(value, path)):
        mask |= CLOCK_EVENT_REASONS[_choice(name, f"{path}[{i}]", CLOCK_EVENT_REASONS)]
    return mask


def _phase_body(entry: dict[str, Any], path: str) -> dict[str, Any]:
    """Parse the metric, reason and process keys shared by phases and per-GPU overrides."""
    body: dict[str, Any] = {}
    for key, raw in entry.items():
        if key in METRICS:
            body[key] = _value_spec(raw, f"{path}.{key}", METRICS[key])
        elif key == "clock_event_reasons":
            body[key] = _reasons(raw, f"{path}.{key}")
        elif key == "processes":
            body[key] = _processes(raw, f"{path}.{key}")
    return body


_PHASE_BODY_KEYS = {*METRICS, "clock_event_reasons", "processes"}


def _phases(value: object, path: str) -> tuple[Phase, ...]:
    entries = _list(value, path)
    if not entries:
        raise _fail(path, "expected at least one phase")
    phases = []
    for i, entry in enumerate(entries):
        where = f"{path}[{i}]"
        _mapping(entry, where, {"name", "duration", *_PHASE_BODY_KEYS}, {"duration"})
        duration = _duration(entry["duration"], f"{where}.duration")
        if duration <= 0:
            raise _fail(f"{where}.duration", "must be greater than zero")
        body = _phase_body(entry, where)
        phases.append(
            Phase(
                name=_string(entry.get("name", f"phase{i}"), f"{where}.name"),
                duration=duration,
                specs={k: v for k, v in body.items() if k in METRICS},
                clock_event_reasons=body.get("clock_event_reasons"),
                processes=body.get("processes", ()),
            )
        )
    return tuple(phases)


# ---------------------------------------------------------------------------------------------
# GPU models


_MODEL_FIELDS: dict[str, Callable[[object, str], Any]] = {
    "name": _string,
    "brand": lambda v, p: BRANDS[_choice(v, p, BRANDS)],
    "architecture": lambda v, p: ARCHITECTURES[_choice(v, p, ARCHITECTURES)],
    "compute_capability": lambda v, p: _compute_capability(v, p),
    "memory_total": _size,
    "memory_reserved": _size,
    "bar1_total": _size,
    "memory_bus_width": lambda v, p: _integer(v, p, 1, 16384),
    "pcie_generation": lambda v, p: _integer(v, p, 1, 7),
    "pcie_max_generation": lambda v, p: _integer(v, p, 1, 7),
    "pcie_gpu_max_generation": lambda v, p: _integer(v, p, 1, 7),
    "pcie_width": lambda v, p: _integer(v, p, 1, 32),
    "pcie_max_width": lambda v, p: _integer(v, p, 1, 32),
    "power_limit": _watts,
    "power_default_limit": _watts,
    "power_min_limit": _watts,
    "power_max_limit": _watts,
    "idle_power": _watts,
    "power_reading": lambda v, p: _choice(v, p, ("average", "instant")),
    "max_sm_clock": lambda v, p: _integer(v, p, 1, 20000),
    "max_graphics_clock": lambda v, p: _integer(v, p, 1, 20000),
    "max_memory_clock": lambda v, p: _integer(v, p, 1, 20000),
    "max_video_clock": lambda v, p: _integer(v, p, 1, 20000),
    "idle_sm_clock": lambda v, p: _integer(v, p, 1, 20000),
    "idle_memory_clock": lambda v, p: _integer(v, p, 1, 20000),
    "temp_idle": lambda v, p: _number(v, p, 0, 150),
    "temp_load": lambda v, p: _number(v, p, 0, 150),
    "temp_shutdown": lambda v, p: _integer(v, p, 0, 150),
    "temp_slowdown": lambda v, p: _integer(v, p, 0, 150),
    "temp_gpu_max": lambda v, p: _integer(v, p, 0, 150),
    "temp_memory_max": lambda v, p: _integer(v, p, 0, 150),
    "fans": lambda v, p: _integer(v, p, 0, 8),
    "pci_device_id": lambda v, p: _integer(v, p, 0, 0xFFFFFFFF),
    "pci_subsystem_id": lambda v, p: _integer(v, p, 0, 0xFFFFFFFF),
    "vbios": _string,
    "lacks": _features,
    "features": _opt_in_features,
    "nvlink_links": lambda v, p: _integer(v, p, 0, 18),
    "nvlink_version": lambda v, p: _integer(v, p, 0, 8),
    "mig_profiles": lambda v, p: _choice(v, p, MIG_PROFILES),
}
_OPTIONAL_MODEL_FIELDS = {"lacks", "features", "nvlink_links", "nvlink_version", "mig_profiles"}


def _compute_capability(value: object, path: str) -> tuple[int, int]:
    text = str(value) if _is_number(value) or isinstance(value, str) else ""
    match = re.match(r"^(\d+)\.(\d+)$", text)
    if not match:
        raise _fail(path, "expected a version like '9.0'")
    return int(match.group(1)), int(match.group(2))


def _model_fields(entry: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Validate the model keys present in ``entry`` (a model or a GPU entry's overrides)."""
    return {
        key: parse(entry[key], f"{path}.{key}")
        for key, parse in _MODEL_FIELDS.items()
        if key in entry
    }


@functools.lru_cache(maxsize=1)
def gpu_models() -> dict[str, GpuModel]:
    """Return the GPU profiles shipped in ``models.yaml``, keyed by profile name."""
    document = _read_yaml(MODELS_FILE)
    models = _mapping(document, "models", document.keys() if isinstance(document, dict) else ())
    required = [key for key in _MODEL_FIELDS if key not in _OPTIONAL_MODEL_FIELDS]
    return {
        key: GpuModel(**_model_fields(_mapping(entry, key, _MODEL_FIELDS, required), key))
        for key, entry in models.items()
    }


# ---------------------------------------------------------------------------------------------
# Resolution: node phases + GPU model -> per-GPU phases with every metric in absolute units.


def _derive_defaults(specs: dict[str, ValueSpec], phase: Phase, model: GpuModel) -> None:
    """Fill in metrics a phase leaves out, derived from its utilization and the model.

    Power, temperature, memory-controller load, PCIe traffic and fan speed follow utilization
    linearly; clocks are the model's idle clocks in phases whose utilization is a constant 0 and
    its maximum clocks otherwise; memory used is the sum of the phase's process memory.

    The GPM activity fractions follow a typical mixed-precision training step: SMs are active
    80 % of the time the GPU is busy (utilization counts any kernel running, not how many SMs it
    keeps busy), tensor cores half of that, DRAM 90 % of the memory-controller load. NVLink
    carries a tenth of the links' 25 GB/s per direction at full utilization (all-reduce traffic).
    """
    util = specs.setdefault("utilization", ValueSpec.constant(0.0))
    idle = util.pattern == "constant" and util.high == 0
    busy_power = model.power_limit * 0.9 - model.idle_power
    defaults = {
        "memory_utilization": lambda: util.scaled(0.45),
        "memory_used": lambda: ValueSpec.constant(sum(p.memory * p.count for p in phase.processes)),
        "pcie_tx": lambda: util.scaled(0.5e9),
        "pcie_rx": lambda: util.scaled(1.5e9),
        "temperature": lambda: util.scaled(model.temp_load - model.temp_idle, model.temp_idle),
        "power": lambda: util.scaled(busy_power, model.idle_power),
        "sm_clock": lambda: ValueSpec.constant(model.idle_sm_clock if idle else model.max_sm_clock),
        "memory_clock": lambda: ValueSpec.constant(
            model.idle_memory_clock if idle else model.max_memory_clock
        ),
        "fan": lambda: util.scaled(0.5, 0.3),
    }
    for metric, make in defaults.items():
        if metric not in specs:
            specs[metric] = make()
    for output in OUTPUTS:
        specs.setdefault(output.metric, ValueSpec.constant(output.default))
    # These follow other metrics, so they are filled after them.
    specs.setdefault("graphics_clock", specs["sm_clock"])
    specs.setdefault(
        "video_clock", specs["sm_clock"].scaled(model.max_video_clock / model.max_sm_clock)
    )
    specs.setdefault("memory_temperature", specs["temperature"].scaled(1.0, 6.0))
    specs.setdefault("sm_active", util.scaled(0.8))
    # The graphics engine is busy whenever a kernel runs, however few SMs it fills.
    specs.setdefault("graphics_active", util.scaled(0.95))
    specs.setdefault("dram_active", specs["memory_utilization"].scaled(0.9))
    for metric in GPM_METRICS:
        if metric not in specs:
            # A GPM metric added to exporter.names without a share here fails loudly, on load.
            specs[metric] = specs["sm_active"].scaled(_SHARE_OF_SM_ACTIVE[metric])
    link_traffic = util.scaled(0.1 * model.nvlink_links * _NVLINK_LINK_RATE)
    specs.setdefault("nvlink_tx", link_traffic)
    specs.setdefault("nvlink_rx", link_traffic)


# The GPM pipe fractions as a share of sm_active in a typical mixed-precision training step.
_SHARE_OF_SM_ACTIVE = {
    "sm_occupancy": 0.5,
    "tensor_active": 0.5,
    "fp16_active": 0.2,
    "fp32_active": 0.35,
    "fp64_active": 0.01,
    "integer_active": 0.15,
}
_NVLINK_LINK_RATE = 25e9  # bytes/s per link and direction (NVLink 2, 3 and 4 alike)


def _resolve_phase(phase: Phase, overrides: Mapping[str, Any], model: GpuModel) -> Phase:
    """Apply per-GPU overrides, convert relative units and derive the missing metrics."""
    processes = tuple(
        replace(p, memory=p.memory * model.memory_total, memory_unit="")
        if p.memory_unit == "fraction"
        else p
        for p in overrides.get("processes", phase.processes)
    )
    phase = replace(
        phase,
        processes=processes,
        clock_event_reasons=overrides.get("clock_event_reasons", phase.clock_event_reasons),
    )
    specs = dict(phase.specs)
    specs.update({k: v for k, v in overrides.items() if k in METRICS})
    scales = {
        "memory_used": float(model.memory_total),
        "memory_free": float(model.memory_total),
        "bar1_used": float(model.bar1_total),
        "power": model.power_limit,
    }
    for metric, scale in scales.items():
        if metric in specs and specs[metric].unit == "fraction":
            specs[metric] = specs[metric].scaled(scale)
    _derive_defaults(specs, phase, model)
    return replace(phase, specs=specs)


# ---------------------------------------------------------------------------------------------
# Scenario document


_GPU_KEYS = {
    "model",
    "count",
    "lacks",
    "has",
    "overrides",
    "phases",
    "uuid",
    "serial",
    "pci_bus_id",
    "pcie_replays_per_hour",
    "pcie_replays",
    "ecc_corrected_per_hour",
    "ecc_uncorrected_per_hour",
    "compute_mode",
    "persistence_mode",
    "display_active",
    "ecc_enabled",
    "nvlink_down",
    "nvlink_errors_per_hour",
    "mig",
    *_MODEL_FIELDS,
}


def _pci_bus_id(value: object, path: str) -> str:
    match = _PCI_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise _fail(path, "expected a PCI bus id like '00000000:18:00.0'")
    domain, bus, device, function = (int(group, 16) for group in match.groups())
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function}"


def _gpu_entries(
    value: object, node_phases: tuple[Phase, ...] | None, loop: bool, driver: DriverSpec
) -> tuple[GpuSpec, ...]:
    models = gpu_models()
    gpus: list[GpuSpec] = []
    entries = _list(value, "gpus")
    if not entries:
        raise _fail("gpus", "expected at least one GPU")
    for i, entry in enumerate(entries):
        where = f"gpus[{i}]"
        _mapping(entry, where, _GPU_KEYS, {"model"})
        model = models[_choice(entry["model"], f"{where}.model", models)]
        fields = _model_fields(entry, where)
        fields["lacks"] = model.lacks | fields.get("lacks", frozenset())
        fields.update(_has(entry, where, fields, model))
        model = replace(model, **fields)
        count = _integer(entry.get("count", 1), f"{where}.count", 1, 64)
        for key in ("uuid", "serial", "pci_bus_id"):
            if key in entry and count != 1:
                raise _fail(f"{where}.{key}", "only allowed on an entry with count 1")
        phases = _phases(entry["phases"], f"{where}.phases") if "phases" in entry else node_phases
        if phases is None:
            raise _fail(f"{where}.phases", "required when the scenario has no node phases")
        overrides = {}
        if "overrides" in entry:
            raw = _mapping(entry["overrides"], f"{where}.overrides", _PHASE_BODY_KEYS)
            overrides = _phase_body(raw, f"{where}.overrides")
        timeline = Timeline([_resolve_phase(p, overrides, model) for p in phases], loop)
        identity = _identity(entry, where)
        identity.update(_nvlink_options(entry, where, model))
        if "mig" in entry:
            layout = _MigLayout(model, phases, overrides, loop, driver.version)
            identity["mig"] = layout.parse(entry["mig"], f"{where}.mig")
        for _ in range(count):
            index = len(gpus)
            bus = _DEFAULT_BUSES[index] if index < len(_DEFAULT_BUSES) else 0xE0 + index
            gpus.append(
                GpuSpec(
                    index=index,
                    model=model,
                    timeline=timeline,
                    pci_bus_id=identity.pop("pci_bus_id", f"00000000:{bus:02X}:00.0"),
                    **identity,
                )
            )
    _check_distinct(gpus)
    return tuple(gpus)


def _has(
    entry: Mapping[str, Any], where: str, fields: Mapping[str, Any], model: GpuModel
) -> dict[str, Any]:
    """``has: [features]``: features the model lacks that this GPU has (a recording shows them).

    They come off the ``lacks`` list; opt-in features (:data:`OPT_IN_FEATURES`) are declared. The
    recorded H100 SXM prints encoder utilization 0 % where the h100-sxm model lacks an encoder
    (captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt, `Utilization: Encoder`).
    """
    if "has" not in entry:
        return {}
    has = _features(entry["has"], f"{where}.has")
    both = has & _features(entry.get("lacks", []), f"{where}.lacks")
    if both:
        raise _fail(f"{where}.has", f"{', '.join(sorted(both))} also listed under lacks")
    features = fields.get("features", model.features)
    return {"lacks": fields["lacks"] - has, "features": features | (has & OPT_IN_FEATURES)}


def _nvlink_options(entry: Mapping[str, Any], where: str, model: GpuModel) -> dict[str, Any]:
    """Parse ``nvlink_down: [links]`` and ``nvlink_errors_per_hour: {counter: rate}``."""
    fields: dict[str, Any] = {}
    if "nvlink_down" in entry:
        path = f"{where}.nvlink_down"
        if not model.nvlink_links:
            raise _fail(path, f"{model.name} has no NVLink")
        links = _list(entry["nvlink_down"], path)
        top = model.nvlink_links - 1
        fields["nvlink_down"] = frozenset(
            _integer(link, f"{path}[{i}]", 0, top) for i, link in enumerate(links)
        )
    if "nvlink_errors_per_hour" in entry:
        path = f"{where}.nvlink_errors_per_hour"
        rates = _mapping(entry["nvlink_errors_per_hour"], path, NVLINK_ERROR_COUNTERS)
        fields["nvlink_errors_per_hour"] = tuple(
            _number(rates.get(name, 0), f"{path}.{name}", 0, 1e9) for name in NVLINK_ERROR_COUNTERS
        )
    return fields


_MIG_KEYS = {
    "profile",
    "count",
    "overrides",
    "gpu_instance_id",
    "compute_instances",
    "memory_total",
}


def _shape(profile: MigProfile) -> tuple[int, int]:
    return profile.compute_slices, profile.memory_slices


def _compute_instances(
    entry: Mapping[str, Any], where: str, name: str, profile: MigProfile
) -> list[tuple[int, tuple[Process, ...] | None]]:
    """A GPU instance's compute instances: (compute slices, the processes it lists or None)."""
    whole = profile.compute_slices
    if "compute_instances" not in entry:
        return [(whole, None)]
    path = f"{where}.compute_instances"
    choices = [f"{n}c" for n in _COMPUTE_INSTANCE_SLICES if n <= whole]
    layout: list[tuple[int, tuple[Process, ...] | None]] = []
    for k, item in enumerate(_list(entry["compute_instances"], path)):
        at = f"{path}[{k}]"
        processes = None
        if isinstance(item, dict):
            _mapping(item, at, {"profile", "processes"}, {"profile"})
            if "processes" in item:
                processes = _processes(item["processes"], f"{at}.processes")
            at, item = f"{at}.profile", item["profile"]
        layout.append((int(_choice(item, at, choices)[:-1]), processes))
    if not layout:
        raise _fail(path, "expected at least one compute instance")
    needed = sum(slices for slices, _ in layout)
    if needed > whole:
        raise _fail(path, f"the compute instances need {needed} compute slices; {name} has {whole}")
    return layout


@dataclass(frozen=True)
class _MigLayout:
    """Parses one GPU's ``mig`` list into its MIG devices, one per compute instance."""

    model: GpuModel
    phases: tuple[Phase, ...]
    gpu_overrides: Mapping[str, Any]
    loop: bool
    driver_version: str

    def parse(self, value: object, path: str) -> tuple[MigInstanceSpec, ...]:
        """GPU instance entries ``{profile, count, overrides, gpu_instance_id, compute_instances}``.

        MIG devices are numbered in (GPU instance id, compute instance id) order, as the recorded
        H200 lists them (captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt, ``nvidia-smi -L``
        and ``-q``); compute instance ids count from 0 in the order listed, as there.
        """
        model = self.model
        if not model.mig_capable:
            raise _fail(path, f"{model.name} does not support MIG")
        entries = _list(value, path)
        # Ids named explicitly are set aside before any is given out.
        reserved = {
            entry["gpu_instance_id"]
            for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("gpu_instance_id"), int)
        }
        taken: set[int] = set()
        devices: list[MigInstanceSpec] = []
        compute = memory = 0
        for i, entry in enumerate(entries):
            where = f"{path}[{i}]"
            _mapping(entry, where, _MIG_KEYS, {"profile"})
            name, profile = self._profile(entry["profile"], f"{where}.profile")
            count = _integer(entry.get("count", 1), f"{where}.count", 1, profile.most)
            named = self._named_id(entry, where, name, profile, count)
            if named in taken:
                raise _fail(
                    f"{where}.gpu_instance_id", f"GPU instance id {named} is already in use"
                )
            for _ in range(count):
                compute += profile.compute_slices
                memory += profile.memory_slices
                if compute > 7 or memory > 8:
                    raise _fail(
                        where, "the instances need more than the GPU's 7 compute / 8 memory slices"
                    )
                instance_id = named
                if instance_id is None:
                    used = reserved | taken
                    free = [n for n in _MIG_INSTANCE_IDS[_shape(profile)] if n not in used]
                    instance_id = free[0] if free else max(used) + 1
                taken.add(instance_id)
                devices.extend(self._gpu_instance(entry, where, name, profile, instance_id))
        if not devices:
            raise _fail(path, "expected at least one instance")
        devices.sort(key=lambda d: (d.gpu_instance_id, d.compute_instance_id))
        first: dict[int, int] = {}
        starts = _placement_starts({d.gpu_instance_id: d for d in devices})
        return tuple(
            replace(
                d,
                slot=slot,
                first_slot=first.setdefault(d.gpu_instance_id, slot),
                placement_start=starts[d.gpu_instance_id],
            )
            for slot, d in enumerate(devices)
        )

    def _profile(self, value: object, path: str) -> tuple[str, MigProfile]:
        profiles = MIG_PROFILES[self.model.mig_profiles]
        if not isinstance(value, str) or value not in profiles:
            raise _fail(
                path,
                f"expected one of {', '.join(profiles)} (the MIG profiles of {self.model.name})",
            )
        releases = mig_profile_releases(value, profiles[value])
        if releases is not None and not releases.include(branches.parse(self.driver_version)):
            since = releases.spans[0][0]
            # Written as NVIDIA writes releases: 470.42.01, 570.169.
            first = ".".join([*map(str, since[:2]), *(f"{n:02d}" for n in since[2:])])
            raise _fail(
                path, f"{value} needs driver {first} or later; the driver is {self.driver_version}"
            )
        return value, profiles[value]

    def _named_id(
        self, entry: Mapping[str, Any], where: str, name: str, profile: MigProfile, count: int
    ) -> int | None:
        if "gpu_instance_id" not in entry:
            return None
        path = f"{where}.gpu_instance_id"
        if count != 1:
            raise _fail(path, "only allowed on an entry with count 1")
        ids = _MIG_INSTANCE_IDS[_shape(profile)]
        value = entry["gpu_instance_id"]
        if not isinstance(value, int) or isinstance(value, bool) or value not in ids:
            raise _fail(path, f"expected one of {', '.join(map(str, ids))} (the ids of {name})")
        return value

    def _gpu_instance(
        self, entry: Mapping[str, Any], where: str, name: str, profile: MigProfile, instance_id: int
    ) -> list[MigInstanceSpec]:
        """The MIG devices of one GPU instance: one per compute instance."""
        model = self.model
        overrides = dict(self.gpu_overrides)
        if "overrides" in entry:
            raw = _mapping(entry["overrides"], f"{where}.overrides", _PHASE_BODY_KEYS)
            overrides.update(_phase_body(raw, f"{where}.overrides"))
        memory_total = mig_instance_memory(profile, model.memory_total)
        if "memory_total" in entry:
            # As a recording printed it, where it differs from the profile's share.
            memory_total = _size(entry["memory_total"], f"{where}.memory_total")
        # Fractions of memory in the instance's processes and specs are of its own memory.
        instance_model = replace(model, memory_total=memory_total, memory_reserved=0)
        layout = _compute_instances(entry, where, name, profile)
        listed = any(processes is not None for _, processes in layout)
        timelines: list[list[Phase]] = [[] for _ in layout]  # [compute instance][phase]
        for phase in self.phases:
            # Each compute instance's processes: those it lists or, when none lists any, the GPU
            # instance's own in its first one.
            own = overrides.get("processes", phase.processes)
            shares = [processes or () for _, processes in layout] if listed else [own]
            everyone = tuple(p for share in shares for p in share)
            # Resolved together, so that the memory they hold is the GPU instance's.
            body = _resolve_phase(phase, {**overrides, "processes": everyone}, instance_model)
            start = 0
            for k in range(len(layout)):
                size = len(shares[k]) if k < len(shares) else 0
                timelines[k].append(replace(body, processes=body.processes[start : start + size]))
                start += size
        return [
            MigInstanceSpec(
                slot=0,  # numbered once the GPU's whole layout is known
                profile=name,
                gpu_instance_id=instance_id,
                compute_slices=profile.compute_slices,
                memory_slices=profile.memory_slices,
                memory_total=memory_total,
                timeline=Timeline(timelines[k], self.loop),
                compute_instance_id=k,
                compute_instance_slices=slices,
            )
            for k, (slices, _) in enumerate(layout)
        ]


def _identity(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Parse a GPU entry's identity and behaviour keys into GpuSpec keyword arguments."""
    fields: dict[str, Any] = {}
    if "uuid" in entry:
        uuid = _string(entry["uuid"], f"{where}.uuid")
        if not _UUID_RE.match(uuid):
            raise _fail(f"{where}.uuid", "expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex)")
        fields["uuid"] = uuid
    if "serial" in entry:
        fields["serial"] = _string(str(entry["serial"]), f"{where}.serial")
    if "pci_bus_id" in entry:
        fields["pci_bus_id"] = _pci_bus_id(entry["pci_bus_id"], f"{where}.pci_bus_id")
    if "pcie_replays" in entry:
        replays = _integer(entry["pcie_replays"], f"{where}.pcie_replays", 0, 2**32 - 1)
        fields["pcie_replays"] = replays
    for key in ("pcie_replays_per_hour", "ecc_corrected_per_hour", "ecc_uncorrected_per_hour"):
        if key in entry:
            fields[key] = _number(entry[key], f"{where}.{key}", 0, 1e9)
    if "compute_mode" in entry:
        mode = _choice(entry["compute_mode"], f"{where}.compute_mode", COMPUTE_MODES)
        fields["compute_mode"] = COMPUTE_MODES[mode]
    for key in ("persistence_mode", "display_active", "ecc_enabled"):
        if key in entry:
            fields[key] = _boolean(entry[key], f"{where}.{key}")
    return fields


def _check_distinct(gpus: list[GpuSpec]) -> None:
    seen: dict[str, int] = {}
    for gpu in gpus:
        if gpu.pci_bus_id in seen:
            first = seen[gpu.pci_bus_id]
            raise _fail("gpus", f"GPUs {first} and {gpu.index} share PCI bus id {gpu.pci_bus_id}")
        seen[gpu.pci_bus_id] = gpu.index


def _driver(value: object) -> DriverSpec:
    entry = _mapping(
        value,
        "driver",
        {
            "version",
            "cuda_version",
            "nvml_version",
            "lacks",
            "uptime",
            "pcie_counter_bits",
            "latency",
        },
        {"version", "cuda_version"},
    )
    latency, default_latency = _latency(entry.get("latency", {}), "driver.latency")
    version = _string(entry["version"], "driver.version")
    cuda = _integer(entry["cuda_version"], "driver.cuda_version", 1000, 99999)
    return DriverSpec(
        version=version,
        cuda_version=cuda,
        nvml_version=_string(
            entry.get("nvml_version", f"{cuda // 1000}.{version}"), "driver.nvml_version"
        ),
        lacks=_function_names(entry.get("lacks", []), "driver.lacks"),
        uptime=_duration(entry.get("uptime", "3d"), "driver.uptime"),
        pcie_counter_bits=_counter_bits(entry.get("pcie_counter_bits", 32)),
        latency=latency,
        default_latency=default_latency,
    )


def _counter_bits(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value not in (32, 64):
        raise _fail("driver.pcie_counter_bits", "expected 32 or 64")
    return value


def _latency(value: object, path: str) -> tuple[dict[str, float], float]:
    """Parse ``{C function name or default: duration}`` on top of :data:`DEFAULT_LATENCY`."""
    entry = _mapping(value, path, {"default", *FUNCTION_NAMES})
    latency = dict(DEFAULT_LATENCY)
    default = 0.0
    for key, raw in entry.items():
        seconds = _duration(raw, f"{path}.{key}")
        if seconds > 60:
            raise _fail(f"{path}.{key}", "expected at most 60 seconds")
        if key == "default":
            default = seconds
        else:
            latency[key] = seconds
    return latency, default


_FAULT_KEYS: dict[str, tuple[set[str], set[str]]] = {
    "gpu_lost": ({"gpu"}, {"gpu"}),
    "not_supported": ({"gpu", "calls"}, {"calls"}),
    "error": ({"gpu", "call", "error"}, {"call", "error"}),
    "sentinel": ({"gpu", "call"}, {"call"}),
    "driver_not_loaded": (set(), set()),
    "hang": ({"gpu", "call", "seconds"}, {"call", "seconds"}),
    "nvlink_down": ({"gpu", "link"}, {"gpu", "link"}),
    "xid": ({"gpu", "code"}, {"gpu", "code"}),
    "ecc_uncorrectable": ({"gpu", "count", "remap"}, {"gpu", "count"}),
}


def _error_code(value: object, path: str) -> int:
    import pynvml

    name = value.upper() if isinstance(value, str) else ""
    name = name.removeprefix("NVML_ERROR_")
    code = getattr(pynvml, f"NVML_ERROR_{name}", None) if name else None
    if not isinstance(code, int):
        raise _fail(path, "expected an NVML error name such as UNKNOWN, TIMEOUT, GPU_IS_LOST")
    return code


def _fault_details(entry: Mapping[str, Any], where: str, gpu: GpuSpec | None) -> dict[str, Any]:
    """Parse the keys of the NVLink, XID and ECC fault kinds."""
    details: dict[str, Any] = {}
    if "link" in entry:
        links = gpu.model.nvlink_links if gpu is not None else 0
        if not links:
            raise _fail(f"{where}.link", "this GPU has no NVLink")
        details["link"] = _integer(entry["link"], f"{where}.link", 0, links - 1)
    if "code" in entry:
        details["code"] = _integer(entry["code"], f"{where}.code", 1, 1023)
    if "count" in entry:
        details["count"] = _integer(entry["count"], f"{where}.count", 1, 10**6)
    if "remap" in entry:
        details["remap"] = _choice(entry["remap"], f"{where}.remap", REMAP_OUTCOMES)
    return details


def _faults(value: object, gpus: tuple[GpuSpec, ...]) -> tuple[Fault, ...]:
    gpu_count = len(gpus)
    faults = []
    for i, entry in enumerate(_list(value, "faults")):
        where = f"faults[{i}]"
        if not isinstance(entry, dict):
            raise _fail(where, "expected a mapping")
        kind = _choice(entry.get("kind"), f"{where}.kind", FAULT_KINDS)
        allowed, required = _FAULT_KEYS[kind]
        window = set() if kind in _INSTANT_FAULTS else {"until"}
        _mapping(entry, where, {"kind", "at", *window, *allowed}, required)
        gpu = _integer(entry["gpu"], f"{where}.gpu", 0, gpu_count - 1) if "gpu" in entry else None
        fault = Fault(
            kind=kind,
            at=_duration(entry.get("at", 0), f"{where}.at"),
            until=_duration(entry["until"], f"{where}.until") if "until" in entry else math.inf,
            gpu=gpu,
            calls=_function_names(
                entry.get("calls", [entry["call"]] if "call" in entry else []), f"{where}.call"
            ),
            error=_error_code(entry["error"], f"{where}.error") if "error" in entry else 0,
            seconds=_number(entry["seconds"], f"{where}.seconds", 0, 3600)
            if "seconds" in entry
            else 0.0,
            **_fault_details(entry, where, gpus[gpu] if gpu is not None else None),
        )
        if fault.until <= fault.at:
            raise _fail(f"{where}.until", "must be later than 'at'")
        faults.append(fault)
    return tuple(faults)


_TOP_KEYS = {
    "name",
    "description",
    "seed",
    "loop",
    "caller",
    "driver",
    "gpus",
    "phases",
    "faults",
    "kubernetes",
}
CALLERS = ("root", "unprivileged", "unprivileged-no-host-pid")


def parse_scenario(document: object, default_name: str = "scenario") -> Scenario:
    """Validate a parsed YAML document and return the resolved :class:`Scenario`."""
    entry = _mapping(document, "", _TOP_KEYS, {"driver", "gpus"})
    loop = _boolean(entry.get("loop", True), "loop")
    phases = _phases(entry["phases"], "phases") if "phases" in entry else None
    driver = _driver(entry["driver"])  # first: which MIG profiles exist depends on it
    gpus = _gpu_entries(entry["gpus"], phases, loop, driver)
    name = _string(entry.get("name", default_name), "name")
    seed = _integer(entry.get("seed", 0), "seed", 0, 2**63 - 1)
    kubernetes = None
    if "kubernetes" in entry:
        kubernetes = parse_kubernetes(entry["kubernetes"], gpus, name, seed)
    return Scenario(
        name=name,
        description=_string(entry.get("description", default_name), "description"),
        seed=seed,
        loop=loop,
        driver=driver,
        gpus=gpus,
        faults=_faults(entry.get("faults", []), gpus),
        caller=_caller(entry.get("caller", "root")),
        kubernetes=kubernetes,
    )


def _caller(value: object) -> str:
    if value not in CALLERS:
        raise _fail("caller", f"expected one of {', '.join(CALLERS)}")
    return str(value)


def _read_yaml(path: Path) -> object:
    try:
        with path.open(encoding="utf-8") as stream:
            return yaml.safe_load(stream)
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: invalid YAML: {exc}") from exc


def scenario_names() -> list[str]:
    """Return the names of the scenarios shipped with gpuload, sorted."""
    return sorted(path.stem for path in SCENARIO_DIR.glob("*.yaml"))


def scenario_path(name_or_path: str | os.PathLike[str]) -> Path:
    """Return the file behind a shipped scenario name or a path to a scenario file."""
    text = os.fspath(name_or_path)
    path = Path(text)
    is_path = path.suffix in (".yaml", ".yml") or os.sep in text or "/" in text
    if is_path or path.exists():
        return path
    if text not in scenario_names():
        raise ScenarioError(
            f"unknown scenario {text!r}: expected a file or one of {', '.join(scenario_names())}"
        )
    return SCENARIO_DIR / f"{text}.yaml"


def load_scenario(name_or_path: str | os.PathLike[str]) -> Scenario:
    """Load and validate a scenario by shipped name (e.g. ``training``) or file path.

    Raises:
        ScenarioError: the file cannot be read or any key or value is invalid; the message names
            the key path.
    """
    path = scenario_path(name_or_path)
    try:
        return parse_scenario(_read_yaml(path), default_name=path.stem)
    except ScenarioError as exc:
        if path.parent == SCENARIO_DIR:
            raise ScenarioError(f"scenario {path.stem}: {exc}") from exc
        raise


def _short_name(name: str) -> str:
    for prefix in ("NVIDIA ", "Tesla "):
        name = name.removeprefix(prefix)
    return name


def describe_scenarios() -> str:
    """Return a table of the shipped scenarios: name, GPU count, models and description."""
    rows = [("NAME", "GPUS", "MODELS", "DESCRIPTION")]
    for name in scenario_names():
        scenario = load_scenario(name)
        counts: dict[str, int] = {}
        for gpu in scenario.gpus:
            counts[gpu.model.name] = counts.get(gpu.model.name, 0) + 1
        models = ", ".join(f"{n}x {_short_name(model)}" for model, n in counts.items())
        rows.append((name, str(len(scenario.gpus)), models, scenario.description))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  "
        + row[3]
        for row in rows
    ]
    return "\n".join(lines)
