"""Simulated NVML GPM (GPU performance monitoring) functions, Hopper and newer.

A GPM sample is an opaque handle from nvmlGpmSampleAlloc; nvmlGpmSampleGet (or
nvmlGpmMigSampleGet for one MIG GPU instance) records in it which device it read and when.
nvmlGpmMetricsGet then answers each requested metric as the exact time-average of the
corresponding noise-free curve between the two samples' times:

- percentages (0..100) of the phase fractions ``graphics_active`` (GRAPHICS_UTIL),
  ``sm_active`` (SM_UTIL), ``sm_occupancy``,
  ``integer_active``, ``tensor_active`` (ANY_TENSOR_UTIL), ``dram_active`` (DRAM_BW_UTIL),
  ``fp64_active``, ``fp32_active``, ``fp16_active``;
- MiB/s of the rates ``pcie_tx``/``pcie_rx`` and ``nvlink_rx``/``nvlink_tx`` (all links).

Other metric ids below NVML_GPM_METRIC_MAX answer NOT_SUPPORTED in their slot. NVML's reference
says the two samples should be more than 100 ms apart and does not name the error otherwise; the
simulator answers NVML_ERROR_INVALID_ARGUMENT in each metric's ``nvmlReturn`` for samples closer
than that (or in the wrong order), so callers must handle a per-metric failure. With a pinned
scenario clock, two samples at the same instant give the curves' values at that instant. GPUs
whose model does not declare ``gpm`` report isSupportedDevice 0 and answer NOT_SUPPORTED to sample
reads.
``GpmSamples`` counts allocations so tests can check that callers free what they allocate.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.names import GPM_METRICS
from exporter.sim import records
from exporter.sim.device import MigDevice, SimulatedGpu
from exporter.sim.functions import (
    ARGUMENT_VERSION_MISMATCH,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    Call,
    address,
    device,
    integer,
    system,
    write_pointer,
)

if TYPE_CHECKING:
    from exporter.sim.library import SimulatedNvml

METRIC_MAX = records.GPM_METRIC_MAX  # NVML_GPM_METRIC_MAX: the size of the metrics array
MIN_INTERVAL = 0.1  # seconds between the two samples

_PERCENT = 100.0
_MIB_PER_SECOND = 1.0 / 2**20

# NVML's description of each metric it computes (nvmlGpmMetric_t.metricInfo: short name, long
# name, unit), by metric id (nvml.h, NVML_GPM_METRIC_*).
_PERCENT_INFO: dict[int, tuple[bytes, bytes]] = {
    1: (b"gr_util", b"Graphics utilization"),
    2: (b"sm_util", b"SM utilization"),
    3: (b"sm_occupancy", b"SM occupancy"),
    4: (b"integer_util", b"Integer utilization"),
    5: (b"any_tensor_util", b"Any tensor utilization"),
    10: (b"dram_bw_util", b"DRAM bandwidth utilization"),
    11: (b"fp64_util", b"FP64 utilization"),
    12: (b"fp32_util", b"FP32 utilization"),
    13: (b"fp16_util", b"FP16 utilization"),
}

# metric id -> (curve, scale, short name, long name, unit). The percentages are gpuload's GPM
# metrics (exporter.names), each answered from the scenario curve of the same name; the bandwidths
# come from the PCIe and NVLink traffic curves.
METRICS: dict[int, tuple[str, float, bytes, bytes, bytes]] = {
    **{
        metric_id: (metric, _PERCENT, *_PERCENT_INFO[metric_id], b"%")
        for metric, metric_id in GPM_METRICS.items()
    },
    20: ("pcie_tx", _MIB_PER_SECOND, b"pcie_tx_per_sec", b"PCIe TX bandwidth", b"MiB/s"),
    21: ("pcie_rx", _MIB_PER_SECOND, b"pcie_rx_per_sec", b"PCIe RX bandwidth", b"MiB/s"),
    60: ("nvlink_rx", _MIB_PER_SECOND, b"nvlink_rx_per_sec", b"NVLink RX bandwidth", b"MiB/s"),
    61: ("nvlink_tx", _MIB_PER_SECOND, b"nvlink_tx_per_sec", b"NVLink TX bandwidth", b"MiB/s"),
}

# Sample handles are fake pointers like device handles, in their own range.
_SAMPLE_BASE = 0x6E7700000000
_SAMPLE_STRIDE = 0x40


@dataclass(frozen=True)
class GpmReading:
    """What a GPM sample holds once read: the device (or MIG instance) and the scenario time."""

    gpu: SimulatedGpu
    instance: MigDevice | None
    t: float


class GpmSamples:
    """The GPM sample buffers allocated from one simulated library, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[int, GpmReading | None] = {}
        self.allocated = 0
        self.freed = 0

    @property
    def open(self) -> int:
        """How many samples are allocated and not yet freed."""
        return self.allocated - self.freed

    def alloc(self) -> int:
        """Allocate an empty sample and return its address."""
        with self._lock:
            self.allocated += 1
            sample = _SAMPLE_BASE + self.allocated * _SAMPLE_STRIDE
            self._samples[sample] = None
        return sample

    def free(self, sample: int) -> bool:
        """Free a sample; False when it was not allocated (or already freed)."""
        with self._lock:
            if sample not in self._samples:
                return False
            del self._samples[sample]
            self.freed += 1
        return True

    def record(self, sample: int, reading: GpmReading) -> bool:
        """Store a reading in an allocated sample; False when it was not allocated."""
        with self._lock:
            if sample not in self._samples:
                return False
            self._samples[sample] = reading
        return True

    def reading(self, sample: int) -> GpmReading | None:
        """The reading a sample holds; None when it is unknown or was never read."""
        with self._lock:
            return self._samples.get(sample)


@system("nvmlGpmSampleAlloc")
def _alloc(call: Call, ref: Any) -> int:
    return write_pointer(ref, call.sim.gpm_samples.alloc())


@system("nvmlGpmSampleFree")
def _free(call: Call, sample: Any) -> int:
    return SUCCESS if call.sim.gpm_samples.free(address(sample)) else INVALID_ARGUMENT


@device("nvmlGpmQueryDeviceSupport")
def _query_support(call: Call, ref: Any) -> int:
    support = records.read(ref, records.GpmSupport)
    if support.version != records.GPM_SUPPORT_VERSION:
        # What drivers answer: go-nvml issue 168, fixed by PR 176 (it sent a struct version).
        return ARGUMENT_VERSION_MISMATCH
    support.isSupportedDevice = int(not call.device.lacks("gpm"))
    records.write(ref, support)
    return SUCCESS


@device("nvmlGpmSampleGet")
def _sample_get(call: Call, sample: Any) -> int:
    reading = GpmReading(call.device, None, call.t)
    return SUCCESS if call.sim.gpm_samples.record(address(sample), reading) else INVALID_ARGUMENT


@device("nvmlGpmMigSampleGet")
def _mig_sample_get(call: Call, gpu_instance_id: Any, sample: Any) -> int:
    wanted = integer(gpu_instance_id)
    instance = next((m for m in call.device.mig if m.gpu_instance_id == wanted), None)
    if instance is None:
        return INVALID_ARGUMENT  # not in MIG mode, or no GPU instance with that id
    reading = GpmReading(call.device, instance, call.t)
    return SUCCESS if call.sim.gpm_samples.record(address(sample), reading) else INVALID_ARGUMENT


def _locate_samples(sim: SimulatedNvml, args: tuple[Any, ...]) -> SimulatedGpu | int:
    """The GPU the first sample was read from, so that the GPU's faults apply to the call."""
    reading = sim.gpm_samples.reading(records.read(args[0], records.GpmMetricsGet).sample1 or 0)
    return INVALID_ARGUMENT if reading is None else reading.gpu


@device("nvmlGpmMetricsGet", locate=_locate_samples)
def _metrics_get(call: Call, ref: Any) -> int:
    # The driver reads its own layout and fills only the numMetrics entries asked for, so a
    # caller whose array has another length (another NVML_GPM_METRIC_MAX) still gets them.
    request = records.read(ref, records.GpmMetricsGet)
    if request.version != records.GPM_METRICS_GET_VERSION:
        return ARGUMENT_VERSION_MISMATCH
    samples = call.sim.gpm_samples
    first = samples.reading(request.sample1 or 0)
    second = samples.reading(request.sample2 or 0)
    if first is None or second is None or request.numMetrics > METRIC_MAX:
        return INVALID_ARGUMENT
    if (first.gpu, first.instance) != (second.gpu, second.instance):
        return INVALID_ARGUMENT
    timeline = (first.instance or first.gpu).timeline
    interval = second.t - first.t
    # A pinned scenario clock never moves: two samples of it describe one instant, and the
    # metrics are the curves' values there, so that pinned runs (golden files) show them.
    frozen = call.sim.pinned_time is not None and interval == 0
    for slot in request.metrics[: request.numMetrics]:
        known = METRICS.get(slot.metricId)
        if known is None:
            slot.nvmlReturn = NOT_SUPPORTED if slot.metricId < METRIC_MAX else INVALID_ARGUMENT
            continue
        if interval < MIN_INTERVAL and not frozen:
            slot.nvmlReturn = INVALID_ARGUMENT
            continue
        curve, scale, short_name, long_name, unit = known
        if frozen:
            phase, since_start = timeline.locate(second.t)
            slot.value = phase.specs[curve].clean(since_start) * scale
        else:
            area = timeline.integral(curve, second.t) - timeline.integral(curve, first.t)
            slot.value = area / interval * scale
        slot.nvmlReturn = SUCCESS
        # Pointers to the module's constant strings, which live as long as the driver's do.
        slot.metricInfo.shortName = short_name
        slot.metricInfo.longName = long_name
        slot.metricInfo.unit = unit
    records.write(ref, request)
    return SUCCESS
