"""The daemon's configuration: one typed object built from defaults < file < env < flags.

Every setting has a dotted key path (``web.listen_address``); the YAML file
nests by it, the environment spells it ``GPULOAD_WEB_LISTEN_ADDRESS`` and the
command line ``--web.listen-address``. Validation happens here, once, and an
error names the key path, where it came from and what was expected.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from exporter.relay.config import RelayConfig
    from exporter.server.webconfig import WebSecurity

ENV_PREFIX = "GPULOAD_"
# Variables of others: the simulated NVML in programs started by `gpuload sim exec`, and
# the relay's settings, which may share an environment with the exporter.
_RESERVED_ENV_PREFIXES = ("GPULOAD_SIM_", "GPULOAD_RELAY_")
DEFAULT_PORT = 19400


class ConfigError(ValueError):
    """A setting is unknown or has a bad value; the message names its key path."""


@dataclass(frozen=True)
class WebConfig:
    """Where and how the HTTP endpoint listens."""

    listen_address: str = f":{DEFAULT_PORT}"
    telemetry_path: str = "/metrics"
    # The exporter-toolkit web config file (TLS, basic auth) and what it said at start.
    config_file: str | None = None
    security: WebSecurity | None = field(default=None, repr=False)


@dataclass(frozen=True)
class LogConfig:
    """Log level and line format."""

    level: str = "info"
    format: str = "text"


@dataclass(frozen=True)
class SimulationConfig:
    """Run against the simulated NVML instead of the driver (`--simulate`)."""

    scenario: str | None = None
    epoch: float | None = None
    seed: int | None = None
    time: float | None = None
    # Who the simulated driver believes is calling; None: the scenario's own `caller`.
    caller: str | None = None


@dataclass(frozen=True)
class AlertingConfig:
    """The local alerts (`alerting` in the file): where they go, and how they are labelled."""

    # The relay's targets, route, queue, delivery and message settings; None without targets.
    delivery: RelayConfig | None = None
    # The `instance` label of local alerts; None: the listen address, or host:port when it
    # listens on every interface.
    instance: str | None = None
    job: str = "gpuload"
    thresholds_file: str | None = None
    # Seconds between evaluations of the rules (the history takes every cycle's samples).
    evaluation_interval: float = 15.0
    # Seconds between notifications of a still-firing alert, as Alertmanager's repeat_interval
    # (0: only when it fires and when it resolves).
    repeat_interval: float = 4 * 3600.0


@dataclass(frozen=True)
class Config:
    """Everything `gpuload serve` needs, validated."""

    web: WebConfig = field(default_factory=WebConfig)
    log: LogConfig = field(default_factory=LogConfig)
    collect_interval: float = 1.0
    collect_timeout: float | None = None
    # Limits, maxima, error counters, remapped rows, driver versions: read this often.
    collect_slow_interval: float = 10.0
    # Which series are exported: minimal, default or full (exporter/collectors/profiles.py).
    metrics_profile: str = "default"
    collectors: Mapping[str, bool] = field(default_factory=dict)
    collector_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    simulate: SimulationConfig = field(default_factory=SimulationConfig)
    alerting: AlertingConfig = field(default_factory=AlertingConfig)

    @property
    def effective_collect_timeout(self) -> float:
        """How long one cycle waits for a GPU before reporting it stale."""
        return self.collect_timeout or max(0.1, self.collect_interval * 0.8)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]*):(\d{1,5})$")


# The longest duration any setting takes: a year (the relay's dead-letter retention is a week).
MAX_DURATION_SECONDS = 366 * 86400.0


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``500ms``, ``1s``, ``2m``: finite, up to a year."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 1s, 500ms or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ValueError("expected a duration like 1s, 500ms or a number of seconds")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("expected a duration above zero, like 1s, 500ms or 5m")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError("expected a duration of at most a year (8784h)")
    return seconds


# Words in a key's name that say its value is a secret: such values are never shown in an error.
_SECRET_WORDS = ("token", "secret", "password", "url", "credential", "key")


def with_flag_names(message: str, flag_of: Callable[[str], str]) -> str:
    """A config error about a flag, naming the flag as typed: "flag --sim.epoch", not its key."""
    if not message.startswith("flag "):
        return message
    key, _, rest = message.removeprefix("flag ").partition(":")
    return f"flag {flag_of(key)}:{rest}"


def shown(key: str, value: Any) -> str:
    """A value for an error message: repr(value), or only its kind for a key that names a secret."""
    name = key.rsplit(".", 1)[-1].lower()
    if any(word in name for word in _SECRET_WORDS):
        return f"a {type(value).__name__} (not shown: the key names a secret)"
    return repr(value)


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases, which no setting needs.

    `*name` re-uses a node, and a few of them nested expand to gigabytes (a "billion laughs")
    before any key is checked.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(
                problem="aliases (*name) are not accepted in a config file",
                problem_mark=event.start_mark,
            )
        return super().compose_node(parent, index)


def load_yaml(text: str, where: str) -> Any:
    """Parse a config file's YAML; an error says the line and the problem, never the text there.

    Raises:
        ConfigError: naming ``where`` and the line.
    """
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context or "not valid YAML"
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{where}: not valid YAML") from None


def parse_bool(value: Any) -> bool:
    """A boolean from YAML or from the words true/false/1/0/yes/no."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_listen_address(value: Any) -> str:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port``; port 0 picks a free one."""
    text = str(value)
    match = _ADDRESS.match(text)
    if not match or int(match.group(2)) > 65535:
        raise ValueError("expected host:port, :port or [ipv6]:port with a port 0-65535")
    return text


def parse_choice(*allowed: str) -> Callable[[Any], str]:
    """A parser accepting one of `allowed` (case-insensitive), returned lower-case."""

    def parse(value: Any) -> str:
        text = str(value).lower()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return text

    return parse


def parse_url_path(value: Any) -> str:
    """An HTTP path such as /metrics."""
    text = str(value)
    if not text.startswith("/"):
        raise ValueError("expected a path starting with /")
    return text


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else parse(value)


def _number(value: Any) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except ValueError:
        raise ValueError("expected a number, e.g. 1767225600 (unix seconds) or 2.5") from None


def _integer(value: Any) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(value)
    except ValueError:
        raise ValueError("expected a whole number, e.g. 42") from None


# Every scalar setting, by key path. Collectors' `collectors.NAME.enabled` keys
# come from the collector registry and are added by `load`.
_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "web.listen_address": parse_listen_address,
    "web.telemetry_path": parse_url_path,
    "web.config_file": _optional(str),
    "log.level": parse_choice("debug", "info", "warning", "error"),
    "log.format": parse_choice("text", "json"),
    "collect_interval": parse_duration,
    "collect_timeout": _optional(parse_duration),
    "collect_slow_interval": parse_duration,
    "metrics_profile": parse_choice("minimal", "default", "full"),
    "simulate.scenario": _optional(str),
    "simulate.epoch": _optional(_number),
    "simulate.seed": _optional(_integer),
    "simulate.time": _optional(_number),
    # The simulator's callers (exporter/sim/scenario.py CALLERS), named here so that a real
    # deployment's configuration never imports the simulator.
    "simulate.caller": _optional(parse_choice("root", "unprivileged", "unprivileged-no-host-pid")),
}


def env_name(key: str, prefix: str = ENV_PREFIX) -> str:
    """The environment variable of a key path: web.listen_address -> GPULOAD_WEB_LISTEN_ADDRESS."""
    return prefix + key.upper().replace(".", "_")


# Sections of `gpuload serve`'s file that are structures of their own, not settings.
_STRUCTURES = ("alerting",)


def flatten(tree: Mapping[Any, Any], structures: Collection[str] = ()) -> dict[str, Any]:
    """Key paths to values: {"web": {"listen_address": x}} -> {"web.listen_address": x}.

    A mapping under one of `structures` stays whole, under its own key path.
    """
    flat: dict[str, Any] = {}

    def walk(node: Mapping[Any, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, Mapping) and path not in structures:
                walk(value, path)
            else:
                flat[path] = value

    walk(tree, "")
    return flat


def read_settings_file(path: Path, structures: Collection[str] = ()) -> dict[str, Any]:
    """A YAML settings file, flattened to key paths; errors name the file."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"config file {path}: cannot read it ({error.strerror})") from None
    tree = load_yaml(text, f"config file {path}")
    if tree is None:
        return {}
    if not isinstance(tree, Mapping):
        raise ConfigError(f"config file {path}: expected a mapping of settings at the top level")
    return flatten(tree, structures)


def read_env(
    environ: Mapping[str, str],
    settings: Collection[str],
    *,
    prefix: str = ENV_PREFIX,
    skip: tuple[str, ...] = _RESERVED_ENV_PREFIXES,
    program: str = "gpuload",
) -> dict[str, Any]:
    """The settings given as `prefix`+KEY_PATH variables; any other such variable is an error."""
    by_name = {env_name(key, prefix): key for key in settings}
    found: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(prefix) or name.startswith(skip):
            continue
        if name not in by_name:
            raise ConfigError(f"environment variable {name}: not a {program} setting")
        found[by_name[name]] = value
    return found


def load(
    *,
    file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    collectors: Mapping[str, bool] | None = None,
    collector_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build and validate the configuration; flags > env > file > defaults.

    Args:
        file: YAML config file, nested by key path.
        environ: the process environment (GPULOAD_* variables are read).
        flags: values given on the command line, by key path.
        collectors: every known collector and whether it is enabled by default.
        collector_options: each collector's own settings and their defaults; a setting
            ``collectors.NAME.OPTION`` takes a value of the default's type.

    Raises:
        ConfigError: naming the first bad key path, its source and what is expected.
    """
    known = dict(collectors or {})
    settings = dict(_SETTINGS)
    settings.update({f"collectors.{name}.enabled": parse_bool for name in known})
    options = {name: dict(defaults) for name, defaults in (collector_options or {}).items()}
    for name, defaults in options.items():
        for option, default in defaults.items():
            settings[f"collectors.{name}.{option}"] = _parser_like(default)

    from_file = read_settings_file(Path(file), _STRUCTURES) if file else {}
    alerting = _alerting(
        from_file.pop("alerting", None), Path(file).parent if file else Path.cwd(), environ or {}
    )
    layers = [
        ("config file", from_file),
        ("environment", read_env(environ or {}, settings)),
        ("flag", dict(flags or {})),
    ]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, layer in layers:
        for key, raw in layer.items():
            parse = settings.get(key)
            if parse is None:
                raise ConfigError(f"{source} {key}: unknown setting{_hint(key, settings)}")
            try:
                values[key] = parse(raw)
            except (TypeError, ValueError) as error:
                raise ConfigError(
                    f"{source} {key}: {shown(key, raw)} is not valid: {error}"
                ) from None
            sources[key] = source
    for key, value in values.items():
        parts = key.split(".")
        if parts[0] == "collectors" and parts[2] != "enabled":
            options[parts[1]][parts[2]] = value
    config = replace(_build(values, known, options), alerting=alerting)
    web_config = values.get("web.config_file")
    if web_config is None:
        return config
    source = sources["web.config_file"]
    if source == "config file" and file:
        web_config = str(Path(file).parent / web_config)
    return replace(
        config,
        web=replace(
            config.web,
            config_file=web_config,
            security=load_web_config(web_config, f"{source} web.config_file"),
        ),
    )


def load_web_config(path: str, where: str) -> WebSecurity:
    """Read and check a web config file; errors start with `where` (source and key path).

    Raises:
        ConfigError: naming the key path and the key in the web config file.
    """
    # Imported here: the web config module imports this one's parsers.
    from exporter.server import webconfig

    try:
        return webconfig.load(path)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


# The queue file of local alerts, unless `alerting.queue.path` says otherwise.
DEFAULT_ALERT_QUEUE = "gpuload-alerts.db"
_ALERTING_KEYS = {"instance", "job", "thresholds_file", "evaluation_interval", "repeat_interval"}


def _alerting(tree: Any, base: Path, environ: Mapping[str, str]) -> AlertingConfig:
    """The `alerting` section: gpuload's own keys, the rest in the relay's format."""
    if tree is None:
        return AlertingConfig()
    if not isinstance(tree, Mapping):
        raise ConfigError("config file alerting: expected a mapping (targets, route, queue, ...)")
    own = {key: tree[key] for key in _ALERTING_KEYS if key in tree}
    intervals = {}
    for key in ("evaluation_interval", "repeat_interval"):
        value = own.pop(key, getattr(AlertingConfig, key))
        if key == "repeat_interval" and str(value).strip() in ("0", "0s"):
            intervals[key] = 0.0  # never repeat
            continue
        try:
            intervals[key] = parse_duration(value)
        except ValueError as error:
            raise ConfigError(
                f"config file alerting.{key}: {value!r} is not valid: {error}"
            ) from None
    for key, value in own.items():
        if not isinstance(value, str) or not value:
            raise ConfigError(f"config file alerting.{key}: {value!r} is not valid: expected text")
    relay_part = {key: value for key, value in tree.items() if key not in _ALERTING_KEYS}
    # Imported here: the relay's configuration imports this module's parsers.
    from exporter.relay.config import load_section

    delivery = load_section(
        relay_part,
        path="alerting",
        base=base,
        environ=environ,
        defaults={"queue.path": DEFAULT_ALERT_QUEUE},
    )
    thresholds_file = own.get("thresholds_file")
    if thresholds_file is not None:
        thresholds_file = str(base / thresholds_file)
    return AlertingConfig(
        delivery=delivery if delivery.targets else None,
        instance=own.get("instance"),
        job=own.get("job", "gpuload"),
        thresholds_file=thresholds_file,
        evaluation_interval=intervals["evaluation_interval"],
        repeat_interval=intervals["repeat_interval"],
    )


def _parser_like(default: Any) -> Callable[[Any], Any]:
    if default == "auto":  # detected unless said: auto, true or false
        return parse_choice("auto", "true", "false")
    if isinstance(default, bool):
        return parse_bool
    if isinstance(default, int):
        return parse_positive_integer
    if isinstance(default, float):
        return parse_duration
    return str


def parse_positive_integer(value: Any) -> int:
    """An integer of at least 1 (not a bool, not a fraction)."""
    number = _integer(value)
    if number < 1:
        raise ValueError("expected an integer of at least 1")
    return number


def _hint(key: str, settings: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(settings), n=1, cutoff=0.75)
    suggestion = f"; did you mean {close[0]}?" if close else ""
    if key.startswith("collectors."):
        names = sorted({k.split(".")[1] for k in settings if k.startswith("collectors.")})
        return (
            f"{suggestion} (collectors are: {', '.join(names)}; "
            "see `gpuload collectors` for their keys)"
        )
    known = ", ".join(sorted(k for k in settings if not k.startswith("collectors.")))
    return f"{suggestion} (known: {known})"


def _build(
    values: Mapping[str, Any],
    collectors: Mapping[str, bool],
    options: Mapping[str, Mapping[str, Any]],
) -> Config:
    def get(key: str, default: Any) -> Any:
        return values.get(key, default)

    defaults = Config()
    enabled = {
        name: get(f"collectors.{name}.enabled", default_on)
        for name, default_on in collectors.items()
    }
    return Config(
        web=WebConfig(
            listen_address=get("web.listen_address", defaults.web.listen_address),
            telemetry_path=get("web.telemetry_path", defaults.web.telemetry_path),
        ),
        log=LogConfig(
            level=get("log.level", defaults.log.level),
            format=get("log.format", defaults.log.format),
        ),
        collect_interval=get("collect_interval", defaults.collect_interval),
        collect_timeout=get("collect_timeout", defaults.collect_timeout),
        collect_slow_interval=get("collect_slow_interval", defaults.collect_slow_interval),
        metrics_profile=get("metrics_profile", defaults.metrics_profile),
        collectors=enabled,
        collector_options=options,
        simulate=SimulationConfig(
            scenario=get("simulate.scenario", None),
            epoch=get("simulate.epoch", None),
            seed=get("simulate.seed", None),
            time=get("simulate.time", None),
            caller=get("simulate.caller", None),
        ),
    )
