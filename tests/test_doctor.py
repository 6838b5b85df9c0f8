"""`gpuload doctor`: each simulated scenario gets its verdict, locally and from Prometheus.

The node's verdict comes first and alike GPUs are one block; MIG GPUs say what cannot be measured
and why, and are judged per instance where GPM allows; XIDs are part of the verdict; progress goes
to stderr whether or not it is a terminal; an unreachable Prometheus is one plain line.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import ROOT, wait_until

from exporter.alerting import thresholds
from exporter.alerting.history import Labels
from exporter.doctor.command import Options, Progress, run
from exporter.doctor.node import index_ranges, merge
from exporter.doctor.verdicts import BUSY_STEPS, IDLE_STEPS, Window, diagnose, figures

# Short windows keep the suite fast: 3 s at 200 ms is 15 samples per GPU.
SHORT = ["--duration", "3s", "--collect.interval", "200ms"]


def doctor(*args: str) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    return subprocess.Popen(
        [sys.executable, "-m", "exporter", "doctor", *args],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# scenario -> (extra arguments, exit code, expected state of each GPU or of GPU index -> state)
SCENARIOS: dict[str, tuple[list[str], int, dict[int, str] | str]] = {
    "idle": ([], 0, "idle"),
    "saturated": ([], 0, "compute-bound"),
    "memory-bound": ([], 1, "memory-bandwidth-bound"),
    # The throttled phase runs from 2m to 5m after the epoch.
    "thermal-throttle": (["--sim.epoch", "-150"], 1, "throttled-thermal"),
    # GPU 3 falls off the bus 60 s after the epoch; the others keep training at ~90%.
    "fell-off-bus": (["--sim.epoch", "-62"], 1, {3: "hardware-fault", 0: "compute-bound"}),
    # Each GPU computes 1 s and waits 3 s for its input: 8 s hold two of its steps.
    "data-starved": (["--duration", "8s"], 1, "input-starved"),
}
# MIG scenarios with 2 GPUs: (exit code, state of each GPU); h100-mig's is checked on its own.
MIG = {"a100-mig": (2, {0: "unknown", 1: "unknown"}), "h100-mig": (None, {1: "idle"})}
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[int, str, str]]:
    """Every scenario's doctor run (JSON, and text where a test reads it), all at once."""
    running = {}
    for scenario, (extra, _code, _state) in SCENARIOS.items():
        # A negative epoch here is relative to now: the scenario started that long ago.
        args = [
            str(time.time() + float(a)) if a[:1] == "-" and a[1:2].isdigit() else a for a in extra
        ]
        running[scenario] = doctor("--simulate", scenario, *SHORT, *args, "--json")
    for scenario in MIG:
        running[scenario] = doctor("--simulate", scenario, *SHORT, "--json")
    for scenario in ("data-starved", "a100-mig"):
        extra = SCENARIOS[scenario][0] if scenario in SCENARIOS else []
        running[f"{scenario} text"] = doctor("--simulate", scenario, *SHORT, *extra)
    results = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=90)
        results[name] = (process.returncode, out, err)
    return results


@pytest.fixture(scope="module")
def verdicts(runs) -> dict[str, tuple[int, dict[str, Any], str]]:
    """The JSON runs, parsed: stdout holds the JSON document and nothing else."""
    return {
        name: (code, json.loads(out), err)
        for name, (code, out, err) in runs.items()
        if " " not in name
    }


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_scenario_gets_its_verdict(scenario: str, verdicts) -> None:
    _extra, code, expected = SCENARIOS[scenario]
    returncode, report, err = verdicts[scenario]
    states = {gpu["gpu"]: gpu["state"] for gpu in report["gpus"]}
    assert len(states) == 8, err
    if isinstance(expected, str):
        assert set(states.values()) == {expected}, states
    else:
        for gpu, state in expected.items():
            assert states[gpu] == state, states
    assert returncode == code
    assert report["exit_code"] == code
    # Progress goes to stderr as whole lines when it is not a terminal: the first after the
    # first collection, the last at the end of the window.
    progress = [line for line in err.splitlines() if line.startswith("sampling ")]
    seconds = 8 if scenario == "data-starved" else 3
    assert progress[-1] == f"sampling 8 GPUs: {seconds} s of {seconds} s", err
    assert progress[0].startswith("sampling 8 GPUs: ") and progress[0].endswith(
        f" s of {seconds} s"
    )


def test_progress_lines_every_five_seconds_when_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    for elapsed in [0.2, 1.2, 4.9, 5.1, 6.0, 9.0, 11.4, 12.0]:
        progress(elapsed, 12.0, 8)
    progress.clear()
    assert stream.getvalue() == (
        "sampling 8 GPUs: 0 s of 12 s\n"
        "sampling 8 GPUs: 5 s of 12 s\n"
        "sampling 8 GPUs: 11 s of 12 s\n"
        "sampling 8 GPUs: 12 s of 12 s\n"
    )


def test_alike_gpus_are_one_block_after_the_node_verdict(runs, verdicts) -> None:
    code, out, err = runs["data-starved text"]
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0] == f"node {HOST}: 8 GPUs, 8 input-starved"
    assert lines[1] == "sampled 8 s from the simulated NVML (scenario data-starved)"
    assert lines[3] == "GPUs 0-7: input-starved  (8 x NVIDIA H100 80GB HBM3)"
    assert lines[4] == "  busy in bursts, fully idle in between: waits for its input"
    # One block: the next steps are printed once, not once per GPU.
    assert out.count("next steps:") == 1
    assert lines[-1] == "result: findings above: see the next steps (exit 1)"
    report = verdicts["data-starved"][1]
    assert report["node"]["verdict"] == f"node {HOST}: 8 GPUs, 8 input-starved"
    assert report["node"]["states"] == {"input-starved": 8}
    assert [group["gpus"] for group in report["groups"]] == [list(range(8))]
    assert report["groups"][0]["label"] == "GPUs 0-7"


def test_a_group_shows_differing_numbers_as_ranges() -> None:
    assert merge(["utilization mean 22%", "utilization mean 24%", "utilization mean 23%"]) == (
        "utilization mean 22-24%"
    )
    assert merge(["61.0 GiB held by 1 process(es)"] * 3) == "61.0 GiB held by 1 process(es)"
    assert index_ranges([7, 0, 1, 2, 4, 5, 6]) == "0-2,4-7"
    assert index_ranges([3]) == "3"


def test_a_lost_gpu_stands_apart_with_its_xid_in_the_verdict() -> None:
    # GPU 3 reports XID 79 and is lost 60 s after the epoch: here 3 s into the window, long after
    # the doctor's first collection has registered for the GPUs' XID events.
    epoch = time.time() - 57
    options = Options(duration=5.0, interval=0.2, simulate="fell-off-bus", sim_epoch=epoch)
    out = io.StringIO()
    assert run(options, out=out, err=io.StringIO()) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == f"node {HOST}: 8 GPUs, 1 hardware-fault, 7 compute-bound"
    assert lines[1] == "  XID 79 on GPU 3: GPU has fallen off the bus"
    # The earlier application XIDs are listed too, after the critical one.
    assert lines[2:5] == [
        "  XID 13 on GPU 1: graphics engine exception",
        "  XID 31 on GPU 5: GPU memory page fault",
        "  XID 43 on GPU 6: GPU stopped processing",
    ]
    assert lines[7].startswith("GPU 3: hardware-fault  (NVIDIA H100 80GB HBM3, GPU-")
    # The evidence is the readings, not the summary again: up at first, lost within the window.
    assert lines[8] == "  NVML answers GPU is lost: it has fallen off the bus"
    assert re.fullmatch(
        r"    - gpu_up 1 until \d+ s into the window, 0 in the \d+ readings since", lines[9]
    )
    assert "    - XID 79 on GPU 3: GPU has fallen off the bus" in lines
    assert "GPUs 0-2,4-7: compute-bound  (7 x NVIDIA H100 80GB HBM3)" in lines
    assert (
        "  XID 13 on GPU 1: graphics engine exception; usually the application (out-of-range "
        "access, illegal instruction); fix the code; if it follows the GPU, test it"
    ) in lines


def test_a_gpu_lost_before_it_was_read_says_its_name_and_uuid_are_unknown(verdicts) -> None:
    # fell-off-bus's GPU 3 is lost 60 s after the epoch, 2 s before the doctor starts: NVML
    # never gives its name or UUID, and no sample of the window carries them.
    epoch = time.time() - 62
    options = Options(duration=2.0, interval=0.2, simulate="fell-off-bus", sim_epoch=epoch)
    text = io.StringIO()
    assert run(options, out=text, err=io.StringIO()) == 1
    out = text.getvalue()
    lines = out.splitlines()
    block = lines.index(
        "GPU 3: hardware-fault  (name unknown: lost before it was read, "
        "UUID unknown: lost before it was read)"
    )
    # The evidence is the readings, not the summary again.
    assert lines[block + 1] == "  NVML answers GPU is lost: it has fallen off the bus"
    assert re.fullmatch(r"    - gpu_up 0 in all \d+ readings of the window", lines[block + 2])
    assert "(, )" not in out and ", )" not in out
    report = verdicts["fell-off-bus"][1]
    lost = report["gpus"][3]
    assert lost["name"] == "name unknown: lost before it was read"
    assert lost["uuid"] == "UUID unknown: lost before it was read"
    assert re.fullmatch(
        r"gpu_up 0 in all \d+ readings of the window", lost["findings"][0]["evidence"][0]
    )
    for gpu in report["gpus"]:
        assert gpu["name"] and gpu["uuid"], gpu
    assert all(group["name"] for group in report["groups"]), report["groups"]


def _findings(report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for gpu in report["gpus"]:
        yield from gpu["findings"]
        for instance in gpu["mig_instances"]:
            yield from instance["findings"]


def test_no_evidence_line_repeats_its_summary(verdicts) -> None:
    for scenario, (_code, report, _err) in verdicts.items():
        for finding in _findings(report):
            for line in finding["evidence"]:
                assert line not in finding["summary"], (scenario, finding)
                assert finding["summary"] not in line, (scenario, finding)


def test_a_gpu_lost_across_a_restart_keeps_the_name_and_uuid_read_before() -> None:
    # GPU 0 read by an exporter until 4 s, then by a restarted one that could not read its UUID.
    identity = (("gpu", "0"), ("uuid", "GPU-0"))
    before = [(0.0, 1.0), (4.0, 1.0)]
    series: dict[str, dict[Labels, list[tuple[float, float]]]] = {
        "gpu_info": {(*identity, ("name", "NVIDIA H100 80GB HBM3")): before},
        "gpu_up": {identity: before, (("gpu", "0"),): [(6.0, 0.0), (8.0, 0.0), (10.0, 0.0)]},
    }
    (report,) = diagnose(Window(series, 0.0, 10.0), thresholds.load())
    assert (report.name, report.uuid) == ("NVIDIA H100 80GB HBM3", "GPU-0")
    # The newest readings say how it is now: lost, since the restarted exporter's first.
    assert report.state == "hardware-fault"
    finding = report.findings[0]
    assert finding.summary == "NVML answers GPU is lost: it has fallen off the bus"
    assert finding.evidence[0] == "gpu_up 1 until 4 s into the window, 0 in the 3 readings since"


def test_the_newest_readings_say_which_gpu_it_is() -> None:
    # A GPU replaced between two runs of the exporter: the UUID read last wins.
    old, new = (("gpu", "0"), ("uuid", "GPU-old")), (("gpu", "0"), ("uuid", "GPU-new"))
    series = {"gpu_up": {new: [(6.0, 1.0), (10.0, 1.0)], old: [(0.0, 1.0), (4.0, 1.0)]}}
    assert Window(series, 0.0, 10.0).gpus() == {"0": {"gpu": "0", "uuid": "GPU-new"}}


def test_mig_without_gpm_says_what_it_cannot_measure_and_why(runs, verdicts) -> None:
    code, out, err = runs["a100-mig text"]
    assert code == 2, err
    lines = out.splitlines()
    assert lines[0] == f"node {HOST}: 2 GPUs, 2 unknown"
    gpu0 = lines[
        lines.index(
            "GPU 0: unknown  (NVIDIA A100-SXM4-80GB, GPU-b0b55aba-ce45-a40f-f413-704e2c5d7490)"
        ) :
    ]
    assert gpu0[1:3] == [
        "  load not measurable: MIG mode without GPM",
        "    - 7 MIG instances: 1 idle, 6 unknown",
    ]
    assert (
        "  not measured: whole-GPU utilization: NVML has no whole-GPU utilization in MIG mode"
        in gpu0
    )
    assert (
        "  not measured: activity per MIG instance: the NVIDIA A100-SXM4-80GB has no GPM (GPU "
        "performance monitoring, Hopper and newer); only each instance's memory is measured"
    ) in gpu0
    assert "    instance 7 (1g.10gb): unknown, memory 9.0 GiB of 9.8 GiB" in gpu0
    assert "    instance 13 (1g.10gb): idle, memory 0.0 GiB of 9.8 GiB" in gpu0
    # No healthy verdict contradicts the unknown state any more.
    assert "busy" not in out and "working, nothing holding it back" not in out
    assert lines[-1] == "result: could not measure: see what was not measured above (exit 2)"
    report = verdicts["a100-mig"][1]
    gpu = report["gpus"][1]
    assert gpu["mig_mode"] is True
    assert [u["what"] for u in gpu["not_measured"]] == [
        "whole-GPU utilization",
        "activity per MIG instance",
    ]
    instances = {i["mig_instance"]: i for i in gpu["mig_instances"]}
    assert {i: (v["mig_profile"], v["state"]) for i, v in instances.items()} == {
        1: ("3g.40gb", "unknown"),
        3: ("2g.20gb", "unknown"),
        4: ("2g.20gb", "unknown"),
    }
    assert instances[1]["figures"]["memory_used_bytes"] == 36 * 2**30
    assert instances[1]["figures"]["sm_active_mean"] is None


def test_mig_instances_with_gpm_are_judged_one_by_one(verdicts) -> None:
    code, report, err = verdicts["h100-mig"]
    gpu, whole = report["gpus"]
    assert gpu["mig_mode"] is True and whole["mig_mode"] is False
    assert gpu["not_measured"] == [
        {
            "what": "whole-GPU utilization",
            "why": "NVML has no whole-GPU utilization in MIG mode; judged per MIG instance from "
            "GPM instead",
        }
    ]
    instances = {i["mig_instance"]: i for i in gpu["mig_instances"]}
    assert sorted(instances) == [1, 3, 4]
    # The scenario's instances run at 70% SM activity (the 3g) and 25% (the 2g, DRAM at 55%).
    # How many readings the doctor takes in its window depends on the machine's speed, so each
    # figure is checked against the threshold its verdict was judged by, not pinned.
    low = thresholds.load().alert("GPUUtilizationLow").number("below")
    bound = thresholds.load().alert("GPUMemoryBandwidthBound").number("dram_active_above")
    big = instances[1]
    assert (big["mig_profile"], big["state"]) == ("3g.40gb", "busy")
    assert big["figures"]["sm_active_mean"] > low
    assert big["findings"][0]["next_steps"] == BUSY_STEPS
    for small in (instances[3], instances[4]):
        assert small["mig_profile"] == "2g.20gb"
        # SM activity below GPUUtilizationLow's 30%, GPUMIGUtilizationLow's basis: the slice is
        # underused; DRAM below GPUMemoryBandwidthBound's 60%: not bandwidth-bound.
        assert small["figures"]["sm_active_mean"] < low
        assert small["figures"]["dram_active_mean"] < bound
        assert small["state"] == "input-starved"
        assert small["findings"][0]["runbook_url"].endswith("#gpumigutilizationlow")
    # The GPU's state is its most serious instance's; the exit code follows.
    assert gpu["state"] == "input-starved"
    assert code == report["exit_code"] == 1, err
    assert gpu["summary"].startswith("MIG instance ")


def test_findings_carry_evidence_and_next_steps_from_the_runbooks(verdicts) -> None:
    gpu = verdicts["thermal-throttle"][1]["gpus"][0]
    finding = gpu["findings"][0]
    assert finding["state"] == "throttled-thermal"
    assert any("thermal slowdown active 100% of the window" in e for e in finding["evidence"])
    assert any(e.startswith("temperature 89 °C (slowdown at") for e in finding["evidence"])
    assert finding["next_steps"][0].startswith("Check the cooling")
    assert finding["runbook_url"].endswith("runbooks.md#gputhermalthrottling")
    lost = verdicts["fell-off-bus"][1]["gpus"][3]["findings"][0]
    assert lost["summary"] == "NVML answers GPU is lost: it has fallen off the bus"
    assert lost["next_steps"][0].startswith("Drain the node")
    memory_bound = verdicts["memory-bound"][1]["gpus"][0]
    bound = memory_bound["findings"][0]
    assert bound["state"] == "memory-bandwidth-bound"
    # The figure the verdict was judged on, from the readings the doctor took (how many it took
    # depends on the machine's speed, so the figure is not pinned: 90% in the scenario).
    dram = memory_bound["figures"]["dram_active_mean"]
    assert bound["evidence"][0] == f"DRAM bandwidth {dram * 100:.0f}% of peak"
    assert dram > thresholds.load().alert("GPUMemoryBandwidthBound").number("dram_active_above")


def test_a_starved_input_pipeline_is_input_starved() -> None:
    # data-starved computes for 1 s at 90% and sits fully idle for 3 s: an 8 s window holds two
    # of its steps, whenever the sampling starts.
    out = io.StringIO()
    code = run(
        Options(duration=8.0, interval=0.2, simulate="data-starved", json=True),
        out=out,
        err=io.StringIO(),
    )
    report = json.loads(out.getvalue())
    assert code == 1
    assert {gpu["state"] for gpu in report["gpus"]} == {"input-starved"}
    finding = report["gpus"][0]["findings"][0]
    assert finding["summary"] == "busy in bursts, fully idle in between: waits for its input"
    figures = report["gpus"][0]["figures"]
    assert 0.15 < figures["utilization_mean"] < 0.35
    assert 0.55 < figures["idle_fraction"] < 0.85
    steps = finding["next_steps"]
    assert any("num_workers" in step for step in steps)
    assert any("pin_memory=True" in step for step in steps)


GPU0 = (("gpu", "0"), ("uuid", "GPU-0"))


def window(counters: dict[str, list[tuple[float, float]]]) -> Window:
    """10 s of one GPU that is up and runs a process, with its counters' (time, value) readings."""
    series = {name: {GPU0: points} for name, points in counters.items()}
    for name in ("gpu_up", "gpu_processes"):
        series[name] = {GPU0: [(0.0, 1.0), (10.0, 1.0)]}
    return Window(series, 0.0, 10.0)


def test_window_means_are_the_counters_increase_over_the_window() -> None:
    # Busy 0.9 s of every 4 s, read once at each second: gauge readings of the last second would
    # say 90% or 0% by where they land; the counter says 22.5%, and resets (an exporter restart
    # at 6 s) cost nothing of it.
    busy = [(0.0, 100.0), (2.0, 100.45), (4.0, 100.9), (6.0, 0.45), (8.0, 0.9), (10.0, 1.35)]
    idle = [(float(t), 0.7 * t) for t in range(0, 11, 2)]
    found = figures(
        window({"gpu_utilization_seconds_total": busy, "gpu_idle_seconds_total": idle}), "0"
    )
    assert found["utilization_mean"] == pytest.approx(0.225)
    assert found["idle_fraction"] == pytest.approx(0.7)
    assert found["samples"] == 6


@pytest.mark.parametrize(
    ("idle_per_second", "state"),
    [
        (0.7, "input-starved"),  # waits for each batch: GPUDataLoaderStarved
        (0.0, "busy"),  # a steady small workload runs something in every sample period
    ],
)
def test_starved_needs_fully_idle_time_not_just_a_low_mean(
    idle_per_second: float, state: str
) -> None:
    loaded = thresholds.load()
    starved = loaded.alert("GPUDataLoaderStarved")
    mean = (starved.number("average_below") + loaded.alert("GPUUtilizationLow").number("below")) / 2
    counters = {
        "gpu_utilization_seconds_total": [(0.0, 0.0), (10.0, 10 * mean)],
        "gpu_idle_seconds_total": [(0.0, 0.0), (10.0, 10 * idle_per_second)],
    }
    (report,) = diagnose(window(counters), loaded)
    assert report.state == state
    if state == "busy":
        # A healthy GPU has next steps too: what to watch.
        assert report.findings[0].steps == BUSY_STEPS


def test_too_few_readings_are_unknown_and_the_evidence_counts_them() -> None:
    (report,) = diagnose(window({"gpu_utilization_seconds_total": [(0.0, 0.0)]}), thresholds.load())
    assert report.state == "unknown"
    finding = report.findings[0]
    assert finding.summary == "not measurable: a mean needs two readings"
    assert finding.evidence == ["1 reading(s) in the window"]


def test_idle_gpus_say_there_is_nothing_to_do(verdicts) -> None:
    finding = verdicts["idle"][1]["gpus"][0]["findings"][0]
    assert finding["next_steps"] == IDLE_STEPS
    assert verdicts["idle"][1]["node"]["verdict"] == f"node {HOST}: 8 GPUs, healthy (8 idle)"


def test_text_report_and_progress_on_a_terminal() -> None:
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "doctor", "--simulate", "idle", "--duration", "1s"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    out, _ = process.communicate(timeout=30)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert process.returncode == 0
    # On a terminal the progress line is rewritten in place, then cleared.
    assert b"\rsampling 8 GPUs: 1 s of 1 s" in shown
    lines = out.splitlines()
    assert lines[0] == f"node {HOST}: 8 GPUs, healthy (8 idle)"
    assert lines[3] == "GPUs 0-7: idle  (8 x NVIDIA H100 80GB HBM3)"
    assert "      * Nothing to do if this GPU is meant to be free." in lines
    assert lines[-1] == "result: healthy: nothing to do (exit 0)"


def test_no_nvml_or_no_prometheus_is_exit_code_2() -> None:
    unreachable = doctor("--prometheus", "http://127.0.0.1:1", "--instance", "n1:19400")
    out, err = unreachable.communicate(timeout=30)
    assert unreachable.returncode == 2
    assert (out, err) == (
        "",
        "gpuload doctor: cannot reach Prometheus at http://127.0.0.1:1: connection refused\n",
    )
    # This machine has no NVIDIA driver: NVML cannot be initialised.
    no_driver = doctor("--duration", "1s")
    out, err = no_driver.communicate(timeout=30)
    if no_driver.returncode != 2 and "NVIDIA" in out:
        pytest.skip("this machine has a GPU")
    assert no_driver.returncode == 2
    assert "NVML is not available" in err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus(tmp_path: Path, daemon_factory) -> Iterator[tuple[str, str]]:
    """A real Prometheus scraping a simulated memory-bound exporter every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("needs Debian's prometheus (scripts/test installs it)")
    daemon = daemon_factory("--simulate", "memory-bound", "--collect.interval", "500ms")
    target = daemon.url.removeprefix("http://").rstrip("/")
    port = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{"job_name": "gpuload", "static_configs": [{"targets": [target]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with (tmp_path / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, target
    finally:
        process.kill()
        process.wait(timeout=10)


def _samples(url: str, target: str) -> int:
    try:
        answer = requests.get(
            url + "/api/v1/query",
            params={"query": f'count_over_time(gpu_up{{instance="{target}",gpu="0"}}[1m])'},
            timeout=2,
        ).json()
    except (requests.RequestException, ValueError):
        return 0
    result = answer.get("data", {}).get("result", [])
    return int(float(result[0]["value"][1])) if result else 0


def test_a_remote_node_is_diagnosed_from_prometheus(prometheus) -> None:
    url, target = prometheus
    wait_until(lambda: _samples(url, target) >= 4, timeout=30, what="four scrapes")
    process = doctor("--prometheus", url, "--instance", target, "--duration", "10s", "--json")
    out, err = process.communicate(timeout=30)
    report = json.loads(out)
    assert process.returncode == 1, err
    assert len(report["gpus"]) == 8
    assert {gpu["state"] for gpu in report["gpus"]} == {"memory-bandwidth-bound"}
    assert report["source"] == f"Prometheus {url}, instance {target}"
