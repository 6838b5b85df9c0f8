"""`gpuload sim import`: scenarios from what nvidia-smi printed.

XML, -q text, --query-gpu CSV and capture bundles, on every recorded machine in
../shared/reality and on hand-made bad files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
import yaml
from helpers import ROOT

from exporter import cli, sim
from exporter.sim import FUNCTION_NAMES, importer
from exporter.sim.importer import fit_memory
from exporter.sim.nvsmi import RecordingError
from exporter.sim.scenario import parse_scenario
from tools.conformance import recordings

REALITY = ROOT.parent / "shared" / "reality"
NEEDS_REALITY = pytest.mark.skipif(
    not REALITY.is_dir(), reason="needs ../shared/reality (the recorded machines); not present"
)
# Without the recordings, one placeholder case, skipped with NEEDS_REALITY's reason.
RECORDED = list(recordings(REALITY)) if REALITY.is_dir() else [(REALITY, None)]
H100 = REALITY / "captures" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H200 = REALITY / "captures" / "linux-x86_64__nvidia-h200-mig__590.48.01.txt"
T4 = REALITY / "nvidia-smi-xml" / "tesla-t4.xml"


@pytest.fixture
def installed() -> Iterator[None]:
    yield
    sim.uninstall()


def _load(imported: importer.Imported) -> sim.Scenario:
    """The rendered YAML, read back the way --simulate reads it."""
    return parse_scenario(yaml.safe_load(importer.render(imported)))


def _install(tmp_path: Path, imported: importer.Imported) -> None:
    path = tmp_path / "imported.yaml"
    path.write_text(importer.render(imported), encoding="utf-8")
    sim.install(path, epoch=0, pinned_time=60)
    pynvml.nvmlInit()


def _import(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["sim", "import", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------
# Every recorded machine


@NEEDS_REALITY
@pytest.mark.parametrize(
    ("path", "state"), RECORDED, ids=[f"{p.name}:{s or 'xml'}" for p, s in RECORDED]
)
def test_every_recorded_file_imports_as_a_scenario_with_the_recorded_gpu(
    path: Path, state: str | None
) -> None:
    imported = importer.import_file(path, state or "load")
    scenario = _load(imported)
    # The -q report's `    Product Name   : ...` lines, or the XML's <product_name>.
    pattern = r"^ +Product Name +: (.+)$|<product_name>(.+)</product_name>"
    printed = {a or b for a, b in re.findall(pattern, path.read_text(), re.MULTILINE)}
    assert {gpu.model.name for gpu in scenario.gpus} == printed
    # Values that move are constants at the recorded value: nothing is noisy.
    for gpu in scenario.gpus:
        for phase in gpu.timeline.phases:
            noisy = {metric for metric, spec in phase.specs.items() if spec.noise}
            assert not noisy, noisy
            assert all(spec.pattern == "constant" for spec in phase.specs.values())


@NEEDS_REALITY
def test_a_capture_gives_the_state_asked_for() -> None:
    idle = _load(importer.import_file(H100, "idle")).gpus[0].timeline.phases[0].specs
    load = _load(importer.import_file(H100, "load")).gpus[0].timeline.phases[0].specs
    assert (idle["utilization"].low, load["utilization"].low) == (0.0, 1.0)
    # The query-gpu CSV of the state: 69.85 W idle, 631.95 W under load (-q printed 629.45 W).
    assert (idle["power"].low, load["power"].low) == (69.85, 631.95)


@NEEDS_REALITY
def test_na_answers_not_supported_and_values_are_the_recorded_ones(
    tmp_path: Path, installed: None
) -> None:
    _install(tmp_path, importer.import_file(T4))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    # <fan_speed>N/A</fan_speed>, <memory_temp>N/A</memory_temp>, <remapped_rows>N/A</...>.
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle)
    [memory_temperature] = pynvml.nvmlDeviceGetFieldValues(handle, [82])
    assert memory_temperature.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == 0
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 26780
    assert pynvml.nvmlDeviceGetUUID(handle) == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle) == 8
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert round(memory.used / 2**20) == 1032
    assert pynvml.nvmlDeviceGetBAR1MemoryInfo(handle).bar1Used == 5 * 2**20
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in processes] == [(5762, 1005 * 2**20)]
    [xorg] = pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
    assert (xorg.pid, pynvml.nvmlSystemGetProcessName(xorg.pid)) == (675, "/usr/lib/xorg/Xorg")


@NEEDS_REALITY
def test_mig_instances_keep_their_ids_profiles_memory_and_processes(
    tmp_path: Path, installed: None
) -> None:
    _install(tmp_path, importer.import_file(H200, "load"))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    devices = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue
        used = pynvml.nvmlDeviceGetMemoryInfo(mig).used
        devices.append(
            (
                pynvml.nvmlDeviceGetGpuInstanceId(mig),
                pynvml.nvmlDeviceGetComputeInstanceId(mig),
                pynvml.nvmlDeviceGetName(mig),
                round(used / 2**20),
            )
        )
    # nvidia-smi -L and -q of the recorded H200 (load).
    assert devices == [
        (2, 0, "NVIDIA H200 MIG 1c.3g.71gb", 16925),
        (2, 1, "NVIDIA H200 MIG 2c.3g.71gb", 16925),
        (3, 0, "NVIDIA H200 MIG 2g.35gb", 17),
        (9, 0, "NVIDIA H200 MIG 1g.18gb", 9),
        (10, 0, "NVIDIA H200 MIG 1g.18gb", 9),
    ]
    # The instances' rounded figures add up to 16960 MiB; the GPU printed 16959 MiB.
    whole = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert round(whole.used / 2**20) == 16959
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert sorted((p.pid, p.gpuInstanceId, p.computeInstanceId) for p in processes) == [
        (12249, 2, 1),
        (12250, 2, 1),
        (12267, 2, 1),
    ]


# An H100 in MIG mode as nvidia-smi -q -x prints it (<mig_device> as nvsmi_device_v12.dtd
# names its elements): two 3g instances whose memory is not the profile table's share.
MIG_XML = """<?xml version="1.0" ?>
<nvidia_smi_log>
  <driver_version>575.57.08</driver_version>
  <cuda_version>12.9</cuda_version>
  <gpu id="00000000:00:09.0">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <uuid>GPU-5b1f6e0a-8c3d-4e2f-9a7b-1c2d3e4f5a6b</uuid>
    <mig_mode><current_mig>Enabled</current_mig><pending_mig>Enabled</pending_mig></mig_mode>
    <mig_devices>
      <mig_device>
        <index>0</index><gpu_instance_id>1</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <device_attributes><shared><multiprocessor_count>48</multiprocessor_count></shared>
        </device_attributes>
        <fb_memory_usage><total>40192 MiB</total><used>1000 MiB</used></fb_memory_usage>
      </mig_device>
      <mig_device>
        <index>1</index><gpu_instance_id>2</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <device_attributes><shared><multiprocessor_count>48</multiprocessor_count></shared>
        </device_attributes>
        <fb_memory_usage><total>40192 MiB</total><used>0 MiB</used></fb_memory_usage>
      </mig_device>
    </mig_devices>
    <fb_memory_usage><total>81559 MiB</total><reserved>479 MiB</reserved></fb_memory_usage>
    <processes>
      <process_info>
        <gpu_instance_id>1</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <pid>4242</pid><type>C</type><process_name>python</process_name>
        <used_memory>990 MiB</used_memory>
      </process_info>
    </processes>
  </gpu>
</nvidia_smi_log>
"""


def test_mig_devices_of_an_xml_report_become_gpu_instances(tmp_path: Path, installed: None) -> None:
    recording = tmp_path / "h100-mig.xml"
    recording.write_text(MIG_XML)
    imported = importer.import_file(recording)
    [gpu] = imported.document["gpus"]
    assert [(m["profile"], m["gpu_instance_id"], m["memory_total"]) for m in gpu["mig"]] == [
        ("3g.40gb", 1, "40192MiB"),
        ("3g.40gb", 2, "40192MiB"),
    ]
    _install(tmp_path, imported)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    memory = pynvml.nvmlDeviceGetMemoryInfo(first)
    assert (memory.total, memory.used) == (40192 * 2**20, 1000 * 2**20)
    [process] = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (process.pid, process.gpuInstanceId, process.usedGpuMemory) == (4242, 1, 990 * 2**20)


# The same GPU as a user attaches it to a bug report: ids, UUID and serial blanked out.
REDACTED_XML = (
    MIG_XML.replace("GPU-5b1f6e0a-8c3d-4e2f-9a7b-1c2d3e4f5a6b", "[REDACTED]")
    .replace("<product_name>", "<serial>xxxxxxxxxxxx</serial><product_name>")
    .replace(
        "<mig_mode>",
        "<pci><pci_device_id>[REDACTED]</pci_device_id><pci_bus_id>00000000:00:09.0</pci_bus_id>"
        "</pci><mig_mode>",
    )
)


def test_redacted_values_are_unknown_with_a_note_and_the_rest_is_imported(tmp_path: Path) -> None:
    recording = tmp_path / "redacted.xml"
    recording.write_text(REDACTED_XML)
    imported = importer.import_file(recording)
    [gpu] = imported.document["gpus"]
    assert "uuid" not in gpu and "serial" not in gpu and "pci_device_id" not in gpu
    assert gpu["model"] == "h100-sxm"  # from the product name, the device id being unknown
    assert [m["gpu_instance_id"] for m in gpu["mig"]] == [1, 2]
    redacted = [note for note in imported.notes if "is redacted" in note]
    assert len(redacted) == 3, imported.notes
    assert any("pci_device_id is redacted ('[REDACTED]')" in note for note in redacted)
    # A value that is neither redacted nor readable is still refused.
    recording.write_text(REDACTED_XML.replace("[REDACTED]</pci_device_id>", "zz</pci_device_id>"))
    with pytest.raises(RecordingError, match="expected a hexadecimal id"):
        importer.import_file(recording)


@NEEDS_REALITY
def test_functions_missing_from_the_symbol_list_answer_function_not_found(
    tmp_path: Path, installed: None
) -> None:
    stripped = {"nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2"}
    capture = tmp_path / H100.name
    lines = [line for line in H100.read_text().splitlines() if line.strip() not in stripped]
    capture.write_text("\n".join(lines) + "\n")
    imported = importer.import_file(capture, "load")
    assert set(imported.document["driver"]["lacks"]) == stripped
    # The recorded library exports every function the simulator models.
    assert "lacks" not in importer.import_file(H100, "load").document["driver"]
    _install(tmp_path, imported)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 59
    assert stripped <= FUNCTION_NAMES


# ---------------------------------------------------------------------------------------------
# The other formats and the command


@NEEDS_REALITY
def test_the_q_text_report_alone_imports_like_the_capture_it_came_from(tmp_path: Path) -> None:
    lines = H100.read_text().splitlines()
    start = lines.index("# load :: query (-q)") + 3
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("#####"))
    report = tmp_path / "nvidia-smi-q.txt"
    report.write_text("\n".join(lines[start:end]) + "\n")
    text = importer.import_file(report).document["gpus"][0]
    capture = importer.import_file(H100, "load").document["gpus"][0]
    for key in ("name", "memory_total", "bar1_total", "power_limit", "max_video_clock"):
        assert text[key] == capture[key], key
    # -q printed 629.45 W; the capture's query-gpu CSV, taken moments later, 631.95 W.
    assert text["overrides"]["power"] == "629.45W"


def test_a_standalone_query_gpu_csv_imports(tmp_path: Path) -> None:
    table = tmp_path / "query-gpu.csv"
    table.write_text(
        "name, uuid, driver_version, memory.total [MiB], fan.speed [%], temperature.gpu\n"
        "Tesla T4, GPU-d37e67a5-91dd-3774-a5cb-99096249601a, 515.105.01, 15360 MiB, [N/A], 40\n"
    )
    scenario = _load(importer.import_file(table))
    gpu = scenario.gpus[0]
    assert (gpu.model.name, gpu.model.memory_total, gpu.model.fans) == ("Tesla T4", 15360 << 20, 0)
    assert gpu.timeline.phases[0].specs["temperature"].low == 40


@NEEDS_REALITY
def test_import_writes_yaml_that_simulate_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "t4.yaml"
    code, out, err = _import([str(T4), "-o", str(output)], capsys)
    assert (code, out, err) == (0, "", "")
    assert sim.load_scenario(output).gpus[0].model.name == "Tesla T4"
    code, out, _ = _import([str(T4)], capsys)
    assert code == 0 and out == output.read_text()


@NEEDS_REALITY
def test_an_unknown_field_is_ignored_and_listed_with_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = tmp_path / "t4-newer-driver.xml"
    extra = "<frobnication_level>11</frobnication_level>"
    recording.write_text(T4.read_text().replace("<fan_speed>", f"{extra}\n<fan_speed>"))
    code, out, err = _import([str(recording)], capsys)
    assert code == 0 and "frobnication" not in err and out.startswith("# Imported")
    code, _, err = _import([str(recording), "--verbose"], capsys)
    assert code == 0
    assert f"ignored: {recording}: <gpu id='00000000:00:1E.0'>: frobnication_level" in err


@NEEDS_REALITY
def test_insufficient_permissions_answers_no_permission(tmp_path: Path, installed: None) -> None:
    recording = tmp_path / "t4-unprivileged.xml"
    text = T4.read_text().replace(
        "<serial>0000000000000</serial>", "<serial>Insufficient Permissions</serial>"
    )
    recording.write_text(text)
    _install(tmp_path, importer.import_file(recording))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetSerial(pynvml.nvmlDeviceGetHandleByIndex(0))


def _capture_with_broken_csv(tmp_path: Path) -> tuple[Path, int]:
    lines = H100.read_text().splitlines()
    header = lines.index("# load :: query-gpu (csv, what the exporter parses)") + 3
    row = header + 1
    lines[row] = lines[row].rsplit(", ", 2)[0]  # the last two cells lost
    capture = tmp_path / "cut.txt"
    capture.write_text("\n".join(lines) + "\n")
    return capture, row + 1


@NEEDS_REALITY
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("truncated.xml", r"truncated\.xml:\d+: malformed XML at column \d+ .*nvidia-smi -q -x"),
        ("cut.txt", r"cut\.txt:{row}: CSV row has \d+ columns: expected \d+, as the header"),
        ("missing.xml", r"missing\.xml: cannot read: No such file or directory"),
        (
            "bad-fan.xml",
            r"bad-fan\.xml: <gpu id='00000000:00:1E\.0'>/fan_speed: fan speed 'lots'"
            r": expected a number of % like '12 %'",
        ),
        ("README.md", r"README\.md:1: not a recognised nvidia-smi output"),
    ],
)
def test_a_bad_file_gets_one_line_naming_the_file_the_place_and_what_was_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str
) -> None:
    path = tmp_path / case
    if case == "truncated.xml":
        path.write_text(T4.read_text()[:3000])
    elif case == "cut.txt":
        path, row = _capture_with_broken_csv(tmp_path)
        expected = expected.format(row=row)
    elif case == "bad-fan.xml":
        path.write_text(
            T4.read_text().replace("<fan_speed>N/A</fan_speed>", "<fan_speed>lots</fan_speed>")
        )
    elif case == "README.md":
        path = REALITY / "README.md"
    code, out, err = _import([str(path)], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.fullmatch(f"gpuload sim import: .*{expected}.*\n", err), err


@NEEDS_REALITY
def test_a_capture_without_the_state_says_which_states_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = H100.read_text().splitlines()
    kept = lines[: lines.index("# load :: nvidia-smi (default table)") - 1]
    capture = tmp_path / "idle-only.txt"
    capture.write_text("\n".join(kept) + "\n")
    code, _, err = _import([str(capture), "--state", "load"], capsys)
    assert code == 2
    assert "no '# load :: query (-q)' section" in err and "states recorded: idle" in err


# ---------------------------------------------------------------------------------------------
# What the import relies on


@pytest.mark.parametrize(
    ("printed", "fits"),
    [
        # The recorded H100, idle: 81559 = 479 + 0 + 81081 - 1 MiB.
        ((81559, 479, 0, 81081), True),
        ((46068, 609, 1235, 44225), True),  # L40S under load: adds up
        ((23028, 435, 22, 22569), False),  # a10g.xml: 2 MiB apart, more than rounding
    ],
)
def test_memory_is_placed_so_every_printed_figure_rounds_back(
    printed: tuple[int, int, int, int], fits: bool
) -> None:
    total, reserved, used, free = printed
    steps = fit_memory(total, reserved, used, free)
    assert steps[3] is fits
    t, r, u = (value / 16 for value in steps[:3])  # 1/16 MiB steps
    assert (round(t), round(r), round(u)) == (total, reserved, used)
    assert (round(t - r - u) == free) is fits
    if not fits:
        assert (t, r, u) == (total, reserved, used)  # as printed; free is set on its own


def test_has_takes_a_feature_off_the_model_and_ecc_can_be_off(installed: None) -> None:
    document = {
        "driver": {"version": "590.48.01", "cuda_version": 13010},
        "gpus": [
            # The recorded H100 reports encoder utilization 0 %: the model says none.
            {
                "model": "h100-sxm",
                "has": ["encoder", "retired_pages"],
                "ecc_enabled": False,
                "pcie_replays": 9,
                "overrides": {"bar1_used": "1MiB", "memory_free": "100MiB"},
            },
            {"model": "h100-sxm"},
        ],
        "phases": [{"duration": 60}],
    }
    scenario = parse_scenario(document)
    assert "encoder" not in scenario.gpus[0].lacks and "encoder" in scenario.gpus[1].lacks
    assert "retired_pages" not in scenario.gpus[0].lacks
    sim.install(scenario, epoch=0, pinned_time=10)
    pynvml.nvmlInit()
    changed, plain = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert pynvml.nvmlDeviceGetEncoderUtilization(changed)[0] == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEncoderUtilization(plain)
    assert pynvml.nvmlDeviceGetEccMode(changed) == [0, 0]
    assert pynvml.nvmlDeviceGetEccMode(plain) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEccErrors(changed, 0, 0)
    assert pynvml.nvmlDeviceGetPcieReplayCounter(changed) == 9
    assert pynvml.nvmlDeviceGetBAR1MemoryInfo(changed).bar1Used == 2**20
    assert pynvml.nvmlDeviceGetBAR1MemoryInfo(plain).bar1Used == 2 * 2**20  # 2 MiB, no process
    memory = pynvml.nvmlDeviceGetMemoryInfo(changed, version=pynvml.nvmlMemory_v2)
    assert memory.free == 100 * 2**20
    plain_memory = pynvml.nvmlDeviceGetMemoryInfo(plain, version=pynvml.nvmlMemory_v2)
    assert plain_memory.free == plain_memory.total - plain_memory.reserved - plain_memory.used


def test_a_feature_both_had_and_lacked_is_an_error() -> None:
    document = {
        "driver": {"version": "590.48.01", "cuda_version": 13010},
        "gpus": [{"model": "h100-sxm", "has": ["encoder"], "lacks": ["encoder"]}],
        "phases": [{"duration": 60}],
    }
    with pytest.raises(sim.ScenarioError, match=r"gpus\[0\]\.has: encoder also listed"):
        parse_scenario(document)


def test_a_bad_state_is_refused() -> None:
    with pytest.raises(RecordingError, match="--state busy: expected one of idle, load"):
        importer.import_file(T4, "busy")
