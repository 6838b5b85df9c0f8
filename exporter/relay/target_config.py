"""What a delivery target is configured with: made by `exporter.relay.config`, read by targets."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Secret:
    """A secret value and where it came from; only the source is ever shown."""

    value: str = field(repr=False)
    source: str = "config file"

    def __str__(self) -> str:
        return f"<secret from {self.source}>"


@dataclass(frozen=True)
class TargetConfig:
    """One delivery target: its kind, where it is and how it is signed."""

    name: str
    kind: str
    url: Secret | None = None
    secret: Secret | None = None
    routing_key: Secret | None = None
    template: str | None = None
    min_interval: float | None = None
    timeout: float | None = None
    at_mobiles: tuple[str, ...] = ()
    at_all: bool = False
    content_type: str = "application/json"
