"""gpuload's alerts about the hardware: heat, power, links, XIDs, memory errors, lost GPUs.

One definition each (:class:`~exporter.alerting.definition.Alert`), in :data:`HEALTH`, the
order of the ``gpuload.health`` group. The slowdown threshold falls back to a fixed temperature
where a GPU reports none; a pending page retirement stands in for a pending row remap on
pre-Ampere GPUs.
"""

from __future__ import annotations

from exporter.alerting.definition import Alert, AlertDefinition
from exporter.alerting.expressions import (
    CELSIUS,
    COUNT,
    GPU,
    PERCENT,
    WHERE,
    literal,
    recording_names,
    xid_increase,
)
from exporter.alerting.thresholds import AlertThresholds, Thresholds


def _clocks_held(thresholds: Thresholds, settings: AlertThresholds, reasons: str) -> str:
    """The clock event ``reasons`` (a label matcher) active more than the alert's share."""
    events = recording_names(thresholds)["clock_events"]
    return (
        f"max without (reason) ({events}{{{reasons}}})"
        f"\n> {literal(settings.number('active_above'))}"
    )


def thermal_throttling(thresholds: Thresholds) -> Alert:
    """A GPU whose clocks heat cut for a share of the window."""
    thermal = thresholds.alert("GPUThermalThrottling")
    return Alert.of(
        thresholds,
        thermal,
        _clocks_held(thresholds, thermal, 'reason=~"sw_thermal|hw_thermal"'),
        summary="A GPU is slowed down by heat",
        description=f"{WHERE} had its clocks cut by thermal slowdown"
        f" {{{{ $value | humanizePercentage }}}} of the last {thresholds.window}.",
        value=PERCENT + " of the time",
    )


def power_capped(thresholds: Thresholds) -> Alert:
    """A GPU whose clocks its power limit or a power brake held down for a share of the window."""
    power = thresholds.alert("GPUPowerCapped")
    return Alert.of(
        thresholds,
        power,
        _clocks_held(thresholds, power, 'reason=~"sw_power_cap|hw_power_brake"'),
        summary="A GPU is held down by its power limit",
        description=f"{WHERE} had its clocks held down by its power limit or an external power"
        f" brake {{{{ $value | humanizePercentage }}}} of the last {thresholds.window}.",
        value=PERCENT + " of the time",
    )


def hardware_slowdown(thresholds: Thresholds) -> Alert:
    """A GPU whose hardware slowdown was engaged for a share of the window."""
    slowdown = thresholds.alert("GPUHardwareSlowdown")
    return Alert.of(
        thresholds,
        slowdown,
        _clocks_held(thresholds, slowdown, 'reason="hw_slowdown"'),
        summary="A GPU's hardware cut its clocks",
        description=f"{WHERE} had hardware slowdown engaged (clocks cut by half or more: heat, a"
        " power brake or the power supply) {{ $value | humanizePercentage }} of the last"
        f" {thresholds.window}.",
        value=PERCENT + " of the time",
    )


def temperature_high(thresholds: Thresholds) -> Alert:
    """A GPU close to its slowdown temperature, or above a fixed one where it reports none."""
    temperature = thresholds.alert("GPUTemperatureHigh")
    margin = literal(temperature.number("margin_celsius"))
    fallback = literal(temperature.number("fallback_celsius"))
    return Alert.of(
        thresholds,
        temperature,
        'gpu_temperature_celsius{sensor="gpu"}\n'
        f"  > ignoring (sensor) (gpu_temperature_slowdown_threshold_celsius - {margin})\n"
        "or\n"
        f'max without (sensor) (gpu_temperature_celsius{{sensor="gpu"}} > {fallback})\n'
        f"  unless on ({GPU}) gpu_temperature_slowdown_threshold_celsius",
        summary="A GPU is close to its slowdown temperature",
        description=f"{WHERE} is at {{{{ $value | humanize }}}} °C, less than {margin} °C below"
        f" its slowdown threshold (or above {fallback} °C where it reports none).",
        value=CELSIUS,
    )


def memory_temperature_high(thresholds: Thresholds) -> Alert:
    """A GPU's memory near its maximum operating temperature."""
    memory_temperature = thresholds.alert("GPUMemoryTemperatureHigh")
    above = literal(memory_temperature.number("above_celsius"))
    return Alert.of(
        thresholds,
        memory_temperature,
        f'gpu_temperature_celsius{{sensor="memory"}} > {above}',
        summary="A GPU's memory is close to its temperature limit",
        description=f"{WHERE} has its memory (HBM) at {{{{ $value | humanize }}}} °C, above"
        f" {above} °C: near its maximum operating temperature, where it is throttled.",
        value=CELSIUS,
    )


def pcie_link_degraded(thresholds: Thresholds) -> Alert:
    """A busy GPU whose PCIe link trained below what it supports."""
    names = recording_names(thresholds)
    pcie = thresholds.alert("GPUPCIeLinkDegraded")
    return Alert.of(
        thresholds,
        pcie,
        # Each generation doubles the per-lane rate (gen 3 onwards after encoding), so this is
        # the link's bandwidth as a fraction of what it supports.
        "2 ^ (gpu_pcie_link_generation - gpu_pcie_link_max_generation)\n"
        "  * gpu_pcie_link_width / gpu_pcie_link_max_width\n"
        "< 1\n"
        f"and on ({GPU}) {names['avg']} > {literal(pcie.number('busy_above'))}",
        summary="A busy GPU's PCIe link runs below its capability",
        description=f"{WHERE} is busy but its PCIe link gives"
        " {{ $value | humanizePercentage }} of its maximum bandwidth: it trained at a lower"
        " generation or fewer lanes than it supports.",
        value=PERCENT + " of its bandwidth",
    )


def nvlink_down(thresholds: Thresholds) -> Alert:
    """An NVLink link of a GPU down while its other links are up."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPUNVLinkDown"),
        "gpu_nvlink_link_down == 1",
        summary="An NVLink link of a GPU is down",
        description=f"{WHERE} has NVLink link {{{{ $labels.link }}}} inactive while its other"
        " links are up: traffic over it falls back to other paths, or collectives stall.",
        value="link {{ $labels.link }} down",
    )


def xid_error(thresholds: Thresholds) -> Alert:
    """A GPU that reported one of the critical XID codes."""
    xid = thresholds.alert("GPUXidError")
    xids = "|".join(str(code) for code in xid.xids())
    window = xid.duration("window")
    return Alert.of(
        thresholds,
        xid,
        xid_increase(f'xid=~"{xids}"', window),
        summary="A GPU reported a critical XID error",
        description=f"{WHERE} reported XID {{{{ $labels.xid }}}}"
        f' ({{{{ $value | printf "%.0f" }}}} in the last {window}):'
        " see the runbook for what this code needs (reset, drain or service).",
        value=f"{COUNT} of XID {{{{ $labels.xid }}}}",
    )


def recovery_action_required(thresholds: Thresholds) -> Alert:
    """A GPU whose driver asks for a recovery action (XID 154)."""
    recovery = thresholds.alert("GPURecoveryActionRequired")
    window = recovery.duration("window")
    return Alert.of(
        thresholds,
        recovery,
        xid_increase('xid="154"', window),
        summary="A GPU needs a recovery action",
        description=f'{WHERE} reported XID 154 ({{{{ $value | printf "%.0f" }}}} in the last'
        f" {window}): the driver asks for a recovery action (a GPU reset, a node reboot or a"
        " drain); the kernel log names which.",
        value=f"{COUNT} of XID 154",
    )


def fell_off_bus(thresholds: Thresholds) -> Alert:
    """A GPU that no longer answers NVML."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPUFellOffBus"),
        # Without the UUID: after an exporter restart NVML cannot read a lost GPU's UUID
        # (GPU_IS_LOST), and the alert must stay the same alert across the restart.
        "max without (uuid) (gpu_up == 0)",
        summary="A GPU has fallen off the bus",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }}"
        "{{ with $labels.node }} (node {{ . }}){{ end }}"
        " no longer answers NVML (GPU is lost): it has fallen off the bus.",
        value="lost (gpu_up 0)",
    )


def ecc_uncorrectable(thresholds: Thresholds) -> Alert:
    """A GPU that counted uncorrectable memory errors."""
    ecc = thresholds.alert("GPUECCUncorrectable")
    window = ecc.duration("window")
    uncorrected = 'gpu_ecc_errors_total{type="uncorrected",counter="volatile"}'
    return Alert.of(
        thresholds,
        ecc,
        f"{uncorrected} > 0\n"
        "or\n"
        # Where the volatile counter is missing, new errors in the aggregate one.
        'increase(gpu_ecc_errors_total{type="uncorrected",counter="aggregate"}'
        f"[{window}]) > 0\n"
        f"  unless on ({GPU}) {uncorrected}",
        summary="A GPU had uncorrectable memory errors",
        description=f'{WHERE} counted {{{{ $value | printf "%.0f" }}}} uncorrectable ECC errors'
        f" since its driver was loaded (or in the last {window}).",
        value=f"{COUNT} errors",
    )


def row_remap_pending(thresholds: Thresholds) -> Alert:
    """A GPU with a memory repair that waits for a reset."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPURowRemapPending"),
        # Pre-Ampere GPUs retire pages instead of remapping rows: same action.
        "gpu_row_remap_pending == 1\nor\ngpu_retired_pages_pending == 1",
        summary="A GPU needs a reset to repair its memory",
        description=f"{WHERE} has a memory row remapping (or page retirement) pending: it takes"
        " effect at the next GPU reset.",
        value="remap pending",
    )


def row_remap_failed(thresholds: Thresholds) -> Alert:
    """A GPU that could not repair its memory."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPURowRemapFailed"),
        "gpu_row_remap_failed == 1",
        summary="A GPU failed to repair its memory",
        description=f"{WHERE} failed to remap a memory row: it needs service.",
        value="remap failed",
    )


# The group's alerts, in the order Prometheus evaluates them.
HEALTH: tuple[AlertDefinition, ...] = (
    thermal_throttling,
    power_capped,
    hardware_slowdown,
    temperature_high,
    memory_temperature_high,
    pcie_link_degraded,
    nvlink_down,
    xid_error,
    recovery_action_required,
    fell_off_bus,
    ecc_uncorrectable,
    row_remap_pending,
    row_remap_failed,
)
