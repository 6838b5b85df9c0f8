"""What a scenario describes, once read: GPU models, GPUs, faults, the driver, and their tables.

`exporter.sim.scenario` reads scenario files into these; the simulated library and its devices
(`exporter.sim.library`, `exporter.sim.device`) run them. This module imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.sim.curves import Timeline

CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# Features a model has only when its `features` list declares them (the others it has unless its
# `lacks` list names them). NVLink is declared by `nvlink_links` instead.
OPT_IN_FEATURES = frozenset({"gpm", "row_remapping", "retired_pages"})


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile of a MIG-capable product, as its table in MIG_PROFILES lists it."""

    compute_slices: int  # of the GPU's 7
    memory_slices: int  # of the GPU's 8
    most: int  # instances of this profile one GPU holds at most
    profile_id: int  # its GPU instance profile id, as nvidia-smi mig -lgip lists it
    # Memory NVML reports for an instance, in MiB; 0: its memory slices' share of the GPU's less
    # ~2.5 % that the driver keeps (a 1g.10gb instance of an A100 80GB reports 9984 MiB).
    memory_mib: int = 0


# MIG user guide (v580), "Supported MIG Profiles": Table 7 (H100) and the note to Table 6 (A100
# 80GB: "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"), same names and shapes.
# Profile ids (nvmlGpuInstanceGetInfo's profileId) as `nvidia-smi mig -lgip` lists them, by shape:
# 19 (1g), 20 (1g+me), 15 (1g, 2 memory slices), 14 (2g), 9 (3g), 5 (4g), 0 (7g), as in the MIG
# user guide's "List GPU instance profiles" example. NVIDIA's DRA driver names MIG devices by them
# (k8s-dra-driver-gpu 22407113785e, cmd/gpu-kubelet-plugin/partitions.go "gpu-2-mig-1g24gb-19-0",
# device_state.go "gpu-1-mig-2g47gb-14-0").
_MIG_80GB = {
    "1g.10gb": MigProfile(1, 1, 7, 19),
    "1g.10gb+me": MigProfile(1, 1, 1, 20),
    "1g.20gb": MigProfile(1, 2, 4, 15),
    "2g.20gb": MigProfile(2, 2, 3, 14),
    "3g.40gb": MigProfile(3, 4, 2, 9),
    "4g.40gb": MigProfile(4, 4, 1, 5),
    "7g.80gb": MigProfile(7, 8, 1, 0),
}
# A model's `mig_profiles` names one of these tables: the profiles its GPUs can be split into.
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "a100-h100-80gb": _MIG_80GB,
    # Table 8 (H200). Memory as NVML reports it: 16384, 33280 and 71424 MiB for 1g.18gb, 2g.35gb
    # and 3g.71gb on the recorded H200 (captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt);
    # 16.00, 32.50 and 140.00 GiB for 1g.18gb+me, 2g.35gb and 7g.141gb in an H200's
    # `nvidia-smi mig -lgip`; 1g.35gb and 4g.71gb have the memory slices of 2g.35gb and 3g.71gb.
    "h200-141gb": {
        "1g.18gb": MigProfile(1, 1, 7, 19, 16384),
        "1g.18gb+me": MigProfile(1, 1, 1, 20, 16384),
        "1g.35gb": MigProfile(1, 2, 4, 15, 33280),
        "2g.35gb": MigProfile(2, 2, 3, 14, 33280),
        "3g.71gb": MigProfile(3, 4, 2, 9, 71424),
        "4g.71gb": MigProfile(4, 4, 1, 5, 71424),
        "7g.141gb": MigProfile(7, 8, 1, 0, 143360),
    },
}
NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")

# Per-call latency of the real library: nvmlDeviceGetPcieThroughput counts bytes over a 20 ms
# window before it returns (NVML API reference: "the throughput is sampled over a 20 ms
# interval"), so every call blocks about that long.
DEFAULT_LATENCY: dict[str, float] = {"nvmlDeviceGetPcieThroughput": 0.020}

ARCHITECTURES = {
    "kepler": 2,
    "maxwell": 3,
    "pascal": 4,
    "volta": 5,
    "turing": 6,
    "ampere": 7,
    "ada": 8,
    "hopper": 9,
    "blackwell": 10,
}


@dataclass(frozen=True)
class GpuModel:
    """Static properties of a GPU product, as listed in ``models.yaml``."""

    name: str
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_total: int
    memory_reserved: int
    bar1_total: int
    memory_bus_width: int
    pcie_generation: int
    pcie_max_generation: int
    pcie_gpu_max_generation: int
    pcie_width: int
    pcie_max_width: int
    power_limit: float
    power_default_limit: float
    power_min_limit: float
    power_max_limit: float
    idle_power: float
    power_reading: str
    max_sm_clock: int
    max_graphics_clock: int
    max_memory_clock: int
    max_video_clock: int
    idle_sm_clock: int
    idle_memory_clock: int
    temp_idle: float
    temp_load: float
    temp_shutdown: int
    temp_slowdown: int
    temp_gpu_max: int
    temp_memory_max: int
    fans: int
    pci_device_id: int
    pci_subsystem_id: int
    vbios: str
    lacks: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    nvlink_links: int = 0
    nvlink_version: int = 0
    mig_profiles: str = ""  # its table in MIG_PROFILES; empty: no MIG

    @property
    def mig_capable(self) -> bool:
        """Whether the product can be partitioned with MIG."""
        return bool(self.mig_profiles)


@dataclass(frozen=True)
class MigInstanceSpec:
    """One MIG device: a compute instance of a GPU instance of a GPU in MIG mode.

    "A MIG device handle is an NVML abstraction which maps to a MIG compute instance" (nvml.h,
    nvmlDeviceIsMigDeviceHandle). The compute instances of one GPU instance share its memory, its
    load and its GPM readings; each lists its own processes.
    """

    slot: int  # index for nvmlDeviceGetMigDeviceHandleByIndex
    profile: str  # the GPU instance's, e.g. 3g.71gb
    gpu_instance_id: int
    compute_slices: int  # the GPU instance's
    memory_slices: int
    memory_total: int
    timeline: Timeline  # the GPU instance's readings, with this compute instance's processes
    compute_instance_id: int = 0
    compute_instance_slices: int = 0  # 0: the whole GPU instance
    first_slot: int = 0  # the slot of its GPU instance's first compute instance
    placement_start: int = 0  # the GPU instance's first memory slice (nvmlGpuInstanceGetInfo)

    @property
    def name(self) -> str:
        """The MIG device's profile as NVML names it, e.g. ``1c.3g.71gb`` or ``3g.71gb``.

        ``<n>c.`` precedes the GPU instance's profile when the compute instance has fewer slices
        than it (``nvidia-smi -L`` on captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt).
        """
        slices = self.compute_instance_slices
        if not slices or slices == self.compute_slices:
            return self.profile
        return f"{slices}c.{self.profile}"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of a scenario: its model, identity overrides and resolved timeline."""

    index: int
    model: GpuModel
    timeline: Timeline
    pci_bus_id: str
    uuid: str | None = None
    serial: str | None = None
    pcie_replays_per_hour: float = 0.0
    # The replay counter at elapsed 0: nvidia-smi prints it ("Replays Since Reset : 9" on the
    # recorded H100, captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt).
    pcie_replays: int = 0
    ecc_corrected_per_hour: float = 0.0
    ecc_uncorrected_per_hour: float = 0.0
    compute_mode: int = 0
    persistence_mode: bool = True
    display_active: bool = False
    ecc_enabled: bool = True
    nvlink_down: frozenset[int] = frozenset()
    nvlink_errors_per_hour: tuple[float, ...] = (0.0,) * len(NVLINK_ERROR_COUNTERS)
    mig: tuple[MigInstanceSpec, ...] = ()

    @property
    def lacks(self) -> frozenset[str]:
        """Features this GPU does not support: listed under `lacks` or not declared by the model."""
        missing = self.model.lacks | (OPT_IN_FEATURES - self.model.features)
        return missing | {"nvlink"} if not self.model.nvlink_links else missing


@dataclass(frozen=True)
class DriverSpec:
    """The simulated driver: version strings and the C functions it does not export."""

    version: str
    cuda_version: int
    nvml_version: str
    lacks: frozenset[str] = frozenset()
    uptime: float = 3 * 86400.0
    # nvml.h on the PCIe byte fields: "Value can be wrapped"; the width is not documented, so a
    # scenario may show either (nvml-facts.md: treat it as 32-bit). 32 wraps every ~86 ms at
    # PCIe Gen5 x16 line rate.
    pcie_counter_bits: int = 32
    latency: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_LATENCY))
    default_latency: float = 0.0

    def latency_of(self, name: str) -> float:
        """Seconds a call to C function ``name`` blocks before it answers."""
        return self.latency.get(name, self.default_latency)


@dataclass(frozen=True)
class Fault:
    """A fault window; ``gpu`` None means every GPU (and system calls, for call faults)."""

    kind: str
    at: float = 0.0
    until: float = math.inf
    gpu: int | None = None
    calls: frozenset[str] = frozenset()
    error: int = 0
    seconds: float = 0.0
    link: int | None = None
    code: int = 0
    count: int = 0
    remap: str = ""

    def active(self, t: float) -> bool:
        """Whether the fault applies at elapsed time ``t``."""
        return self.at <= t < self.until


@dataclass(frozen=True)
class Scenario:
    """A validated, fully resolved scenario."""

    name: str
    description: str
    seed: int
    loop: bool
    driver: DriverSpec
    gpus: tuple[GpuSpec, ...]
    faults: tuple[Fault, ...] = ()
    # Who calls NVML: root, unprivileged, or unprivileged without the host's PID namespace.
    caller: str = "root"
    kubernetes: KubernetesSpec | None = None


# The QoS classes of Kubernetes pods, as a scenario names them and as the API writes them
# (k8s.io/api/core/v1 types.go, PodQOSClass).
POD_QOS_CLASSES = {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}


@dataclass(frozen=True)
class PodClaim:
    """A DRA ResourceClaim a container uses: whole GPUs and MIG devices (GPU, GPU instance id)."""

    name: str
    uid: str
    gpus: tuple[int, ...] = ()
    mig: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class PodContainer:
    """One container of a simulated pod: the GPUs a device plugin gave it and its processes."""

    name: str
    id: str  # the runtime's container ID: 64 hex digits
    gpus: tuple[int, ...] = ()
    mig: tuple[tuple[int, int], ...] = ()  # (GPU index, GPU instance id)
    shared: tuple[tuple[int, int], ...] = ()  # (GPU index, replica number) of time-sliced GPUs
    claim: PodClaim | None = None
    pids: tuple[int, ...] = ()
    cgroup: str = "systemd-v2"
    runtime: str = "containerd"


@dataclass(frozen=True)
class PodSpec:
    """A pod on the simulated node, running from ``start`` until ``until`` (scenario seconds)."""

    name: str
    namespace: str
    uid: str
    qos: str = "burstable"
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name), nearest first
    labels: Mapping[str, str] = field(default_factory=dict)
    start: float = 0.0
    until: float = math.inf
    containers: tuple[PodContainer, ...] = ()

    def running(self, t: float) -> bool:
        """Whether the pod runs at elapsed time ``t``."""
        return self.start <= t < self.until


@dataclass(frozen=True)
class KubernetesSpec:
    """The node's Kubernetes side: its name and the pods its kubelet runs."""

    node: str
    pods: tuple[PodSpec, ...] = ()

    def pid_lifetimes(self) -> dict[int, tuple[float, float]]:
        """Each pod process's PID mapped to its pod's (start, until)."""
        return {
            pid: (pod.start, pod.until)
            for pod in self.pods
            for container in pod.containers
            for pid in container.pids
        }
