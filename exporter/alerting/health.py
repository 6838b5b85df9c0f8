"""gpuload's alerts about the hardware: heat, power, links, XIDs, memory errors, lost GPUs.

One definition each (:class:`~exporter.alerting.definition.Alert`), in :data:`HEALTH`, the
order of the ``gpuload.health`` group. The slowdown threshold falls back to a fixed temperature
where a GPU reports none; a pending page retirement stands in for a pending row remap on
pre-Ampere GPUs.

One fault pages once (:data:`FOLDS`): the alerts and XIDs that report the same fault of the
same GPU are folded, in the rule expressions themselves, into the one alert that says it best.
Folding at the source holds for the local evaluator and for any Alertmanager alike, from the
first evaluation: an inhibit rule would mute a folded alert only once its source fires, after
the source's `for:`.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.alerting.definition import Alert, AlertDefinition
from exporter.alerting.expressions import (
    CELSIUS,
    COUNT,
    GPU,
    PERCENT,
    WHERE,
    indented,
    literal,
    recording_names,
    xid_increase,
)
from exporter.alerting.thresholds import AlertThresholds, Thresholds


def _clocks_held(thresholds: Thresholds, settings: AlertThresholds, reasons: str) -> str:
    """The clock event ``reasons`` (a label matcher) active more than the alert's share."""
    return f"{_clock_share(thresholds, reasons)}\n> {literal(settings.number('active_above'))}"


def _clock_share(thresholds: Thresholds, reasons: str) -> str:
    """The share of the window the clock event ``reasons`` were active."""
    events = recording_names(thresholds)["clock_events"]
    return f"max without (reason) ({events}{{{reasons}}})"


def thermal_throttling(thresholds: Thresholds) -> Alert:
    """A GPU whose clocks heat cut for a share of the window."""
    thermal = thresholds.alert("GPUThermalThrottling")
    return Alert.of(
        thresholds,
        thermal,
        _folded(thresholds, "GPUThermalThrottling"),
        summary="A GPU is slowed down by heat",
        description=f"{WHERE} had its clocks cut by thermal slowdown"
        f" {{{{ $value | humanizePercentage }}}} of the last {thresholds.window}.",
        value=PERCENT + " of the time",
        reading=_clock_share(thresholds, 'reason=~"sw_thermal|hw_thermal"'),
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
        reading=_clock_share(thresholds, 'reason=~"sw_power_cap|hw_power_brake"'),
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
        reading=_clock_share(thresholds, 'reason="hw_slowdown"'),
    )


def temperature_high(thresholds: Thresholds) -> Alert:
    """A GPU close to its slowdown temperature, or above a fixed one where it reports none."""
    temperature = thresholds.alert("GPUTemperatureHigh")
    margin = literal(temperature.number("margin_celsius"))
    fallback = literal(temperature.number("fallback_celsius"))
    return Alert.of(
        thresholds,
        temperature,
        _folded(thresholds, "GPUTemperatureHigh"),
        summary="A GPU is close to its slowdown temperature",
        description=f"{WHERE} is at {{{{ $value | humanize }}}} °C, less than {margin} °C below"
        f" its slowdown threshold (or above {fallback} °C where it reports none).",
        value=CELSIUS,
        reading='gpu_temperature_celsius{sensor="gpu"}',
    )


def memory_temperature_high(thresholds: Thresholds) -> Alert:
    """A GPU's memory near its maximum operating temperature."""
    memory_temperature = thresholds.alert("GPUMemoryTemperatureHigh")
    above = literal(memory_temperature.number("above_celsius"))
    return Alert.of(
        thresholds,
        memory_temperature,
        _folded(thresholds, "GPUMemoryTemperatureHigh"),
        summary="A GPU's memory is close to its temperature limit",
        description=f"{WHERE} has its memory (HBM) at {{{{ $value | humanize }}}} °C, above"
        f" {above} °C: near its maximum operating temperature, where it is throttled.",
        value=CELSIUS,
        reading='gpu_temperature_celsius{sensor="memory"}',
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


# The ECC counters: uncorrectable errors since the driver was loaded, and over its lifetime.
_UNCORRECTED = 'gpu_ecc_errors_total{type="uncorrected",counter="volatile"}'
_UNCORRECTED_EVER = 'gpu_ecc_errors_total{type="uncorrected",counter="aggregate"}'
# The keys that name one GPU whether or not a series carries its UUID: a lost GPU's gpu_up has
# none after an exporter restart.
_SAME_GPU = "instance, job, gpu"


@dataclass(frozen=True)
class Fold:
    """One fault of a GPU, told by ``alert``; the XIDs that report the same fault fold into it.

    ``seen`` is the fault's own reading in the XID alert's window (a PromQL condition over
    ``window``): while it shows, those XIDs raise no alert of their own. ``outranks`` are the
    alerts about the same fault that ``alert`` takes over while its condition holds, so the
    fault's worst form is the one alert that fires.
    """

    alert: str
    reason: str
    xids: tuple[int, ...] = ()
    outranks: tuple[str, ...] = ()

    def seen(self, window: str) -> str:
        """The fault's reading at any time in the last ``window``."""
        return _SEEN[self.alert](window)


def _lost_within(window: str) -> str:
    return f"min_over_time(gpu_up[{window}]) == 0"


def _memory_fault_within(window: str) -> str:
    return (
        f"max_over_time({_UNCORRECTED}[{window}]) > 0\n"
        f"or increase({_UNCORRECTED_EVER}[{window}]) > 0\n"
        f"or max_over_time(gpu_row_remap_pending[{window}]) == 1\n"
        f"or max_over_time(gpu_retired_pages_pending[{window}]) == 1\n"
        f"or max_over_time(gpu_row_remap_failed[{window}]) == 1"
    )


_SEEN = {
    "GPUFellOffBus": _lost_within,
    "GPUECCUncorrectable": _memory_fault_within,
}

# The folds, one per fault. docs/runbooks.md#one-page-per-fault explains each.
FOLDS: tuple[Fold, ...] = (
    Fold(
        "GPUFellOffBus",
        "XID 79 is the driver's word for a GPU that fell off the bus; gpu_up 0 says the same",
        xids=(79,),
    ),
    Fold(
        "GPUECCUncorrectable",
        "these XIDs report uncorrectable memory errors and their repair, which the ECC"
        " counters and the row remap gauges read directly",
        # Double-bit ECC, row remap event and failure, contained and uncontained ECC errors.
        xids=(48, 63, 64, 94, 95),
        # Worst first: a failed repair needs service, an uncorrectable error a look, a pending
        # repair only a reset (which GPUECCUncorrectable's runbook says).
        outranks=("GPURowRemapFailed", "GPUECCUncorrectable", "GPURowRemapPending"),
    ),
    # A GPU hot enough to be near its slowdown temperature, or to have its clocks cut, heats its
    # memory too: one cooling fault, which the GPU's own alert tells. The two GPU alerts stay
    # apart: one is the heat, the other what it costs, and they come minutes apart.
    Fold(
        "GPUTemperatureHigh",
        "its memory's heat is the same cooling fault",
        outranks=("GPUTemperatureHigh", "GPUMemoryTemperatureHigh"),
    ),
    Fold(
        "GPUThermalThrottling",
        "its memory's heat is the same cooling fault",
        outranks=("GPUThermalThrottling", "GPUMemoryTemperatureHigh"),
    ),
)


def folded_xids(codes: tuple[int, ...], window: str) -> str:
    """XIDs of ``codes`` in the last ``window``, but not those a fold gives to another alert.

    A folded XID still fires where its GPU shows no reading of the fault (a GPU without ECC
    counters, an XID 79 whose GPU came back before a scrape saw it lost). Each branch selects
    from all of ``codes`` and narrows by the fold's own, whichever codes the thresholds list:
    the rule reads the same for any list (the Helm chart templates the list).
    """
    listed = f'xid=~"{"|".join(map(str, codes))}"'
    every = "|".join(str(code) for fold in FOLDS for code in fold.xids)
    branches = [xid_increase(f'{listed},xid!~"{every}"', window)]
    for fold in FOLDS:
        if not fold.xids:
            continue
        mine = "|".join(map(str, fold.xids))
        xids = indented(xid_increase(f'{listed},xid=~"{mine}"', window))
        inner = f"(\n{xids}\n)\nunless on ({_SAME_GPU}) (\n{indented(fold.seen(window))}\n)"
        branches.append(f"(\n{indented(inner)}\n)")
    return "\nor\n".join(branches)


def _fold_xids(alert: str) -> str:
    """The XIDs folded into ``alert``, as text: "48, 63, 64"."""
    return ", ".join(str(code) for fold in FOLDS if fold.alert == alert for code in fold.xids)


def _outranked(name: str, conditions: dict[str, str]) -> str:
    """``unless`` each alert about the same fault that outranks ``name``, where one does."""
    worse = [
        other
        for fold in FOLDS
        if name in fold.outranks
        for other in fold.outranks[: fold.outranks.index(name)]
    ]
    return "".join(
        f"\nunless on ({_SAME_GPU}) (\n{indented(conditions[other])}\n)" for other in worse
    )


def _event_stays(window: str) -> str:
    """Why an alert over an XID counter outlives the fault: how long it stays."""
    return (
        f"An XID is an event, not a state: the alert stays for {window} after the last one, so"
        " that it is seen, however soon the GPU is well again."
    )


def xid_error(thresholds: Thresholds) -> Alert:
    """A GPU that reported one of the critical XID codes, unless a fold reports its fault."""
    xid = thresholds.alert("GPUXidError")
    window = xid.duration("window")
    return Alert.of(
        thresholds,
        xid,
        folded_xids(xid.xids(), window),
        summary="A GPU reported a critical XID error",
        description=f"{WHERE} reported XID {{{{ $labels.xid }}}}"
        f' ({{{{ $value | printf "%.0f" }}}} in the last {window}):'
        " see the runbook for what this code needs (reset, drain or service). "
        + _event_stays(window),
        value=f"{COUNT} of XID {{{{ $labels.xid }}}}",
        reading=f"increase(gpu_xid_errors_total[{window}])",
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
        " drain); the kernel log names which. " + _event_stays(window),
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
        # The value is gpu_up: 0 while it fires, 1 once the GPU answers again.
        value="{{ if $value }}answering (gpu_up 1){{ else }}lost (gpu_up 0){{ end }}",
        reading="max without (uuid) (gpu_up)",
    )


def _memory_conditions(thresholds: Thresholds) -> dict[str, str]:
    """The conditions of the alerts about a GPU's memory errors, by alert."""
    window = thresholds.alert("GPUECCUncorrectable").duration("window")
    return {
        "GPURowRemapFailed": "gpu_row_remap_failed == 1",
        "GPUECCUncorrectable": f"{_UNCORRECTED} > 0\n"
        "or\n"
        # Where the volatile counter is missing, new errors in the aggregate one.
        f"increase({_UNCORRECTED_EVER}[{window}]) > 0\n"
        f"  unless on ({GPU}) {_UNCORRECTED}",
        # Pre-Ampere GPUs retire pages instead of remapping rows: same action.
        "GPURowRemapPending": "gpu_row_remap_pending == 1\nor\ngpu_retired_pages_pending == 1",
    }


def _hot(thresholds: Thresholds, temperature: str) -> str:
    """GPUTemperatureHigh's condition on ``temperature`` (a selector of the GPU sensor's)."""
    settings = thresholds.alert("GPUTemperatureHigh")
    margin = literal(settings.number("margin_celsius"))
    fallback = literal(settings.number("fallback_celsius"))
    return (
        f"{temperature}\n"
        f"  > ignoring (sensor) (gpu_temperature_slowdown_threshold_celsius - {margin})\n"
        "or\n"
        f"max without (sensor) ({temperature} > {fallback})\n"
        f"  unless on ({GPU}) gpu_temperature_slowdown_threshold_celsius"
    )


def _heat_conditions(thresholds: Thresholds) -> dict[str, str]:
    """The conditions of the alerts about a hot GPU, by alert."""
    thermal = thresholds.alert("GPUThermalThrottling")
    above = literal(thresholds.alert("GPUMemoryTemperatureHigh").number("above_celsius"))
    return {
        "GPUThermalThrottling": _clocks_held(
            thresholds, thermal, 'reason=~"sw_thermal|hw_thermal"'
        ),
        "GPUTemperatureHigh": _hot(thresholds, 'gpu_temperature_celsius{sensor="gpu"}'),
        "GPUMemoryTemperatureHigh": f'gpu_temperature_celsius{{sensor="memory"}} > {above}',
    }


def _folded(thresholds: Thresholds, name: str) -> str:
    """The alert's condition, unless a worse alert about the same fault holds instead."""
    conditions = {**_memory_conditions(thresholds), **_heat_conditions(thresholds)}
    own = conditions[name]
    outranked = _outranked(name, conditions)
    if not outranked:
        return own
    return f"(\n{indented(own)}\n){outranked}"


def ecc_uncorrectable(thresholds: Thresholds) -> Alert:
    """A GPU that counted uncorrectable memory errors, and whose repair did not fail."""
    ecc = thresholds.alert("GPUECCUncorrectable")
    window = ecc.duration("window")
    return Alert.of(
        thresholds,
        ecc,
        _folded(thresholds, "GPUECCUncorrectable"),
        summary="A GPU had uncorrectable memory errors",
        description=f'{WHERE} counted {{{{ $value | printf "%.0f" }}}} uncorrectable ECC errors'
        f" since its driver was loaded (or in the last {window}); the XIDs that report them"
        f" ({_fold_xids('GPUECCUncorrectable')}) and a pending row remap are part of this"
        " alert. A pending remap takes effect at the next GPU reset.",
        value=f"{COUNT} errors",
        reading=_UNCORRECTED,
    )


def row_remap_pending(thresholds: Thresholds) -> Alert:
    """A GPU with a memory repair that waits for a reset, and no uncorrectable error counted."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPURowRemapPending"),
        _folded(thresholds, "GPURowRemapPending"),
        summary="A GPU needs a reset to repair its memory",
        description=f"{WHERE} has a memory row remapping (or page retirement) pending: it takes"
        " effect at the next GPU reset.",
        value="remap pending",
    )


def row_remap_failed(thresholds: Thresholds) -> Alert:
    """A GPU that could not repair its memory: its uncorrectable errors are part of it."""
    return Alert.of(
        thresholds,
        thresholds.alert("GPURowRemapFailed"),
        _folded(thresholds, "GPURowRemapFailed"),
        summary="A GPU failed to repair its memory",
        description=f"{WHERE} failed to remap a memory row after uncorrectable errors: it needs"
        " service. Its uncorrectable ECC errors and the XIDs that report them are part of this"
        " alert.",
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
