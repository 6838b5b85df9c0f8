"""The relay's configuration: one typed object from defaults < file < env < flags.

The scalar settings are declared in `exporter.relay.settings`. ``targets`` and ``route`` are
structures and come from the file only. Secrets (webhook URLs, signing secrets, routing keys,
inbound credentials) are read from a file (``url_file``) or an environment variable
(``url_env``) and never printed. Every error names the key path.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.matchers import parse_matcher
from exporter.relay.routes import Route
from exporter.relay.settings import SETTINGS
from exporter.relay.target_config import Secret, TargetConfig, TargetSetting, declared_options
from exporter.settings import (
    ConfigError,
    LogConfig,
    flatten,
    parse_bool,
    read_input,
    read_settings_file,
    shown,
)

if TYPE_CHECKING:
    from exporter.relay.targets import Target
    from exporter.web.webconfig import WebSecurity

__all__ = ["ConfigError", "RelayConfig", "Secret", "TargetConfig", "load", "startup_warnings"]


@dataclass(frozen=True)
class AuthConfig:
    """Inbound credentials Alertmanager must send (its ``http_config``)."""

    bearer_token: Secret | None = None
    username: str | None = None
    password: Secret | None = None


@dataclass(frozen=True)
class WebConfig:
    """The inbound HTTP endpoint."""

    listen_address: str
    path: str
    max_body_bytes: int
    allow_unauthenticated: bool
    # The exporter-toolkit web config file (TLS, basic auth) and what it said at start.
    config_file: str | None
    auth: AuthConfig = field(default_factory=AuthConfig)
    security: WebSecurity | None = field(default=None, repr=False)


@dataclass(frozen=True)
class QueueConfig:
    """The on-disk queue."""

    path: str
    max_age: float
    dedup_window: float
    dead_letter_retention: float
    # Seconds between integrity checks of the file (`exporter.relay.recovery`).
    check_interval: float


@dataclass(frozen=True)
class DeliveryConfig:
    """How workers retry and coalesce."""

    timeout: float
    backoff_initial: float
    backoff_max: float
    storm_threshold: int
    digest_max: int


@dataclass(frozen=True)
class MessageConfig:
    """What messages show besides the alerts themselves."""

    grafana_url: str | None
    grafana_dashboard: str
    timezone: str


@dataclass(frozen=True)
class RelayConfig:
    """Everything `gpuload relay` needs, validated; built from :data:`SETTINGS`."""

    web: WebConfig
    queue: QueueConfig
    delivery: DeliveryConfig
    message: MessageConfig
    log: LogConfig
    targets: Mapping[str, TargetConfig] = field(default_factory=dict)
    route: Route = field(default_factory=Route)


_SECTIONS = {
    "web": WebConfig,
    "queue": QueueConfig,
    "delivery": DeliveryConfig,
    "message": MessageConfig,
    "log": LogConfig,
}


def is_loopback(listen_address: str) -> bool:
    """Whether the address only accepts connections from this machine."""
    host = listen_address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load(
    *,
    file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> RelayConfig:
    """Build and validate the configuration; flags > env > file > defaults.

    Args:
        file: YAML config file, nested by key path, with ``targets`` and ``route``.
        environ: the process environment (GPULOAD_RELAY_* variables, and the
            variables that ``*_env`` settings name).
        flags: values given on the command line, by key path.

    Raises:
        ConfigError: naming the first bad key path, its source and what is expected.
    """
    environ = environ or {}
    from_file = read_settings_file(Path(file), SETTINGS.structures) if file else {}
    values, sources = SETTINGS.resolve(
        [
            (
                "config file",
                {k: v for k, v in from_file.items() if k not in SETTINGS.structures},
            ),
            ("environment", SETTINGS.from_env(environ)),
            ("flag", dict(flags or {})),
        ]
    )
    security = None
    if values["web.config_file"] is not None:
        source = sources["web.config_file"]
        if source == "config file" and file:
            values["web.config_file"] = str(Path(file).parent / values["web.config_file"])
        # Imported here: bcrypt, which the web config module imports, only with such a file.
        from exporter.web import webconfig

        where = f"{source} web.config_file"
        security = webconfig.load_setting(values["web.config_file"], where)
    secrets = _Secrets(Path(file).parent if file else Path.cwd(), environ)
    _all_secrets_present(from_file, secrets, "")
    targets = _targets(from_file.get("targets"), secrets)
    route = _route(from_file.get("route", {}), "route", set(targets), top=True)
    if targets and not route.targets and not route.routes:
        raise ConfigError(
            "config file route: give the top route's targets (the default) and/or child routes"
        )
    return _build(values, secrets, targets, route, security)


# The relay settings that the exporter's `alerting` section takes (no inbound endpoint there).
_SECTION_PREFIXES = ("queue.", "delivery.", "message.")


def load_section(
    tree: Mapping[str, Any],
    *,
    path: str,
    base: Path,
    environ: Mapping[str, str],
    defaults: Mapping[str, Any] | None = None,
) -> RelayConfig:
    """Targets, route, queue, delivery and message settings given as a mapping in another file.

    ``gpuload serve`` takes them in its ``alerting`` section to deliver its local alerts the
    relay's way; errors name the key path under ``path``.

    Raises:
        ConfigError: naming the first bad key path.
    """
    flat = flatten(tree, SETTINGS.structures)
    given = {
        key: value
        for key, value in flat.items()
        if key not in SETTINGS.structures and not SETTINGS.is_empty_section(key, value)
    }
    for key in given:
        if key not in SETTINGS or not key.startswith(_SECTION_PREFIXES):
            known = ", ".join(k for k in sorted(SETTINGS.by_key) if k.startswith(_SECTION_PREFIXES))
            raise ConfigError(f"config file {path}.{key}: unknown setting (known: {known})")
    try:
        values, _sources = SETTINGS.resolve(
            [("config file", dict(defaults or {})), ("config file", given)]
        )
    except ConfigError as error:
        raise ConfigError(str(error).replace("config file ", f"config file {path}.", 1)) from None
    secrets = _Secrets(base, environ)
    _all_secrets_present(flat, secrets, f"{path}.")
    try:
        targets = _targets(flat.get("targets"), secrets)
        route = _route(flat.get("route", {}), "route", set(targets), top=True)
    except ConfigError as error:
        raise ConfigError(str(error).replace("config file ", f"config file {path}.", 1)) from None
    if targets and not route.targets and not route.routes:
        raise ConfigError(
            f"config file {path}.route: give the top route's targets (the default) "
            "and/or child routes"
        )
    # No inbound endpoint: the loopback address only satisfies _build's authentication check.
    values["web.listen_address"] = "127.0.0.1:0"
    return _build(values, secrets, targets, route)


def queue_path(
    *,
    file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> str:
    """Only ``queue.path``, for the queue commands; the rest of the file is not checked."""
    key = "queue.path"
    path = str(SETTINGS.defaults()[key])
    from_file = read_settings_file(Path(file), SETTINGS.structures) if file else {}
    for layer in (
        from_file,
        {k: v for k, v in (environ or {}).items() if k == SETTINGS.env_name(key)},
        flags or {},
    ):
        for name, value in layer.items():
            if name in (key, SETTINGS.env_name(key)) and value is not None:
                path = str(value)
    return path


def _all_secrets_present(tree: Mapping[str, Any], secrets: _Secrets, prefix: str) -> None:
    """Every ``*_env`` variable set and ``*_file`` readable, or one error naming all that are not.

    Said once for all, not one per run: a first start usually lacks several.
    """
    missing = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
            return
        if not isinstance(node, str) or not path.endswith(("_env", "_file")):
            return
        if path == "web.config_file":
            return  # not a secret: webconfig.load_setting reads and checks it
        try:
            if path.endswith("_env"):
                secrets._from_env(node, prefix + path)
            else:
                secrets._from_file(node, prefix + path)
        except ConfigError as error:
            missing.append(str(error).removeprefix("config file "))

    walk(tree, "")
    if len(missing) > 1:
        raise ConfigError(f"config file: {len(missing)} secrets are missing: {'; '.join(missing)}")
    if missing:
        raise ConfigError(f"config file {missing[0]}")


class _Secrets:
    """Reads ``KEY_file`` and ``KEY_env`` settings; relative files are beside the config file."""

    def __init__(self, base: Path, environ: Mapping[str, str]) -> None:
        self._base = base
        self._environ = environ

    def read(
        self, values: Mapping[str, Any], path: str, key: str, *, literal: bool = False
    ) -> Secret | None:
        prefix = f"{path}." if path else ""
        given = [k for k in (key, f"{key}_file", f"{key}_env") if values.get(k) is not None]
        if not literal and key in given:
            raise ConfigError(
                f"config file {prefix}{key}: give it as {key}_file or {key}_env, not inline"
            )
        if len(given) > 1:
            raise ConfigError(f"config file {prefix}{key}: give only one of {', '.join(given)}")
        if not given:
            return None
        chosen = given[0]
        raw = values[chosen]
        if not isinstance(raw, str) or not raw:
            raise ConfigError(
                f"config file {prefix}{chosen}: expected a string, got a {type(raw).__name__}"
            )
        if chosen.endswith("_env"):
            return self._from_env(raw, f"{prefix}{chosen}")
        if chosen.endswith("_file"):
            return self._from_file(raw, f"{prefix}{chosen}")
        return Secret(raw, "config file")

    def _from_env(self, name: str, where: str) -> Secret:
        value = self._environ.get(name, "").strip()
        if not value:
            raise ConfigError(f"config file {where}: environment variable {name} is not set")
        return Secret(value, f"environment variable {name}")

    def _from_file(self, name: str, where: str) -> Secret:
        path = self._base / name
        try:
            value = read_input(path).strip()
        except ConfigError as error:
            problem = str(error)
            if problem.startswith("cannot read it"):
                problem = problem.replace("it", str(path), 1)
            else:
                problem = f"{path}: {problem}"
            raise ConfigError(f"config file {where}: {problem}") from None
        if not value:
            raise ConfigError(f"config file {where}: {path} is empty")
        return Secret(value, f"file {path}")


def _targets(tree: Any, secrets: _Secrets) -> dict[str, TargetConfig]:
    # Imported here: every target module, and jinja2 with the templates, only where
    # targets are configured.
    from exporter.relay.targets import KINDS

    if tree is None:
        return {}
    if not isinstance(tree, Mapping):
        raise ConfigError("config file targets: expected a mapping of target names to settings")
    targets: dict[str, TargetConfig] = {}
    for name, values in tree.items():
        path = f"targets.{name}"
        if not isinstance(values, Mapping):
            raise ConfigError(f"config file {path}: expected a mapping of settings")
        kind = values.get("type")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ConfigError(
                f"config file {path}.type: {kind!r} is not valid: expected one of "
                f"{', '.join(sorted(KINDS))}"
            )
        _only_keys_of_kind(values, path, kind, KINDS)
        spec = KINDS[kind]
        read = {
            key: _target_setting(values, path, setting, secrets)
            for key, setting in spec.declarations().items()
        }
        # The kind's own settings make its options; the shared ones are the config's fields.
        own = {setting.name for setting in declared_options(spec.options_type)}
        targets[str(name)] = TargetConfig(
            name=str(name),
            kind=kind,
            options=spec.options_type(**{key: read[key] for key in own}),
            **{key: value for key, value in read.items() if key not in own},
        )
    return targets


def _only_keys_of_kind(
    values: Mapping[str, Any], path: str, kind: str, kinds: Mapping[str, type[Target]]
) -> None:
    """Every key is one the kind declares; a key of other kinds is named as theirs."""
    accepted = kinds[kind].accepted_keys()
    for key in map(str, values):
        if key in accepted:
            continue
        known = ", ".join(sorted(accepted))
        owners = sorted(other for other, spec in kinds.items() if key in spec.accepted_keys())
        if owners:
            raise ConfigError(
                f"config file {path}.{key}: not used by type {kind}, only by "
                f"{', '.join(owners)} (type {kind} takes: {known})"
            )
        raise ConfigError(f"config file {path}.{key}: unknown setting (known: {known})")


def _target_setting(
    values: Mapping[str, Any], path: str, setting: TargetSetting, secrets: _Secrets
) -> Any:
    """One declared setting of a target section, parsed, or its default when not given."""
    key = setting.name
    if setting.secret:
        secret = secrets.read(values, path, key, literal=True)
        if secret is None:
            if setting.required:
                raise ConfigError(
                    f"config file {path}: {key} (or {key}_file, {key}_env) is required"
                )
            return setting.default
        try:
            # The secret's text is checked but never shown.
            return dataclasses.replace(secret, value=setting.parse(secret.value))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"config file {path}.{key}: {error}") from None
    raw = values.get(key)
    if raw is None:
        if setting.required:
            raise ConfigError(f"config file {path}: {key} is required")
        return setting.default
    try:
        return setting.parse(raw)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"config file {path}.{key}: {shown(key, raw)} is not valid: {error}"
        ) from None


_ROUTE_KEYS = {"matchers", "targets", "continue", "routes"}


def _route(tree: Any, path: str, known: set[str], *, top: bool = False) -> Route:
    if not isinstance(tree, Mapping):
        raise ConfigError(f"config file {path}: expected a mapping with matchers, targets, routes")
    unknown = sorted(set(map(str, tree)) - _ROUTE_KEYS)
    if unknown:
        raise ConfigError(
            f"config file {path}.{unknown[0]}: unknown setting "
            f"(known: {', '.join(sorted(_ROUTE_KEYS))})"
        )
    if top and (tree.get("matchers") or tree.get("continue")):
        raise ConfigError(f"config file {path}: the top route matches every alert; no matchers")
    raw_matchers = tree.get("matchers") or []
    if not isinstance(raw_matchers, list):
        raise ConfigError(
            f"config file {path}.matchers: expected a list like ['severity=\"critical\"']"
        )
    matchers = []
    for i, text in enumerate(raw_matchers):
        try:
            matchers.append(parse_matcher(str(text)))
        except ValueError as error:
            raise ConfigError(
                f"config file {path}.matchers[{i}]: {text!r} is not valid: {error}"
            ) from None
    raw_targets = tree.get("targets") or []
    if isinstance(raw_targets, str):
        raw_targets = [raw_targets]
    if not isinstance(raw_targets, list):
        raise ConfigError(f"config file {path}.targets: expected a list of target names")
    for i, name in enumerate(raw_targets):
        if name not in known:
            listed = ", ".join(sorted(known)) or "none defined"
            raise ConfigError(
                f"config file {path}.targets[{i}]: {name!r} is not a target (targets: {listed})"
            )
    raw_routes = tree.get("routes") or []
    if not isinstance(raw_routes, list):
        raise ConfigError(f"config file {path}.routes: expected a list of routes")
    children = tuple(
        _route(child, f"{path}.routes[{i}]", known) for i, child in enumerate(raw_routes)
    )
    try:
        keep_going = parse_bool(tree.get("continue", False))
    except ValueError as error:
        raise ConfigError(f"config file {path}.continue: {error}") from None
    return Route(tuple(matchers), tuple(map(str, raw_targets)), keep_going, children)


def _build(
    values: Mapping[str, Any],
    secrets: _Secrets,
    targets: Mapping[str, TargetConfig],
    route: Route,
    security: WebSecurity | None = None,
) -> RelayConfig:
    if values["delivery.backoff_initial"] > values["delivery.backoff_max"]:
        raise ConfigError(
            f"delivery.backoff_initial: {values['delivery.backoff_initial']:g}s is above "
            f"delivery.backoff_max ({values['delivery.backoff_max']:g}s): the first retry "
            "cannot wait longer than the longest"
        )
    auth = _auth(values, secrets)
    web = SETTINGS.build(WebConfig, values, prefix="web.", auth=auth, security=security)
    unauthenticated = auth.bearer_token is None and auth.password is None
    if not unauthenticated and security is not None and security.users:
        # Both would need the one Authorization header.
        raise ConfigError(
            "web.auth: give either web.auth or basic_auth_users in web.config_file, not both"
        )
    if security is not None and security.authenticates:
        unauthenticated = False
    if unauthenticated and not web.allow_unauthenticated and not is_loopback(web.listen_address):
        raise ConfigError(
            f"web.auth: required when listening on {web.listen_address}, which is not loopback: "
            "set web.auth.bearer_token_file (or _env) or web.auth.basic_auth, basic_auth_users "
            "or client_auth_type RequireAndVerifyClientCert in web.config_file, or "
            "web.allow_unauthenticated: true behind a proxy that authenticates"
        )
    sections = {key: kind for key, kind in _SECTIONS.items() if key != "web"}
    return SETTINGS.build(RelayConfig, values, sections, web=web, targets=targets, route=route)


def startup_warnings(config: RelayConfig) -> list[str]:
    """What the operator should fix although the relay can start: one line each, no secrets.

    A Teams target with an Office 365 connector URL (``*.webhook.office.com/webhookb2/...``):
    Microsoft retired those connectors, so its messages are refused or silently lost.
    """
    from exporter.relay.targets.teams import retired_connector

    return [
        f"targets.{name}.url: an Office 365 connector webhook, which Microsoft retired; "
        "create a Workflows webhook for the channel and use its URL (see docs/relay.md, Teams)"
        for name, target in config.targets.items()
        if target.kind == "teams" and target.url is not None and retired_connector(target.url.value)
    ]


def _auth(values: Mapping[str, Any], secrets: _Secrets) -> AuthConfig:
    token = secrets.read(
        {k.removeprefix("web.auth."): v for k, v in values.items() if k.startswith("web.auth.")},
        "web.auth",
        "bearer_token",
    )
    basic = {
        k.removeprefix("web.auth.basic_auth."): v
        for k, v in values.items()
        if k.startswith("web.auth.basic_auth.")
    }
    password = secrets.read(basic, "web.auth.basic_auth", "password")
    username = basic.get("username")
    if (username is None) != (password is None):
        raise ConfigError(
            "config file web.auth.basic_auth: give both username and "
            "password_file (or password_env)"
        )
    if token is not None and password is not None:
        raise ConfigError("config file web.auth: give bearer_token or basic_auth, not both")
    return AuthConfig(bearer_token=token, username=username, password=password)
