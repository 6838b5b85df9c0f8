"""What a delivery target is configured with, and how a target kind declares its settings.

A kind declares its own settings as a frozen dataclass whose fields are made by :func:`option`,
next to the code that reads them; the settings every kind shares are declared once in
`exporter.relay.targets.base`. `exporter.relay.config` validates a target's section against its
kind's declaration and builds a :class:`TargetConfig` holding the kind's typed ``options``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.relay.settings import parse_text

# Where `option` keeps a field's declaration in the dataclass field's metadata.
_DECLARATION = "gpuload.target_setting"


@dataclass(frozen=True)
class Secret:
    """A secret value and where it came from; only the source is ever shown."""

    value: str = field(repr=False)
    source: str = "config file"

    def __str__(self) -> str:
        return f"<secret from {self.source}>"


@dataclass(frozen=True)
class TargetSetting:
    """One setting a target kind accepts: its key, how it is read, and what it is for.

    ``parse`` takes the value as written and returns it typed, or raises ValueError saying what
    is expected. A ``secret`` setting is given as ``NAME_file`` or ``NAME_env`` (or inline as
    ``NAME``), is never shown, and reaches the target as a :class:`Secret`; its ``parse`` checks
    the secret's text. ``default`` is already typed; None is unset.
    """

    name: str
    parse: Callable[[Any], Any] = parse_text
    default: Any = None
    required: bool = False
    secret: bool = False
    help: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys a target's section may give it by."""
        if self.secret:
            return (self.name, f"{self.name}_file", f"{self.name}_env")
        return (self.name,)


def option(
    parse: Callable[[Any], Any] = parse_text,
    *,
    default: Any = None,
    required: bool = False,
    secret: bool = False,
    help: str,
) -> Any:
    """A field of a kind's options dataclass, declared as a setting named after the field.

    A required option has no default, so the dataclass cannot be built without it.
    """
    declaration = TargetSetting("", parse, default, required, secret, help)
    metadata = {_DECLARATION: declaration}
    if required:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


def declared_options(options_type: type[Any]) -> tuple[TargetSetting, ...]:
    """The settings an options dataclass declares, in field order.

    Raises:
        TypeError: a field not made by :func:`option`, which the configuration could not fill.
    """
    settings = []
    for item in dataclasses.fields(options_type):
        declaration = item.metadata.get(_DECLARATION)
        if not isinstance(declaration, TargetSetting):
            raise TypeError(
                f"{options_type.__name__}.{item.name}: declare it with option(...), "
                "so that the configuration knows how to read it"
            )
        settings.append(dataclasses.replace(declaration, name=item.name))
    return tuple(settings)


@dataclass(frozen=True)
class NoOptions:
    """The options of a kind that takes only the shared settings."""


@dataclass(frozen=True)
class TargetConfig:
    """One delivery target: its kind, the shared settings, and the kind's own ``options``."""

    name: str
    kind: str
    url: Secret | None = None
    template: str | None = None
    min_interval: float | None = None
    timeout: float | None = None
    options: Any = field(default_factory=NoOptions)
