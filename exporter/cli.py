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
from exporter.settings import parse_duration, with_flag_names

# Command-line flag -> configuration key path.
_SERVE_FLAGS = {
    "--web.listen-address": (
        "web.listen_address",
        f"address to listen on, host:port or :port (default :{config.DEFAULT_PORT})",
    ),
    "--web.telemetry-path": ("web.telemetry_path", "path of the metrics (default /metrics)"),
    "--web.config.file": (
        "web.config_file",
        "web config file in the Prometheus exporter-toolkit format: TLS and basic auth "
        "(docs/security.md)",
    ),
    "--collect.interval": (
        "collect_interval",
        "how often NVML is read, e.g. 1s, 500ms (default 1s)",
    ),
    "--collect.timeout": (
        "collect_timeout",
        "how long a cycle waits for a GPU before marking it stale (default 80%% of the interval)",
    ),
    "--collect.slow-interval": (
        "collect_slow_interval",
        "how often values that change rarely are read: limits, maxima, ECC/NVLink/PCIe error "
        "counters, remapped rows, MIG mode, driver versions (default 10s; at most the "
        "interval: every cycle)",
    ),
    "--metrics.profile": (
        "metrics_profile",
        "which series each GPU exports: minimal (at most 25 per GPU), default (at most 80) or "
        "full (everything, e.g. for a node being debugged); docs/fleet.md (default default)",
    ),
    "--log.level": ("log.level", "debug, info, warning or error (default info)"),
    "--log.format": ("log.format", "text or json (default text)"),
    "--simulate": (
        "simulate.scenario",
        "use the simulated NVML with this scenario name or YAML file instead of the GPU driver",
    ),
    "--sim.epoch": ("simulate.epoch", "scenario start, unix seconds (default: now)"),
    "--sim.seed": ("simulate.seed", "seed of the scenario's noise"),
    "--sim.time": (
        "simulate.time",
        "pin the scenario clock at this many seconds after its epoch; retries and slow reads "
        "follow the scenario clock, so a pinned one gives the same output every run",
    ),
    "--sim.caller": (
        "simulate.caller",
        "who the simulated driver believes is calling: root, unprivileged or "
        "unprivileged-no-host-pid (default: the scenario's caller, root unless it says)",
    ),
}


def _serve_parser(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the exporter",
        description="Read NVML in the background and serve Prometheus metrics. Settings come "
        "from flags > GPULOAD_* environment variables > the config file > defaults.",
    )
    serve.add_argument("--config", metavar="FILE", help="YAML configuration file")
    for flag, (key, text) in _SERVE_FLAGS.items():
        aliases = [flag, "--log-format"] if flag == "--log.format" else [flag]
        serve.add_argument(
            *aliases, dest=key, metavar="VALUE", help=text, default=argparse.SUPPRESS
        )
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
    conformance = commands.add_parser(
        "conformance",
        help="compare gpuload on imported recordings with nvidia-smi's figures",
        description="Import every recording under DIR, run gpuload serve --simulate on it and "
        "compare /metrics with what nvidia-smi printed (docs/conformance.md). Exit 1 on any "
        "mismatch.",
    )
    conformance.add_argument("directory", help="e.g. ../shared/reality")
    conformance.add_argument(
        "--families", action="store_true", help="also print which families were compared"
    )
    run = commands.add_parser(
        "exec",
        help="run a program against the simulated GPUs",
        description="Run any Python program that uses pynvml (nvitop, gpustat, your own "
        "script) against simulated GPUs: gpuload sim exec --simulate training -- nvitop -1. "
        "`python` and `python3` run in gpuload's own environment, where pynvml is.",
    )
    # The same flags as `serve` and `doctor`; the short ones stay for older scripts.
    run.add_argument(
        "--simulate",
        "--scenario",
        dest="scenario",
        required=True,
        help="scenario name or YAML file",
    )
    run.add_argument(
        "--sim.epoch",
        "--epoch",
        dest="epoch",
        type=_unix_seconds,
        help="scenario start, unix seconds (default: now)",
    )
    run.add_argument(
        "--sim.seed", "--seed", dest="seed", type=int, help="seed of the scenario's noise"
    )
    run.add_argument(
        "--sim.time",
        "--time",
        type=float,
        dest="pinned_time",
        help="pin the scenario clock at this many seconds after its epoch",
    )
    run.add_argument(
        "--sim.caller",
        "--caller",
        dest="caller",
        choices=("root", "unprivileged", "unprivileged-no-host-pid"),
        help="who the simulated driver believes is calling (default: the scenario's caller)",
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
    doctor.add_argument(
        "--collect.interval", dest="interval", default="1s", help="sampling interval (default 1s)"
    )
    doctor.add_argument("--json", action="store_true", help="print JSON for machines")
    doctor.add_argument("--simulate", metavar="SCENARIO", help="sample the simulated NVML")
    doctor.add_argument(
        "--sim.epoch",
        dest="sim_epoch",
        type=_unix_seconds,
        help="scenario start, unix seconds: the doctor samples from it "
        "(default: so that the samples end now)",
    )
    doctor.add_argument("--sim.seed", dest="sim_seed", type=int, help="scenario noise seed")
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
  gpuload relay --config examples/relay-local.yaml
  gpuload sim list                               the simulated scenarios
  gpuload collectors                             every collector, its settings and families
"""


def _unix_seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not unix seconds (e.g. 1767225600; `date +%s` prints now)"
        ) from None


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
    subparsers.add_parser("collectors", help="list the collectors and their metric families")
    return parser


def _serve(args: argparse.Namespace) -> int:
    known = {key for key, _help in _SERVE_FLAGS.values()}
    flags = {
        key: value
        for key, value in vars(args).items()
        if key in known or key.startswith("collectors.")
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
        flags = {setting: flag for flag, (setting, _help) in _SERVE_FLAGS.items()}
        named = with_flag_names(str(error), lambda key: flags.get(key, "--" + key))
        print(f"gpuload: {named}", file=sys.stderr)
        return 2
    if settings.simulate.scenario:
        from exporter import sim

        try:
            sim.load_scenario(settings.simulate.scenario)
        except (sim.ScenarioError, OSError) as error:
            print(f"gpuload: --simulate {settings.simulate.scenario}: {error}", file=sys.stderr)
            return 2

    from exporter import logs
    from exporter.server.daemon import serve

    logs.setup(settings.log.level, settings.log.format)
    return serve(settings)


def _sim(args: argparse.Namespace) -> int:
    from exporter import sim

    if args.sim_command == "list":
        print(sim.describe_scenarios())
        return 0
    if args.sim_command == "import":
        from exporter.sim.importer import import_command

        return import_command(args.file, args.state, args.gpu, args.output, args.verbose)
    if args.sim_command == "conformance":
        from pathlib import Path

        from exporter.sim.conformance import run

        return run(Path(args.directory), families=args.families)
    if args.sim_command == "record":
        from exporter.sim.recording import record_command

        return record_command(args.output, mask=args.mask)
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        print("gpuload sim exec: give the program to run after --", file=sys.stderr)
        return 2
    try:
        sim.load_scenario(args.scenario)
    except (sim.ScenarioError, OSError) as error:
        print(f"gpuload sim exec: --simulate {args.scenario}: {error}", file=sys.stderr)
        return 2
    if command[0] in ("python", "python3"):
        # The environment gpuload runs in, where pynvml is, not the first python on PATH.
        command = [sys.executable, *command[1:]]
    return sim.exec_command(
        args.scenario,
        command,
        epoch=args.epoch,
        seed=args.seed,
        pinned_time=args.pinned_time,
        caller=args.caller,
    )


def _doctor(args: argparse.Namespace) -> int:
    from exporter.doctor.command import Options, run

    try:
        duration = None if args.duration is None else parse_duration(args.duration)
        interval = parse_duration(args.interval)
    except ValueError as error:
        print(f"gpuload doctor: {error}", file=sys.stderr)
        return 2
    if args.prometheus and not args.instance:
        print("gpuload doctor: --prometheus needs --instance HOST:PORT", file=sys.stderr)
        return 2
    if args.simulate:
        from exporter import sim

        try:
            sim.load_scenario(args.simulate)
        except (sim.ScenarioError, OSError) as error:
            print(f"gpuload doctor: --simulate {args.simulate}: {error}", file=sys.stderr)
            return 2
    options = Options(
        duration=duration,
        interval=interval,
        simulate=args.simulate,
        sim_epoch=args.sim_epoch,
        sim_seed=args.sim_seed,
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
    return _collectors()


if __name__ == "__main__":
    sys.exit(main())
