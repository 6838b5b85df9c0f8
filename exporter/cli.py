"""The `gpuload` command line: argument parsing only; the work lives elsewhere."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from exporter import __version__, config
from exporter.collectors import REGISTRY
from exporter.relay import arguments as relay_arguments
from exporter.report import arguments as report_arguments
from exporter.settings import parse_duration, with_flag_names

# The simulator's settings, which `serve`, `sim exec` and `doctor` all take.
_SIMULATION = (
    "simulate.scenario",
    "simulate.epoch",
    "simulate.seed",
    "simulate.time",
    "simulate.caller",
)


def _serve_parser(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the exporter",
        description="Read NVML in the background and serve Prometheus metrics. Settings come "
        "from flags > GPULOAD_* environment variables > the config file > defaults.",
    )
    serve.add_argument("--config", metavar="FILE", help="YAML configuration file")
    config.SETTINGS.add_flags(serve, aliases={"log.format": ("--log-format",)})
    group = serve.add_argument_group(
        "collectors", "--collector.NAME turns a collector on, --no-collector.NAME off"
    )
    for name, spec in sorted(REGISTRY.items()):
        state = "on" if spec.enabled_by_default else "off"
        group.add_argument(
            f"--collector.{name}",
            dest=f"collectors.{name}.enabled",
            action="store_const",
            const=True,
            default=argparse.SUPPRESS,
            help=f"{spec.description} (default {state})",
        )
        group.add_argument(
            f"--no-collector.{name}",
            dest=f"collectors.{name}.enabled",
            action="store_const",
            const=False,
            default=argparse.SUPPRESS,
            help=f"turn the {name} collector off",
        )


def _sim_parser(subparsers: Any) -> None:
    sim = subparsers.add_parser("sim", help="the simulated NVML")
    commands = sim.add_subparsers(dest="sim_command", required=True)
    commands.add_parser("list", help="list the shipped scenarios")
    imported = commands.add_parser(
        "import",
        help="make a scenario from nvidia-smi output",
        description="Turn nvidia-smi -q -x (XML), nvidia-smi -q (text), --query-gpu CSV or a "
        "capture bundle into a scenario that --simulate and sim exec take: every recorded "
        "value becomes the GPU's, every N/A an unsupported function.",
    )
    imported.add_argument("file", help="the recording")
    imported.add_argument(
        "--state",
        choices=("idle", "load"),
        default="load",
        help="which state of a capture bundle (default load)",
    )
    imported.add_argument("--gpu", type=int, help="only this GPU of the recording (by position)")
    imported.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    imported.add_argument(
        "--verbose", action="store_true", help="also list the fields the import did not read"
    )
    run = commands.add_parser(
        "exec",
        help="run a program against the simulated GPUs",
        description="Run any Python program that uses pynvml (nvitop, gpustat, your own "
        "script) against simulated GPUs: gpuload sim exec --simulate training -- nvitop -1. "
        "`python` and `python3` run in gpuload's own environment, where pynvml is.",
    )
    # The same flags as `serve` and `doctor`; the short ones stay for older scripts.
    config.SETTINGS.add_flags(
        run,
        _SIMULATION,
        aliases={key: ("--" + key.split(".")[1],) for key in _SIMULATION},
    )
    run.add_argument("program", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    record = commands.add_parser(
        "record",
        help="write this node's NVML answers as a scenario",
        description="Read every NVML function gpuload uses once per GPU and write a scenario "
        "that the simulator serves as this node: gpuload serve --simulate FILE. UUIDs, serial "
        "numbers and process arguments are masked unless --no-mask.",
    )
    record.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    record.add_argument(
        "--no-mask",
        dest="mask",
        action="store_false",
        help="keep GPU UUIDs, serial numbers and full process names as read",
    )


def _doctor_parser(subparsers: Any) -> None:
    doctor = subparsers.add_parser(
        "doctor",
        help="sample the GPUs and say what holds each one back",
        description="Sample the GPUs, evaluate the shipped rules on the samples and print, per "
        "GPU, its recorded state, its bottleneck classes (input-starved, memory-bandwidth-bound, "
        "hung, compute-bound, throttled, PCIe-bound, imbalanced, ...) and its pending and firing "
        "alerts, with the next steps from the runbooks. On the simulator the scenario's minutes "
        "are sampled at once. Exit code 0 healthy, 1 findings, 2 could not measure.",
    )
    doctor.add_argument(
        "--duration",
        help="how long to sample, e.g. 30s, 10m (default: the rules' warm-up, their window and "
        "short window after each other, so every mean and alert has its samples)",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON for machines")
    config.SETTINGS.add_flags(
        doctor, ("collect_interval", "simulate.scenario", "simulate.epoch", "simulate.seed")
    )
    doctor.add_argument(
        "--prometheus", metavar="URL", help="read the window from this Prometheus instead"
    )
    doctor.add_argument(
        "--instance", help="with --prometheus: the node's instance label (host:port)"
    )


EXAMPLES = """examples:
  gpuload serve                                  export this node's GPUs on :19400
  gpuload serve --simulate training              the same on simulated GPUs, no GPU needed
  gpuload doctor                                 what holds each GPU back, by the rules
  gpuload doctor --simulate data-starved         the same on a simulated node, at once
  gpuload report --prometheus URL --last-week    GPU-hours allocated, used and idle by owner
  gpuload relay --config examples/relay-local.yaml
  gpuload sim list                               the simulated scenarios
  gpuload collectors                             every collector, its settings and families
"""


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line that suggests the flag or command meant."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = _Parser(
        prog="gpuload",
        description="GPU load exporter.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuload {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _serve_parser(subparsers)
    _sim_parser(subparsers)
    relay_arguments.add_parser(subparsers)
    _doctor_parser(subparsers)
    report_arguments.add_parser(subparsers)
    subparsers.add_parser("collectors", help="list the collectors and their metric families")
    return parser


def _serve(args: argparse.Namespace) -> int:
    flags = {
        key: value
        for key, value in vars(args).items()
        if key in config.SETTINGS or key.startswith("collectors.")
    }
    try:
        settings = config.load(
            file=args.config,
            environ=os.environ,
            flags=flags,
            collectors={name: spec.enabled_by_default for name, spec in REGISTRY.items()},
            collector_options={name: spec.options for name, spec in REGISTRY.items()},
        )
    except config.ConfigError as error:
        print(f"gpuload: {with_flag_names(str(error), config.SETTINGS.flag_of)}", file=sys.stderr)
        return 2
    if settings.simulate.scenario and not _scenario_loads(settings.simulate.scenario, "gpuload"):
        return 2

    from exporter import logs
    from exporter.server.daemon import serve

    logs.setup(settings.log.level, settings.log.format)
    return serve(settings)


def _flag_settings(args: argparse.Namespace, where: str) -> dict[str, Any] | None:
    """The serve settings a command took as flags, parsed as `serve` parses them, with defaults.

    None after one line naming the bad flag.
    """
    try:
        values, _sources = config.SETTINGS.resolve([("flag", config.SETTINGS.flags_given(args))])
    except config.ConfigError as error:
        print(f"{where}: {with_flag_names(str(error), config.SETTINGS.flag_of)}", file=sys.stderr)
        return None
    return values


def _scenario_loads(scenario: str, where: str) -> bool:
    from exporter import sim

    try:
        sim.load_scenario(scenario)
    except (sim.ScenarioError, OSError) as error:
        print(f"{where}: --simulate {scenario}: {error}", file=sys.stderr)
        return False
    return True


def _sim(args: argparse.Namespace) -> int:
    from exporter import sim

    if args.sim_command == "list":
        print(sim.describe_scenarios())
        return 0
    if args.sim_command == "import":
        from exporter.sim.importer import import_command

        return import_command(args.file, args.state, args.gpu, args.output, args.verbose)
    if args.sim_command == "record":
        from exporter.sim.recording import record_command

        return record_command(args.output, mask=args.mask)
    where = "gpuload sim exec"
    settings = _flag_settings(args, where)
    if settings is None:
        return 2
    scenario = settings["simulate.scenario"]
    if scenario is None:
        print(f"{where}: give the scenario: --simulate NAME or FILE", file=sys.stderr)
        return 2
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        print(f"{where}: give the program to run after --", file=sys.stderr)
        return 2
    if not _scenario_loads(scenario, where):
        return 2
    if command[0] in ("python", "python3"):
        # The environment gpuload runs in, where pynvml is, not the first python on PATH.
        command = [sys.executable, *command[1:]]
    return sim.exec_command(
        scenario,
        command,
        epoch=settings["simulate.epoch"],
        seed=settings["simulate.seed"],
        pinned_time=settings["simulate.time"],
        caller=settings["simulate.caller"],
    )


def _doctor(args: argparse.Namespace) -> int:
    from exporter.doctor.command import Options, run

    where = "gpuload doctor"
    settings = _flag_settings(args, where)
    if settings is None:
        return 2
    try:
        duration = None if args.duration is None else parse_duration(args.duration)
    except ValueError as error:
        print(f"{where}: --duration {args.duration!r}: {error}", file=sys.stderr)
        return 2
    if args.prometheus and not args.instance:
        print(f"{where}: --prometheus needs --instance HOST:PORT", file=sys.stderr)
        return 2
    simulate = settings["simulate.scenario"]
    if simulate and not _scenario_loads(simulate, where):
        return 2
    options = Options(
        duration=duration,
        interval=settings["collect_interval"],
        simulate=simulate,
        sim_epoch=settings["simulate.epoch"],
        sim_seed=settings["simulate.seed"],
        prometheus=args.prometheus,
        instance=args.instance,
        json=args.json,
    )
    return run(options)


def _collectors() -> int:
    for name, spec in sorted(REGISTRY.items()):
        state = "enabled" if spec.enabled_by_default else "disabled"
        print(f"{name} ({state} by default, per {spec.scope}): {spec.description}")
        for option, default in spec.options.items():
            # Float options are seconds (a refresh, a timeout): written as a duration.
            shown = f"{default:g}s" if isinstance(default, float) else default
            print(f"  setting collectors.{name}.{option} (default {shown})")
        for family in spec.families:
            print(f"  {family.name}")
    return 0


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [option for option in parser._option_string_actions if option.startswith("--")]


def _parse(argv: Sequence[str]) -> argparse.Namespace | int:
    """Parse, or print one line naming the unknown flag or command and what was meant."""
    parser = build_parser()
    commands: dict[str, argparse.ArgumentParser] = {}
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        commands.update(getattr(action, "choices", {}) or {})
    words = list(argv)
    first = next((w for w in words if not w.startswith("-")), None)
    if (
        first is not None
        and first not in commands
        and not any(w in ("-h", "--help", "--version") for w in words)
    ):
        # An unknown command, or flags given before the command: suggest the whole line.
        flags = [w for w in words if w.startswith("--")]
        for name, command in commands.items():
            known = _options(command)
            fixes = {f: difflib.get_close_matches(f, known, n=1, cutoff=0.75) for f in flags}
            if flags and all(fixes.values()):
                line = " ".join(fixes[w][0] if w in fixes else w for w in words)
                print(
                    f"gpuload: {first!r} is not a command; did you mean `gpuload {name} {line}`?",
                    file=sys.stderr,
                )
                return 2
        print(
            f"gpuload: {first!r} is not a command (commands: {', '.join(commands)})"
            f"{_suggest(first, list(commands))}",
            file=sys.stderr,
        )
        return 2
    args, extra = parser.parse_known_args(words)
    if extra:
        chosen = commands.get(getattr(args, "command", "") or "")
        known = _options(chosen) if chosen is not None else []
        unknown = extra[0]
        where = f"gpuload {args.command}" if chosen is not None else "gpuload"
        hint = _suggest(unknown.split("=")[0], known) if unknown.startswith("-") else ""
        print(f"{where}: unknown argument {unknown!r}{hint} (see {where} --help)", file=sys.stderr)
        return 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gpuload` console script."""
    parsed = _parse(sys.argv[1:] if argv is None else argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    if args.command == "serve":
        return _serve(args)
    if args.command == "sim":
        return _sim(args)
    if args.command == "relay":
        from exporter.relay import cli as relay_cli

        return relay_cli.run(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "report":
        from exporter.report import command as report_command

        return report_command.run(args)
    return _collectors()


if __name__ == "__main__":
    sys.exit(main())
