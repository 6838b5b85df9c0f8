"""What every program's configuration is read with: errors, YAML, parsers, files and variables.

A program declares each of its settings once, as a :class:`Setting` in its :class:`Settings`
table: the key path (the file's nesting, the environment variable, the field of the typed
configuration), the parser, the default, and the flag with its help where it has one. Reading the
layers, the error messages, the command-line flags and the typed object all come from the table.

`exporter.config` (gpuload serve's settings), `exporter.relay.settings` (the relay's) and
`exporter.web.webconfig` (the web config file) build on this module; it imports none of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

ENV_PREFIX = "GPULOAD_"
# The relay's settings, which may share an environment with the exporter's.
RELAY_ENV_PREFIX = f"{ENV_PREFIX}RELAY_"
# The simulated NVML's, in programs started by `gpuload sim exec` (exporter/sim/installer.py).
SIM_ENV_PREFIX = f"{ENV_PREFIX}SIM_"
# Variables under ENV_PREFIX that are not the exporter's settings: its table skips them.
RESERVED_ENV_PREFIXES = (SIM_ENV_PREFIX, RELAY_ENV_PREFIX)


def one_line(text: str) -> str:
    """``text`` with its control characters escaped: an error is one line, whatever a key holds."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


class ConfigError(ValueError):
    """A setting is unknown or has a bad value; the message names its key path, in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


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


def parse_duration_or_zero(value: Any) -> float:
    """A duration, or 0 (``0``, ``0s``) for "never"."""
    if not isinstance(value, bool) and (value == 0 or str(value).strip() in ("0", "0s")):
        return 0.0
    return parse_duration(value)


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
    return cut(repr(value))


# Bounds on what any input file may hold: a settings file is a few KiB and a few levels deep.
MAX_INPUT_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_INTEGER_DIGITS = 20
# How much of a value an error message shows.
SHOWN_CHARACTERS = 80


def _kind_of(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a folder",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def read_input(path: str | Path) -> str:
    """An input file's text: a regular file, read without blocking, at most 1 MiB, strict UTF-8.

    A FIFO, a device (``/dev/zero``) or a folder is refused before any read, so no input file
    can hang a process or grow its memory.

    Raises:
        ConfigError: one line saying what was wrong and what is expected (without the path,
            which the caller names).
    """
    if "\0" in str(path):
        # os.open raises ValueError, not OSError, for a name no file can have.
        raise ConfigError("a file name with a NUL byte: no file can have it; give a path")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise ConfigError(f"cannot read it ({error.strerror})") from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{_kind_of(mode)}, not a regular file: give a file")
        data = bytearray()
        while len(data) <= MAX_INPUT_BYTES:
            chunk = os.read(descriptor, 1 << 16)
            if not chunk:
                break
            data += chunk
    except OSError as error:
        raise ConfigError(f"cannot read it ({error.strerror})") from None
    finally:
        os.close(descriptor)
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError(f"larger than {MAX_INPUT_BYTES} bytes (1 MiB): not a settings file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"not UTF-8: byte 0x{data[error.start]:02x} at offset {error.start} "
            f"({error.reason}); save the file as UTF-8"
        ) from None


class _StrictLoader(yaml.SafeLoader):
    """YAML as a settings file needs it: no aliases, no duplicate keys, bounded depth and numbers.

    `*name` re-uses a node, and a few of them nested expand to gigabytes (a "billion laughs")
    before any key is checked. A duplicate key would silently take the last value. Deep
    nesting would exhaust the recursion of the composer, and a 5,000-digit integer the
    interpreter's limit on converting it.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(
                problem="aliases (*name) are not accepted in a config file",
                problem_mark=event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.MarkedYAMLError(
                problem=f"nested deeper than {MAX_DEPTH} levels",
                problem_mark=self.peek_event().start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key {cut(repr(key))}",
                    problem_mark=key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        digits = [c for c in str(node.value) if c.isalnum()]
        if len(digits) > MAX_INTEGER_DIGITS:
            raise yaml.constructor.ConstructorError(
                problem=f"an integer of more than {MAX_INTEGER_DIGITS} digits",
                problem_mark=node.start_mark,
            )
        return int(super().construct_yaml_int(node))


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def cut(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """``text`` for a message: whole up to ``limit`` characters, else its start and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def load_yaml(text: str, where: str) -> Any:
    """Parse a config file's YAML; an error says the line and the problem, never the text there.

    Raises:
        ConfigError: naming ``where`` and the line.
    """
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context or "not valid YAML"
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
    except (yaml.YAMLError, RecursionError):
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


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def parse_label_name(value: Any) -> str:
    """A Prometheus label name: [a-zA-Z_][a-zA-Z0-9_]*, not starting with __ (reserved)."""
    text = str(value)
    if not _LABEL_NAME.match(text) or text.startswith("__"):
        raise ValueError(
            "expected a label name of [a-zA-Z_][a-zA-Z0-9_]* not starting with __, e.g. Hostname"
        )
    return text


def parse_url_path(value: Any) -> str:
    """An HTTP path such as /metrics."""
    text = str(value)
    if not text.startswith("/"):
        raise ValueError("expected a path starting with /")
    return text


def optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A parser that lets None through and parses anything else with ``parse``."""
    return lambda value: None if value is None else parse(value)


def number(value: Any) -> float:
    """A number, not a bool."""
    try:
        if isinstance(value, bool):
            raise ValueError
        result = float(value)
        if not math.isfinite(result):
            raise ValueError
        return result
    except (ValueError, TypeError, OverflowError):
        raise ValueError("expected a number, e.g. 1767225600 (unix seconds) or 2.5") from None


def integer(value: Any) -> int:
    """A whole number, not a bool and not a fraction."""
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(value)
    except (ValueError, TypeError, OverflowError):
        raise ValueError("expected a whole number, e.g. 42") from None


def env_name(key: str, prefix: str = ENV_PREFIX) -> str:
    """The environment variable of a key path: web.listen_address -> GPULOAD_WEB_LISTEN_ADDRESS."""
    return prefix + key.upper().replace(".", "_")


def flatten(tree: Mapping[Any, Any], structures: Collection[str] = ()) -> dict[str, Any]:
    """Key paths to values: {"web": {"listen_address": x}} -> {"web.listen_address": x}.

    A mapping under one of `structures` stays whole, under its own key path.
    """
    flat: dict[str, Any] = {}

    def walk(node: Mapping[Any, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            # An empty mapping stays a value: `metrics_profile: {}` is a bad value, not no value.
            if isinstance(value, Mapping) and value and path not in structures:
                walk(value, path)
            else:
                flat[path] = value

    walk(tree, "")
    return flat


def read_settings_file(path: Path, structures: Collection[str] = ()) -> dict[str, Any]:
    """A YAML settings file, flattened to key paths; errors name the file."""
    try:
        text = read_input(path)
    except ConfigError as error:
        raise ConfigError(f"config file {path}: {error}") from None
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
    skip: tuple[str, ...] = RESERVED_ENV_PREFIXES,
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


def parse_positive_integer(value: Any) -> int:
    """An integer of at least 1 (not a bool, not a fraction)."""
    number = integer(value)
    if number < 1:
        raise ValueError("expected an integer of at least 1")
    return number


def at_most(limit: int) -> Callable[[Any], int]:
    """A parser of positive integers up to ``limit``."""

    def parse(value: Any) -> int:
        number = parse_positive_integer(value)
        if number > limit:
            raise ValueError(f"expected an integer from 1 to {limit}")
        return number

    return parse


@dataclass(frozen=True)
class Setting:
    """One setting of one program, declared once.

    ``key`` is the key path: the file nests by it, the environment spells it ``PREFIX_KEY_PATH``,
    and the typed configuration has a field at that path. ``default`` is already typed (None:
    unset). A setting with a ``flag`` is on the command line, with ``help`` and the default.
    """

    key: str
    parse: Callable[[Any], Any]
    default: Any = None
    flag: str | None = None
    help: str = ""

    def help_line(self) -> str:
        """The flag's --help text: the help, then the default where it is a value."""
        if self.default is None or "(default" in self.help:
            text = self.help
        else:
            text = f"{self.help} (default {_default_text(self.default)})"
        return text.replace("%", "%%")  # argparse formats help with %


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):  # every float setting is a duration in seconds
        return f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"
    return str(value)


def listen_address(port: int) -> Setting:
    """``web.listen_address`` of a program that listens on ``port`` by default."""
    return Setting(
        "web.listen_address",
        parse_listen_address,
        f":{port}",
        "--web.listen-address",
        "address to listen on, host:port or :port",
    )


# Every program logs alike: these two settings, into a `LogConfig`.
LOG_SETTINGS = (
    Setting(
        "log.level",
        parse_choice("debug", "info", "warning", "error"),
        "info",
        "--log.level",
        "debug, info, warning or error",
    ),
    Setting("log.format", parse_choice("text", "json"), "text", "--log.format", "text or json"),
)


@dataclass(frozen=True)
class LogConfig:
    """Log level and line format (:data:`LOG_SETTINGS`)."""

    level: str
    format: str


Built = TypeVar("Built")


class Settings:
    """A program's settings table: layers in, typed configuration and command line out."""

    def __init__(
        self,
        settings: Iterable[Setting],
        *,
        program: str,
        prefix: str = ENV_PREFIX,
        structures: Collection[str] = (),
        reserved: tuple[str, ...] = (),
    ) -> None:
        self.by_key = {setting.key: setting for setting in settings}
        self.program = program
        self.prefix = prefix
        # File sections that are structures of their own (targets, route), not settings.
        self.structures = tuple(structures)
        # Variables under the prefix that belong to another program.
        self.reserved = reserved

    def __contains__(self, key: object) -> bool:
        return key in self.by_key

    def with_settings(self, extra: Iterable[Setting]) -> Settings:
        """This table and more settings (the collectors' keys, known only from the registry)."""
        return Settings(
            [*self.by_key.values(), *extra],
            program=self.program,
            prefix=self.prefix,
            structures=self.structures,
            reserved=self.reserved,
        )

    def defaults(self) -> dict[str, Any]:
        """Every setting's default by key path."""
        return {key: setting.default for key, setting in self.by_key.items()}

    def flag_of(self, key: str) -> str:
        """The flag of a key path as a user types it, for messages about flags."""
        setting = self.by_key.get(key)
        return setting.flag if setting is not None and setting.flag else "--" + key

    def env_name(self, key: str) -> str:
        """The environment variable of a key path."""
        return env_name(key, self.prefix)

    def from_env(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """The settings given as variables; any other variable under the prefix is an error."""
        return read_env(
            environ, self.by_key, prefix=self.prefix, skip=self.reserved, program=self.program
        )

    def add_flags(
        self,
        parser: argparse.ArgumentParser | Any,
        keys: Iterable[str] | None = None,
        aliases: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Put the settings' flags (all, or those of ``keys``) on a command's parser.

        Each flag's value lands under its key path, unparsed: :meth:`resolve` parses it with
        the file's and the environment's values.
        """
        chosen = self.by_key.values() if keys is None else [self.by_key[key] for key in keys]
        for setting in chosen:
            if setting.flag is None:
                continue
            # A switch (`--metrics.dcgm-compat`) alone means true; a value may still follow.
            switch: dict[str, Any] = (
                {"nargs": "?", "const": "true"} if isinstance(setting.default, bool) else {}
            )
            parser.add_argument(
                setting.flag,
                *(aliases or {}).get(setting.key, ()),
                dest=setting.key,
                metavar="VALUE",
                default=argparse.SUPPRESS,
                help=setting.help_line(),
                **switch,
            )

    def flags_given(self, namespace: argparse.Namespace) -> dict[str, Any]:
        """The settings given as flags, by key path, from a parsed command line."""
        return {key: value for key, value in vars(namespace).items() if key in self.by_key}

    def resolve(
        self, layers: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Each setting's value (the defaults, then each layer over the last) and its source.

        Raises:
            ConfigError: naming the first unknown or bad key path, its source and what is
                expected.
        """
        values = self.defaults()
        sources = dict.fromkeys(values, "default")
        for source, layer in layers:
            for key, raw in layer.items():
                setting = self.by_key.get(key)
                if setting is None and self.is_empty_section(key, raw):
                    continue
                if setting is None:
                    raise ConfigError(f"{source} {key}: unknown setting{self.hint(key)}")
                try:
                    values[key] = setting.parse(raw)
                except (TypeError, ValueError) as error:
                    raise ConfigError(
                        f"{source} {key}: {shown(key, raw)} is not valid: {error}"
                    ) from None
                sources[key] = source
        return values, sources

    def is_empty_section(self, key: str, value: Any) -> bool:
        """Whether ``key: {}`` is a section with nothing set (``web: {}``), not a bad value."""
        return value == {} and any(known.startswith(key + ".") for known in self.by_key)

    def hint(self, key: str) -> str:
        """The closest known key, and what is known, for an unknown one."""
        known = [*self.by_key, *self.structures]
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        suggestion = f"; did you mean {close[0]}?" if close else ""
        if key.startswith("collectors."):
            names = sorted({k.split(".")[1] for k in known if k.startswith("collectors.")})
            return (
                f"{suggestion} (collectors are: {', '.join(names)}; "
                "see `gpuload collectors` for their keys)"
            )
        listed = ", ".join(sorted(k for k in known if not k.startswith("collectors.")))
        return f"{suggestion} (known: {listed})"

    def build(
        self,
        kind: type[Built],
        values: Mapping[str, Any],
        sections: Mapping[str, type] | None = None,
        prefix: str = "",
        **given: Any,
    ) -> Built:
        """The typed configuration: each field at a key path takes that setting's value.

        ``sections`` names the dataclass of each section (``{"web": WebConfig}``); ``given``
        are fields made otherwise (a structure, a secret); any other field that is no setting
        keeps its dataclass default.
        """
        arguments: dict[str, Any] = dict(given)
        for field in dataclasses.fields(kind):  # type: ignore[arg-type]
            path = prefix + field.name
            section = (sections or {}).get(path)
            if section is not None:
                arguments[field.name] = self.build(section, values, sections, path + ".")
            elif path in self.by_key:
                arguments[field.name] = values[path]
        return kind(**arguments)
