"""dcgm-exporter's series, written from gpuload's snapshot: the `metrics.dcgm_compat` setting.

Dashboards, cost tools and alert rules written for NVIDIA's dcgm-exporter read its names
(``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``...). With the setting on, /metrics
also serves every field of dcgm-exporter's default counter set (etc/default-counters.csv in
https://github.com/NVIDIA/dcgm-exporter) that NVML can give, named, typed, labelled and in the
units dcgm-exporter serves them. Nothing here reads NVML: `FIELDS` maps each DCGM field to the
gpuload family it is written from, with its unit conversion, and every value comes from the same
immutable snapshot as gpuload's own families. docs/migrating-from-dcgm-exporter.md is the guide.

Labels are dcgm-exporter's: ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidiaN``),
``modelName``, the host label (``Hostname`` by default) and ``DCGM_FI_DRIVER_VERSION``; on a MIG
instance ``GPU_I_ID`` and ``GPU_I_PROFILE``; ``pod``, ``namespace`` and ``container`` on the
series of a GPU or MIG instance that one container holds (``gpu_pod_info``).

A GPU that several containers share (time-slicing): dcgm-exporter 4.x, with
``--kubernetes-virtual-gpus``, keeps the device's series and adds a copy per pod, with the pod's
own per-process values for DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED and the device's value for
every other field (internal/pkg/transformation/kubernetes.go, Process and
createPerProcessMetrics; process_metrics.go, isPerProcessMetric), which counts the device's
activity once per pod (NVIDIA/dcgm-exporter issue 587). Here the device's series stay without
pod labels and each container gets its measured share, only of the usage fields (`SHARED_OUT`):
its memory (``gpu_pod_memory_used_bytes``) for FB_USED, and the device's value times its share
of the SM time the GPU's containers had since the previous snapshot written
(``gpu_pod_utilization_seconds_total``) for GPU_UTIL and PROF_GR_ENGINE_ACTIVE, so that the
pods' values add up to the device's. Without those families (``collectors.kubernetes.pods``
unset) a shared GPU's series carry no pod: any split would be a guess, and a copy per pod would
count its use once per pod.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from exporter.collectors.base import Sample
from exporter.names import DEFAULT_HOSTNAME_LABEL
from exporter.snapshot import Snapshot

MIB = 2**20
# Each conversion: gpuload's base unit -> DCGM's unit.
TO_MHZ = 1e-6
TO_MILLIJOULES = 1000.0
TO_PERCENT = 100.0


@dataclass(frozen=True)
class Field:
    """One DCGM field as dcgm-exporter serves it, and the gpuload family it is written from.

    ``kind`` and ``help`` are default-counters.csv's. ``source`` is a sample name of gpuload's
    snapshot and ``select`` the label values that pick its series; ``mig_source`` the family of
    a MIG instance's value. ``rate``: the field is per second, from the counter's increase
    between two snapshots. ``profiling``: a PROF_ field, absent on GPUs without GPM.
    """

    name: str
    kind: str
    help: str
    source: str = ""
    select: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    whole: bool = False
    mig_source: str = ""
    rate: tuple[str, ...] = ()
    profiling: bool = False


# Every uncommented row of dcgm-exporter's etc/default-counters.csv (commit d5e5f510a1b6), in its
# order, with what it is written from. DCGM_FI_DRIVER_VERSION is a label; the rows NVML cannot give
# are in `NOT_SERVED`.
FIELDS: tuple[Field, ...] = (
    Field(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        "gpu_clock_hertz",
        (("clock", "sm"),),
        TO_MHZ,
    ),
    Field(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        "gpu_clock_hertz",
        (("clock", "memory"),),
        TO_MHZ,
    ),
    Field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        "gpu_temperature_celsius",
        (("sensor", "memory"),),
    ),
    Field(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        "gpu_temperature_celsius",
        (("sensor", "gpu"),),
    ),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "gpu_power_usage_watts"),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "gpu_energy_consumption_joules_total",
        scale=TO_MILLIJOULES,
    ),
    Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries.",
        "gpu_pcie_replay_errors_total",
    ),
    Field(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        "gpu_utilization_ratio",
        scale=TO_PERCENT,
    ),
    Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        "gpu_memory_utilization_ratio",
        scale=TO_PERCENT,
    ),
    Field(
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "Encoder utilization (in %).",
        "gpu_encoder_utilization_ratio",
        scale=TO_PERCENT,
    ),
    Field(
        "DCGM_FI_DEV_DEC_UTIL",
        "gauge",
        "Decoder utilization (in %).",
        "gpu_decoder_utilization_ratio",
        scale=TO_PERCENT,
    ),
    Field(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        "gpu_last_xid_code",
    ),
    Field(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        "gpu_memory_free_bytes",
        scale=1 / MIB,
        whole=True,
    ),
    Field(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        "gpu_memory_used_bytes",
        scale=1 / MIB,
        whole=True,
        mig_source="gpu_mig_memory_used_bytes",
    ),
    Field(
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "Framebuffer memory reserved (in MiB).",
        "gpu_memory_reserved_bytes",
        scale=1 / MIB,
        whole=True,
    ),
    # DCGM turns NVML's NVLink data counters (KiB, fields 138/139) into a rate: the increase of
    # their sum over the interval, per second, divided by 1000 (DcgmCacheManager.cpp,
    # ReadAndCacheNvLinkBandwidth, quoted in NVIDIA/dcgm-exporter pull request 658): ~MB/s.
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        scale=1 / 1024 / 1000,
        rate=("gpu_nvlink_transmit_bytes_total", "gpu_nvlink_receive_bytes_total"),
    ),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "gpu_remapped_rows",
        (("type", "uncorrectable"),),
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "gpu_remapped_rows",
        (("type", "correctable"),),
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        "gpu_row_remap_failed",
    ),
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        "gpu_graphics_active_ratio",
        mig_source="gpu_mig_graphics_active_ratio",
        profiling=True,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "gpu_tensor_active_ratio",
        mig_source="gpu_mig_tensor_active_ratio",
        profiling=True,
    ),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "gpu_dram_active_ratio",
        mig_source="gpu_mig_dram_active_ratio",
        profiling=True,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        rate=("gpu_pcie_transmit_bytes_total",),
        profiling=True,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        rate=("gpu_pcie_receive_bytes_total",),
        profiling=True,
    ),
)

# The default set's rows that are not served, and why (docs/migrating-from-dcgm-exporter.md).
NOT_SERVED = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "a vGPU guest's licence: NVML gives it only inside a "
    "vGPU guest (nvmlDeviceGetGridLicensableFeatures), which gpuload does not read",
}
# Served as a label on every series, as dcgm-exporter does.
LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)
# The usage fields a shared GPU's containers get their measured share of.
SHARED_OUT = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
# With `metrics.dcgm_gr_engine_from_utilization`: where GPM is missing, this field is NVML's
# utilization (the fraction of time a kernel ran), an approximation of the graphics engine's.
GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_FALLBACK = "gpu_utilization_ratio"

_POD_SHARES = ("gpu_pod_utilization_seconds_total", "gpu_pod_memory_used_bytes")


def source_families() -> dict[str, tuple[str, ...]]:
    """Each gpuload family a DCGM field is written from, with the label values it reads."""
    sources: dict[str, set[str]] = defaultdict(set)
    for dcgm_field in FIELDS:
        for name in (dcgm_field.source, dcgm_field.mig_source, *dcgm_field.rate):
            if name:
                sources[name].update(value for _, value in dcgm_field.select)
    sources.setdefault(_FALLBACK, set())  # what GR_ENGINE_ACTIVE may be approximated from
    return {name: tuple(sorted(values)) for name, values in sources.items()}


def keeps_sources() -> Callable[[Sample], bool]:
    """Whether a sample is one a DCGM field is written from: the profile keeps it too."""
    sources = source_families()

    def keep(sample: Sample) -> bool:
        values = sources.get(sample.family)
        if values is None:
            return False
        return not values or any(value in sample.labels for value in values)

    return keep


@dataclass(frozen=True)
class DcgmFamily:
    """A DCGM field's series in one snapshot: each series' label pairs and its value."""

    field: Field
    series: list[tuple[tuple[tuple[str, str], ...], float]]


@dataclass
class _Index:
    """A snapshot's samples by sample name and GPU, read once per snapshot."""

    by_gpu: dict[str, dict[str, list[tuple[dict[str, str], float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    gpus: list[dict[str, str]] = field(default_factory=list)
    driver: str = ""

    @classmethod
    def of(cls, snapshot: Snapshot, wanted: frozenset[str]) -> _Index:
        index = cls()
        for name, pairs, value in snapshot.series():
            labels = dict(pairs)
            if name == "gpu_info":
                index.gpus.append(labels)
            elif name == "gpuload_driver_info":
                index.driver = labels.get("driver_version", "")
            elif name in wanted and "gpu" in labels:
                index.by_gpu[labels["gpu"]][name].append((labels, value))
        return index

    def value(self, gpu: str, name: str, select: Iterable[tuple[str, str]] = ()) -> float | None:
        for labels, value in self.by_gpu[gpu].get(name, ()):
            if all(labels.get(key) == wanted for key, wanted in select):
                return value
        return None


class DcgmView:
    """Writes a snapshot's DCGM fields; keeps the last snapshot's counters for the rates."""

    def __init__(
        self, hostname: str, *, host_label: str = DEFAULT_HOSTNAME_LABEL, gr_engine_fallback: bool
    ) -> None:
        self._host = (host_label, hostname)
        self._fallback = gr_engine_fallback
        self._wanted = frozenset([*source_families(), *_POD_SHARES, "gpu_pod_info"])
        # The snapshot written last, its counters, and the one before it: rates and shares.
        self._current: tuple[Snapshot, _Index] | None = None
        self._previous: tuple[Snapshot, _Index] | None = None

    def __call__(self, snapshot: Snapshot) -> list[DcgmFamily]:
        """Every field with series in ``snapshot``, in the default set's order."""
        if self._current is None or self._current[0] is not snapshot:
            self._previous = self._current
            self._current = (snapshot, _Index.of(snapshot, self._wanted))
        index = self._current[1]
        families = [DcgmFamily(f, list(self._series(f, index))) for f in FIELDS]
        return [family for family in families if family.series]

    def _series(self, dcgm_field: Field, index: _Index) -> Iterator[tuple[tuple, float]]:
        for gpu in index.gpus:
            number = gpu["gpu"]
            has_gpm = gpu.get("profiling") == "gpm"
            if dcgm_field.profiling and not has_gpm and dcgm_field.name != GR_ENGINE:
                continue
            base = self._labels(gpu, index.driver)
            value = self._value(dcgm_field, number, index, has_gpm)
            if value is not None:
                yield from self._attributed(dcgm_field, number, base, value, index)
            if dcgm_field.mig_source and (has_gpm or not dcgm_field.profiling):
                yield from self._instances(dcgm_field, number, base, index)

    def _value(self, dcgm_field: Field, gpu: str, index: _Index, has_gpm: bool) -> float | None:
        if dcgm_field.rate:
            return self._rate(dcgm_field, gpu)
        source = dcgm_field.source
        if dcgm_field.profiling and not has_gpm:
            if not self._fallback:
                return None
            source = _FALLBACK  # GR_ENGINE_ACTIVE approximated by NVML's utilization
        value = index.value(gpu, source, dcgm_field.select)
        return None if value is None else _converted(dcgm_field, value)

    def _rate(self, dcgm_field: Field, gpu: str) -> float | None:
        if self._previous is None or self._current is None:
            return None
        (before, old), (now, new) = self._previous, self._current
        seconds = now.completed_at - before.completed_at
        increases = [_increase(old, new, gpu, name) for name in dcgm_field.rate]
        if seconds <= 0 or any(increase is None for increase in increases):
            return None
        return sum(i for i in increases if i is not None) / seconds * dcgm_field.scale

    def _labels(self, gpu: Mapping[str, str], driver: str) -> dict[str, str]:
        # In dcgm-exporter's order; the names are `DCGM_LABELS`'s, which the host label avoids.
        return {
            "gpu": gpu["gpu"],
            "UUID": gpu["uuid"],
            "pci_bus_id": gpu.get("pci_bus_id", ""),
            "device": f"nvidia{gpu['gpu']}",
            "modelName": gpu.get("name", ""),
            self._host[0]: self._host[1],
            "DCGM_FI_DRIVER_VERSION": driver,
        }

    def _attributed(
        self, dcgm_field: Field, gpu: str, base: dict[str, str], value: float, index: _Index
    ) -> Iterator[tuple[tuple, float]]:
        holders = _holders(index, gpu, "")
        if len(holders) == 1:
            yield _pairs(base, _pod(holders[0])), value
            return
        yield _pairs(base), value
        if len(holders) > 1 and dcgm_field.name in SHARED_OUT:
            yield from self._shares(dcgm_field, gpu, base, value, holders, index)

    def _shares(
        self,
        dcgm_field: Field,
        gpu: str,
        base: dict[str, str],
        value: float,
        holders: list[dict[str, str]],
        index: _Index,
    ) -> Iterator[tuple[tuple, float]]:
        """Each container's measured share of a shared GPU's usage; none where unmeasured."""
        if dcgm_field.name == "DCGM_FI_DEV_FB_USED":
            memory = _by_container(index, gpu, "gpu_pod_memory_used_bytes")
            if not memory:
                return
            for holder in holders:
                used = memory.get(_key(holder), 0.0)
                yield _pairs(base, _pod(holder)), _converted(dcgm_field, used)
            return
        shares = self._time_shares(gpu)
        if shares is None:
            return
        for holder in holders:
            yield _pairs(base, _pod(holder)), value * shares.get(_key(holder), 0.0)

    def _time_shares(self, gpu: str) -> dict[tuple[str, str, str], float] | None:
        """Each container's part of its GPU's measured SM time since the last snapshot."""
        if self._previous is None or self._current is None:
            return None
        old = _by_container(self._previous[1], gpu, "gpu_pod_utilization_seconds_total")
        new = _by_container(self._current[1], gpu, "gpu_pod_utilization_seconds_total")
        if not new:
            return None
        busy = {key: max(0.0, seconds - old.get(key, 0.0)) for key, seconds in new.items()}
        total = sum(busy.values())
        return {key: (seconds / total if total > 0 else 0.0) for key, seconds in busy.items()}

    def _instances(
        self, dcgm_field: Field, gpu: str, base: dict[str, str], index: _Index
    ) -> Iterator[tuple[tuple, float]]:
        for labels, value in index.by_gpu[gpu].get(dcgm_field.mig_source, ()):
            instance = labels.get("mig_instance", "")
            mig = {**base, "GPU_I_ID": instance, "GPU_I_PROFILE": labels.get("mig_profile", "")}
            holders = _holders(index, gpu, instance)
            pod = _pod(holders[0]) if len(holders) == 1 else {}
            yield _pairs(mig, pod), _converted(dcgm_field, value)


def _converted(dcgm_field: Field, value: float) -> float:
    converted = value * dcgm_field.scale
    return float(int(converted)) if dcgm_field.whole else converted


def _increase(old: _Index, new: _Index, gpu: str, name: str) -> float | None:
    before, after = old.value(gpu, name), new.value(gpu, name)
    if before is None or after is None or after < before:
        return None
    return after - before


def _holders(index: _Index, gpu: str, instance: str) -> list[dict[str, str]]:
    return [
        labels
        for labels, _ in index.by_gpu[gpu].get("gpu_pod_info", ())
        if labels.get("mig_instance", "") == instance
    ]


def _key(labels: Mapping[str, str]) -> tuple[str, str, str]:
    return labels.get("pod", ""), labels.get("namespace", ""), labels.get("container", "")


def _by_container(index: _Index, gpu: str, name: str) -> dict[tuple[str, str, str], float]:
    return {_key(labels): value for labels, value in index.by_gpu[gpu].get(name, ())}


def _pod(holder: Mapping[str, str]) -> dict[str, str]:
    pod, namespace, container = _key(holder)
    return {"pod": pod, "namespace": namespace, "container": container}


def _pairs(*parts: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    merged: dict[str, str] = {}
    for part in parts:
        merged.update(part)
    return tuple((name, value) for name, value in merged.items() if value)
