"""The collector framework: the registry, samples, and the per-call error boundary.

A collector module defines the metric families it exports and a class whose
`collect(device, read)` reads one GPU (or, with ``scope="node"``, `collect(read)` reads the
node) and yields `Sample`s. One instance per GPU, so it may keep per-GPU state. It registers
itself with `@register` when imported, so that the `--collector.NAME` flags and the
``collectors.NAME.enabled`` keys exist for it without any central list to edit.

A collector holding NVML resources (GPM samples, an event thread) also defines ``close()``; the
framework calls it before the GPU's handle is dropped and before NVML shuts down.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

import pynvml

from exporter.nvml import Device, NotSupported, NvmlError

T = TypeVar("T")

# Labels every per-GPU series carries; everything else descriptive is in gpu_info.
GPU_LABELS = ("gpu", "uuid")
# Answers that hold until the driver changes; NOT_FOUND and NO_DATA mean "nothing right now".
_PERMANENTLY_ABSENT = frozenset(
    {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
)


@dataclass(frozen=True)
class Family:
    """A metric family's contract: name, type, help and its labels beyond gpu/uuid."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()
    per_gpu: bool = True


class Sample(NamedTuple):
    """One value of a family; `labels` are the values of the family's extra labels."""

    family: str
    value: float
    labels: tuple[str, ...] = ()


class Reader:
    """Runs NVML reads for one collector on one GPU, sorting their outcomes.

    A value that does not exist (not supported, sentinel) comes back as None and
    is not an error. Any other NVML error also yields None, so the collector's
    other series go on, but is recorded for the error counters and the log.

    A read of `device` that NVML answered NOT_SUPPORTED (no fan on an SXM board, no video
    encoder on an H100) goes into `unsupported` and is not asked again while slow reads
    are not due: the framework empties that set once per slow interval.

    NO_PERMISSION is an answer to expect, not a failure: an unprivileged caller is refused
    whole-GPU memory and processes on MIG GPUs, and GPM in some containers (nvml-facts.md).
    The read's name goes into `refused`, and the read is asked again once per slow interval.

    `keep` is the metrics profile's filter: a collector asks `wants` before a read whose every
    sample the profile would drop, and skips it (each NVML call costs driver time per GPU).
    """

    def __init__(
        self,
        *,
        slow_due: bool = True,
        device: Device | None = None,
        unsupported: set[Hashable] | None = None,
        now: float | None = None,
        keep: Callable[[Sample], bool] | None = None,
    ) -> None:
        # Whether values that change rarely are to be read again this time (see `SlowReads`).
        self.slow_due = slow_due
        # The node's clock (seconds) at this collection: what counters of seconds integrate over.
        # The simulated node's clock under --simulate.
        self.now = time.monotonic() if now is None else now
        self.errors: list[NvmlError] = []
        self.invalid: list[str] = []
        self.refused: list[str] = []  # the names of reads NVML answered NO_PERMISSION
        # Why the last read gave None: an error, or None when the value is simply absent.
        self.last_error: NvmlError | None = None
        # Without a set to keep them in, nothing is remembered.
        self._device = device if unsupported is not None else None
        self._unsupported: set[Hashable] = unsupported if unsupported is not None else set()
        self._keep = keep

    def wants(self, family: str, *labels: str) -> bool:
        """Whether the metrics profile publishes ``family`` with these extra labels."""
        return self._keep is None or self._keep(Sample(family, 0.0, labels))

    def record(self, error: NvmlError) -> None:
        """Count an error that happened outside a read (e.g. in a collector's own thread)."""
        self.errors.append(error)

    def __call__(
        self,
        read: Callable[..., T],
        *args: Any,
        valid: Callable[[T], bool] | None = None,
        what: str = "",
    ) -> T | None:
        """Return `read(*args)`, or None when the value is absent, failed or implausible."""
        self.last_error = None
        key = self._key(read, args)
        if key is not None and key in self._unsupported:
            return None
        try:
            value = read(*args)
        except NotSupported as error:
            if key is not None and error.code in _PERMANENTLY_ABSENT:
                self._unsupported.add(key)
            return None
        except NvmlError as error:
            if error.code == pynvml.NVML_ERROR_NO_PERMISSION:
                self.refused.append(what or getattr(read, "__name__", "read"))
                if key is not None:
                    self._unsupported.add(key)
                return None
            self.errors.append(error)
            self.last_error = error
            return None
        if valid is not None and not valid(value):
            self.invalid.append(f"{what or getattr(read, '__name__', 'value')}={value!r}")
            return None
        return value

    def _key(self, read: Callable[..., object], args: tuple[Any, ...]) -> Hashable | None:
        """(method, arguments) of a read of this GPU's own methods; None for any other read."""
        if self._device is None or getattr(read, "__self__", None) is not self._device:
            return None
        try:
            hash(args)
        except TypeError:  # a list of fields, say: not worth remembering
            return None
        return (getattr(read, "__func__", read), args)


class SlowReads:
    """Samples of values that change rarely (limits, maxima, error counters), kept between reads.

    Each NVML call costs driver time on every GPU every cycle, and most of a GPU's calls
    read values that change a few times a day. The framework sets `Reader.slow_due` once per
    slow interval; in between, the last samples are served again. A read that failed is
    not kept, so it is retried on the next cycle rather than hidden for a slow interval.
    """

    def __init__(self) -> None:
        self._samples: tuple[Sample, ...] | None = None

    def __call__(self, read: Reader, produce: Callable[[], Iterable[Sample]]) -> tuple[Sample, ...]:
        """Run `produce` when due (or never run yet), else return its last samples."""
        if self._samples is not None and not read.slow_due:
            return self._samples
        errors = len(read.errors)
        samples = tuple(produce())
        self._samples = samples if len(read.errors) == errors else None
        return samples


class SecondsCounter:
    """A counter of seconds: a fraction of time (0..1) integrated over the node's clock.

    Each collection adds the mean fraction since the previous one times the seconds between
    them, so that ``rate()`` over any window is the exact mean over that window, whatever the
    scrape interval (a gauge of the last second keeps 1 s of every 15 s scrape). The first
    collection only starts the clock. A collection that read nothing adds nothing, and the next
    one covers the gap with its mean, which NVML's samples and GPM compute since the last read.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._since: float | None = None

    def add(self, fraction: float, now: float) -> float:
        """Add `fraction` of the seconds since the last call; return the total."""
        if self._since is not None and now > self._since:
            self.seconds += min(max(fraction, 0.0), 1.0) * (now - self._since)
        self._since = now
        return self.seconds


def seconds_name(ratio: str) -> str:
    """The counter of seconds beside a fraction of time: `x_ratio` -> `x_seconds_total`."""
    return ratio.removesuffix("_ratio") + "_seconds_total"


def seconds_family(ratio: Family, how: str) -> Family:
    """The counter beside a family of a fraction of time: `x_ratio` -> `x_seconds_total`."""
    return Family(
        seconds_name(ratio.name),
        "counter",
        f"Seconds of {how}, integrated from every reading between collections: "
        f"rate() over any window is the mean of {ratio.name} over that window.",
        ratio.labels,
        ratio.per_gpu,
    )


# A collector may also define ``fields(slow_due) -> Sequence[FieldId]``: the field values its
# next `collect` will read. The framework reads those of all its collectors in one
# nvmlDeviceGetFieldValues call first (`Device.read_fields_ahead`), and `device.field_values`
# serves them from it; a field not listed is still read, in a call of its own.
FieldId = int | tuple[int, int]


@dataclass(frozen=True)
class CollectorSpec:
    """A registered collector: how to build it and whether it runs by default."""

    name: str
    families: tuple[Family, ...]
    factory: Callable[..., object]
    scope: Literal["device", "node"] = "device"
    enabled_by_default: bool = True
    description: str = field(default="")
    options: Mapping[str, Any] = field(default_factory=dict)


REGISTRY: dict[str, CollectorSpec] = {}


def register(
    name: str,
    families: Iterable[Family],
    *,
    scope: Literal["device", "node"] = "device",
    enabled_by_default: bool = True,
    options: Mapping[str, Any] | None = None,
) -> Callable[[type[T]], type[T]]:
    """Class decorator adding a collector to the registry under `name`.

    `options` are the collector's own settings with their defaults; they become the
    ``collectors.NAME.OPTION`` configuration keys and are passed to the class as
    keyword arguments.
    """

    def add(cls: type[T]) -> type[T]:
        if name in REGISTRY:
            raise ValueError(f"collector {name!r} registered twice")
        REGISTRY[name] = CollectorSpec(
            name=name,
            families=tuple(families),
            factory=cls,
            scope=scope,
            enabled_by_default=enabled_by_default,
            description=(cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
            options=dict(options or {}),
        )
        return cls

    return add


def ratio_from_percent(percent: float) -> float:
    """NVML's 0-100 percent as a Prometheus 0..1 ratio."""
    return percent / 100.0


def is_percent(value: float) -> bool:
    """True for a plausible percentage."""
    return 0 <= value <= 100
