"""The daemon's configuration: one typed object built from defaults < file < env < flags.

Every setting has a dotted key path (``web.listen_address``); the YAML file
nests by it, the environment spells it ``GPULOAD_WEB_LISTEN_ADDRESS`` and the
command line ``--web.listen-address``. Validation happens here, once, and an
error names the key path, where it came from and what was expected.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.settings import (
    ConfigError,
    integer,
    number,
    optional,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_listen_address,
    parse_positive_integer,
    parse_url_path,
    read_env,
    read_settings_file,
    shown,
)

if TYPE_CHECKING:
    from exporter.relay.config import RelayConfig
    from exporter.server.webconfig import WebSecurity

DEFAULT_PORT = 19400


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


# Every scalar setting, by key path. Collectors' `collectors.NAME.enabled` keys
# come from the collector registry and are added by `load`.
_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "web.listen_address": parse_listen_address,
    "web.telemetry_path": parse_url_path,
    "web.config_file": optional(str),
    "log.level": parse_choice("debug", "info", "warning", "error"),
    "log.format": parse_choice("text", "json"),
    "collect_interval": parse_duration,
    "collect_timeout": optional(parse_duration),
    "collect_slow_interval": parse_duration,
    "metrics_profile": parse_choice("minimal", "default", "full"),
    "simulate.scenario": optional(str),
    "simulate.epoch": optional(number),
    "simulate.seed": optional(integer),
    "simulate.time": optional(number),
    # The simulator's callers (exporter/sim/scenario.py CALLERS), named here so that a real
    # deployment's configuration never imports the simulator.
    "simulate.caller": optional(parse_choice("root", "unprivileged", "unprivileged-no-host-pid")),
}


# Sections of `gpuload serve`'s file that are structures of their own, not settings.
_STRUCTURES = ("alerting",)


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
            security=_web_security(web_config, f"{source} web.config_file"),
        ),
    )


def _web_security(path: str, where: str) -> WebSecurity:
    # Imported here: bcrypt, which the web config module imports, stays out of a daemon
    # without a web config file.
    from exporter.server import webconfig

    return webconfig.load_setting(path, where)


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
    # Imported here: the relay's configuration (~1.6 MB) stays out of a daemon without
    # an alerting section.
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
