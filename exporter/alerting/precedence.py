"""The order of precedence of the rules' alerts: which of a GPU's problems is its headline.

A GPU can have several findings at once. Its headline (the status page's label, the doctor's
first word for it), the first line of its summary and the first of its next steps are its worst
real problem's: the one of the highest severity (critical, then warning, then info) and, within a
severity, the first in :data:`PRECEDENCE`. A bottleneck class that is a finding ranks as its alert
(``hung`` as GPUJobHung), before the alert itself when both are there, so that a GPU reads "hung"
rather than the alert's name. docs/runbooks.md#order-of-precedence says why this order.
"""

from __future__ import annotations

PRECEDENCE: tuple[str, ...] = (
    "GPUFellOffBus",
    "GPURecoveryActionRequired",
    # The memory fault's forms in the order its fold ranks them (health.FOLDS).
    "GPURowRemapFailed",
    "GPUECCUncorrectable",
    "GPUXidError",
    "GPUJobHung",
    "GPUHardwareSlowdown",
    "GPUThermalThrottling",
    "GPUTemperatureHigh",
    "GPUMemoryTemperatureHigh",
    "GPUNVLinkDown",
    "GPUPCIeLinkDegraded",
    "GPURowRemapPending",
    "GPUMemoryNearlyFull",
    "GPUDataLoaderStarved",
    "GPULoadImbalance",
    "GPUUtilizationLow",
    "GPUMIGUtilizationLow",
    "GPUIdleAllocated",
    "GPUPowerCapped",
    "GPUMemoryBandwidthBound",
    "GPUUtilizationHigh",
)
_RANKS = {name: position for position, name in enumerate(PRECEDENCE)}


def rank(alertname: str | None) -> int:
    """An alert's place in :data:`PRECEDENCE`; one not in it (or none) after all of them."""
    return _RANKS.get(alertname or "", len(PRECEDENCE))
