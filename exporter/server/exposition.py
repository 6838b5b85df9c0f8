"""/metrics in the Prometheus text format or OpenMetrics 1.0.0, written from a snapshot's rows.

Every family a snapshot holds (the collectors' and gpuload's own, `exporter.snapshot`) and the
process's own (`ProcessMetrics`) is written the same way: one format string per family, its
labels sorted by name, a label value escaped only when it holds a backslash, a newline or a
double quote. The bytes are those prometheus_client writes for the same families
(tests/test_exposition.py compares them on every scenario and on awkward values), at ~4.5 times
less CPU than building its families first, and without importing it: prometheus_client pulls in
http.server, urllib, email and ssl, 5.5 MB of a daemon's memory.

Negotiation (`negotiate`) answers as prometheus_client's `choose_encoder` does for the versions
written here: OpenMetrics 1.0.0 when an `application/openmetrics-text` entry asks no version or
one of at least 1.0.0 (the first such entry decides, as there), else the text format 0.0.4.
"""

from __future__ import annotations

import math
import os
import platform
import re
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from exporter.collectors.base import Family, Sample
from exporter.snapshot import Layout, Snapshot, each_family_samples, shape_of

if TYPE_CHECKING:
    from exporter.server.dcgm import DcgmFamily

TEXT = "text"
OPENMETRICS = "openmetrics"
CONTENT_TYPES = {
    TEXT: "text/plain; version=0.0.4; charset=utf-8",
    OPENMETRICS: "application/openmetrics-text; version=1.0.0; charset=utf-8",
}
_ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")

# A label value with any of these is escaped (rare: most are numbers and UUIDs).
_NEEDS_ESCAPING = re.compile(r'[\\\n"]')


class Negotiated(NamedTuple):
    """What a scrape asked for: the format written and the Content-Type that says so."""

    form: str
    content_type: str


def negotiate(accept: str) -> Negotiated:
    """The format for an Accept header, as prometheus_client's ``choose_encoder`` picks it."""
    for entry in (accept or "").split(","):
        fields = entry.split(";")
        kind = fields[0].strip()
        if kind not in ("application/openmetrics-text", "text/plain"):
            continue
        version, escaping = _parameter(fields, "version"), _parameter(fields, "escaping")
        escaping = escaping if escaping in _ESCAPINGS else "underscores"
        at_least_1 = _version(version) >= (1, 0, 0)
        if kind == "application/openmetrics-text" and not version:
            return Negotiated(OPENMETRICS, CONTENT_TYPES[OPENMETRICS])
        if kind == "application/openmetrics-text" and at_least_1:
            # Only 1.0.0 is written: its name escaping is moot, every name here being plain.
            content_type = f"{CONTENT_TYPES[OPENMETRICS]}; escaping={escaping}"
            return Negotiated(OPENMETRICS, content_type)
        if kind == "text/plain" and at_least_1:
            content_type = f"text/plain; version=1.0.0; charset=utf-8; escaping={escaping}"
            return Negotiated(TEXT, content_type)
    return Negotiated(TEXT, CONTENT_TYPES[TEXT])


def _parameter(fields: list[str], name: str) -> str:
    for field in fields[1:]:
        key, equals, value = field.strip().partition("=")
        if equals and key == name:
            return value
    return ""


def _version(text: str) -> tuple[int, ...]:
    numbers = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(part) for part in numbers.group().split(".")) if numbers else ()


def gzip_accepted(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header lists gzip (any weight, as prometheus_client reads it)."""
    return any(
        entry.split(";")[0].strip().lower() == "gzip"
        for entry in (accept_encoding or "").split(",")
    )


class Exposition:
    """Writes a snapshot's families, then the process's own, in the text or OpenMetrics format."""

    def __init__(
        self,
        process: Callable[[], Iterable[tuple[Family, Sample]]] | None = None,
        dcgm: Callable[[Snapshot], list[DcgmFamily]] | None = None,
    ):
        """``process``: the rows written after the snapshot's (the process's own metrics).

        ``dcgm``: dcgm-exporter's fields from the same snapshot (`exporter.server.dcgm`),
        written after gpuload's own families when `metrics.dcgm_compat` is on.
        """
        self._process = process
        self._dcgm = dcgm
        self._lock = threading.Lock()
        self._layout: Layout | None = None
        self._headers: dict[tuple[str, str], str] = {}  # (format, family) -> HELP and TYPE
        self._lines: dict[str, Callable[..., str]] = {}  # family -> its line's format

    def encode(self, snapshot: Snapshot, form: str, names: Collection[str] = ()) -> bytes:
        """The snapshot and the process's metrics; with ``names``, only those sample names."""
        lines: list[str] = []
        with self._lock:
            if snapshot.layout is not self._layout:
                self._layout, self._headers, self._lines = snapshot.layout, {}, {}
            for family, samples in each_family_samples(snapshot.layout, snapshot.all_runs):
                self._write(lines, family, samples, form, names)
            for dcgm_family in self._dcgm(snapshot) if self._dcgm else ():
                if not names or dcgm_family.field.name in names:
                    _write_dcgm(lines, dcgm_family, form)
            process: dict[Family, list[tuple[tuple[str, ...], Sample]]] = {}
            for family, sample in self._process() if self._process else ():
                process.setdefault(family, []).append(((), sample))
            for family, samples in process.items():
                self._write(lines, family, samples, form, names)
        if form == OPENMETRICS:
            lines.append("# EOF\n")
        return "".join(lines).encode()

    def _write(
        self,
        lines: list[str],
        family: Family,
        samples: list[tuple[tuple[str, ...], Sample]],
        form: str,
        names: Collection[str],
    ) -> None:
        if names and shape_of(family)[1] not in names:
            return
        lines.append(self._header(family, form))
        line = self._line(family)
        for labels, sample in samples:
            values = (*labels, *sample.labels)
            if _NEEDS_ESCAPING.search("".join(values)):
                values = tuple(_escape(value) for value in values)
            lines.append(line(*values, go_float(sample.value)))

    def _line(self, family: Family) -> Callable[..., str]:
        """``format`` of the family's line: label values by position, then the value."""
        line = self._lines.get(family.name)
        if line is None:
            _, sample_name, names = shape_of(family)
            # Sorted by label name, as prometheus_client writes them; braces doubled for format.
            order = sorted(range(len(names)), key=names.__getitem__)
            labels = ",".join(f'{names[i]}="{{{i}}}"' for i in order)
            labels = f"{{{{{labels}}}}}" if labels else ""
            line = self._lines[family.name] = f"{sample_name}{labels} {{{len(names)}}}\n".format
        return line

    def _header(self, family: Family, form: str) -> str:
        header = self._headers.get((form, family.name))
        if header is None:
            name, sample_name, _ = shape_of(family)
            if form == TEXT:
                # The text format names a counter's family by its samples' name.
                shown = sample_name
                escaped = family.help.replace("\\", r"\\").replace("\n", r"\n")
            else:
                shown, escaped = name, _escape(family.help)
            header = self._headers[(form, family.name)] = (
                f"# HELP {shown} {escaped}\n# TYPE {shown} {family.kind}\n"
            )
        return header


# OpenMetrics names a counter's samples <family>_total; dcgm-exporter's counters are named
# without it, so they are declared `unknown` there, and as dcgm-exporter declares them in text.
_OPENMETRICS_KIND = {"gauge": "gauge", "counter": "unknown"}


def _write_dcgm(lines: list[str], family: DcgmFamily, form: str) -> None:
    """A DCGM field's HELP, TYPE and series, its labels in dcgm-exporter's order."""
    name, kind = family.field.name, family.field.kind
    if form == TEXT:
        escaped = family.field.help.replace("\\", r"\\").replace("\n", r"\n")
    else:
        escaped, kind = _escape(family.field.help), _OPENMETRICS_KIND[kind]
    lines.append(f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n")
    for pairs, value in family.series:
        labels = ",".join(f'{label}="{_escape(text)}"' for label, text in pairs)
        lines.append(f"{name}{{{labels}}} {go_float(value)}\n")


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def go_float(value: float) -> str:
    """A sample value as Go (and so Prometheus and prometheus_client) writes it."""
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    # Go switches to exponents sooner than Python (from 1e21 on, here from 1e7 on a dot).
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


# The process's own metrics, named and described as every Prometheus client library does.
VIRTUAL_MEMORY = Family(
    "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", per_gpu=False
)
RESIDENT_MEMORY = Family(
    "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", per_gpu=False
)
START_TIME = Family(
    "process_start_time_seconds",
    "gauge",
    "Start time of the process since unix epoch in seconds.",
    per_gpu=False,
)
CPU_SECONDS = Family(
    "process_cpu_seconds_total",
    "counter",
    "Total user and system CPU time spent in seconds.",
    per_gpu=False,
)
OPEN_FDS = Family("process_open_fds", "gauge", "Number of open file descriptors.", per_gpu=False)
MAX_FDS = Family(
    "process_max_fds", "gauge", "Maximum number of open file descriptors.", per_gpu=False
)
PYTHON_INFO = Family(
    "python_info",
    "gauge",
    "Python platform information",
    labels=("implementation", "major", "minor", "patchlevel", "version"),
    per_gpu=False,
)


class ProcessMetrics:
    """The process's memory, CPU, start time and descriptors, read from /proc at each call."""

    def __init__(self, proc: str = "/proc/self") -> None:
        self._proc = proc
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")
        major, minor, patchlevel = platform.python_version_tuple()
        self._python = Sample(
            PYTHON_INFO.name,
            1,
            (platform.python_implementation(), major, minor, patchlevel, platform.python_version()),
        )
        self._boot_time = _boot_time()

    def __call__(self) -> Iterator[tuple[Family, Sample]]:
        """Each family with its one sample; a family /proc does not answer is left out."""
        try:
            with open(f"{self._proc}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            fields = []
        if len(fields) > 21 and self._boot_time is not None:
            yield VIRTUAL_MEMORY, Sample(VIRTUAL_MEMORY.name, float(fields[20]))
            yield RESIDENT_MEMORY, Sample(RESIDENT_MEMORY.name, float(fields[21]) * self._page)
            start = float(fields[19]) / self._ticks + self._boot_time
            yield START_TIME, Sample(START_TIME.name, start)
            cpu = (float(fields[11]) + float(fields[12])) / self._ticks
            yield CPU_SECONDS, Sample(CPU_SECONDS.name, cpu)
        try:
            open_fds = len(os.listdir(f"{self._proc}/fd"))
            with open(f"{self._proc}/limits", "rb") as limits:
                soft = next(line.split()[3] for line in limits if line.startswith(b"Max open file"))
            max_fds = float(soft)  # "unlimited" is a ValueError: both left out, as before
        except (OSError, StopIteration, ValueError):
            pass
        else:
            yield OPEN_FDS, Sample(OPEN_FDS.name, open_fds)
            yield MAX_FDS, Sample(MAX_FDS.name, max_fds)
        yield PYTHON_INFO, self._python


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None
