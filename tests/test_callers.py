"""gpuload as root, as an unprivileged user, and in a container without the host's PID namespace.

The simulated driver answers each caller as `exporter/sim/privileges.py` cites; what gpuload
does with each answer is in docs/reliability.md. Every shipped scenario is run as each caller.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT, Clock, exposition_text, parse_metrics, series, value_of, wait_until

from exporter import config, sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.collectors.processes import resolve_host_pid_namespace
from exporter.sim.scenario import CALLERS, SCENARIO_DIR, load_scenario
from exporter.snapshot import Snapshot

SCENARIOS = sorted(path.stem for path in SCENARIO_DIR.glob("*.yaml"))
# Reads NVML refuses to an unprivileged caller, as docs/reliability.md lists them: whole-GPU
# memory and processes on MIG GPUs (nvml.h), GPM samples of the GPU and of its MIG instances
# (DCGM issue 214).
DOCUMENTED_REFUSALS = {
    ("memory", "memory"),
    ("processes", "compute_processes"),
    ("gpm", "gpm_sample"),
    ("mig", "gpm_sample"),
}
# Faults that make a read fail on purpose, and so a collector report failure while they last.
FAILING_FAULTS = {"error", "sentinel", "hang", "gpu_lost", "driver_not_loaded"}


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


def _faults_at(scenario: str, t: float) -> set[str]:
    return {f.kind for f in load_scenario(scenario).faults if f.active(t)} & FAILING_FAULTS


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_minute_of_every_scenario_as_each_caller(scenario: str, caller: str) -> None:
    clock = Clock(0)
    # The driver's latency is not slept: what is checked here is every answer, not its speed.
    sim.install(scenario, clock=clock, epoch=0, caller=caller, sleep=lambda _: None)
    visible = resolve_host_pid_namespace(str(caller != "unprivileged-no-host-pid").lower())
    collection = Collection(
        dict.fromkeys(REGISTRY, True),
        timeout=60,
        slow_interval=20,
        clock=clock,
        options={"processes": {"host_pid_namespace": visible}},
    )
    refused: set[tuple[str, str]] = set()
    try:
        for t in range(0, 61, 10):
            clock.now = t
            samples = _scrape(collection.run_cycle())
            failed = {
                dict(k)["collector"]
                for k, v in series(samples, "gpuload_collector_success").items()
                if v != 1
            }
            assert not failed or _faults_at(scenario, t), (t, failed)
            refused |= {
                (dict(k)["collector"], dict(k)["read"])
                for k in series(samples, "gpuload_nvml_permission_denied")
            }
            processes = series(samples, "gpu_processes")
            shown = set(series(samples, "gpuload_processes_visible").values())
            if caller == "unprivileged-no-host-pid":
                assert processes == {} and shown == {0.0}, (processes, shown)
            else:
                assert shown <= {1.0}, shown
    finally:
        collection.close()
        sim.uninstall()
    if caller == "root":
        assert refused == set()
    else:
        assert refused <= DOCUMENTED_REFUSALS, refused
    # Over the minute, a collector fails only while a fault of the scenario makes it.
    errors = series(samples, "gpuload_nvml_errors_total")
    assert not errors or any(_faults_at(scenario, t) for t in range(61)), errors


def test_outside_the_host_pid_namespace_the_kernel_says_so() -> None:
    # A child in a PID namespace of its own: what a container without hostPID is.
    unshare = shutil.which("unshare")
    probe = (
        "from exporter.collectors.processes import resolve_host_pid_namespace as resolve; "
        "print(resolve('auto'))"
    )
    if unshare is None or subprocess.run([unshare, "-Urpf", "true"], check=False).returncode:
        pytest.skip("unshare cannot make a PID namespace here")
    result = subprocess.run(
        [unshare, "-Urpf", "--mount-proc", sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "false"
    assert resolve_host_pid_namespace("true") == "true"
    assert resolve_host_pid_namespace("false") == "false"


def _load(**flags: str) -> config.Config:
    return config.load(
        environ={},
        flags=flags,
        collectors={name: spec.enabled_by_default for name, spec in REGISTRY.items()},
        collector_options={name: spec.options for name, spec in REGISTRY.items()},
    )


def test_the_settings_accept_each_caller_and_namespace_answer_and_name_a_bad_one() -> None:
    for caller in CALLERS:
        assert _load(**{"simulate.caller": caller}).simulate.caller == caller
    for answer in ("auto", "true", "false"):
        settings = _load(**{"collectors.processes.host_pid_namespace": answer})
        assert settings.collector_options["processes"]["host_pid_namespace"] == answer
    with pytest.raises(config.ConfigError, match=r"simulate\.caller.*expected one of root"):
        _load(**{"simulate.caller": "admin"})
    with pytest.raises(config.ConfigError, match=r"host_pid_namespace.*expected one of auto"):
        _load(**{"collectors.processes.host_pid_namespace": "maybe"})


def test_serve_tells_that_processes_are_not_visible_without_host_pid(daemon_factory) -> None:
    hidden = daemon_factory("--simulate", "training", "--sim.caller", "unprivileged-no-host-pid")
    shown = daemon_factory("--simulate", "training", "--sim.caller", "unprivileged")
    for daemon, visible in ((hidden, 0.0), (shown, 1.0)):
        wait_until(
            lambda d=daemon: len(series(d.metrics(), "gpuload_processes_visible")) == 8,
            what="8 GPUs",
        )
        samples = daemon.metrics()
        assert set(series(samples, "gpuload_processes_visible").values()) == {visible}
        assert (series(samples, "gpu_processes") == {}) == (visible == 0.0)
        assert value_of(samples, "gpuload_collector_success", collector="processes") == 1
    hidden.stop()
    logged = [line for line in hidden.log().splitlines() if "host's PID namespace" in line]
    assert len(logged) == 1 and "hostPID: true" in logged[0], hidden.log()


def test_sim_exec_answers_as_the_caller_it_is_given() -> None:
    script = textwrap.dedent(
        """
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        try:
            pynvml.nvmlDeviceGetMemoryInfo(handle)
            print("answered")
        except pynvml.NVMLError_NoPermission:
            print("refused")
        """
    )
    answers = {}
    for caller in ("root", "unprivileged"):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter",
                "sim",
                "exec",
                "--scenario",
                "h100-mig",
                "--caller",
                caller,
                "--",
                sys.executable,
                "-c",
                script,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        answers[caller] = result.stdout.strip()
    # Whole-GPU memory of a MIG-enabled GPU: only to a privileged caller (nvml.h).
    assert answers == {"root": "answered", "unprivileged": "refused"}


def test_an_unprivileged_exporter_says_it_cannot_judge_mig_instances(daemon_factory) -> None:
    """NVML refuses GPM to an unprivileged caller: a series, and a warning naming the cost."""
    daemon = daemon_factory("--simulate", "h100-mig", "--sim.caller", "unprivileged")
    wait_until(
        lambda: (
            value_of(
                daemon.metrics(),
                "gpuload_nvml_permission_denied",
                collector="mig",
                read="gpm_sample",
            )
            == 1
        ),
        what="the MIG GPU's refused GPM samples",
    )
    assert series(daemon.metrics(), "gpu_mig_sm_active_seconds_total") == {}
    daemon.stop()
    (warning,) = [line for line in daemon.log().splitlines() if "collector mig:" in line]
    assert "WARNING" in warning and "GPUMIGUtilizationLow" in warning, warning
    assert "runAsUser: 0" in warning, warning
