"""Readers of what ``nvidia-smi`` prints: the raw material of ``gpuload sim import``.

Four inputs a user can attach to a bug report:

- ``nvidia-smi -q -x``: XML (the ``nvsmi_device_v11`` to ``v13`` DTDs), read with the standard
  library's ``xml.etree``;
- ``nvidia-smi -q``: the indented text report;
- ``nvidia-smi --query-gpu=... --format=csv``: one row per GPU under a header of field names;
- a capture bundle in the format of ``../shared/reality/captures/`` (nvidia_gpu_exporter's
  ``internal/captures``): banner-separated sections such as ``# load :: query (-q)`` holding the
  outputs above for an ``idle`` and a ``load`` state, and ``capabilities`` sections (``list
  (-L)``, ``nvlink -s``, ``nvml-symbols``).

The readers find values; they do not interpret them. Each GPU of a recording is a
:class:`GpuSource` that answers :meth:`GpuSource.get` with a :class:`Field`: the text as printed
and where it stands (file and line, or file and XML element), so that a bad value can be reported
in one line. A source remembers which of its fields were asked for, so the fields nobody asked
for can be listed (``gpuload sim import --verbose``).

:func:`read_recording` gathers one file into a :class:`Recording`: per GPU, each value under one
key whatever the format (the tables ``_TEXT_PATHS``, ``_XML_PATHS``, ``_CSV_PATHS`` say where
each format prints it), its processes and MIG devices. For a capture bundle the ``--query-gpu``
CSV of the chosen state wins over its ``-q`` report where both have a value (the two were taken
moments apart); the ``-q`` report gives what the CSV lacks, ``nvidia-smi -L`` the MIG profiles,
``nvlink -s`` the links and ``nvml-symbols`` the exported functions. What the values become in a
scenario is :mod:`exporter.sim.importer`'s business.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sim.features import OUTPUTS
from exporter.sim.scenario import CLOCK_EVENT_REASONS

NOT_SUPPORTED = "NOT_SUPPORTED"
NO_PERMISSION = "NO_PERMISSION"

# How nvidia-smi says that it has no value (with or without brackets in the CSV): NVML answered
# NOT_SUPPORTED, or NO_PERMISSION for "Insufficient Permissions".
_MISSING = {
    "n/a": NOT_SUPPORTED,
    "not supported": NOT_SUPPORTED,
    "not available": NOT_SUPPORTED,
    "requested functionality has been deprecated": NOT_SUPPORTED,
    "insufficient permissions": NO_PERMISSION,
    "no permission": NO_PERMISSION,
}


class RecordingError(ValueError):
    """A recording cannot be read.

    The message is one line naming the file, the line or element, and what was expected.
    """


@dataclass(frozen=True)
class Field:
    """One value as nvidia-smi printed it, and where: ``FILE:LINE`` or ``FILE: <a>/<b>``."""

    text: str
    where: str

    @property
    def missing(self) -> str | None:
        """NOT_SUPPORTED or NO_PERMISSION where nvidia-smi printed no value, else None."""
        text = self.text.strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        return _MISSING.get(text.strip().lower())

    @property
    def redacted(self) -> bool:
        """Whether the value was blanked out before the file was shared: [REDACTED], xxxx, ***."""
        text = self.text.strip().strip("[]<>()").strip().lower()
        if text in ("redacted", "removed", "hidden", "masked", "anonymized", "anonymised"):
            return True
        return len(text) >= 3 and set(text) <= {"x", "*", "#", "-"} and text.strip("x*#") != "-"

    def fail(self, name: str, expected: str) -> RecordingError:
        """The error for this field's text not being what ``expected`` says."""
        return RecordingError(f"{self.where}: {name} {self.text.strip()!r}: expected {expected}")

    def number(self, name: str, unit: str = "") -> float:
        """The number before ``unit`` (e.g. ``81559`` of ``81559 MiB``)."""
        text = self.text.strip()
        if unit and text.lower().endswith(unit.lower()):
            text = text[: -len(unit)].strip()
        try:
            return float(text)
        except ValueError:
            example = f"'12 {unit}'" if unit else "a number"
            raise self.fail(
                name, f"a number{f' of {unit}' if unit else ''} like {example}"
            ) from None

    def integer(self, name: str, unit: str = "") -> int:
        """The whole number before ``unit``; hexadecimal when written 0x..."""
        text = self.text.strip()
        if text.lower().startswith("0x"):
            try:
                return int(text, 16)
            except ValueError:
                raise self.fail(name, "a hexadecimal number like 0x233010DE") from None
        value = self.number(name, unit)
        if value != int(value):
            raise self.fail(name, "a whole number")
        return int(value)


def _normal(key: str) -> str:
    return " ".join(key.split()).lower()


class GpuSource:
    """One GPU of a recording: its fields by path, and which of them were asked for."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._asked: set[str] = set()

    def get(self, *paths: str) -> Field | None:
        """The field at the first of ``paths`` that the recording has, else None."""
        for path in paths:
            self._asked.add(path)
            found = self._find(path)
            if found is not None:
                return found
        return None

    def _find(self, path: str) -> Field | None:
        raise NotImplementedError

    def leaves(self) -> Iterator[str]:
        """The paths of every field the recording has for this GPU."""
        raise NotImplementedError

    def unasked(self) -> list[str]:
        """The paths of the fields no one asked for."""
        asked = {_normal(path) for path in self._asked}
        return [leaf for leaf in self.leaves() if _normal(leaf) not in asked]


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q -x


class XmlGpu(GpuSource):
    """A ``<gpu>`` element of ``nvidia-smi -q -x``; paths like ``pci/pci_bus_id``."""

    def __init__(self, element: ElementTree.Element, where: str) -> None:
        super().__init__(where)
        self.element = element

    def _find(self, path: str) -> Field | None:
        found = self.element.find(path)
        if found is None:
            return self._missing_section(path)
        if len(found):
            return None
        return Field(found.text or "", f"{self.where}/{path}")

    def _missing_section(self, path: str) -> Field | None:
        """``<remapped_rows>N/A</remapped_rows>``: N/A for every field the section would hold."""
        parts = path.split("/")
        for end in range(len(parts) - 1, 0, -1):
            section = self.element.find("/".join(parts[:end]))
            if section is not None:
                value = Field(section.text or "", f"{self.where}/{'/'.join(parts[:end])}")
                return value if not len(section) and value.missing else None
        return None

    def children(self, path: str) -> list[XmlGpu]:
        """The child elements under ``path``, each as a source of its own."""
        self._asked.add(path)
        parent = self.element.find(path)
        if parent is None:
            return []
        return [XmlGpu(child, f"{self.where}/{path}/{child.tag}") for child in parent]

    def leaves(self) -> Iterator[str]:
        """The paths of the leaf elements."""

        def walk(element: ElementTree.Element, prefix: str) -> Iterator[str]:
            for child in element:
                path = f"{prefix}{child.tag}"
                if len(child):
                    yield from walk(child, f"{path}/")
                else:
                    yield path

        seen: set[str] = set()
        for leaf in walk(self.element, ""):
            if leaf not in seen and not any(leaf.startswith(f"{a}/") for a in self._asked):
                seen.add(leaf)
                yield leaf


@dataclass(frozen=True)
class XmlLog:
    """A parsed ``nvidia-smi -q -x`` document."""

    root: ElementTree.Element
    where: str

    def top(self, tag: str) -> Field | None:
        """A value directly under ``<nvidia_smi_log>`` (driver_version, cuda_version)."""
        found = self.root.find(tag)
        return None if found is None else Field(found.text or "", f"{self.where}: <{tag}>")

    def gpus(self) -> list[XmlGpu]:
        """The ``<gpu>`` elements in order."""
        return [
            XmlGpu(gpu, f"{self.where}: <gpu id={gpu.get('id', str(i))!r}>")
            for i, gpu in enumerate(self.root.findall("gpu"))
        ]


def parse_xml(text: str, name: str) -> XmlLog:
    """Parse ``nvidia-smi -q -x`` output; a malformed document names its line and column."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as error:
        line, column = error.position
        reason = str(error).split(":")[0]
        raise RecordingError(
            f"{name}:{line}: malformed XML at column {column} ({reason}): expected the complete "
            "output of nvidia-smi -q -x"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise RecordingError(
            f"{name}: element <{root.tag}>: expected <nvidia_smi_log>, the root of nvidia-smi -q -x"
        )
    if root.find("gpu") is None:
        raise RecordingError(f"{name}: element <nvidia_smi_log>: expected at least one <gpu>")
    return XmlLog(root, name)


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q


@dataclass
class TextNode:
    """One line of ``nvidia-smi -q``: ``key : value`` or a section title, and what it holds."""

    key: str
    value: str | None
    line: int
    children: list[TextNode] = field(default_factory=list)

    def child(self, key: str) -> TextNode | None:
        """The first child whose key is ``key`` (case and spacing aside)."""
        wanted = _normal(key)
        return next((c for c in self.children if _normal(c.key) == wanted), None)

    def find(self, path: str) -> TextNode | None:
        """The node at ``a/b/c`` below this one."""
        node: TextNode | None = self
        for part in path.split("/"):
            node = node.child(part) if node is not None else None
        return node


# `    Product Name                    : NVIDIA H100 80GB HBM3`: spaces before the colon, which
# keeps `GPU 00000000:00:09.0` (a section title) apart from a key-value line.
_TEXT_LINE = re.compile(r"^( *)(\S.*?)\s+:(?: (.*))?$")


class TextGpu(GpuSource):
    """A ``GPU 00000000:..`` block of ``nvidia-smi -q``; paths like ``PCI/Bus Id``."""

    def __init__(self, node: TextNode, name: str) -> None:
        super().__init__(f"{name}:{node.line}")
        self.node = node
        self.name = name

    def _find(self, path: str) -> Field | None:
        found = self.node.find(path)
        if found is None:
            return self._missing_section(path)
        if found.value is None:
            return None
        return Field(found.value, f"{self.name}:{found.line}")

    def _missing_section(self, path: str) -> Field | None:
        """``Remapped Rows : N/A``: N/A for every line the section would hold."""
        parts = path.split("/")
        for end in range(len(parts) - 1, 0, -1):
            section = self.node.find("/".join(parts[:end]))
            if section is not None:
                if section.children or section.value is None:
                    return None
                value = Field(section.value, f"{self.name}:{section.line}")
                return value if value.missing else None
        return None

    def section(self, path: str) -> TextNode | None:
        """The section at ``path`` (its children are read by the caller)."""
        self._asked.add(path)
        return self.node.find(path)

    def leaves(self) -> Iterator[str]:
        """The paths of the key-value lines."""

        def walk(node: TextNode, prefix: str) -> Iterator[str]:
            for child in node.children:
                path = f"{prefix}{child.key}"
                if child.children:
                    if not any(_normal(path) == _normal(a) for a in self._asked):
                        yield from walk(child, f"{path}/")
                elif child.value is not None:
                    yield path

        seen: set[str] = set()
        for leaf in walk(self.node, ""):
            if leaf not in seen:
                seen.add(leaf)
                yield leaf


@dataclass(frozen=True)
class TextLog:
    """A parsed ``nvidia-smi -q`` report: header values and the GPU blocks."""

    header: TextNode
    blocks: tuple[TextNode, ...]
    name: str

    def top(self, key: str) -> Field | None:
        """A header value (Driver Version, CUDA Version, KMD Version)."""
        node = self.header.child(key)
        if node is None or node.value is None:
            return None
        return Field(node.value, f"{self.name}:{node.line}")

    def gpus(self) -> list[TextGpu]:
        """The GPU blocks in order."""
        return [TextGpu(block, self.name) for block in self.blocks]


def parse_text(lines: Sequence[str], name: str, first_line: int = 1) -> TextLog:
    """Parse ``nvidia-smi -q`` output into a tree of :class:`TextNode` by indentation."""
    root = TextNode("", None, first_line)
    stack: list[tuple[int, TextNode]] = [(-1, root)]
    for number, raw in enumerate(lines, start=first_line):
        line = raw.rstrip()
        if not line.strip() or line.startswith("====="):
            continue
        match = _TEXT_LINE.match(line)
        indent = len(line) - len(line.lstrip(" "))
        if match:
            node = TextNode(match.group(2).strip(), (match.group(3) or "").strip(), number)
        else:
            node = TextNode(line.strip(), None, number)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    blocks = tuple(c for c in root.children if c.value is None and c.key.startswith("GPU "))
    if not blocks:
        raise RecordingError(
            f"{name}:{first_line}: no 'GPU 00000000:..' block: expected the output of nvidia-smi -q"
        )
    return TextLog(root, blocks, name)


# ---------------------------------------------------------------------------------------------
# nvidia-smi --query-gpu=... --format=csv


_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]$")


class CsvGpu(GpuSource):
    """A row of ``--query-gpu`` CSV; paths are field names such as ``memory.used``."""

    def __init__(self, cells: dict[str, str], line: int, name: str) -> None:
        super().__init__(f"{name}:{line}")
        self.cells = cells
        self.line = line
        self.name = name

    def _find(self, path: str) -> Field | None:
        if path not in self.cells:
            return None
        return Field(self.cells[path], f"{self.name}:{self.line}: column {path}")

    def leaves(self) -> Iterator[str]:
        """The field names of the header."""
        return iter(self.cells)


def parse_csv(lines: Sequence[str], name: str, first_line: int = 1) -> list[CsvGpu]:
    """Parse ``--format=csv`` output: a header of field names (units in brackets) and rows.

    Raises:
        RecordingError: a row has more or fewer cells than the header, naming its line.
    """
    numbered = [(n, line) for n, line in enumerate(lines, start=first_line) if line.strip()]
    if not numbered:
        raise RecordingError(f"{name}:{first_line}: empty CSV: expected a header line of fields")
    header_line, header = numbered[0]
    fields = [_HEADER_UNIT.sub("", cell) for cell in _csv_cells(header)]
    rows = []
    for number, line in numbered[1:]:
        cells = _csv_cells(line)
        if len(cells) != len(fields):
            raise RecordingError(
                f"{name}:{number}: CSV row has {len(cells)} columns: expected {len(fields)}, "
                f"as the header on line {header_line}"
            )
        rows.append(CsvGpu(dict(zip(fields, cells, strict=True)), number, name))
    return rows


def _csv_cells(line: str) -> list[str]:
    return [cell.strip() for cell in next(csv.reader([line], skipinitialspace=True))]


# ---------------------------------------------------------------------------------------------
# Capture bundles


@dataclass(frozen=True)
class Section:
    """One section of a capture bundle: its lines and the line number of the first."""

    state: str
    title: str
    lines: tuple[str, ...]
    first_line: int


_BANNER = re.compile(r"^#{20,}\s*$")
_SECTION_TITLE = re.compile(r"^# (\S+) :: (.+?)\s*$")


@dataclass(frozen=True)
class Capture:
    """A capture bundle: its sections by (state, title)."""

    name: str
    sections: tuple[Section, ...]

    def section(self, state: str, title_start: str) -> Section | None:
        """The first section of ``state`` whose title starts with ``title_start``."""
        return next(
            (s for s in self.sections if s.state == state and s.title.startswith(title_start)),
            None,
        )

    def states(self) -> list[str]:
        """The states recorded (``idle``, ``load``), in order."""
        return list(dict.fromkeys(s.state for s in self.sections if s.state != "capabilities"))


def parse_capture(lines: Sequence[str], name: str) -> Capture:
    """Split a capture bundle into its sections.

    A section starts at a banner (a line of ``#``) followed by ``# STATE :: TITLE`` and more
    ``# `` lines, closed by a second banner; its content runs to the next section's banner.
    """
    starts: list[tuple[int, str, str, int]] = []  # (banner index, state, title, content index)
    i = 0
    while i < len(lines):
        banner = _SECTION_TITLE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if _BANNER.match(lines[i]) and banner:
            j = i + 2
            while j < len(lines) and not _BANNER.match(lines[j]):
                j += 1
            starts.append((i, banner.group(1), banner.group(2), j + 1))
            i = j + 1
            continue
        i += 1
    sections = []
    for k, (_, state, title, content) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        sections.append(Section(state, title, tuple(lines[content:end]), content + 1))
    if not sections:
        raise RecordingError(f"{name}:1: no '# STATE :: TITLE' section: expected a capture bundle")
    return Capture(name, tuple(sections))


# ---------------------------------------------------------------------------------------------
# Reading a file


XML, TEXT, CSV, CAPTURE = "xml", "text", "csv", "capture"
FORMATS = (XML, TEXT, CSV, CAPTURE)


def read_lines(path: Path) -> list[str]:
    """The file's lines; one clear error when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        raise RecordingError(f"{path}: cannot read: {error.strerror or error}") from None


def detect_format(lines: Sequence[str], name: str) -> str:
    """Which of :data:`FORMATS` the file is, from its first lines."""
    text = "\n".join(lines[:200])
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("<?xml") or first.startswith("<nvidia_smi_log"):
        return XML
    if any(_SECTION_TITLE.match(line) for line in lines[:400]) and "capture" in text:
        return CAPTURE
    if "NVSMI LOG" in text or any(line.startswith("Attached GPUs") for line in lines[:50]):
        return TEXT
    if "," in first and re.match(r"^[a-z_.]+( \[[^\]]*\])?(, [a-zA-Z_.]+( \[[^\]]*\])?)+$", first):
        return CSV
    raise RecordingError(
        f"{name}:1: not a recognised nvidia-smi output: expected nvidia-smi -q -x (XML), "
        "nvidia-smi -q (text), --query-gpu CSV or a capture bundle"
    )


# `GPU 0: NVIDIA H200 (UUID: GPU-...)` and `  MIG 1c.3g.71gb  Device  0: (UUID: MIG-...)`.
_LIST_GPU = re.compile(r"^GPU (\d+): ")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+):")


def mig_profiles_listed(section: Section | None) -> dict[int, dict[int, str]]:
    """``nvidia-smi -L``: the profile of each MIG device, by GPU index and device index."""
    profiles: dict[int, dict[int, str]] = {}
    gpu = -1
    for line in section.lines if section else ():
        listed = _LIST_GPU.match(line)
        if listed:
            gpu = int(listed.group(1))
            continue
        mig = _LIST_MIG.match(line)
        if mig and gpu >= 0:
            profiles.setdefault(gpu, {})[int(mig.group(2))] = mig.group(1)
    return profiles


@dataclass(frozen=True)
class NvlinkRecord:
    """What ``nvidia-smi nvlink -s`` said about one GPU: each link up or not, or why none."""

    links: tuple[bool, ...]
    note: str  # "" when links were listed; otherwise nvidia-smi's message
    where: str


_NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*)$")


def nvlink_status(section: Section | None, name: str) -> dict[int, NvlinkRecord]:
    """``nvidia-smi nvlink -s`` by GPU index: link N up when it shows a speed."""
    records: dict[int, NvlinkRecord] = {}
    if section is None:
        return records
    gpu, note, where = -1, "", ""
    links: list[bool] = []

    def close() -> None:
        if gpu >= 0:
            records[gpu] = NvlinkRecord(tuple(links), "" if links else note, where)

    for number, line in enumerate(section.lines, start=section.first_line):
        listed = _LIST_GPU.match(line)
        if listed:
            close()
            gpu, note, where = int(listed.group(1)), "", f"{name}:{number}"
            links = []
            continue
        link = _NVLINK_LINK.match(line)
        if link:
            links.append(bool(re.search(r"\d+(\.\d+)?\s*[GM]B/s", link.group(2))))
        elif line.strip() and not note:
            note = line.strip()
    close()
    return records


def nvml_symbols(section: Section | None) -> frozenset[str] | None:
    """The ``nvml*`` functions a driver's library exports, where the capture lists them."""
    if section is None:
        return None
    return frozenset(line.strip() for line in section.lines if line.startswith("nvml"))


# ---------------------------------------------------------------------------------------------
# What each format prints where


# Canonical key -> where each format prints it. Alternatives cover nvidia-smi's renamings
# (throttle -> event reasons, power_readings -> gpu_power_readings, ...).
_TEXT_PATHS: dict[str, tuple[str, ...]] = {
    "name": ("Product Name",),
    "brand": ("Product Brand",),
    "architecture": ("Product Architecture",),
    "serial": ("Serial Number",),
    "uuid": ("GPU UUID",),
    "vbios": ("VBIOS Version",),
    "persistence_mode": ("Persistence Mode",),
    "display_active": ("Display Active",),
    "compute_mode": ("Compute Mode",),
    "mig_mode": ("MIG Mode/Current",),
    "pci_bus_id": ("PCI/Bus Id",),
    "pci_device_id": ("PCI/Device Id",),
    "pci_subsystem_id": ("PCI/Sub System Id",),
    "pcie_generation": ("PCI/GPU Link Info/PCIe Generation/Current",),
    "pcie_max_generation": ("PCI/GPU Link Info/PCIe Generation/Max",),
    "pcie_gpu_max_generation": ("PCI/GPU Link Info/PCIe Generation/Device Max",),
    "pcie_width": ("PCI/GPU Link Info/Link Width/Current",),
    "pcie_max_width": ("PCI/GPU Link Info/Link Width/Max",),
    "pcie_replays": ("PCI/Replays Since Reset",),
    "pcie_tx": ("PCI/Tx Throughput",),
    "pcie_rx": ("PCI/Rx Throughput",),
    "fan": ("Fan Speed",),
    "memory_total": ("FB Memory Usage/Total",),
    "memory_reserved": ("FB Memory Usage/Reserved",),
    "memory_used": ("FB Memory Usage/Used",),
    "memory_free": ("FB Memory Usage/Free",),
    "bar1_total": ("BAR1 Memory Usage/Total",),
    "bar1_used": ("BAR1 Memory Usage/Used",),
    "utilization": ("Utilization/GPU",),
    "memory_utilization": ("Utilization/Memory",),
    "ecc_mode": ("ECC Mode/Current",),
    "retired_single_bit": ("Retired Pages/Single Bit ECC",),
    "retired_double_bit": ("Retired Pages/Double Bit ECC",),
    "retired_pending": ("Retired Pages/Pending Page Blacklist",),
    "remapped_correctable": ("Remapped Rows/Correctable Error",),
    "remapped_uncorrectable": ("Remapped Rows/Uncorrectable Error",),
    "remapped_pending": ("Remapped Rows/Pending",),
    "remapped_failure": ("Remapped Rows/Remapping Failure Occurred",),
    "temperature": ("Temperature/GPU Current Temp",),
    "memory_temperature": ("Temperature/Memory Current Temp",),
    "temp_shutdown": ("Temperature/GPU Shutdown Temp",),
    "temp_slowdown": ("Temperature/GPU Slowdown Temp",),
    "temp_gpu_max": ("Temperature/GPU Max Operating Temp",),
    "temp_memory_max": ("Temperature/Memory Max Operating Temp",),
    "tlimit_shutdown": ("Temperature/GPU Shutdown T.Limit Temp",),
    "tlimit_slowdown": ("Temperature/GPU Slowdown T.Limit Temp",),
    "tlimit_gpu_max": ("Temperature/GPU Max Operating T.Limit Temp",),
    "tlimit_memory_max": ("Temperature/Memory Max Operating T.Limit Temp",),
    "power_draw": ("Power Readings/Power Draw", "GPU Power Readings/Power Draw"),
    "power_draw_average": ("GPU Power Readings/Average Power Draw",),
    "power_draw_instant": ("GPU Power Readings/Instantaneous Power Draw",),
    "power_limit": (
        "GPU Power Readings/Current Power Limit",
        "GPU Power Readings/GPU Ceiling Power Limit/Current Power Limit",
        "Power Readings/Enforced Power Limit",
    ),
    "power_default_limit": (
        "GPU Power Readings/Default Power Limit",
        "GPU Power Readings/GPU Ceiling Power Limit/Default Power Limit",
        "Power Readings/Default Power Limit",
    ),
    "power_min_limit": ("GPU Power Readings/Min Power Limit", "Power Readings/Min Power Limit"),
    "power_max_limit": ("GPU Power Readings/Max Power Limit", "Power Readings/Max Power Limit"),
    "graphics_clock": ("Clocks/Graphics",),
    "sm_clock": ("Clocks/SM",),
    "memory_clock": ("Clocks/Memory",),
    "video_clock": ("Clocks/Video",),
    "max_graphics_clock": ("Max Clocks/Graphics",),
    "max_sm_clock": ("Max Clocks/SM",),
    "max_memory_clock": ("Max Clocks/Memory",),
    "max_video_clock": ("Max Clocks/Video",),
}
_TEXT_REASONS = {
    "gpu_idle": "Idle",
    "applications_clocks_setting": "Applications Clocks Setting",
    "sw_power_cap": "SW Power Cap",
    "hw_slowdown": "HW Slowdown",
    "hw_thermal_slowdown": "HW Slowdown/HW Thermal Slowdown",
    "hw_power_brake_slowdown": "HW Slowdown/HW Power Brake Slowdown",
    "sync_boost": "Sync Boost",
    "sw_thermal_slowdown": "SW Thermal Slowdown",
    "display_clock_setting": "Display Clock Setting",
}
for _reason, _path in _TEXT_REASONS.items():
    _TEXT_PATHS[f"reason.{_reason}"] = (
        f"Clocks Event Reasons/{_path}",
        f"Clocks Throttle Reasons/{_path}",
    )
# Old reports print the throttle reasons unnested.
_TEXT_PATHS["reason.hw_thermal_slowdown"] += ("Clocks Throttle Reasons/HW Thermal Slowdown",)
_TEXT_PATHS["reason.hw_power_brake_slowdown"] += (
    "Clocks Throttle Reasons/HW Power Brake Slowdown",
)

_XML_PATHS: dict[str, tuple[str, ...]] = {
    "name": ("product_name",),
    "brand": ("product_brand",),
    "architecture": ("product_architecture",),
    "serial": ("serial",),
    "uuid": ("uuid",),
    "vbios": ("vbios_version",),
    "persistence_mode": ("persistence_mode",),
    "display_active": ("display_active",),
    "compute_mode": ("compute_mode",),
    "mig_mode": ("mig_mode/current_mig",),
    "pci_bus_id": ("pci/pci_bus_id",),
    "pci_device_id": ("pci/pci_device_id",),
    "pci_subsystem_id": ("pci/pci_sub_system_id",),
    "pcie_generation": ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
    "pcie_max_generation": ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",),
    "pcie_gpu_max_generation": ("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen",),
    "pcie_width": ("pci/pci_gpu_link_info/link_widths/current_link_width",),
    "pcie_max_width": ("pci/pci_gpu_link_info/link_widths/max_link_width",),
    "pcie_replays": ("pci/replay_counter",),
    "pcie_tx": ("pci/tx_util",),
    "pcie_rx": ("pci/rx_util",),
    "fan": ("fan_speed",),
    "memory_total": ("fb_memory_usage/total",),
    "memory_reserved": ("fb_memory_usage/reserved",),
    "memory_used": ("fb_memory_usage/used",),
    "memory_free": ("fb_memory_usage/free",),
    "bar1_total": ("bar1_memory_usage/total",),
    "bar1_used": ("bar1_memory_usage/used",),
    "utilization": ("utilization/gpu_util",),
    "memory_utilization": ("utilization/memory_util",),
    "ecc_mode": ("ecc_mode/current_ecc",),
    "retired_single_bit": ("retired_pages/multiple_single_bit_retirement/retired_count",),
    "retired_double_bit": ("retired_pages/double_bit_retirement/retired_count",),
    "retired_pending": ("retired_pages/pending_blacklist",),
    "remapped_correctable": ("remapped_rows/remapped_row_corr",),
    "remapped_uncorrectable": ("remapped_rows/remapped_row_unc",),
    "remapped_pending": ("remapped_rows/remapped_row_pending",),
    "remapped_failure": ("remapped_rows/remapped_row_failure",),
    "temperature": ("temperature/gpu_temp",),
    "memory_temperature": ("temperature/memory_temp",),
    "temp_shutdown": ("temperature/gpu_temp_max_threshold",),
    "temp_slowdown": ("temperature/gpu_temp_slow_threshold",),
    "temp_gpu_max": ("temperature/gpu_temp_max_gpu_threshold",),
    "temp_memory_max": ("temperature/gpu_temp_max_mem_threshold",),
    "tlimit_shutdown": ("temperature/gpu_temp_max_tlimit_threshold",),
    "tlimit_slowdown": ("temperature/gpu_temp_slow_tlimit_threshold",),
    "tlimit_gpu_max": ("temperature/gpu_temp_max_gpu_tlimit_threshold",),
    "tlimit_memory_max": ("temperature/gpu_temp_max_mem_tlimit_threshold",),
    "power_draw": ("power_readings/power_draw",),
    "power_draw_average": (
        "gpu_power_readings/average_power_draw",
        "power_readings/average_power_draw",
    ),
    "power_draw_instant": (
        "gpu_power_readings/instant_power_draw",
        "power_readings/instant_power_draw",
    ),
    "power_limit": (
        "power_readings/enforced_power_limit",
        "gpu_power_readings/current_power_limit",
    ),
    "power_default_limit": (
        "power_readings/default_power_limit",
        "gpu_power_readings/default_power_limit",
    ),
    "power_min_limit": ("power_readings/min_power_limit", "gpu_power_readings/min_power_limit"),
    "power_max_limit": ("power_readings/max_power_limit", "gpu_power_readings/max_power_limit"),
    "graphics_clock": ("clocks/graphics_clock",),
    "sm_clock": ("clocks/sm_clock",),
    "memory_clock": ("clocks/mem_clock",),
    "video_clock": ("clocks/video_clock",),
    "max_graphics_clock": ("max_clocks/graphics_clock",),
    "max_sm_clock": ("max_clocks/sm_clock",),
    "max_memory_clock": ("max_clocks/mem_clock",),
    "max_video_clock": ("max_clocks/video_clock",),
}
for _reason in CLOCK_EVENT_REASONS:
    # The XML spells the last one display_clocks_setting.
    _tag = "display_clocks_setting" if _reason == "display_clock_setting" else _reason
    _XML_PATHS[f"reason.{_reason}"] = (
        f"clocks_event_reasons/clocks_event_reason_{_tag}",
        f"clocks_throttle_reasons/clocks_throttle_reason_{_tag}",
    )

_CSV_PATHS: dict[str, tuple[str, ...]] = {
    "name": ("name",),
    "serial": ("serial",),
    "uuid": ("uuid",),
    "vbios": ("vbios_version",),
    "persistence_mode": ("persistence_mode",),
    "display_active": ("display_active",),
    "compute_mode": ("compute_mode",),
    "compute_capability": ("compute_cap",),
    "mig_mode": ("mig.mode.current",),
    "pci_bus_id": ("pci.bus_id",),
    "pci_device_id": ("pci.device_id",),
    "pci_subsystem_id": ("pci.sub_device_id",),
    "pcie_generation": ("pcie.link.gen.current",),
    "pcie_max_generation": ("pcie.link.gen.max",),
    "pcie_gpu_max_generation": ("pcie.link.gen.gpumax",),
    "pcie_width": ("pcie.link.width.current",),
    "pcie_max_width": ("pcie.link.width.max",),
    "fan": ("fan.speed",),
    "reason_mask": ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
    "memory_total": ("memory.total",),
    "memory_reserved": ("memory.reserved",),
    "memory_used": ("memory.used",),
    "memory_free": ("memory.free",),
    "utilization": ("utilization.gpu",),
    "memory_utilization": ("utilization.memory",),
    "ecc_mode": ("ecc.mode.current",),
    "ecc.corrected.volatile": ("ecc.errors.corrected.volatile.total",),
    "ecc.corrected.aggregate": ("ecc.errors.corrected.aggregate.total",),
    "ecc.uncorrected.volatile": ("ecc.errors.uncorrected.volatile.total",),
    "ecc.uncorrected.aggregate": ("ecc.errors.uncorrected.aggregate.total",),
    "retired_single_bit": ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"),
    "retired_double_bit": ("retired_pages.double_bit.count", "retired_pages.dbe"),
    "retired_pending": ("retired_pages.pending",),
    "remapped_correctable": ("remapped_rows.correctable",),
    "remapped_uncorrectable": ("remapped_rows.uncorrectable",),
    "remapped_pending": ("remapped_rows.pending",),
    "remapped_failure": ("remapped_rows.failure",),
    "temperature": ("temperature.gpu",),
    "memory_temperature": ("temperature.memory",),
    "power_draw": ("power.draw",),
    "power_draw_average": ("power.draw.average",),
    "power_draw_instant": ("power.draw.instant",),
    "power_limit": ("enforced.power.limit",),
    "power_default_limit": ("power.default_limit",),
    "power_min_limit": ("power.min_limit",),
    "power_max_limit": ("power.max_limit",),
    "graphics_clock": ("clocks.current.graphics", "clocks.gr"),
    "sm_clock": ("clocks.current.sm", "clocks.sm"),
    "memory_clock": ("clocks.current.memory", "clocks.mem"),
    "video_clock": ("clocks.current.video", "clocks.video"),
    "max_graphics_clock": ("clocks.max.graphics", "clocks.max.gr"),
    "max_sm_clock": ("clocks.max.sm",),
    "max_memory_clock": ("clocks.max.memory", "clocks.max.mem"),
}
# The table-driven readings' values, under their scenario keys (exporter/sim/features.py).
for _output in OUTPUTS:
    for _paths, _printed in (
        (_TEXT_PATHS, _output.printed.text),
        (_XML_PATHS, _output.printed.xml),
        (_CSV_PATHS, _output.printed.csv),
    ):
        if _printed:
            _paths[_output.metric] = _printed
# ECC counts in the text and XML reports: summed over the locations printed.
_ECC_PARTS = {
    "corrected": ("SRAM Correctable", "DRAM Correctable", "Single Bit/Total"),
    "uncorrected": (
        "SRAM Uncorrectable",
        "SRAM Uncorrectable Parity",
        "SRAM Uncorrectable SEC-DED",
        "DRAM Uncorrectable",
        "Double Bit/Total",
    ),
}
_XML_ECC_PARTS = {
    "corrected": ("sram_correctable", "dram_correctable", "single_bit/total"),
    "uncorrected": (
        "sram_uncorrectable",
        "sram_uncorrectable_parity",
        "sram_uncorrectable_secded",
        "dram_uncorrectable",
        "double_bit/total",
    ),
}


@dataclass
class RecordedProcess:
    """A process as nvidia-smi listed it."""

    pid: int
    name: str
    kind: str  # C, G or C+G
    memory: Field | None
    gpu_instance: int | None
    compute_instance: int | None
    where: str


@dataclass
class RecordedMigDevice:
    """A MIG device (a compute instance) as ``nvidia-smi -q`` printed it."""

    index: int
    gpu_instance: int
    compute_instance: int
    multiprocessors: int | None
    memory_total: float
    memory_used: Field | None
    profile: str | None  # from nvidia-smi -L, e.g. 1c.3g.71gb
    where: str


@dataclass
class RecordedGpu:
    """One GPU of a recording: canonical fields and what goes with them."""

    fields: dict[str, Field]
    sources: list[GpuSource]
    processes: list[RecordedProcess] | None = None  # None: the format lists none
    mig_devices: list[RecordedMigDevice] = field(default_factory=list)
    nvlink: NvlinkRecord | None = None
    where: str = ""


@dataclass
class Recording:
    """What one file says about a node."""

    name: str
    form: str
    state: str | None
    driver_version: Field | None
    cuda_version: Field | None
    gpus: list[RecordedGpu]
    symbols: frozenset[str] | None = None


# ---------------------------------------------------------------------------------------------
# One recording, by key


def _extract(source: GpuSource, paths: Mapping[str, tuple[str, ...]]) -> dict[str, Field]:
    fields = {}
    for key, alternatives in paths.items():
        found = source.get(*alternatives)
        if found is not None:
            fields[key] = found
    return fields


def _ecc_sums(
    source: GpuSource, prefix: str, counters: tuple[str, str], parts: Mapping[str, tuple[str, ...]]
) -> dict[str, Field]:
    """``ecc.<type>.<counter>``: the sum of the locations printed, or their N/A."""
    sums: dict[str, Field] = {}
    for kind, names in parts.items():
        for counter, printed in zip(("volatile", "aggregate"), counters, strict=True):
            base = f"{prefix}{printed}/"
            found = [f for f in (source.get(f"{base}{name}") for name in names) if f is not None]
            if not found:
                continue
            values = [f for f in found if f.missing is None]
            if not values:
                sums[f"ecc.{kind}.{counter}"] = found[0]
                continue
            total = sum(f.integer(f"ECC {kind} {counter}") for f in values)
            sums[f"ecc.{kind}.{counter}"] = Field(str(total), values[0].where)
    return sums


def _text_processes(gpu: TextGpu) -> list[RecordedProcess] | None:
    section = gpu.section("Processes")
    if section is None:
        return None
    processes: list[RecordedProcess] = []
    instance: dict[str, int | None] = {}
    for node in section.children:
        key = node.key.lower()
        if key in ("gpu instance id", "compute instance id"):
            instance[key] = _optional_int(Field(node.value or "", f"{gpu.name}:{node.line}"), key)
            continue
        if key != "process id":
            continue
        where = f"{gpu.name}:{node.line}"
        pid = Field(node.value or "", where).integer("Process ID")
        details = {_normal(c.key): c for c in node.children}

        def text(key: str, details: dict[str, TextNode] = details) -> Field | None:
            found = details.get(key)
            return None if found is None else Field(found.value or "", f"{gpu.name}:{found.line}")

        name = text("name")
        kind = text("type")
        processes.append(
            RecordedProcess(
                pid=pid,
                name=name.text if name else "",
                kind=kind.text.strip() if kind else "C",
                memory=text("used gpu memory"),
                gpu_instance=instance.get("gpu instance id"),
                compute_instance=instance.get("compute instance id"),
                where=where,
            )
        )
        instance = {}
    return processes


def _optional_int(value: Field, name: str) -> int | None:
    return None if value.missing else value.integer(name)


def _text_mig_devices(gpu: TextGpu, listed: Mapping[int, str]) -> list[RecordedMigDevice]:
    devices = []
    for node in gpu.node.children:
        if _normal(node.key) != "mig device":
            continue
        source = TextGpu(node, gpu.name)
        index = _required(source, "Index", "MIG device index").integer("MIG device index")
        total = _required(source, "Shared FB Memory Usage/Total", "MIG memory total")
        sms = source.get("Device Attributes/Shared/Multiprocessor count")
        devices.append(
            RecordedMigDevice(
                index=index,
                gpu_instance=_required(source, "GPU Instance ID", "GPU instance id").integer(
                    "GPU Instance ID"
                ),
                compute_instance=_required(
                    source, "Compute Instance ID", "compute instance id"
                ).integer("Compute Instance ID"),
                multiprocessors=None if sms is None else _optional_int(sms, "Multiprocessor count"),
                memory_total=total.number("MIG memory total", "MiB"),
                memory_used=source.get("Shared FB Memory Usage/Used"),
                profile=listed.get(index),
                where=source.where,
            )
        )
    gpu.section("MIG Device")
    return devices


def _required(source: GpuSource, path: str, name: str) -> Field:
    found = source.get(path)
    if found is None:
        raise RecordingError(f"{source.where}: no {path!r}: expected the {name}")
    return found


def _xml_processes(gpu: XmlGpu) -> list[RecordedProcess] | None:
    if gpu.element.find("processes") is None:
        return None
    processes = []
    for info in gpu.children("processes"):
        pid = info.get("pid")
        if pid is None:
            raise RecordingError(f"{info.where}: no <pid>: expected the process id")
        name, kind, memory = info.get("process_name"), info.get("type"), info.get("used_memory")
        gi, ci = info.get("gpu_instance_id"), info.get("compute_instance_id")
        processes.append(
            RecordedProcess(
                pid=pid.integer("pid"),
                name=name.text.strip() if name else "",
                kind=kind.text.strip() if kind else "C",
                memory=memory,
                gpu_instance=None if gi is None else _optional_int(gi, "gpu_instance_id"),
                compute_instance=None if ci is None else _optional_int(ci, "compute_instance_id"),
                where=info.where,
            )
        )
    return processes


def _xml_mig_devices(gpu: XmlGpu) -> list[RecordedMigDevice]:
    # Element names of nvsmi_device_v12.dtd's <mig_device>.
    devices = []
    for device in gpu.children("mig_devices"):
        if device.element.tag != "mig_device":
            continue
        total = _required(device, "fb_memory_usage/total", "MIG memory total")
        sms = device.get("device_attributes/shared/multiprocessor_count")
        devices.append(
            RecordedMigDevice(
                index=_required(device, "index", "MIG device index").integer("index"),
                gpu_instance=_required(device, "gpu_instance_id", "GPU instance id").integer(
                    "gpu_instance_id"
                ),
                compute_instance=_required(
                    device, "compute_instance_id", "compute instance id"
                ).integer("compute_instance_id"),
                multiprocessors=None if sms is None else _optional_int(sms, "multiprocessors"),
                memory_total=total.number("MIG memory total", "MiB"),
                memory_used=device.get("fb_memory_usage/used"),
                profile=None,
                where=device.where,
            )
        )
    return devices


def _read_xml(lines: Sequence[str], name: str) -> Recording:
    log = parse_xml("\n".join(lines), name)
    gpus = []
    for source in log.gpus():
        fields = _extract(source, _XML_PATHS)
        fields.update(_ecc_sums(source, "ecc_errors/", ("volatile", "aggregate"), _XML_ECC_PARTS))
        gpus.append(
            RecordedGpu(
                fields,
                [source],
                processes=_xml_processes(source),
                mig_devices=_xml_mig_devices(source),
                where=source.where,
            )
        )
    return Recording(name, XML, None, log.top("driver_version"), log.top("cuda_version"), gpus)


def _text_gpus(log: TextLog, listed: Mapping[int, Mapping[int, str]]) -> list[RecordedGpu]:
    gpus = []
    for index, source in enumerate(log.gpus()):
        fields = _extract(source, _TEXT_PATHS)
        fields.update(_ecc_sums(source, "ECC Errors/", ("Volatile", "Aggregate"), _ECC_PARTS))
        gpus.append(
            RecordedGpu(
                fields,
                [source],
                processes=_text_processes(source),
                mig_devices=_text_mig_devices(source, listed.get(index, {})),
                where=source.where,
            )
        )
    return gpus


def _text_driver(log: TextLog) -> tuple[Field | None, Field | None]:
    return (
        log.top("KMD Version") or log.top("Driver Version"),
        log.top("CUDA UMD Version") or log.top("CUDA Version"),
    )


def _read_text(lines: Sequence[str], name: str) -> Recording:
    log = parse_text(lines, name)
    driver, cuda = _text_driver(log)
    return Recording(name, TEXT, None, driver, cuda, _text_gpus(log, {}))


def _csv_gpus(rows: list[CsvGpu]) -> list[RecordedGpu]:
    return [RecordedGpu(_extract(row, _CSV_PATHS), [row], where=row.where) for row in rows]


def _read_csv(lines: Sequence[str], name: str) -> Recording:
    rows = parse_csv(lines, name)
    if not rows:
        raise RecordingError(f"{name}:2: no rows: expected one row per GPU under the header")
    driver = rows[0].get("driver_version")
    return Recording(name, CSV, None, driver, None, _csv_gpus(rows))


def _read_capture(lines: Sequence[str], name: str, state: str) -> Recording:
    capture = parse_capture(lines, name)
    query = _state_section(capture, state, "query (-q)")
    table = _state_section(capture, state, "query-gpu")
    log = parse_text(query.lines, name, query.first_line)
    listed = mig_profiles_listed(capture.section("capabilities", "list (-L)"))
    gpus = _text_gpus(log, listed)
    rows = parse_csv(table.lines, name, table.first_line)
    if len(rows) != len(gpus):
        raise RecordingError(
            f"{name}:{table.first_line}: the {state} query-gpu CSV has {len(rows)} rows: "
            f"expected one per GPU of the {state} -q report ({len(gpus)})"
        )
    nvlink = nvlink_status(capture.section("capabilities", "nvlink -s"), name)
    for index, (gpu, row) in enumerate(zip(gpus, rows, strict=True)):
        # The CSV was taken moments after the -q report: where both have a value, the CSV's.
        gpu.fields.update(_extract(row, _CSV_PATHS))
        gpu.sources.append(row)
        gpu.nvlink = nvlink.get(index)
    driver, cuda = _text_driver(log)
    symbols = nvml_symbols(capture.section("capabilities", "nvml-symbols"))
    return Recording(name, CAPTURE, state, driver, cuda, gpus, symbols)


def _state_section(capture: Capture, state: str, title: str) -> Section:
    section = capture.section(state, title)
    if section is None:
        states = ", ".join(capture.states()) or "none"
        raise RecordingError(
            f"{capture.name}: no '# {state} :: {title}' section: expected a capture bundle with "
            f"it (states recorded: {states})"
        )
    return section


def read_recording(path: Path, state: str = "load") -> Recording:
    """Read any of the four formats into a :class:`Recording`."""
    name = str(path)
    lines = read_lines(path)
    form = detect_format(lines, name)
    if form == XML:
        recording = _read_xml(lines, name)
    elif form == TEXT:
        recording = _read_text(lines, name)
    elif form == CSV:
        recording = _read_csv(lines, name)
    else:
        recording = _read_capture(lines, name, state)
    return recording
