"""A collection cycle's result: the rows every reader shares, and the families they belong to.

A `Snapshot` is immutable once published. Every sample is in one row format, `CollectorRun`: the
collectors' runs, then gpuload's own families (`OWN_FAMILIES`). /metrics writes them
(`exporter.server.exposition`), the local history reads them (`Snapshot.series`), the status page
and the doctor read what the local evaluator made of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from exporter.collectors.base import GPU_LABELS, CollectorSpec, Family, Sample
from exporter.nvml import NvmlError


@dataclass(frozen=True)
class GpuStatus:
    """What the landing page and readiness need to know about one GPU."""

    index: int
    uuid: str
    name: str
    up: bool
    stale: bool


# One series as the local history reads it: sample name, label (name, value) pairs, value.
Series = tuple[str, tuple[tuple[str, str], ...], float]


# Family name -> (sample name, label names), None for a family not asked for; and the
# collectors with at least one family asked for.
Wanted = tuple[dict[str, tuple[str, tuple[str, ...]] | None], frozenset[str]]


def shape_of(family: Family) -> tuple[str, str, tuple[str, ...]]:
    """(the family's name as exposed, its samples' name, its label names).

    A counter's family is named without `_total`, its samples with it; a GPU's family puts
    the GPU's identity labels first.
    """
    labels = (*GPU_LABELS, *family.labels) if family.per_gpu else family.labels
    if family.kind == "counter":
        name = family.name.removesuffix("_total")
        return name, f"{name}_total", labels
    return family.name, family.name, labels


# gpuload's own families, published with each snapshot after the collectors' (run `OWN`).
OWN = "gpuload"
GPU_INFO = Family(
    "gpu_info",
    "gauge",
    "Identity of each GPU; always 1. Join on gpu/uuid for the model name "
    "(nvmlDeviceGetName, GetUUID, GetPciInfo, GetSerial, GetVbiosVersion).",
    labels=("name", "pci_bus_id", "serial", "vbios_version", "profiling"),
)
GPU_UP = Family(
    "gpu_up", "gauge", "1 while NVML can reach the GPU, 0 once it is lost (fell off the bus)."
)
GPU_STALE = Family(
    "gpuload_gpu_stale",
    "gauge",
    "1 while a GPU's collection has not returned within the collection timeout "
    "(a hung NVML call); its device series are then absent.",
)
COLLECTOR_SUCCESS = Family(
    "gpuload_collector_success",
    "gauge",
    "1 if the collector's last run had no unexpected error on any GPU, else 0.",
    labels=("collector",),
    per_gpu=False,
)
COLLECTOR_DURATION = Family(
    "gpuload_collector_duration_seconds",
    "gauge",
    "Time the collector spent in its last run, summed over GPUs.",
    labels=("collector",),
    per_gpu=False,
)
COLLECTOR_LAST_SUCCESS = Family(
    "gpuload_collector_last_success_timestamp_seconds",
    "gauge",
    "Unix time at which the collector last completed without unexpected errors.",
    labels=("collector",),
    per_gpu=False,
)
NVML_ERRORS = Family(
    "gpuload_nvml_errors_total",
    "counter",
    "NVML calls that failed unexpectedly, by collector and NVML error "
    "(not_supported is not counted: the series is simply absent).",
    labels=("collector", "error"),
    per_gpu=False,
)
NVML_REFUSED = Family(
    "gpuload_nvml_permission_denied",
    "gauge",
    "GPUs on which NVML refused a read to this process (NO_PERMISSION), by collector and "
    "read: those series are absent. Whole-GPU memory and processes on MIG GPUs need root.",
    labels=("collector", "read"),
    per_gpu=False,
)
COLLECTOR_EXCEPTIONS = Family(
    "gpuload_collector_exceptions_total",
    "counter",
    "Collector runs that raised an unexpected exception (a bug: please report it).",
    labels=("collector",),
    per_gpu=False,
)
NVML_UP = Family(
    "gpuload_nvml_up", "gauge", "1 if NVML is initialised and answering, else 0.", per_gpu=False
)
LAST_COLLECTION = Family(
    "gpuload_last_collection_timestamp_seconds",
    "gauge",
    "Unix time at which the last collection cycle completed.",
    per_gpu=False,
)
COLLECTION_DURATION = Family(
    "gpuload_collection_duration_seconds",
    "gauge",
    "Wall time of the last collection cycle (GPUs are read in parallel).",
    per_gpu=False,
)
BUILD_INFO = Family(
    "gpuload_build_info",
    "gauge",
    "gpuload's version; always 1.",
    labels=("version",),
    per_gpu=False,
)
OWN_FAMILIES = (
    GPU_INFO,
    GPU_UP,
    GPU_STALE,
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    COLLECTOR_LAST_SUCCESS,
    NVML_ERRORS,
    NVML_REFUSED,
    COLLECTOR_EXCEPTIONS,
    NVML_UP,
    LAST_COLLECTION,
    COLLECTION_DURATION,
    BUILD_INFO,
)
# Names the exposition writes as they are (no quoting, no escaping): checked once per layout.
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


class Layout:
    """The enabled collectors' families in registry order, then gpuload's own; their shapes."""

    def __init__(self, specs: Iterable[CollectorSpec]) -> None:
        groups = [(spec.name, spec.families) for spec in specs]
        groups.append((OWN, OWN_FAMILIES))
        self.families = tuple(family for _, families in groups for family in families)
        self._collectors = {name: [family.name for family in families] for name, families in groups}
        # Family name -> (its name as exposed, its samples' name, label names).
        self.shapes = {family.name: shape_of(family) for family in self.families}
        for name, sample_name, labels in self.shapes.values():
            for plain in (name, sample_name, *labels):
                if not _PLAIN_NAME.match(plain):
                    raise ValueError(f"{plain!r} is not a name of [a-zA-Z_][a-zA-Z0-9_]*")
        self._wanted: dict[frozenset[str] | None, Wanted] = {}

    def wanted(self, names: frozenset[str] | None) -> Wanted:
        """What `Snapshot.series` yields for ``names`` (None: every name)."""
        # The same few sets come every cycle (a history's names): kept, up to a bound.
        if names in self._wanted:
            return self._wanted[names]
        families = {
            family: (sample_name, labels)
            if names is None or name in names or f"{name}_total" in names
            else None
            for family, (name, sample_name, labels) in self.shapes.items()
        }
        collectors = frozenset(
            collector
            for collector, names_of in self._collectors.items()
            if any(families[name] is not None for name in names_of)
        )
        if len(self._wanted) < 8:
            self._wanted[names] = (families, collectors)
        return families, collectors


@dataclass(frozen=True)
class Snapshot:
    """The result of one collection cycle; never modified after it is published.

    Every sample is in one row format, `CollectorRun`: the collectors' ``runs``, then
    gpuload's own families (``own``). /metrics writes them (`exporter.server.exposition`) and
    the local history reads them (`series`) without building anything in between.
    """

    gpus: tuple[GpuStatus, ...]
    nvml_up: bool
    completed_at: float
    runs: tuple[CollectorRun, ...] = ()
    layout: Layout = field(default_factory=lambda: Layout(()), repr=False, compare=False)
    own: CollectorRun | None = None

    @property
    def all_runs(self) -> tuple[CollectorRun, ...]:
        """The collectors' runs, then gpuload's own."""
        return self.runs if self.own is None else (*self.runs, self.own)

    def series(self, names: frozenset[str] | None = None) -> Iterator[Series]:
        """The snapshot's samples: (sample name, label pairs, value).

        With ``names``, only the samples of those metric names (a counter's ``_total``
        included), as `exporter.alerting.history.snapshot_samples` asks.
        """
        wanted, collectors = self.layout.wanted(names)
        for run in self.all_runs:
            if run.name not in collectors:
                continue
            for family, value, labels in run.samples:
                shape = wanted[family]
                if shape is not None:
                    pairs = tuple(zip(shape[1], (*run.labels, *labels), strict=False))
                    yield shape[0], pairs, value


@dataclass(frozen=True)
class CollectorRun:
    """What one collector produced on one GPU (or the node) in one cycle."""

    name: str
    samples: tuple[Sample, ...]
    gpu: int | None = None
    # The GPU's identity labels (gpu, uuid), put before every sample's own labels.
    labels: tuple[str, ...] = ()
    errors: tuple[NvmlError, ...] = ()
    invalid: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # reads NVML answered NO_PERMISSION
    exception: str | None = None
    seconds: float = 0.0


def each_family_samples(
    layout: Layout, runs: Iterable[CollectorRun]
) -> Iterator[tuple[Family, list[tuple[tuple[str, ...], Sample]]]]:
    """Each family with samples, in registry order, with them: (the GPU's labels, sample)."""
    grouped: dict[str, list[tuple[tuple[str, ...], Sample]]] = {
        family.name: [] for family in layout.families
    }
    for run in runs:
        for sample in run.samples:
            grouped[sample.family].append((run.labels, sample))
    for family in layout.families:
        samples = grouped.pop(family.name)
        if samples:
            yield family, samples
