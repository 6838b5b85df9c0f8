"""Conformance: gpuload on an imported recording against what nvidia-smi printed in it.

For each recorded machine (``../shared/reality/``: capture bundles, for each of their states, and
``nvidia-smi -q -x`` files), ``gpuload sim import`` makes a scenario, the real ``gpuload serve
--simulate`` runs it with the scenario clock pinned (no time passes, so a moving value is the
recorded one), and ``/metrics`` is compared with nvidia-smi's own figures in the same file:

- captures: the ``--query-gpu`` CSV of the state; where the CSV has no field for a family, the
  ``-q`` report of the same state (BAR1, PCIe replays, absolute temperature thresholds, MIG
  devices), ``--query-compute-apps`` for the processes and ``nvlink -s`` for the links;
- XML: the XML.

The references are read here, family by family (:data:`CHECKS`), not through the importer's
own tables, so a value the importer maps wrongly shows up as a mismatch. Each gpuload value is
put in nvidia-smi's unit at nvidia-smi's printed precision (bytes to whole MiB, watts to two
decimals, ratios to whole percent, hertz to MHz) and must equal the printed figure; a family
nvidia-smi printed as N/A must be absent and one it printed a value for present. Families
nvidia-smi does not report are not compared, each with its reason (:data:`NOT_COMPARED`).

``python -m tools.conformance DIR`` prints a table
per recorded machine and exits 1 when any series mismatches.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.nvml import GPM_METRICS
from exporter.sim import features, importer, nvsmi
from exporter.sim.nvsmi import CsvGpu, Field, RecordingError, TextGpu, XmlGpu
from tools.golden import listening_url

# The scenario clock is pinned here: any time after the first second works (power is a 1 s mean).
PINNED_TIME = 60.0

EQUAL, ABSENT, MISMATCH = "equal", "absent as expected", "mismatch"

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

# How gpuload is run to be compared: every family it has, and NVLink link by link.
EVERYTHING = {"GPULOAD_METRICS_PROFILE": "full", "GPULOAD_COLLECTORS_NVLINK_PER_LINK": "true"}

# gpuload families nvidia-smi gives nothing to compare with.
NOT_COMPARED = {
    "gpu_up": "gpuload's own reachability flag",
    "gpuload_gpu_stale": "gpuload's own staleness flag",
    "gpu_energy_consumption_joules_total": "nvidia-smi prints no energy counter here",
    "gpu_pcie_transmit_bytes_total": "a byte counter; nvidia-smi prints a 20 ms throughput",
    "gpu_pcie_receive_bytes_total": "a byte counter; nvidia-smi prints a 20 ms throughput",
    "gpu_nvlink_transmit_bytes_total": "nvidia-smi nvlink -s prints link speeds, not traffic",
    "gpu_nvlink_receive_bytes_total": "nvidia-smi nvlink -s prints link speeds, not traffic",
    "gpu_nvlink_replay_errors_total": "not in the recordings",
    "gpu_nvlink_recovery_errors_total": "not in the recordings",
    "gpu_nvlink_crc_errors_total": "not in the recordings",
    "gpu_nvlink_link_transmit_bytes_total": "nvidia-smi nvlink -s prints link speeds, not traffic",
    "gpu_nvlink_link_receive_bytes_total": "nvidia-smi nvlink -s prints link speeds, not traffic",
    "gpu_nvlink_link_replay_errors_total": "not in the recordings",
    "gpu_nvlink_link_recovery_errors_total": "not in the recordings",
    "gpu_nvlink_link_crc_errors_total": "not in the recordings",
    "gpu_nvlink_links_up": "the sum of gpu_nvlink_link_up, which is compared link by link",
    "gpu_nvlink_link_down": "gpu_nvlink_link_up, which is compared link by link, says it too",
    "gpu_idle_seconds_total": "a counter of time; nvidia-smi prints one reading",
    "gpu_sm_active_ratio": "GPM: nvidia-smi does not print it",
    "gpu_process_sm_utilization_ratio": "pmon's samples were taken at other moments than -q and "
    "the CSV, and the simulator splits utilization evenly over processes",
    "gpu_xid_errors_total": "XIDs are events, not in the recordings",
    "gpu_last_xid_code": "XIDs are events, not in the recordings",
    "gpuload_xid_instance_events_withheld": "gpuload's own flag",
    "gpuload_processes_visible": "gpuload's own flag",
    "gpu_pod_info": "Kubernetes attribution",
}
NOT_COMPARED.update({f"gpu_{m}_ratio": "GPM: nvidia-smi does not print it" for m in GPM_METRICS})
NOT_COMPARED.update(
    {
        f"gpu_{m}_seconds_total": "a counter of time; nvidia-smi prints one reading"
        for m in ("utilization", "memory_utilization", "encoder_utilization", "decoder_utilization")
    }
)
NOT_COMPARED.update(
    {f"gpu_{m}_seconds_total": "GPM: nvidia-smi does not print it" for m in GPM_METRICS}
)
NOT_COMPARED.update(
    {
        f"gpu_mig_{m}_seconds_total": "GPM per MIG instance: nvidia-smi does not print it"
        for m in GPM_METRICS
    }
)
NOT_COMPARED.update(
    {
        f"gpu_mig_{m}_ratio": "GPM per MIG instance: nvidia-smi does not print it"
        for m in GPM_METRICS
    }
)


@dataclass(frozen=True)
class Outcome:
    """One series compared: equal, absent as expected, or a mismatch with both values."""

    family: str
    labels: str
    result: str
    recorded: str
    exported: str
    where: str

    def describe(self, recording: str) -> str:
        """One line naming the file, the family and both values."""
        series = f"{self.family}{{{self.labels}}}" if self.labels else self.family
        return (
            f"{recording}: {series}: nvidia-smi {self.recorded} ({self.where}), "
            f"gpuload {self.exported}"
        )


@dataclass
class Report:
    """The comparison for one recorded machine (and state)."""

    recording: str
    state: str | None
    outcomes: list[Outcome] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # family -> why not compared
    collectors: dict[str, float] = field(default_factory=dict)
    # gpu_* families gpuload exported that are neither compared nor listed with a reason.
    unclassified: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        """The file name, with the state for a capture."""
        return f"{self.recording} ({self.state})" if self.state else self.recording

    @property
    def mismatches(self) -> list[Outcome]:
        """The series that differ."""
        return [o for o in self.outcomes if o.result == MISMATCH]

    def count(self, result: str) -> int:
        """How many series had ``result``."""
        return sum(o.result == result for o in self.outcomes)

    @property
    def families(self) -> list[str]:
        """The families compared, sorted."""
        return sorted({o.family for o in self.outcomes})


# ---------------------------------------------------------------------------------------------
# Recorded values in gpuload's terms


def _mib(found: Field) -> float:
    return found.number("MiB", "MiB")


def _count(found: Field) -> float:
    return float(found.integer("count"))


def _percent(found: Field) -> float:
    return found.number("percent", "%")


def _celsius(found: Field) -> float:
    return found.number("degrees", "C")


def _watts(found: Field) -> float:
    return found.number("watts", "W")


def _mhz(found: Field) -> float:
    return found.number("MHz", "MHz")


def _lanes(found: Field) -> float:
    return float(found.integer("lanes", "x"))


def _switch(found: Field) -> float:
    text = " ".join(found.text.split()).lower()
    if text in ("enabled", "yes", "active"):
        return 1.0
    if text in ("disabled", "no", "not active"):
        return 0.0
    raise found.fail("switch", "Enabled or Disabled, Yes or No")


# gpuload's unit -> nvidia-smi's, at nvidia-smi's printed precision.
_TO_PRINTED: dict[Callable[[Field], float], Callable[[float], float]] = {
    _mib: lambda v: round(v / 2**20),
    _count: lambda v: v,
    _percent: lambda v: round(v * 100),
    _celsius: lambda v: v,
    _watts: lambda v: round(v, 2),
    _mhz: lambda v: round(v / 1e6),
    _lanes: lambda v: v,
    _switch: lambda v: v,
}


@dataclass(frozen=True)
class Check:
    """One series and where each format prints its reference (None: that format has none)."""

    family: str
    labels: tuple[tuple[str, str], ...]
    csv: str | None
    text: str | None
    xml: tuple[str, ...]
    read: Callable[[Field], float]


def _check(
    family: str,
    csv: str | None,
    text: str | None,
    xml: str | tuple[str, ...] | None,
    read: Callable[[Field], float],
    **labels: str,
) -> Check:
    paths = (xml,) if isinstance(xml, str) else (xml or ())
    return Check(family, tuple(sorted(labels.items())), csv, text, paths, read)


CHECKS: tuple[Check, ...] = (
    _check(
        "gpu_memory_total_bytes",
        "memory.total",
        "FB Memory Usage/Total",
        "fb_memory_usage/total",
        _mib,
    ),
    _check(
        "gpu_memory_used_bytes", "memory.used", "FB Memory Usage/Used", "fb_memory_usage/used", _mib
    ),
    _check(
        "gpu_memory_free_bytes", "memory.free", "FB Memory Usage/Free", "fb_memory_usage/free", _mib
    ),
    _check(
        "gpu_memory_reserved_bytes",
        "memory.reserved",
        "FB Memory Usage/Reserved",
        "fb_memory_usage/reserved",
        _mib,
    ),
    _check(
        "gpu_bar1_memory_total_bytes",
        None,
        "BAR1 Memory Usage/Total",
        "bar1_memory_usage/total",
        _mib,
    ),
    _check(
        "gpu_bar1_memory_used_bytes", None, "BAR1 Memory Usage/Used", "bar1_memory_usage/used", _mib
    ),
    _check(
        "gpu_pcie_link_generation",
        "pcie.link.gen.current",
        "PCI/GPU Link Info/PCIe Generation/Current",
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
        _count,
    ),
    _check(
        "gpu_pcie_link_max_generation",
        "pcie.link.gen.max",
        "PCI/GPU Link Info/PCIe Generation/Max",
        "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
        _count,
    ),
    _check(
        "gpu_pcie_link_width",
        "pcie.link.width.current",
        "PCI/GPU Link Info/Link Width/Current",
        "pci/pci_gpu_link_info/link_widths/current_link_width",
        _lanes,
    ),
    _check(
        "gpu_pcie_link_max_width",
        "pcie.link.width.max",
        "PCI/GPU Link Info/Link Width/Max",
        "pci/pci_gpu_link_info/link_widths/max_link_width",
        _lanes,
    ),
    _check(
        "gpu_pcie_replay_errors_total",
        None,
        "PCI/Replays Since Reset",
        "pci/replay_counter",
        _count,
    ),
    _check(
        "gpu_utilization_ratio",
        "utilization.gpu",
        "Utilization/GPU",
        "utilization/gpu_util",
        _percent,
    ),
    _check(
        "gpu_memory_utilization_ratio",
        "utilization.memory",
        "Utilization/Memory",
        "utilization/memory_util",
        _percent,
    ),
    _check(
        "gpu_temperature_celsius",
        "temperature.gpu",
        "Temperature/GPU Current Temp",
        "temperature/gpu_temp",
        _celsius,
        sensor="gpu",
    ),
    _check(
        "gpu_temperature_celsius",
        "temperature.memory",
        "Temperature/Memory Current Temp",
        "temperature/memory_temp",
        _celsius,
        sensor="memory",
    ),
    _check(
        "gpu_temperature_slowdown_threshold_celsius",
        None,
        "Temperature/GPU Slowdown Temp",
        "temperature/gpu_temp_slow_threshold",
        _celsius,
    ),
    _check(
        "gpu_temperature_shutdown_threshold_celsius",
        None,
        "Temperature/GPU Shutdown Temp",
        "temperature/gpu_temp_max_threshold",
        _celsius,
    ),
    _check(
        "gpu_power_limit_watts",
        "enforced.power.limit",
        "GPU Power Readings/Current Power Limit",
        ("power_readings/enforced_power_limit", "gpu_power_readings/current_power_limit"),
        _watts,
    ),
    *(
        _check(
            "gpu_clock_hertz",
            f"clocks.current.{clock}",
            f"Clocks/{name}",
            f"clocks/{tag}_clock",
            _mhz,
            clock=clock,
        )
        for clock, name, tag in (
            ("graphics", "Graphics", "graphics"),
            ("sm", "SM", "sm"),
            ("memory", "Memory", "mem"),
        )
    ),
    *(
        _check(
            "gpu_clock_max_hertz",
            f"clocks.max.{clock}",
            f"Max Clocks/{name}",
            f"max_clocks/{tag}_clock",
            _mhz,
            clock=clock,
        )
        for clock, name, tag in (
            ("graphics", "Graphics", "graphics"),
            ("sm", "SM", "sm"),
            ("memory", "Memory", "mem"),
        )
    ),
    _check("gpu_fan_speed_ratio", "fan.speed", "Fan Speed", "fan_speed", _percent),
    _check(
        "gpu_ecc_mode_enabled",
        "ecc.mode.current",
        "ECC Mode/Current",
        "ecc_mode/current_ecc",
        _switch,
    ),
    _check(
        "gpu_mig_mode_enabled",
        "mig.mode.current",
        "MIG Mode/Current",
        "mig_mode/current_mig",
        _switch,
    ),
    _check(
        "gpu_remapped_rows",
        "remapped_rows.correctable",
        "Remapped Rows/Correctable Error",
        "remapped_rows/remapped_row_corr",
        _count,
        type="correctable",
    ),
    _check(
        "gpu_remapped_rows",
        "remapped_rows.uncorrectable",
        "Remapped Rows/Uncorrectable Error",
        "remapped_rows/remapped_row_unc",
        _count,
        type="uncorrectable",
    ),
    _check(
        "gpu_row_remap_pending",
        "remapped_rows.pending",
        "Remapped Rows/Pending",
        "remapped_rows/remapped_row_pending",
        _switch,
    ),
    _check(
        "gpu_row_remap_failed",
        "remapped_rows.failure",
        "Remapped Rows/Remapping Failure Occurred",
        "remapped_rows/remapped_row_failure",
        _switch,
    ),
    _check(
        "gpu_retired_pages",
        "retired_pages.single_bit_ecc.count",
        "Retired Pages/Single Bit ECC",
        "retired_pages/multiple_single_bit_retirement/retired_count",
        _count,
        cause="single_bit",
    ),
    _check(
        "gpu_retired_pages",
        "retired_pages.double_bit.count",
        "Retired Pages/Double Bit ECC",
        "retired_pages/double_bit_retirement/retired_count",
        _count,
        cause="double_bit",
    ),
    _check(
        "gpu_retired_pages_pending",
        "retired_pages.pending",
        "Retired Pages/Pending Page Blacklist",
        "retired_pages/pending_blacklist",
        _switch,
    ),
)


def _table_checks() -> Iterator[Check]:
    """The checks the simulator's reading table declares: each output a family exports."""
    for reading in features.READINGS:
        for output in reading.outputs:
            if not output.family or output.not_compared:
                continue
            printed = output.printed
            yield _check(
                output.family,
                printed.csv[0] if printed.csv else None,
                printed.text[0] if printed.text else None,
                printed.xml,
                _percent if output.kind == "fraction" else _count,
            )


CHECKS += tuple(_table_checks())
NOT_COMPARED.update(
    {
        output.family: output.not_compared
        for reading in features.READINGS
        for output in reading.outputs
        if output.family and output.not_compared
    }
)


# ---------------------------------------------------------------------------------------------
# The reference of one GPU


@dataclass
class Reference:
    """Where one recorded GPU's figures are: the CSV row, the -q block, the XML element."""

    csv: CsvGpu | None = None
    text: TextGpu | None = None
    xml: XmlGpu | None = None
    apps: list[CsvGpu] | None = None  # --query-compute-apps rows of this GPU
    listed: Mapping[int, str] = field(default_factory=dict)  # nvidia-smi -L MIG profiles
    nvlink: nvsmi.NvlinkRecord | None = None

    def find(self, check: Check) -> Field | None:
        """The printed figure for ``check``: the CSV's, else the -q report's, else the XML's."""
        if self.csv is not None and check.csv is not None:
            found = self.csv.get(check.csv)
            if found is not None:
                return found
        if self.text is not None and check.text is not None:
            found = self.text.get(check.text)
            if found is not None:
                return found
        if self.xml is not None and check.xml:
            return self.xml.get(*check.xml)
        return None

    def get(self, csv: str | None, text: str | None, xml: str | None) -> Field | None:
        """One field by its name in each format."""
        return self.find(_check("", csv, text, xml, _count))


@dataclass(frozen=True)
class Recorded:
    """A recorded file (and state): its node-wide figures and each GPU's reference."""

    name: str
    state: str | None
    driver: Field | None
    cuda: Field | None
    gpus: list[Reference]


def read_reference(path: Path, state: str | None) -> Recorded:
    """The figures nvidia-smi printed in ``path`` (for a capture, in ``state``)."""
    lines = nvsmi.read_lines(path)
    name = path.name
    form = nvsmi.detect_format(lines, str(path))
    if form == nvsmi.XML:
        xml = nvsmi.parse_xml("\n".join(lines), name)
        elements = [Reference(xml=gpu) for gpu in xml.gpus()]
        return Recorded(name, None, xml.top("driver_version"), xml.top("cuda_version"), elements)
    if form != nvsmi.CAPTURE or state is None:
        raise RecordingError(f"{path}: conformance reads capture bundles and -q -x XML")
    capture = nvsmi.parse_capture(lines, name)
    query = capture.section(state, "query (-q)")
    table = capture.section(state, "query-gpu")
    if query is None or table is None:
        raise RecordingError(f"{path}: no {state} -q report and query-gpu CSV")
    log = nvsmi.parse_text(query.lines, name, query.first_line)
    rows = nvsmi.parse_csv(table.lines, name, table.first_line)
    apps_section = capture.section(state, "query-compute-apps")
    apps = (
        nvsmi.parse_csv(apps_section.lines, name, apps_section.first_line) if apps_section else None
    )
    listed = nvsmi.mig_profiles_listed(capture.section("capabilities", "list (-L)"))
    nvlink = nvsmi.nvlink_status(capture.section("capabilities", "nvlink -s"), name)
    gpus = []
    for index, (block, row) in enumerate(zip(log.gpus(), rows, strict=True)):
        bus = (row.get("pci.bus_id") or Field("", "")).text
        mine = None if apps is None else [a for a in apps if _cell(a, "gpu_bus_id") == bus]
        gpus.append(Reference(row, block, None, mine, listed.get(index, {}), nvlink.get(index)))
    driver = log.top("KMD Version") or log.top("Driver Version")
    cuda = log.top("CUDA UMD Version") or log.top("CUDA Version")
    return Recorded(name, state, driver, cuda, gpus)


def _cell(row: CsvGpu, name: str) -> str:
    found = row.get(name)
    return "" if found is None else found.text.strip()


# ---------------------------------------------------------------------------------------------
# Comparing


def parse_samples(text: str) -> Samples:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _series(samples: Samples, name: str, **labels: str) -> dict[Labels, float]:
    wanted = set(labels.items())
    return {
        key: value
        for (sample, key), value in samples.items()
        if sample == name and wanted <= set(key)
    }


def _number(value: float) -> str:
    return f"{value:g}"


class _Comparison:
    """Compares one GPU's series with its reference."""

    def __init__(self, report: Report, samples: Samples, gpu: int, reference: Reference) -> None:
        self.report = report
        self.samples = samples
        self.gpu = str(gpu)
        self.reference = reference

    def add(
        self,
        family: str,
        labels: Mapping[str, str],
        result: str,
        recorded: str,
        exported: str,
        where: str,
    ) -> None:
        shown = ",".join(f"{k}={v}" for k, v in sorted({"gpu": self.gpu, **labels}.items()))
        self.report.outcomes.append(Outcome(family, shown, result, recorded, exported, where))

    def exported(self, family: str, **labels: str) -> float | None:
        found = _series(self.samples, family, gpu=self.gpu, **labels)
        exact = {k: v for k, v in found.items() if len(k) == len(labels) + 2}  # + gpu, uuid
        values = list((exact or found).values())
        return values[0] if values else None

    def value(
        self,
        family: str,
        labels: Mapping[str, str],
        printed: Field | None,
        read: Callable[[Field], float],
    ) -> None:
        """Compare one series with one printed figure (or its N/A)."""
        if printed is None:
            self.report.skipped.setdefault(family, "not recorded in this file")
            return
        if printed.redacted:
            self.report.skipped.setdefault(family, "redacted in this file")
            return
        actual = self.exported(family, **labels)
        if printed.missing:
            result = ABSENT if actual is None else MISMATCH
            shown = "absent" if actual is None else _number(actual)
            self.add(family, labels, result, printed.text.strip(), shown, printed.where)
            return
        expected = read(printed)
        if actual is None:
            self.add(family, labels, MISMATCH, printed.text.strip(), "absent", printed.where)
            return
        converted = _TO_PRINTED[read](actual)
        result = EQUAL if abs(converted - expected) < 1e-9 else MISMATCH
        self.add(
            family,
            labels,
            result,
            printed.text.strip(),
            f"{_number(actual)} ({_number(converted)} as printed)",
            printed.where,
        )

    def run(self) -> None:
        reference = self.reference
        repairs = reference.get(
            "remapped_rows.correctable",
            "Remapped Rows/Correctable Error",
            "remapped_rows/remapped_row_corr",
        )
        for check in CHECKS:
            if check.family.startswith("gpu_retired_pages") and repairs and not repairs.missing:
                # The remapping collector reads retired pages only on GPUs without row remapping.
                self.report.skipped.setdefault(
                    check.family, "read by gpuload only on GPUs without row remapping"
                )
                continue
            self.value(check.family, dict(check.labels), reference.find(check), check.read)
        self.identity()
        self.power()
        self.reasons()
        self.ecc_errors()
        self.processes()
        self.mig()
        self.nvlink()

    def identity(self) -> None:
        reference = self.reference
        wanted = {
            "name": reference.get("name", "Product Name", "product_name"),
            "uuid": reference.get("uuid", "GPU UUID", "uuid"),
            "pci_bus_id": reference.get("pci.bus_id", "PCI/Bus Id", "pci/pci_bus_id"),
            "serial": reference.get("serial", "Serial Number", "serial"),
            "vbios_version": reference.get("vbios_version", "VBIOS Version", "vbios_version"),
        }
        info = _series(self.samples, "gpu_info", gpu=self.gpu)
        labels = dict(next(iter(info))) if info else {}
        for label, printed in wanted.items():
            # Redacted before the file was shared: the import leaves it unknown (the model's).
            if printed is None or printed.redacted:
                continue
            expected = "" if printed.missing else printed.text.strip()
            actual = labels.get(label)
            result = EQUAL if actual == expected else MISMATCH
            if printed.missing and actual == "":
                result = ABSENT
            self.add(
                "gpu_info",
                {"label": label},
                result,
                printed.text.strip(),
                "absent" if actual is None else repr(actual),
                printed.where,
            )

    def power(self) -> None:
        """The reference of gpu_power_usage_watts (nvmlDeviceGetPowerUsage).

        ``power.draw``; in reports without it, the 1 s average on Ampere (not GA100) and newer
        and the instant reading before (nvml-facts.md).
        """
        reference = self.reference
        printed = reference.get(
            "power.draw", "Power Readings/Power Draw", "power_readings/power_draw"
        )
        if printed is None:
            average = reference.get(
                None,
                "GPU Power Readings/Average Power Draw",
                "gpu_power_readings/average_power_draw",
            )
            instant = reference.get(
                None,
                "GPU Power Readings/Instantaneous Power Draw",
                "gpu_power_readings/instant_power_draw",
            )
            architecture = reference.get(None, "Product Architecture", "product_architecture")
            name = reference.get("name", "Product Name", "product_name")
            newer = architecture is not None and architecture.text.split(" ")[0].lower() in (
                "ampere",
                "ada",
                "hopper",
                "blackwell",
            )
            averaged = newer and name is not None and "A100" not in name.text
            printed = average if averaged else instant
        self.value("gpu_power_usage_watts", {}, printed, _watts)

    def reasons(self) -> None:
        from exporter.collectors.clocks import REASONS

        reference = self.reference
        mask = None
        if reference.csv is not None:
            mask = reference.csv.get(
                "clocks_event_reasons.active", "clocks_throttle_reasons.active"
            )
        bits: dict[str, Field] = {}
        if mask is not None and not mask.missing:
            active = mask.integer("clocks_event_reasons.active")
            for reason, bit in REASONS.items():
                bits[reason] = Field("Active" if active & bit else "Not Active", mask.where)
        elif mask is not None:
            bits = dict.fromkeys(REASONS, mask)
        elif reference.xml is not None:
            tags = {
                "applications_clocks": "applications_clocks_setting",
                "sw_thermal": "sw_thermal_slowdown",
                "hw_thermal": "hw_thermal_slowdown",
                "hw_power_brake": "hw_power_brake_slowdown",
                "display_clocks": "display_clocks_setting",
            }
            for reason in REASONS:
                tag = tags.get(reason, reason)
                found = reference.xml.get(
                    f"clocks_event_reasons/clocks_event_reason_{tag}",
                    f"clocks_throttle_reasons/clocks_throttle_reason_{tag}",
                )
                if found is not None:
                    bits[reason] = found
        if not bits:
            self.report.skipped.setdefault("gpu_clock_event_active", "not recorded in this file")
        for reason, printed in bits.items():
            self.value("gpu_clock_event_active", {"reason": reason}, printed, _switch)

    def ecc_errors(self) -> None:
        for kind in ("corrected", "uncorrected"):
            for counter in ("volatile", "aggregate"):
                printed = self._ecc_reference(kind, counter)
                self.value(
                    "gpu_ecc_errors_total", {"type": kind, "counter": counter}, printed, _count
                )

    def _ecc_reference(self, kind: str, counter: str) -> Field | None:
        reference = self.reference
        if reference.csv is not None:
            return reference.csv.get(f"ecc.errors.{kind}.{counter}.total")
        if reference.xml is None:
            return None
        parts = {
            "corrected": ("sram_correctable", "dram_correctable", "single_bit/total"),
            "uncorrected": (
                "sram_uncorrectable",
                "sram_uncorrectable_parity",
                "sram_uncorrectable_secded",
                "dram_uncorrectable",
                "double_bit/total",
            ),
        }[kind]
        found = [reference.xml.get(f"ecc_errors/{counter}/{part}") for part in parts]
        printed = [f for f in found if f is not None]
        values = [f for f in printed if not f.missing]
        if not values:
            return printed[0] if printed else None
        total = sum(f.integer("ECC count") for f in values)
        return Field(str(total), f"{values[0].where} (sum of the locations printed)")

    def processes(self) -> None:
        """``--query-compute-apps`` (captures) or the XML's compute processes (C, C+G)."""
        reference = self.reference
        listed: list[tuple[str, str, Field | None]]
        if reference.apps is not None:
            listed = [
                (_cell(a, "pid"), _cell(a, "process_name"), a.get("used_gpu_memory"))
                for a in reference.apps
            ]
            where = reference.apps[0].where if reference.apps else "query-compute-apps (empty)"
        elif reference.xml is not None:
            listed = []
            for info in reference.xml.children("processes"):
                kind = info.get("type")
                if kind is not None and "C" in kind.text.upper():
                    pid, command = info.get("pid"), info.get("process_name")
                    listed.append(
                        (
                            pid.text.strip() if pid else "",
                            command.text.strip() if command else "",
                            info.get("used_memory"),
                        )
                    )
            where = f"{reference.xml.where}/processes"
        else:
            self.report.skipped.setdefault("gpu_processes", "not recorded in this file")
            return
        self.value("gpu_processes", {}, Field(str(len(listed)), where), _count)
        for number, process, memory in listed:
            labels = {"pid": number, "process": process}
            self.value("gpu_process_memory_used_bytes", labels, memory, _mib)

    def mig(self) -> None:
        reference = self.reference
        devices = []
        if reference.text is not None:
            for node in reference.text.node.children:
                if " ".join(node.key.split()).lower() == "mig device":
                    devices.append(TextGpu(node, reference.text.name))
        if not devices:
            for family in (
                "gpu_mig_memory_used_bytes",
                "gpu_mig_memory_total_bytes",
                "gpu_mig_multiprocessors",
            ):
                found = _series(self.samples, family, gpu=self.gpu)
                if found:
                    self.add(
                        family,
                        {},
                        MISMATCH,
                        "no MIG device",
                        f"{len(found)} series",
                        "the recording",
                    )
                else:
                    self.report.skipped.setdefault(family, "no MIG devices recorded")
            return
        seen: set[str] = set()
        for device in devices:
            index = (device.get("Index") or Field("-1", "")).integer("index")
            instance = (device.get("GPU Instance ID") or Field("", "")).text.strip()
            compute = (device.get("Compute Instance ID") or Field("", "")).text.strip()
            profile = reference.listed.get(index, "")
            instance_profile = re.sub(r"^\d+c\.", "", profile)
            labels = {
                "mig_instance": instance,
                "mig_compute_instance": compute,
                "mig_profile": profile,
            }
            self.value(
                "gpu_mig_multiprocessors",
                labels,
                device.get("Device Attributes/Shared/Multiprocessor count"),
                _count,
            )
            if instance in seen:
                continue  # memory is the GPU instance's, exported once
            seen.add(instance)
            labels = {"mig_instance": instance, "mig_profile": instance_profile}
            self.value(
                "gpu_mig_memory_used_bytes", labels, device.get("Shared FB Memory Usage/Used"), _mib
            )
            self.value(
                "gpu_mig_memory_total_bytes",
                labels,
                device.get("Shared FB Memory Usage/Total"),
                _mib,
            )

    def nvlink(self) -> None:
        record = self.reference.nvlink
        family = "gpu_nvlink_link_up"
        if record is None:
            self.report.skipped.setdefault(family, "nvidia-smi nvlink -s not recorded")
            return
        if not record.links:
            note = record.note.lower()
            if "inactive" in note:
                self.report.skipped.setdefault(family, f"link count not recorded ({record.note})")
                return
            found = _series(self.samples, family, gpu=self.gpu)
            result = MISMATCH if found else ABSENT
            self.add(
                family,
                {},
                result,
                record.note,
                f"{len(found)} series" if found else "absent",
                record.where,
            )
            return
        for link, up in enumerate(record.links):
            printed = Field("Active" if up else "Not Active", record.where)
            self.value(family, {"link": str(link)}, printed, _switch)


def compare(recorded: Recorded, samples: Samples) -> Report:
    """Compare a scrape of gpuload on the imported recording with the recording itself."""
    report = Report(recorded.name, recorded.state)
    for index, reference in enumerate(recorded.gpus):
        _Comparison(report, samples, index, reference).run()
    _driver(report, recorded, samples)
    report.collectors = {
        dict(labels)["collector"]: value
        for labels, value in _series(samples, "gpuload_collector_success").items()
    }
    for family in NOT_COMPARED:
        report.skipped.setdefault(family, NOT_COMPARED[family])
    decided = {o.family for o in report.outcomes} | set(report.skipped)
    exported = {name for name, _ in samples if name.startswith("gpu_")}
    report.unclassified = sorted(exported - decided)
    return report


def _driver(report: Report, recorded: Recorded, samples: Samples) -> None:
    info = _series(samples, "gpuload_driver_info")
    labels = dict(next(iter(info))) if info else {}
    wanted = {"driver_version": recorded.driver, "cuda_driver_version": recorded.cuda}
    for label, printed in wanted.items():
        if printed is None:
            continue
        expected = printed.text.split("[")[0].strip()
        actual = labels.get(label)
        result = EQUAL if actual == expected else MISMATCH
        report.outcomes.append(
            Outcome(
                "gpuload_driver_info",
                f"label={label}",
                result,
                expected,
                "absent" if actual is None else repr(actual),
                printed.where,
            )
        )


# ---------------------------------------------------------------------------------------------
# Running gpuload on a recording


def scrape(scenario: Path, at: float = PINNED_TIME, timeout: float = 60.0) -> str:
    """Start the real ``gpuload serve --simulate SCENARIO --sim.time AT``, return ``/metrics``."""
    command = [
        sys.executable,
        "-m",
        "exporter",
        "serve",
        "--web.listen-address",
        "127.0.0.1:0",
        "--simulate",
        str(scenario),
        "--sim.time",
        f"{at:g}",
    ]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    environment |= EVERYTHING
    process = subprocess.Popen(
        command, env=environment, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    try:
        url = listening_url(process, timeout)
        deadline = time.monotonic() + timeout
        while not _ready(url):
            if time.monotonic() > deadline:
                raise RuntimeError(f"gpuload serve was not ready in {timeout:g} s")
            time.sleep(0.05)
        with urllib.request.urlopen(f"{url}metrics", timeout=timeout) as response:
            return str(response.read().decode())
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}readyz", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def recordings(directory: Path) -> Iterator[tuple[Path, str | None]]:
    """Every recorded file under ``directory``: each capture once per state, each XML once."""
    for path in sorted(directory.rglob("*")):
        if not path.is_file() or path.name.startswith((".", "LICENSE", "README")):
            continue
        if path.suffix == ".xml":
            yield path, None
        elif path.suffix == ".txt":
            capture = nvsmi.parse_capture(nvsmi.read_lines(path), str(path))
            for state in capture.states():
                if capture.section(state, "query (-q)") and capture.section(state, "query-gpu"):
                    yield path, state


def check_recording(path: Path, state: str | None, workdir: Path) -> Report:
    """Import ``path``, run gpuload on it, compare: the whole conformance of one recording."""
    imported = importer.import_file(path, state or "load")
    scenario = workdir / f"{path.stem}-{state or 'xml'}.yaml"
    scenario.write_text(importer.render(imported), encoding="utf-8")
    samples = parse_samples(scrape(scenario))
    return compare(read_reference(path, state), samples)


def table(reports: Sequence[Report]) -> str:
    """The Markdown table: per recorded machine, what was compared and how it came out."""
    lines = [
        "| recorded machine | families compared | series compared | equal | absent as expected "
        "| mismatches |",
        "|---|---|---|---|---|---|",
    ]
    for report in reports:
        lines.append(
            f"| `{report.title}` | {len(report.families)} | {len(report.outcomes)} | "
            f"{report.count(EQUAL)} | {report.count(ABSENT)} | {report.count(MISMATCH)} |"
        )
    return "\n".join(lines)


def families_table(reports: Sequence[Report]) -> str:
    """Which families were compared for which recording.

    ``=`` equal, ``-`` absent as expected, ``x`` mismatch, blank: not recorded.
    """
    names = sorted({o.family for r in reports for o in r.outcomes})
    lines = [
        "| family | " + " | ".join(f"{i + 1}" for i in range(len(reports))) + " |",
        "|---|" + "---|" * len(reports),
    ]
    for name in names:
        cells = []
        for report in reports:
            results = {o.result for o in report.outcomes if o.family == name}
            cell = (
                "x"
                if MISMATCH in results
                else "="
                if EQUAL in results
                else ("-" if results else "")
            )
            cells.append(cell)
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    key = "; ".join(f"{i + 1}: `{r.title}`" for i, r in enumerate(reports))
    return "\n".join(lines) + f"\n\nColumns: {key}."


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.conformance DIR``: the table, and every mismatch."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.conformance",
        description="Import every recording under DIR, run gpuload serve --simulate on it and "
        "compare /metrics with what nvidia-smi printed.",
    )
    parser.add_argument("directory", type=Path, help="e.g. ../shared/reality")
    parser.add_argument("--families", action="store_true", help="also print which families")
    args = parser.parse_args(argv)
    return run(args.directory, families=args.families)


def run(directory: Path, *, families: bool = False) -> int:
    """Print the conformance table of ``directory``; 1 when a series mismatches, 2 on errors."""
    if not directory.is_dir():
        print(f"conformance: {directory}: no such directory of recordings", file=sys.stderr)
        return 2
    reports = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpuload-conformance-") as workdir:
            for path, state in recordings(directory):
                reports.append(check_recording(path, state, Path(workdir)))
    except RecordingError as error:
        print(f"conformance: {error}", file=sys.stderr)
        return 2
    print(table(reports))
    if families:
        print()
        print(families_table(reports))
    failed = [o.describe(r.title) for r in reports for o in r.mismatches]
    for line in failed:
        print(f"mismatch: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
