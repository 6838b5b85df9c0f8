"""`gpuload doctor`: the shipped rules' verdict on each GPU, from the simulator or Prometheus.

The doctor judges nothing itself: it feeds its samples to the local evaluator of the rule files
and prints each GPU's recorded state, bottleneck classes and alerts. So these tests check what
follows from those definitions (every state is one of the rules' states, a GPU with an alert
above info needs a person, the exit code says whether one does) on every shipped scenario, and
what the scenarios are made to show (a hung collective, a starved input pipeline, a GPU that fell
off the bus). On the simulator the doctor runs on the scenario's clock, so seven minutes of a
scenario take a few seconds and two runs with the same seed and epoch print the same verdicts.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import shutil
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import ROOT, wait_until

from exporter import sim
from exporter.alerting import rules, thresholds
from exporter.alerting.evaluator import warm_up_seconds
from exporter.alerting.history import Labels
from exporter.alerting.states import LEVELS
from exporter.doctor.command import Options, Progress, run
from exporter.doctor.node import index_ranges, merge
from exporter.doctor.sampling import identities_of
from exporter.sim.scenario import SCENARIO_DIR

HOST = socket.gethostname()
# 2026-01-01 00:00 UTC: a fixed past start, so that every run samples the same minutes.
EPOCH = 1_767_225_600
# Seven minutes, past the rules' warm-up (6 minutes with the shipped thresholds), at the
# Prometheus default scrape interval: ~29 collection cycles on the scenario's clock.
SEVEN_MINUTES = ["--duration", "7m", "--collect.interval", "15s"]
FIXED = [*SEVEN_MINUTES, "--sim.seed", "1", "--sim.epoch", str(EPOCH)]
SCENARIOS = sim.scenario_names()
# The text reports the tests read, beside every scenario's --json run. hung-collective's is run
# as a person would type it: no seed, no epoch.
TEXT_RUNS = {
    "hung-collective text": ["--simulate", "hung-collective", *SEVEN_MINUTES],
    "fell-off-bus text": ["--simulate", "fell-off-bus", *FIXED],
    "ecc-remap text": ["--simulate", "ecc-remap", *FIXED],
}


def doctor(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-m", "exporter", "doctor", *args],
        cwd=ROOT,
        env=environment,
        text=True,
        **kwargs,
    )


@dataclass(frozen=True)
class Run:
    """One finished doctor run."""

    code: int
    out: str
    err: str

    @property
    def report(self) -> dict[str, Any]:
        """The --json document: stdout holds it and nothing else."""
        document: dict[str, Any] = json.loads(self.out)
        return document


def _run_all(folder: Path) -> None:
    """Run every scenario's --json doctor and the text runs into ``folder``, one per core.

    One per core, not all at once: the tests running beside them (a daemon scraped by a real
    Prometheus) keep their share of the machine.
    """
    commands = {
        **{scenario: ["--simulate", scenario, *FIXED, "--json"] for scenario in SCENARIOS},
        **TEXT_RUNS,
    }

    def one(name: str) -> None:
        with (folder / f"{name}.out").open("w") as out, (folder / f"{name}.err").open("w") as err:
            code = doctor(*commands[name], stdout=out, stderr=err).wait(timeout=300)
        (folder / f"{name}.code").write_text(str(code))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(one, commands))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every doctor run the tests read, made once per test session.

    Under pytest-xdist each worker would run a module fixture of its own: the first worker makes
    the runs in the session's shared folder, the others wait on its lock and read them.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp("doctor-runs")
        _run_all(folder)
    else:
        folder = tmp_path_factory.getbasetemp().parent / "doctor-runs"
        with (folder.parent / "doctor-runs.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / "done").exists():
                folder.mkdir(exist_ok=True)
                _run_all(folder)
                (folder / "done").touch()
    return {
        path.stem: Run(
            int(path.read_text()),
            path.with_suffix(".out").read_text(),
            path.with_suffix(".err").read_text(),
        )
        for path in folder.glob("*.code")
    }


def _blocks(out: str) -> list[list[str]]:
    """The text report's GPU blocks, each its lines: from a ``GPU`` line to a blank one."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("GPU"):
            current = [line]
            blocks.append(current)
        elif not line:
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def _alert_names(gpu: dict[str, Any]) -> set[str]:
    return {alert["alertname"] for alert in gpu["alerts"]}


def _bottlenecks(gpu: dict[str, Any]) -> set[str]:
    return {bottleneck["bottleneck"] for bottleneck in gpu["bottlenecks"]}


def _needs_a_person(bottleneck: str, loaded: thresholds.Thresholds) -> bool:
    """A bottleneck class whose alert is above info, or that has no alert (not ``none``)."""
    if bottleneck == "none":
        return False
    alert = rules.BOTTLENECK_ALERTS[bottleneck]
    return alert is None or loaded.alert(alert).severity not in ("info", "none")


# The tests that do not read the shared runs come first: under pytest-xdist both workers run
# them before either waits for the runs, whose processes would otherwise starve them.


# Progress


def test_progress_lines_are_paced_by_wall_clock_not_by_the_sampled_time() -> None:
    # Not a terminal: a line at the start, then one every 5 s of wall time, and one at the end,
    # however fast the scenario's minutes pass (here 420 s of them in 11 s of wall time).
    wall = [1000.0]
    stream = io.StringIO()
    progress = Progress(stream, every=5.0, clock=lambda: wall[0])
    for after, elapsed in [(0, 0), (1, 15), (4.9, 30), (5, 45), (6, 60), (10.5, 75), (11, 420)]:
        wall[0] = 1000.0 + after
        progress(elapsed, 420.0, 8)
    progress.clear()
    assert stream.getvalue() == (
        "sampling 8 GPUs: 0 s of 420 s\n"
        "sampling 8 GPUs: 45 s of 420 s\n"
        "sampling 8 GPUs: 75 s of 420 s\n"
        "sampling 8 GPUs: 420 s of 420 s\n"
    )


def test_progress_of_a_quick_run_is_its_first_and_last_line() -> None:
    # The whole window sampled within a second of wall time: nothing in between.
    stream = io.StringIO()
    progress = Progress(stream, every=5.0, clock=lambda: 50.0)
    for elapsed in range(0, 361, 15):
        progress(elapsed, 360.0, 1)
    assert stream.getvalue() == "sampling 1 GPU: 0 s of 360 s\nsampling 1 GPU: 360 s of 360 s\n"


def test_text_report_and_progress_on_a_terminal() -> None:
    leader, follower = pty.openpty()
    process = doctor(
        *["--simulate", "idle", "--duration", "30s", "--collect.interval", "15s"],
        stderr=follower,
    )
    out, _ = process.communicate(timeout=60)
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
    assert process.returncode == 0, out
    # On a terminal the progress line is rewritten in place after each collection, then cleared.
    for elapsed in (0, 15, 30):
        assert f"\rsampling 8 GPUs: {elapsed} s of 30 s\x1b[K".encode() in shown, shown
    assert shown.endswith(b"\r\x1b[K"), shown
    lines = out.splitlines()
    # Idle GPUs run nothing: healthy, measured or not.
    assert lines[0] == f"node {HOST}: 8 GPUs, healthy (8 idle)"
    assert lines[1] == "sampled 30 s from the simulated NVML (scenario idle)"
    # 30 s are less than the rules' warm-up: the report says so.
    assert lines[2].startswith("warming up: ")
    assert [block[0].split(":")[0] for block in _blocks(out)] == ["GPUs 0-7"]
    assert lines[-1] == "result: healthy: nothing to do (exit 0)"


# Could not measure


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
    assert out == ""
    assert "NVML is not available" in err


# Grouping


def test_a_group_shows_differing_numbers_as_ranges() -> None:
    busy = ["busy 22% (5-min mean)", "busy 24% (5-min mean)", "busy 23% (5-min mean)"]
    assert merge(busy) == "busy 22-24% (5-min mean)"
    assert merge(["SM active 66% (5-min mean)"] * 3) == "SM active 66% (5-min mean)"
    assert index_ranges([7, 0, 1, 2, 4, 5, 6]) == "0-2,4-7"
    assert index_ranges([3]) == "3"


# Lost GPUs


@pytest.fixture(scope="module")
def lost_at_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fell-off-bus with GPU 3 lost from the start: NVML never gives its name or UUID."""
    scenario = yaml.safe_load((SCENARIO_DIR / "fell-off-bus.yaml").read_text())
    scenario["faults"] = [{"kind": "gpu_lost", "gpu": 3, "at": 0}]
    path = tmp_path_factory.mktemp("scenarios") / "lost-at-start.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def test_a_gpu_lost_before_it_was_read_says_its_name_and_uuid_are_unknown(
    lost_at_start: Path,
) -> None:
    reports = {}
    for as_json in (False, True):
        options = Options(
            duration=60.0,
            interval=15.0,
            simulate=str(lost_at_start),
            sim_epoch=EPOCH,
            sim_seed=1,
            json=as_json,
        )
        out = io.StringIO()
        assert run(options, out=out, err=io.StringIO()) == 1
        reports[as_json] = out.getvalue()
    unknown = "name unknown: lost before it was read", "UUID unknown: lost before it was read"
    lost, _others = _blocks(reports[False])
    assert lost[0].startswith("GPU 3: lost, ")
    assert lost[0].endswith(f"  ({unknown[0]}, {unknown[1]})")
    assert "(, )" not in reports[False] and ", )" not in reports[False]
    gpus = json.loads(reports[True])["gpus"]
    assert (gpus[3]["name"], gpus[3]["uuid"]) == unknown
    assert all(gpu["name"] == "NVIDIA H100 80GB HBM3" for i, gpu in enumerate(gpus) if i != 3)


def test_a_gpu_lost_across_a_restart_keeps_the_name_and_uuid_read_before() -> None:
    # GPU 0 read by an exporter until 4 s, then by a restarted one that could not read its name
    # or UUID (lost): Prometheus holds both, and either order of its series.
    identity: Labels = (("gpu", "0"), ("uuid", "GPU-0"))
    before = [(0.0, 1.0), (4.0, 1.0)]
    after = [(6.0, 0.0), (8.0, 0.0), (10.0, 0.0)]
    ups: list[dict[Labels, list[tuple[float, float]]]] = [
        {identity: before, (("gpu", "0"),): after},
        {(("gpu", "0"),): after, identity: before},
    ]
    for up in ups:
        series: dict[str, dict[Labels, list[tuple[float, float]]]] = {
            "gpu_info": {(*identity, ("name", "NVIDIA H100 80GB HBM3")): before},
            "gpu_up": up,
        }
        assert identities_of(series) == {"0": ("NVIDIA H100 80GB HBM3", "GPU-0")}


def test_the_newest_readings_say_which_gpu_it_is() -> None:
    # A GPU replaced between two runs of the exporter: the UUID read last wins, whichever
    # series Prometheus answers first.
    old: Labels = (("gpu", "0"), ("uuid", "GPU-old"))
    new: Labels = (("gpu", "0"), ("uuid", "GPU-new"))
    readings = {old: [(0.0, 1.0), (4.0, 1.0)], new: [(6.0, 1.0), (10.0, 1.0)]}
    for order in (readings, dict(reversed(readings.items()))):
        assert identities_of({"gpu_up": order}) == {"0": ("", "GPU-new")}


def test_the_doctor_samples_no_longer_than_asked() -> None:
    out = io.StringIO()
    options = Options(duration=20.0, interval=15.0, simulate="idle", sim_epoch=EPOCH, json=True)
    run(options, out=out, err=io.StringIO())
    report = json.loads(out.getvalue())
    assert report["rules"]["seen_seconds"] <= report["duration_seconds"]


def test_a_gpu_in_use_while_warming_up_is_not_said_to_lack_utilization() -> None:
    out = io.StringIO()
    options = Options(duration=30.0, interval=15.0, simulate="training", sim_epoch=EPOCH, json=True)
    run(options, out=out, err=io.StringIO())
    report = json.loads(out.getvalue())
    assert report["rules"]["warming_up"] is True
    for gpu in report["gpus"]:
        assert "no utilization" not in gpu["summary"], gpu


# From Prometheus


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus(tmp_path: Path, daemon_factory: Any) -> Iterator[tuple[str, str]]:
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


def test_a_remote_node_is_diagnosed_from_prometheus(prometheus: tuple[str, str]) -> None:
    url, target = prometheus
    wait_until(lambda: _samples(url, target) >= 4, timeout=30, what="four scrapes")
    process = doctor("--prometheus", url, "--instance", target, "--duration", "20s", "--json")
    out, err = process.communicate(timeout=60)
    report = json.loads(out)
    # 20 s of scrapes are less than the rules' warm-up: the load of the GPUs in use is not
    # measured yet (exit 2), unless an alert that needs no mean is already pending (exit 1).
    assert process.returncode in (1, 2), err
    assert report["exit_code"] == process.returncode
    assert report["rules"]["warming_up"] is True
    assert report["source"] == f"Prometheus {url}, instance {target}"
    assert len(report["gpus"]) == 8
    for gpu in report["gpus"]:
        assert gpu["name"] == "NVIDIA H100 80GB HBM3", gpu
        assert gpu["uuid"].startswith("GPU-"), gpu
        assert gpu["state"] in rules.STATES, gpu


# On the shared runs


def test_alike_gpus_are_one_block_after_the_node_verdict(runs: dict[str, Run]) -> None:
    # hung-collective: eight GPUs of one model, all stuck in the same collective.
    text = runs["hung-collective text"]
    assert text.code == 1, text.err
    lines = text.out.splitlines()
    assert lines[0] == f"node {HOST}: 8 GPUs, 8 hung"
    assert lines[1] == "sampled 7 min from the simulated NVML (scenario hung-collective)"
    (block,) = _blocks(text.out)
    assert block[0].startswith("GPUs 0-7: ")
    assert block[0].endswith("  (8 x NVIDIA H100 80GB HBM3)")
    # One block: its next steps are printed once, not once per GPU.
    steps = [line for line in lines if line.startswith("    next: ")]
    assert steps and len(steps) == len(set(steps)), steps
    assert lines[-1] == "result: findings above: see the next steps (exit 1)"
    report = runs["hung-collective"].report
    assert report["node"]["verdict"] == lines[0]
    assert report["node"]["counts"] == {"hung": 8}
    assert [(group["label"], group["gpus"]) for group in report["groups"]] == [
        ("GPUs 0-7", list(range(8)))
    ]


# Lost GPUs and XIDs


def test_a_lost_gpu_stands_apart_with_its_xid_listed(runs: dict[str, Run]) -> None:
    # fell-off-bus: XIDs 13, 31 and 43 on GPUs 1, 5 and 6, then GPU 3 reports XID 79 and is
    # lost 60 s after the epoch; the others keep training.
    text = runs["fell-off-bus text"]
    assert text.code == 1, text.err
    lines = text.out.splitlines()
    # A GPU that reported an XID is never called plainly healthy beside it.
    assert lines[0] == f"node {HOST}: 8 GPUs, 1 lost, 4 healthy, 3 healthy with XIDs"
    # The critical XID first, then the others by code, each with its GPU and meaning.
    assert lines[1] == "  XID 79 on GPU 3: GPU has fallen off the bus"
    assert [line.split(":")[0] for line in lines[2:5]] == [
        "  XID 13 on GPU 1",
        "  XID 31 on GPU 5",
        "  XID 43 on GPU 6",
    ]
    lost, others, *with_xids = _blocks(text.out)
    assert lost[0].startswith("GPU 3: lost, ")
    assert any(line.startswith("  GPUFellOffBus firing (critical, ") for line in lost), lost
    assert others[0].startswith("GPUs 0,2,4,7: healthy, ")
    # Each GPU with an application's XID stands apart, with what the XID means and a next step.
    assert [block[0].split(":")[0] for block in with_xids] == ["GPU 1", "GPU 5", "GPU 6"]
    for block, code in zip(with_xids, (13, 31, 43), strict=True):
        assert f"; reported XID {code}" in block[0]
        assert any(line.startswith(f"  XID {code}: ") for line in block), block
        assert any(line.startswith("    next: ") for line in block), block
    report = runs["fell-off-bus"].report
    gpu = report["gpus"][3]
    assert [(xid["xid"], xid["critical"]) for xid in gpu["xids"]] == [(79, True)]
    assert gpu["xids"][0]["text"] == lines[1].strip()
    assert [xid["xid"] for xid in report["gpus"][1]["xids"]] == [13]


# What the report says once


@pytest.mark.parametrize(
    "name",
    [
        "fell-off-bus text",
        "hung-collective text",
        "ecc-remap text",
    ],
)
def test_no_line_of_a_gpu_block_is_printed_twice(runs: dict[str, Run], name: str) -> None:
    for block in _blocks(runs[name].out):
        repeated = [line for line, count in Counter(block).items() if count > 1]
        assert not repeated, block


@pytest.mark.parametrize("name", ["fell-off-bus text", "hung-collective text", "ecc-remap text"])
def test_a_blocks_summary_is_not_repeated_by_its_other_lines(
    runs: dict[str, Run], name: str
) -> None:
    for block in _blocks(runs[name].out):
        summary = block[1].strip()
        assert not [line for line in block[2:] if summary in line], block


# Every scenario, by the definitions


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenarios_verdict_keeps_the_definitions(runs: dict[str, Run], scenario: str) -> None:
    done = runs[scenario]
    report = done.report
    assert done.code == report["exit_code"], done.err
    assert report["source"] == f"the simulated NVML (scenario {scenario})"
    # Seven minutes hold the rules' warm-up.
    loaded = thresholds.load()
    assert report["rules"]["warming_up"] is (warm_up_seconds(loaded) > 420)
    gpus = report["gpus"]
    assert gpus, done.err
    assert [gpu["gpu"] for gpu in gpus] == sorted({gpu["gpu"] for gpu in gpus})
    for gpu in gpus:
        assert gpu["state"] in (*rules.STATES, "unknown"), gpu
        assert gpu["attention"] in LEVELS, gpu
        assert isinstance(gpu["name"], str) and gpu["name"], gpu
        assert isinstance(gpu["uuid"], str) and gpu["uuid"], gpu
        assert gpu["busy_5m"] is None or 0.0 <= gpu["busy_5m"] <= 1.0, gpu
        for instance in gpu["mig_instances"]:
            active = instance["sm_active_5m"]
            assert active is None or 0.0 <= active <= 1.0, instance
        assert all(xid["gpu"] == gpu["gpu"] for xid in gpu["xids"]), gpu
        # What needs a person: a lost GPU, a pending or firing alert above info, a bottleneck
        # class whose alert is above info or that has none.
        serious = [a for a in gpu["alerts"] if a["severity"] in ("warning", "critical")]
        assert _bottlenecks(gpu) <= set(rules.BOTTLENECK_ALERTS), gpu
        findings = [name for name in _bottlenecks(gpu) if _needs_a_person(name, loaded)]
        if gpu["state"] == "lost" or serious or findings:
            assert gpu["healthy"] is False, gpu
        # Healthy: known to need nothing, so neither a finding nor an unmeasured load.
        assert gpu["healthy"] is (gpu["attention"] == "ok"), gpu
    # The exit code: 1 if a GPU (or the node) needs a person, else 2 if no GPU's load was
    # measured, else 0.
    node_serious = [a for a in report["alerts"] if a["severity"] in ("warning", "critical")]
    needs_a_look = any(gpu["attention"] in ("fault", "warning") for gpu in gpus)
    if node_serious or needs_a_look:
        assert done.code == 1, report["node"]
    elif all(gpu["attention"] == "unknown" for gpu in gpus):
        assert done.code == 2, report["node"]
    else:
        assert done.code == 0, report["node"]
    # The node's verdict counts every GPU once, says healthy only when none needs anything, and
    # its groups hold every GPU once.
    node = report["node"]
    assert sum(node["counts"].values()) == node["gpus"] == len(gpus)
    tally = node["verdict"].split(", ", 1)[1]
    assert tally.startswith("healthy (") is all(gpu["attention"] == "ok" for gpu in gpus), tally
    grouped = sorted(index for group in report["groups"] for index in group["gpus"])
    assert grouped == [gpu["gpu"] for gpu in gpus]


def test_a_starved_input_pipeline_is_input_starved(runs: dict[str, Run]) -> None:
    report = runs["data-starved"].report
    assert report["exit_code"] == 1
    for gpu in report["gpus"]:
        assert "input_starved" in _bottlenecks(gpu), gpu
        assert "GPUDataLoaderStarved" in _alert_names(gpu), gpu


def test_a_gpu_that_fell_off_the_bus_is_the_one_lost(runs: dict[str, Run]) -> None:
    report = runs["fell-off-bus"].report
    lost = [gpu for gpu in report["gpus"] if gpu["state"] == "lost"]
    assert [gpu["gpu"] for gpu in lost] == [3]
    assert ("GPUFellOffBus", "firing") in {(a["alertname"], a["state"]) for a in lost[0]["alerts"]}
    assert report["exit_code"] == 1


def test_a_hung_collective_is_named_a_hang(runs: dict[str, Run]) -> None:
    text = runs["hung-collective text"]
    assert text.code == 1, text.err
    verdict = text.out.splitlines()[0]
    assert verdict.startswith(f"node {HOST}: 8 GPUs, ")
    assert "8 hung" in verdict.split(", ")
    assert "healthy" not in verdict
    report = runs["hung-collective"].report
    assert report["exit_code"] == 1
    assert "healthy" not in report["node"]["verdict"]
    for gpu in report["gpus"]:
        assert "hung" in _bottlenecks(gpu), gpu
        assert "GPUJobHung" in _alert_names(gpu), gpu
        assert gpu["healthy"] is False


def test_the_same_seed_and_epoch_give_the_same_verdicts(runs: dict[str, Run]) -> None:
    # The doctor runs on the scenario's clock: another run, in this process and at another
    # moment, samples the same minutes at the same times, whatever the machine's speed.
    out = io.StringIO()
    options = Options(
        duration=420.0,
        interval=15.0,
        simulate="memory-bound",
        sim_epoch=EPOCH,
        sim_seed=1,
        json=True,
    )
    assert run(options, out=out, err=io.StringIO()) == runs["memory-bound"].code
    gpus = json.loads(out.getvalue())["gpus"]
    assert gpus == runs["memory-bound"].report["gpus"]
    for gpu in gpus:
        assert "memory_bandwidth_bound" in _bottlenecks(gpu), gpu


# A defect found on the shared runs: the test states what should hold.


def test_a_one_gpu_node_is_counted_in_the_singular(runs: dict[str, Run]) -> None:
    report = runs["h200-mig"].report
    assert report["node"]["gpus"] == 1
    assert report["node"]["verdict"].startswith(f"node {HOST}: 1 GPU, ")
