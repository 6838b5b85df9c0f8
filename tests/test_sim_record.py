"""`gpuload sim record` round-trips: a recorded simulated node serves the scenario's /metrics.

Each round trip records a shipped scenario through the simulator, as a user records a real node
(``gpuload sim exec --simulate S -- gpuload sim record -o FILE``; the child gets the simulator
through sitecustomize), then serves the scenario and the recording with the clock pinned at the
moment recorded and compares the two /metrics, series by series:

- Every series (name and labels) must be in both, after the identifiers in the scenario's output
  are masked as the recorder masks them (uuid, serial and process labels, by the recorder's own
  functions), so that a wrong or missing mask fails too.
- Every value must be equal (fractions to the recording's six decimals), except in COUNTS:
  - counts since the driver was loaded or over the GPU's life (energy, NVLink bytes, ECC
    errors, PCIe replays, NVLink errors): the scenario format holds per-hour rates from its
    start, not counts, so a recording cannot give them back (PCIe replays: the count recorded,
    without the rate that moves the scenario's on; the test of recorded keys compares it);
  - gpuload_nvml_errors_total, the daemon's own count of failed reads: it grows each cycle
    while a fault lasts (and a recorded fault lasts for ever), so two daemons differ by how
    many cycles each ran.
  The moving values (utilization, memory, power, temperatures, clocks, GPM) are compared
  exactly: recorded at the pinned moment, they are what the scenario serves at that moment.
  One is derived rather than held: the simulator splits a GPU's utilization evenly across its
  processes, so gpu_process_sm_utilization_ratio of a GPU with several processes comes from the
  recorded utilization, a whole percent as NVML gives it, and may round differently by 0.01.
- The families that differ between two runs of one pinned scenario are left out, as in the
  golden files (NON_DETERMINISTIC in tools/golden.py: timestamps, durations, the process's own
  resource use, PCIe byte counters integrated over wall-clock time).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, Daemon, parse_metrics

from exporter.sim.recording import masked_process_name, masked_serial, masked_uuid
from tools.golden import NON_DETERMINISTIC

SEED = "7"
COUNTS = re.compile(
    r"^(gpu_energy_consumption_joules_total|gpu_nvlink_(link_)?(transmit|receive)_bytes_total"
    r"|gpu_ecc_errors_total|gpu_pcie_replay_errors_total"
    r"|gpu_nvlink_(link_)?(replay|recovery|crc)_errors_total|gpuload_nvml_errors_total)$"
)
# Labels that carry the identifiers the recorder masks, and how it masks them.
MASKED_LABELS: dict[str, Callable[[dict[str, str], str], str]] = {
    "uuid": lambda labels, value: masked_uuid(int(labels["gpu"])) if value else value,
    "serial": lambda labels, value: masked_serial(int(labels["gpu"])) if value else value,
    "process": lambda labels, value: value if value == "(other)" else masked_process_name(value),
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def record(
    scenario: str, output: Path, at: float, *flags: str, caller: str = "", code: int = 0
) -> subprocess.CompletedProcess[str]:
    """``gpuload sim record`` run inside ``gpuload sim exec`` on a shipped scenario."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    command = [
        *(sys.executable, "-m", "exporter", "sim", "exec", "--scenario", scenario),
        *("--time", str(at), "--seed", SEED, *(("--caller", caller) if caller else ()), "--"),
        *(sys.executable, "-m", "exporter", "sim", "record", "-o", str(output), *flags),
    ]
    result = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == code, result.stdout + result.stderr
    return result


def compared(text: str) -> Samples:
    """The samples of a scrape that two daemons on one pinned scenario agree on."""
    return {
        key: value
        for key, value in parse_metrics(text).items()
        if not NON_DETERMINISTIC.match(key[0])
    }


def settled(daemon: Daemon) -> Samples:
    """Scrape until three scrapes in a row agree, apart from COUNTS: every cycle's reads seen."""
    previous: Samples = {}
    agreeing = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        samples = compared(daemon.get("/metrics").text)
        steady = {key: value for key, value in samples.items() if not COUNTS.match(key[0])}
        agreeing = agreeing + 1 if previous and steady == previous else 0
        if agreeing == 2:
            return samples
        previous = steady
        time.sleep(0.3)
    raise AssertionError(f"/metrics did not settle:\n{daemon.log()}")


def scrape(
    daemon_factory: Callable[..., Daemon], scenario: str | Path, at: float, *flags: str
) -> Samples:
    """/metrics of ``gpuload serve`` on ``scenario`` pinned at ``at``, settled, parsed."""
    daemon = daemon_factory(
        *("--simulate", str(scenario), "--sim.time", str(at), "--sim.seed", SEED),
        *("--collect.interval", "200ms", "--metrics.profile", "full", *flags),
    )
    return settled(daemon)


def masked(samples: Samples) -> Samples:
    """``samples`` with the identifiers in their labels masked as the recorder masks them."""
    result = {}
    for (name, labels), value in samples.items():
        named = dict(labels)
        for label, mask in MASKED_LABELS.items():
            if label in named:
                named[label] = mask(named, named[label])
        result[(name, tuple(sorted(named.items())))] = value
    return result


def differences(expected: Samples, actual: Samples) -> list[str]:
    """What differs between two scrapes: missing or extra series, values outside COUNTS."""
    problems = [f"missing: {key}" for key in sorted(expected.keys() - actual.keys())]
    problems += [f"extra: {key}" for key in sorted(actual.keys() - expected.keys())]
    for key in sorted(expected.keys() & actual.keys()):
        if COUNTS.match(key[0]):
            continue
        tolerance = 0.01 if key[0] == "gpu_process_sm_utilization_ratio" else 1e-6
        if not math.isclose(expected[key], actual[key], rel_tol=1e-9, abs_tol=tolerance):
            problems.append(f"{key}: scenario {expected[key]!r}, recording {actual[key]!r}")
    return problems


def round_trip(
    daemon_factory: Callable[..., Daemon],
    tmp_path: Path,
    scenario: str,
    at: float,
    caller: str = "",
) -> tuple[Samples, Samples, Path]:
    """Record ``scenario`` at ``at``; the masked scrape of the scenario and the recording's."""
    recording = tmp_path / f"recorded-{scenario}.yaml"
    record(scenario, recording, at, caller=caller)
    flags = ("--sim.caller", caller) if caller else ()
    original = masked(scrape(daemon_factory, scenario, at, *flags))
    replayed = scrape(daemon_factory, recording, at)
    return original, replayed, recording


@pytest.mark.parametrize(
    ("scenario", "at"),
    [
        ("h100-mig", 300),
        ("training", 300),
        ("legacy-v100", 300),  # driver 470: functions it lacks, no v2 memory, retired pages, XID
        ("mixed", 600),  # six models on driver 525, a fan, graphics processes
        ("h200-mig", 300),  # a GPU instance split into compute instances
    ],
)
def test_recording_a_simulated_node_serves_the_same_metrics(
    daemon_factory: Callable[..., Daemon], tmp_path: Path, scenario: str, at: float
) -> None:
    original, replayed, recording = round_trip(daemon_factory, tmp_path, scenario, at)
    problems = differences(original, replayed)
    assert not problems, "\n".join(problems) + "\n\n" + recording.read_text()
    # Not vacuous: the scrape has the GPUs, and values outside COUNTS were compared.
    assert any(name == "gpu_info" for name, _ in original)
    assert sum(not COUNTS.match(name) for name, _ in original) > 100


def test_the_comparison_sees_a_wrong_recorded_value(
    daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The recording of h100-mig with one static value changed no longer serves the same.
    recording = tmp_path / "recorded.yaml"
    record("h100-mig", recording, 300)
    document = yaml.safe_load(recording.read_text())
    document["gpus"][1]["max_sm_clock"] = 1755
    recording.write_text(yaml.safe_dump(document))
    original = masked(scrape(daemon_factory, "h100-mig", 300))
    problems = differences(original, scrape(daemon_factory, recording, 300))
    key = ("gpu_clock_max_hertz", (("clock", "sm"), ("gpu", "1"), ("uuid", masked_uuid(1))))
    assert problems == [f"{key}: scenario 1980000000.0, recording 1755000000.0"]


def test_masking_hides_uuids_and_serials_and_no_mask_keeps_them(tmp_path: Path) -> None:
    from exporter.sim import load_scenario
    from exporter.sim.device import SimulatedGpu

    scenario = load_scenario("training")
    real = [SimulatedGpu(gpu, int(SEED), 0.0, ()) for gpu in scenario.gpus]
    masked_file, kept_file = tmp_path / "masked.yaml", tmp_path / "kept.yaml"
    result = record("training", masked_file, 0)
    record("training", kept_file, 0, "--no-mask")
    masked_text, kept_text = masked_file.read_text(), kept_file.read_text()
    for gpu in real:
        assert gpu.uuid not in masked_text and gpu.serial not in masked_text
        assert gpu.uuid in kept_text and gpu.serial in kept_text
    masked_gpus = yaml.safe_load(masked_text)["gpus"]
    assert [g["uuid"] for g in masked_gpus] == [masked_uuid(i) for i in range(8)]
    assert [g["serial"] for g in masked_gpus] == [masked_serial(i) for i in range(8)]
    # Process names keep the program only; --no-mask keeps the command line.
    assert {p["name"] for g in masked_gpus for p in g["overrides"]["processes"]} == {"python"}
    kept_gpus = yaml.safe_load(kept_text)["gpus"]
    assert {p["name"] for g in kept_gpus for p in g["overrides"]["processes"]} == {
        "python train.py"
    }
    assert "identifiers masked ->" in result.stderr
    assert "# Identifiers masked:" in masked_text and "# Identifiers as read" in kept_text


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("python train.py --token secret", "python"),
        ("/home/alice/venv/bin/python3", "python3"),
        ("/usr/lib/xorg/Xorg", "Xorg"),
        ("", "(unknown)"),
    ],
)
def test_masked_process_names_keep_the_program_only(name: str, shown: str) -> None:
    assert masked_process_name(name) == shown


@pytest.mark.parametrize(
    ("scenario", "at", "faults"),
    [
        # NVML's "unavailable" answer (temperature calls: an absurd 4000 C).
        ("faulty", 35, [{"kind": "sentinel", "gpu": 2, "call": "nvmlDeviceGetTemperature"}]),
        # A lost GPU, and a call that hangs for 2 s: the recorder times each call.
        (
            "faulty",
            90,
            [
                {"kind": "gpu_lost", "gpu": 1},
                {"kind": "hang", "gpu": 3, "call": "nvmlDeviceGetPowerUsage", "seconds": 2.0},
            ],
        ),
        # An error code.
        (
            "faulty",
            155,
            [
                {
                    "kind": "error",
                    "gpu": 0,
                    "call": "nvmlDeviceGetUtilizationRates",
                    "error": "TIMEOUT",
                }
            ],
        ),
        # A GPU fallen off the bus, and the XIDs of the others (a lost GPU takes no events).
        (
            "fell-off-bus",
            120,
            [{"kind": "gpu_lost", "gpu": 3}, {"kind": "xid", "gpu": 1, "code": 13}],
        ),
        # Memory repair: a remap pending, one failed; their XIDs.
        (
            "ecc-remap",
            120,
            [
                {"kind": "ecc_uncorrectable", "gpu": 1, "count": 1, "remap": "pending"},
                {"kind": "ecc_uncorrectable", "gpu": 2, "count": 1, "remap": "failed"},
                {"kind": "xid", "gpu": 1, "code": 94},
                {"kind": "xid", "gpu": 2, "code": 95},
            ],
        ),
    ],
)
def test_a_node_with_faults_replays_them_as_the_driver_gave_them(
    daemon_factory: Callable[..., Daemon],
    tmp_path: Path,
    scenario: str,
    at: float,
    faults: list[dict[str, object]],
) -> None:
    original, replayed, recording = round_trip(daemon_factory, tmp_path, scenario, at)
    problems = differences(original, replayed)
    assert not problems, "\n".join(problems) + "\n\n" + recording.read_text()
    recorded = yaml.safe_load(recording.read_text())["faults"]
    assert [fault for fault in faults if fault not in recorded] == [], recorded


def test_an_unprivileged_recording_says_so_and_replays_the_refusals(
    daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    original, replayed, recording = round_trip(
        daemon_factory, tmp_path, "h100-mig", 300, caller="unprivileged"
    )
    problems = differences(original, replayed)
    assert not problems, "\n".join(problems) + "\n\n" + recording.read_text()
    document = yaml.safe_load(recording.read_text())
    assert document["caller"] == "unprivileged"
    # The refusals are the caller's, not faults of the GPUs.
    assert "NO_PERMISSION" not in recording.read_text()
    # GPM refused: no activity recorded, none served.
    assert not any(name.endswith("active_ratio") for name, _ in replayed)


def test_recording_without_a_loaded_driver_says_so(tmp_path: Path) -> None:
    result = record("faulty", tmp_path / "none.yaml", 205, code=2)
    assert "gpuload sim record: NVML could not be read:" in result.stderr
    assert not (tmp_path / "none.yaml").exists()


# What the format once could not hold and a recording now writes as keys: ECC off, the PCIe
# replay count, a feature the model lacks (h100-sxm has no encoder), BAR1 used, memory free off
# total - reserved - used (on a whole GPU and on a GPU in MIG mode), a MIG instance's memory.
MAPPED_SCENARIO = """\
name: recorded-keys
loop: false
driver: {version: "550.90.07", cuda_version: 12040}
gpus:
  - model: h100-sxm
    ecc_enabled: false
    pcie_replays: 7
    has: [encoder]
    overrides: {memory_used: 20GiB, memory_free: 30000MiB, bar1_used: 1234MiB}
  - model: h100-sxm
    overrides: {memory_free: 10000MiB, bar1_used: 4321MiB}
    mig:
      - {profile: 3g.40gb, memory_total: 40000MiB, overrides: {memory_used: 1GiB}}
      - {profile: 1g.10gb}
phases: [{name: steady, duration: 1h, utilization: 0.5}]
"""


def test_ecc_off_replays_features_bar1_free_and_mig_memory_are_recorded_as_keys(
    daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    scenario, recording = tmp_path / "keys.yaml", tmp_path / "recorded-keys.yaml"
    scenario.write_text(MAPPED_SCENARIO)
    record(str(scenario), recording, 300)
    original = masked(scrape(daemon_factory, scenario, 300))
    replayed = scrape(daemon_factory, recording, 300)
    text = recording.read_text()
    problems = differences(original, replayed)
    assert not problems, "\n".join(problems) + "\n\n" + text

    whole, mig = yaml.safe_load(text)["gpus"]
    assert (whole["ecc_enabled"], whole["pcie_replays"], whole["has"]) == (False, 7, ["encoder"])
    assert (whole["overrides"]["memory_free"], whole["overrides"]["bar1_used"]) == (
        "30000MiB",
        "1234MiB",
    )
    assert (mig["overrides"]["memory_free"], mig["overrides"]["bar1_used"]) == (
        "10000MiB",
        "4321MiB",
    )
    assert "ecc_enabled" not in mig and "pcie_replays" not in mig and "has" not in mig
    # Each instance's memory as read: the one given, and the profile's share of the other.
    assert [i["memory_total"] for i in mig["mig"]] == ["40000MiB", "9940MiB"]
    # ECC off explains the counts' NOT_SUPPORTED: no fault for it.
    assert "nvmlDeviceGetTotalEccErrors" not in text
    assert "ECC is off" not in text and "lacks encoder" not in text and "PCIe replays" not in text

    # Each mapping is seen in what the two serve (the replay counter is in COUNTS: compared here).
    def served(name: str, gpu: str, **labels: str) -> tuple[float, float]:
        key = (name, tuple(sorted({"gpu": gpu, "uuid": masked_uuid(int(gpu)), **labels}.items())))
        return original[key], replayed[key]

    assert served("gpu_ecc_mode_enabled", "0") == (0, 0)
    assert served("gpu_pcie_replay_errors_total", "0") == (7, 7)
    assert served("gpu_encoder_utilization_ratio", "0") == (0, 0)
    assert served("gpu_bar1_memory_used_bytes", "0") == (1234 * 2**20,) * 2
    assert served("gpu_memory_free_bytes", "0") == (30000 * 2**20,) * 2
    assert served("gpu_bar1_memory_used_bytes", "1") == (4321 * 2**20,) * 2
    assert served("gpu_memory_free_bytes", "1") == (10000 * 2**20,) * 2
    totals = {
        dict(labels)["mig_profile"]: (value, replayed[(name, labels)])
        for (name, labels), value in original.items()
        if name == "gpu_mig_memory_total_bytes"
    }
    assert totals == {"3g.40gb": (40000 * 2**20,) * 2, "1g.10gb": (9940 * 2**20,) * 2}
