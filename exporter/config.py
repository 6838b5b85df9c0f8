"""The daemon's configuration: one typed object built from defaults < file < env < flags.

Every setting has a dotted key path (``web.listen_address``); the YAML file
nests by it, the environment spells it ``GPULOAD_WEB_LISTEN_ADDRESS`` and the
command line ``--web.listen-address``. Validation happens here, once, and an
error names the key path, where it came from and what was expected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.names import DCGM_LABELS, DEFAULT_HOSTNAME_LABEL, DEFAULT_PROFILE, PROFILES
from exporter.settings import (
    LOG_SETTINGS,
    RESERVED_ENV_PREFIXES,
    ConfigError,
    LogConfig,
    Setting,
    Settings,
    integer,
    listen_address,
    number,
    optional,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_duration_or_zero,
    parse_label_name,
    parse_positive_integer,
    parse_url_path,
    read_settings_file,
)

if TYPE_CHECKING:
    from exporter.relay.config import RelayConfig
    from exporter.web.webconfig import WebSecurity

DEFAULT_PORT = 19400


@dataclass(frozen=True)
class WebConfig:
    """Where and how the HTTP endpoint listens."""

    listen_address: str
    telemetry_path: str
    # The exporter-toolkit web config file (TLS, basic auth) and what it said at start.
    config_file: str | None
    security: WebSecurity | None = field(default=None, repr=False)


@dataclass(frozen=True)
class MetricsConfig:
    """What /metrics serves besides gpuload's own families (`metrics` in the file)."""

    # dcgm-exporter's default fields, names and labels from the same snapshot (server/dcgm.py).
    dcgm_compat: bool
    # The host label of those series: dcgm-exporter's `Hostname`, `hostname` after its 4.8.2.
    dcgm_hostname_label: str
    # DCGM_FI_PROF_GR_ENGINE_ACTIVE from NVML's utilization on GPUs without GPM: an approximation.
    dcgm_gr_engine_from_utilization: bool


@dataclass(frozen=True)
class SimulationConfig:
    """Run against the simulated NVML instead of the driver (`--simulate`)."""

    scenario: str | None
    epoch: float | None
    seed: int | None
    time: float | None
    # Who the simulated driver believes is calling; None: the scenario's own `caller`.
    caller: str | None


@dataclass(frozen=True)
class HistoryConfig:
    """Where the local evaluator's history is kept across restarts (`history` in the file)."""

    # The file (gzip-compressed JSON, docs/status.md); None: nowhere, every start is cold.
    path: str | None = None
    # A Prometheus to take the history from at start when no file gives it; None: none.
    prometheus: str | None = None
    # This exporter's `instance` label in that Prometheus; None: $NODE_NAME (the chart's
    # relabelling), else the local alerts' instance.
    instance: str | None = None


@dataclass(frozen=True)
class AlertingConfig:
    """The local alerts (`alerting` in the file): where they go, and how they are labelled."""

    # The `instance` label of local alerts; None: the listen address, or host:port when it
    # listens on every interface.
    instance: str | None
    job: str
    thresholds_file: str | None
    # Seconds between evaluations of the rules (the history takes every cycle's samples).
    evaluation_interval: float
    # Seconds between notifications of a still-firing alert, as Alertmanager's repeat_interval
    # (0: only when it fires and when it resolves).
    repeat_interval: float
    # The relay's targets, route, queue, delivery and message settings; None without targets.
    delivery: RelayConfig | None = None


@dataclass(frozen=True)
class Config:
    """Everything `gpuload serve` needs, validated; built by :func:`load` from :data:`SETTINGS`."""

    web: WebConfig
    log: LogConfig
    collect_interval: float
    collect_timeout: float | None
    # Limits, maxima, error counters, remapped rows, driver versions: read this often.
    collect_slow_interval: float
    # Which series are exported: minimal, default or full (exporter/collectors/profiles.py).
    metrics_profile: str
    metrics: MetricsConfig
    simulate: SimulationConfig
    alerting: AlertingConfig
    history: HistoryConfig = field(default_factory=HistoryConfig)
    collectors: Mapping[str, bool] = field(default_factory=dict)
    collector_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def effective_collect_timeout(self) -> float:
        """How long one cycle waits for a GPU before reporting it stale."""
        return self.collect_timeout or max(0.1, self.collect_interval * 0.8)


# What the server answers itself, besides the metrics.
RESERVED_PATHS = ("/", "/healthz", "/readyz", "/api/v1/status")


def _telemetry_path(value: Any) -> str:
    path = parse_url_path(value)
    if path in RESERVED_PATHS:
        raise ValueError(
            f"{path} is gpuload's own ({', '.join(RESERVED_PATHS)}): choose another, e.g. /metrics"
        )
    return path


def _host_label(value: Any) -> str:
    name = parse_label_name(value)
    if name in DCGM_LABELS:
        raise ValueError(f"{name} is another label of dcgm-exporter's: choose Hostname or hostname")
    return name


_SECTIONS = {
    "web": WebConfig,
    "log": LogConfig,
    "metrics": MetricsConfig,
    "simulate": SimulationConfig,
    "history": HistoryConfig,
}

# Every scalar setting of `gpuload serve`: its key path, parser, default, flag and help. The
# collectors' `collectors.NAME.*` keys come from the collector registry and are added by `load`.
SETTINGS = Settings(
    [
        listen_address(DEFAULT_PORT),
        Setting(
            "web.telemetry_path",
            _telemetry_path,
            "/metrics",
            "--web.telemetry-path",
            "path of the metrics",
        ),
        Setting(
            "web.config_file",
            optional(str),
            None,
            "--web.config.file",
            "web config file in the Prometheus exporter-toolkit format: TLS and basic auth "
            "(docs/security.md)",
        ),
        Setting(
            "collect_interval",
            parse_duration,
            1.0,
            "--collect.interval",
            "how often NVML is read, e.g. 1s, 500ms",
        ),
        Setting(
            "collect_timeout",
            optional(parse_duration),
            None,
            "--collect.timeout",
            "how long a cycle waits for a GPU before marking it stale (default 80% of the "
            "interval)",
        ),
        Setting(
            "collect_slow_interval",
            parse_duration,
            10.0,
            "--collect.slow-interval",
            "how often values that change rarely are read: limits, maxima, ECC/NVLink/PCIe error "
            "counters, remapped rows, MIG mode, driver versions (at most the interval: every "
            "cycle)",
        ),
        Setting(
            "metrics_profile",
            parse_choice(*PROFILES),
            DEFAULT_PROFILE,
            "--metrics.profile",
            "which series each GPU exports: minimal (at most 25 per GPU), default (at most 80) "
            "or full (everything, e.g. for a node being debugged); docs/fleet.md",
        ),
        Setting(
            "metrics.dcgm_compat",
            parse_bool,
            False,
            "--metrics.dcgm-compat",
            "also serve dcgm-exporter's default fields with its names and labels, for its "
            "dashboards and cost tools; docs/migrating-from-dcgm-exporter.md",
        ),
        Setting(
            "metrics.dcgm_hostname_label",
            _host_label,
            DEFAULT_HOSTNAME_LABEL,
            "--metrics.dcgm-hostname-label",
            "the host label of the dcgm-exporter fields: Hostname, as dcgm-exporter up to 4.8.2, "
            "or hostname, as after",
        ),
        Setting(
            "metrics.dcgm_gr_engine_from_utilization",
            parse_bool,
            False,
            "--metrics.dcgm-gr-engine-from-utilization",
            "on GPUs without GPM (A100, L4, T4...), serve DCGM_FI_PROF_GR_ENGINE_ACTIVE from "
            "NVML's utilization, an approximation, so that cost tools see usage",
        ),
        *LOG_SETTINGS,
        Setting(
            "history.path",
            optional(str),
            None,
            "--history.path",
            "file the rules' history is saved to every minute and on stop, and read back at "
            "start when recent and from the same GPUs, so that a restart is not blind for the "
            "rules' warm-up (default: none)",
        ),
        Setting(
            "history.prometheus",
            optional(str),
            None,
            "--history.prometheus",
            "URL of a Prometheus that scrapes this exporter: at start, when no history file "
            "gives the rules' history, it is taken from there (default: none)",
        ),
        Setting(
            "history.instance",
            optional(str),
            None,
            "--history.instance",
            "this exporter's instance label in --history.prometheus (default: $NODE_NAME, as the "
            "Helm chart relabels it, else the local alerts' instance)",
        ),
        Setting(
            "simulate.scenario",
            optional(str),
            None,
            "--simulate",
            "use the simulated NVML with this scenario name or YAML file instead of the GPU driver",
        ),
        Setting(
            "simulate.epoch",
            optional(number),
            None,
            "--sim.epoch",
            "scenario start, unix seconds (default: now; for the doctor, so that its samples "
            "end now)",
        ),
        Setting(
            "simulate.seed", optional(integer), None, "--sim.seed", "seed of the scenario's noise"
        ),
        Setting(
            "simulate.time",
            optional(number),
            None,
            "--sim.time",
            "pin the scenario clock at this many seconds after its epoch; retries and slow "
            "reads follow the scenario clock, so a pinned one gives the same output every run",
        ),
        # The simulator's callers (exporter/sim/scenario.py CALLERS), named here so that a real
        # deployment's configuration never imports the simulator.
        Setting(
            "simulate.caller",
            optional(parse_choice("root", "unprivileged", "unprivileged-no-host-pid")),
            None,
            "--sim.caller",
            "who the simulated driver believes is calling: root, unprivileged or "
            "unprivileged-no-host-pid (default: the scenario's caller, root unless it says)",
        ),
    ],
    program="gpuload",
    # `alerting` is a structure of its own (the relay's targets and route among its keys).
    structures=("alerting",),
    # Variables of others: the simulator's and the relay's (exporter/settings.py says why).
    reserved=RESERVED_ENV_PREFIXES,
)


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
    options = {name: dict(defaults) for name, defaults in (collector_options or {}).items()}
    settings = SETTINGS.with_settings(
        [
            *(Setting(f"collectors.{name}.enabled", parse_bool, on) for name, on in known.items()),
            *(
                Setting(f"collectors.{name}.{option}", _parser_like(default), default)
                for name, defaults in options.items()
                for option, default in defaults.items()
            ),
        ]
    )
    from_file = read_settings_file(Path(file), SETTINGS.structures) if file else {}
    alerting = _alerting(
        from_file.pop("alerting", None), Path(file).parent if file else Path.cwd(), environ or {}
    )
    values, sources = settings.resolve(
        [
            ("config file", from_file),
            ("environment", settings.from_env(environ or {})),
            ("flag", dict(flags or {})),
        ]
    )
    config = settings.build(
        Config,
        values,
        _SECTIONS,
        collectors={name: values[f"collectors.{name}.enabled"] for name in known},
        collector_options={
            name: {option: values[f"collectors.{name}.{option}"] for option in defaults}
            for name, defaults in options.items()
        },
        alerting=alerting,
    )
    web_config = values["web.config_file"]
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
    from exporter.web import webconfig

    return webconfig.load_setting(path, where)


# The queue file of local alerts, unless `alerting.queue.path` says otherwise.
DEFAULT_ALERT_QUEUE = "gpuload-alerts.db"


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected text")
    return value


# gpuload's own keys of the `alerting` section (file only); its other keys are the relay's.
ALERTING = Settings(
    [
        Setting("alerting.instance", optional(_text)),
        Setting("alerting.job", _text, "gpuload"),
        Setting("alerting.thresholds_file", optional(_text)),
        Setting("alerting.evaluation_interval", parse_duration, 15.0),
        Setting("alerting.repeat_interval", parse_duration_or_zero, 4 * 3600.0),
    ],
    program="gpuload",
)


def _alerting(tree: Any, base: Path, environ: Mapping[str, str]) -> AlertingConfig:
    """The `alerting` section: gpuload's own keys, the rest in the relay's format."""
    if tree is None:
        tree = {}
    if not isinstance(tree, Mapping):
        raise ConfigError("config file alerting: expected a mapping (targets, route, queue, ...)")
    own = {f"alerting.{key}": value for key, value in tree.items() if f"alerting.{key}" in ALERTING}
    values, _sources = ALERTING.resolve([("config file", own)])
    if values["alerting.thresholds_file"] is not None:
        values["alerting.thresholds_file"] = str(base / values["alerting.thresholds_file"])
    relay_part = {key: value for key, value in tree.items() if f"alerting.{key}" not in ALERTING}
    alerting = ALERTING.build(AlertingConfig, values, prefix="alerting.")
    if not relay_part:
        return alerting
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
    return replace(alerting, delivery=delivery if delivery.targets else None)


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
