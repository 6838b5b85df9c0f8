"""The simulator's optional GPU features and its table-driven NVML readings, each listed once.

:data:`FEATURES` names every optional feature a model or GPU entry may list under ``lacks`` (or
``has``) and the NVML functions that answer NOT_SUPPORTED without it. :data:`READINGS` lists the
NVML functions that simply answer scenario metrics: for each, the feature it needs and every value
it writes, with the scenario key and kind that value comes from, its constant default, where
``nvidia-smi`` prints it and which :class:`exporter.nvml.Device` method reads it.

Everything else derives its per-feature mapping from these two tables:

- ``scenario``: the metric keys and kinds (``METRICS``), the defaults a phase leaves out, the
  ``lacks`` vocabulary (``FEATURES``);
- ``functions``: the handler of each reading, and the feature of every registered device function;
- ``device``: which metrics are fractions, clamped to 0..1;
- ``nvsmi``: where each format prints a reading (text, XML and CSV paths);
- ``importer``: a printed value as an override, and the calls a NO_PERMISSION feature refuses;
- ``recorder``: which method reads each reading, and its value in scenario units;
- ``recording``: the call whose success shows a GPU has a feature, and how a reading is written.

A new reading is one :class:`Reading` entry here (plus its ``exporter.nvml`` method).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    """An optional GPU feature: without it, its NVML functions answer NOT_SUPPORTED."""

    name: str
    calls: tuple[str, ...] = ()  # functions besides the READINGS that name this feature
    also: str = ""  # what else it switches off (field values, sample types) and when GPUs lack it

    @property
    def functions(self) -> tuple[str, ...]:
        """Every NVML function that needs the feature, the readings' first."""
        readings = tuple(r.function for r in READINGS if r.feature == self.name)
        return readings + self.calls

    @property
    def description(self) -> str:
        """What a GPU without the feature does not answer, for the scenario reference."""
        return "; ".join(part for part in (", ".join(self.functions), self.also) if part)


@dataclass(frozen=True)
class Printed:
    """Where ``nvidia-smi`` prints a value; each a tuple of alternatives, empty where not printed.

    ``text`` is the ``-q`` path (sections joined by ``/``), ``xml`` the ``-q -x`` element path,
    ``csv`` the ``--query-gpu`` field name; ``unit`` what follows the number (``%``, or nothing).
    """

    text: tuple[str, ...] = ()
    xml: tuple[str, ...] = ()
    csv: tuple[str, ...] = ()
    unit: str = ""


@dataclass(frozen=True)
class Output:
    """One value an NVML function writes, and the scenario metric that answers it."""

    metric: str  # the scenario key of its curve
    kind: str  # the quantity the scenario accepts: "fraction" (0..1) or "number" (its own unit)
    nvml_per_unit: float  # NVML's units per scenario unit: 100 for a fraction NVML gives in %
    default: float  # the constant of a phase that leaves the metric out
    printed: Printed = Printed()
    # The gpuload family that exports it, which tools/conformance.py compares with what nvidia-smi
    # printed, unless ``not_compared`` says why not.
    family: str = ""
    not_compared: str = ""


@dataclass(frozen=True)
class Reading:
    """An NVML device function that writes scenario metrics, one output pointer each, in order.

    ``period_us``: the sampling period (µs) the function writes after its values (the codec
    utilization calls). ``whole_gpu``: a GPU in MIG mode answers NOT_SUPPORTED. ``method``: the
    :class:`exporter.nvml.Device` method that calls it, returning the values in NVML's units (a
    number, or a tuple in the order of ``outputs``). ``source``: where its behaviour is documented.
    """

    function: str
    outputs: tuple[Output, ...]
    feature: str
    method: str
    source: str
    period_us: int | None = None
    whole_gpu: bool = False


# NVML's sampling period for the codec engines: 1/6 s, the shortest the driver reports for its
# utilization samples (nvml.h, nvmlDeviceGetEncoderUtilization "samplingPeriodUs").
_CODEC_PERIOD_US = 167_000
# In MIG mode the whole GPU reports no codec utilization (the engines belong to the instances):
# the recorded H200 in MIG mode prints utilization.encoder and .decoder [N/A] in both states
# (captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt, query-gpu CSV).
_CODEC_SOURCE = (
    "nvml.h nvmlDeviceGet{Encoder,Decoder}Utilization: utilization %, samplingPeriodUs; "
    "[N/A] in MIG mode in captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt"
)

READINGS: tuple[Reading, ...] = (
    Reading(
        "nvmlDeviceGetEncoderUtilization",
        (
            Output(
                "encoder_utilization",
                "fraction",
                100.0,
                0.0,
                Printed(
                    ("Utilization/Encoder",),
                    ("utilization/encoder_util",),
                    ("utilization.encoder",),
                    "%",
                ),
                family="gpu_encoder_utilization_ratio",
            ),
        ),
        feature="encoder",
        method="encoder_utilization_percent",
        source=_CODEC_SOURCE,
        period_us=_CODEC_PERIOD_US,
        whole_gpu=True,
    ),
    Reading(
        "nvmlDeviceGetDecoderUtilization",
        (
            Output(
                "decoder_utilization",
                "fraction",
                100.0,
                0.0,
                Printed(
                    ("Utilization/Decoder",),
                    ("utilization/decoder_util",),
                    ("utilization.decoder",),
                    "%",
                ),
                family="gpu_decoder_utilization_ratio",
            ),
        ),
        feature="decoder",
        method="decoder_utilization_percent",
        source=_CODEC_SOURCE,
        period_us=_CODEC_PERIOD_US,
        whole_gpu=True,
    ),
    Reading(
        "nvmlDeviceGetEncoderStats",
        (
            Output(
                "encoder_sessions",
                "number",
                1.0,
                0.0,
                Printed(
                    ("Encoder Stats/Active Sessions",),
                    ("encoder_stats/session_count",),
                    ("encoder.stats.sessionCount",),
                ),
                family="gpu_encoder_sessions",
            ),
            Output(
                "encoder_fps",
                "number",
                1.0,
                0.0,
                Printed(
                    ("Encoder Stats/Average FPS",),
                    ("encoder_stats/average_fps",),
                    ("encoder.stats.averageFps",),
                ),
                family="gpu_encoder_average_fps",
                not_compared="absent while no encoder session runs, where nvidia-smi prints 0",
            ),
            # Scenarios give the latency in seconds; NVML answers microseconds.
            Output(
                "encoder_latency",
                "number",
                1e6,
                0.0,
                Printed(
                    ("Encoder Stats/Average Latency",),
                    ("encoder_stats/average_latency",),
                    ("encoder.stats.averageLatency",),
                ),
                family="gpu_encoder_average_latency_seconds",
                not_compared="absent while no encoder session runs, where nvidia-smi prints 0",
            ),
        ),
        feature="encoder",
        method="encoder_stats",
        # Answered in MIG mode too: the recorded H200 in MIG mode prints utilization.encoder
        # [N/A] but encoder.stats.sessionCount 0.
        source=(
            "nvml.h nvmlDeviceGetEncoderStats(device, *sessionCount, *averageFps, "
            "*averageLatency); nvidia-smi --help-query-gpu: 'Average latency in microseconds of "
            "all sessions'; the L40S under load prints 2 sessions, 243 FPS, 3280335 us "
            "(captures/linux-x86_64__nvidia-l40s__595.80.txt, Encoder Stats)"
        ),
    ),
)

FEATURES: tuple[Feature, ...] = (
    Feature("memory_temperature", also="field NVML_FI_DEV_MEMORY_TEMP and the MEM_MAX threshold"),
    Feature("energy", ("nvmlDeviceGetTotalEnergyConsumption",), "field 83 (pre-Volta)"),
    Feature("encoder", also="encoder samples (no NVENC)"),
    Feature("decoder", also="decoder samples (no NVDEC)"),
    Feature(
        "clock_event_reasons",
        (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            "nvmlDeviceGetSupportedClocksEventReasons",
            "nvmlDeviceGetSupportedClocksThrottleReasons",
        ),
        "current and supported clock event (throttle) reasons",
    ),
    Feature("ecc", ("nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors"), "ECC mode and counts"),
    Feature("pcie_throughput", ("nvmlDeviceGetPcieThroughput",)),
    Feature("pcie_counters", also="fields NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES"),
    Feature("pcie_replay", ("nvmlDeviceGetPcieReplayCounter",), "field 94"),
    Feature("power_fields", also="fields NVML_FI_DEV_POWER_AVERAGE / POWER_INSTANT"),
    Feature("samples", ("nvmlDeviceGetSamples",)),
    Feature("serial", ("nvmlDeviceGetSerial",)),
    Feature(
        "process_utilization",
        ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo"),
    ),
    Feature(
        "gpm",
        ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet"),
        "GPM samples and metrics (Hopper and newer; declared by the model)",
    ),
    Feature(
        "events",
        ("nvmlDeviceRegisterEvents", "nvmlDeviceGetSupportedEventTypes"),
        "event registration",
    ),
    Feature(
        "nvlink",
        (
            "nvmlDeviceGetNvLinkState",
            "nvmlDeviceGetNvLinkVersion",
            "nvmlDeviceGetNvLinkErrorCounter",
        ),
        "NVLink state, version, error counters, throughput fields (models with nvlink_links)",
    ),
    Feature(
        "nvlink_error_fields",
        also="fields NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY / _RECOVERY (older drivers)",
    ),
    Feature("nvlink_state_field", also="field NVML_FI_DEV_NVLINK_GET_STATE (older drivers)"),
    Feature(
        "row_remapping",
        ("nvmlDeviceGetRemappedRows",),
        "Ampere and newer data-centre GPUs",
    ),
    Feature(
        "retired_pages",
        (
            "nvmlDeviceGetRetiredPages",
            "nvmlDeviceGetRetiredPages_v2",
            "nvmlDeviceGetRetiredPagesPendingStatus",
        ),
        "pre-Ampere data centre",
    ),
)

FEATURE_NAMES = tuple(feature.name for feature in FEATURES)
# Every NVML function that needs a feature -> that feature.
FEATURE_OF: dict[str, str] = {
    function: feature.name for feature in FEATURES for function in feature.functions
}
OUTPUTS: tuple[Output, ...] = tuple(output for reading in READINGS for output in reading.outputs)
# Scenario metric -> the kind of quantity it accepts, for the metrics the readings answer.
KINDS: dict[str, str] = {output.metric: output.kind for output in OUTPUTS}
