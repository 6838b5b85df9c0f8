"""The `gpuload` command line, run as a user would run it."""

from __future__ import annotations

import sys
from pathlib import Path

from helpers import gpuload

from exporter.collectors import REGISTRY


def test_sim_exec_runs_a_pynvml_program_against_the_scenario() -> None:
    script = (
        "import pynvml; pynvml.nvmlInit(); "
        "h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h))"
    )
    result = gpuload("sim", "exec", "--scenario", "mixed", "--", sys.executable, "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8 NVIDIA H100 PCIe"


def test_sim_exec_passes_the_exit_code_through() -> None:
    result = gpuload(
        "sim", "exec", "--scenario", "idle", "--", sys.executable, "-c", "raise SystemExit(3)"
    )
    assert result.returncode == 3


def test_sim_exec_rejects_an_unknown_scenario() -> None:
    result = gpuload("sim", "exec", "--scenario", "no-such-node", "--", "true")
    assert result.returncode == 2
    assert "no-such-node" in result.stderr


def test_sim_list_names_the_shipped_scenarios() -> None:
    result = gpuload("sim", "list")
    assert result.returncode == 0
    for name in ("idle", "training", "data-starved", "saturated", "thermal-throttle", "mixed"):
        assert f"\n{name} " in result.stdout


def test_collectors_lists_every_registered_collector() -> None:
    result = gpuload("collectors")
    assert result.returncode == 0
    for name in REGISTRY:
        assert result.stdout.count(f"{name} (enabled by default") == 1


def test_serve_rejects_an_unknown_scenario_before_starting() -> None:
    result = gpuload("serve", "--simulate", "no-such-node")
    assert result.returncode == 2
    assert "--simulate no-such-node" in result.stderr


def test_serve_help_lists_collector_flags() -> None:
    result = gpuload("serve", "--help")
    assert "--collector.utilization" in result.stdout
    assert "--web.listen-address" in result.stdout


def test_a_mistyped_flag_before_the_command_suggests_the_whole_line() -> None:
    result = gpuload("--simulte", "training")
    assert result.returncode == 2
    assert result.stderr == (
        "gpuload: 'training' is not a command; did you mean `gpuload serve --simulate training`?\n"
    )


def test_an_unknown_command_names_the_commands_and_the_closest() -> None:
    result = gpuload("servce")
    assert result.returncode == 2
    assert result.stderr == (
        "gpuload: 'servce' is not a command (commands: serve, sim, relay, doctor, report,"
        " collectors); did you mean serve?\n"
    )


def test_a_mistyped_flag_of_a_command_suggests_the_flag() -> None:
    result = gpuload("serve", "--simulte", "training")
    assert result.returncode == 2
    assert result.stderr == (
        "gpuload serve: unknown argument '--simulte'; did you mean --simulate?"
        " (see gpuload serve --help)\n"
    )


def test_a_bad_epoch_names_the_flag_and_what_it_expects() -> None:
    """serve, doctor and sim exec take the simulator's flags from one declaration."""
    expected = (
        "flag --sim.epoch: 'yesterday' is not valid: expected a number,"
        " e.g. 1767225600 (unix seconds) or 2.5\n"
    )
    for where, command in (
        ("gpuload", ["serve", "--simulate", "training", "--sim.epoch", "yesterday"]),
        ("gpuload doctor", ["doctor", "--sim.epoch", "yesterday"]),
        ("gpuload sim exec", ["sim", "exec", "--simulate", "idle", "--epoch", "yesterday"]),
    ):
        result = gpuload(*command, "--", "true") if "exec" in command else gpuload(*command)
        assert (result.returncode, result.stderr) == (2, f"{where}: {expected}")


def test_serve_doctor_and_sim_exec_show_the_same_help_for_a_shared_flag() -> None:
    lines = {}
    for command in (["serve"], ["doctor"], ["sim", "exec"]):
        text = " ".join(gpuload(*command, "--help").stdout.split())
        text = text.replace(", --seed VALUE", "")  # sim exec's older spelling
        start = text.rindex("--sim.seed VALUE")  # in the options, after the usage line
        lines[command[-1]] = text[start : text.index(" --", start + 2)]
    assert lines["serve"] == lines["doctor"] == lines["exec"]
    assert "seed of the scenario's noise" in lines["serve"]


def test_an_unknown_config_key_suggests_the_closest(tmp_path: Path) -> None:
    path = tmp_path / "gpuload.yaml"
    path.write_text("web:\n  listen_adress: ':19400'\n")
    result = gpuload("serve", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(
        "gpuload: config file web.listen_adress: unknown setting;"
        " did you mean web.listen_address? (known: "
    )
    assert result.stderr.count("\n") == 1


def test_help_shows_examples_and_the_no_collector_flags() -> None:
    top = gpuload("--help")
    assert "examples:\n  gpuload serve " in top.stdout
    serve = gpuload("serve", "--help")
    assert "--no-collector.utilization" in serve.stdout


def test_collectors_print_durations_as_durations() -> None:
    result = gpuload("collectors")
    assert "setting collectors.kubernetes.refresh (default 10s)" in result.stdout
    assert "setting collectors.kubernetes.timeout (default 2s)" in result.stdout


def test_sim_exec_takes_the_same_flags_as_serve_and_runs_python_in_gpuloads_environment() -> None:
    script = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
    # `python3`, not sys.executable: the first python3 on PATH may lack pynvml.
    result = gpuload(
        "sim", "exec", "--simulate", "mixed", "--sim.seed", "3", "--", "python3", "-c", script
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8"
