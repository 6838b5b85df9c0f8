"""MIG: the instances of a GPU partitioned with Multi-Instance GPU.

Families:
    gpu_mig_mode_enabled: nvmlDeviceGetMigMode (current mode).
    gpu_mig_memory_used_bytes{mig_instance,mig_profile}, gpu_mig_memory_total_bytes: once per
        GPU instance, nvmlDeviceGetMemoryInfo on its first MIG device handle.
    gpu_mig_<metric>_ratio{mig_instance,mig_profile}: GPM per GPU instance
        (nvmlGpmMigSampleGet), on GPUs with GPM, for the metrics of the gpm collector, and
        gpu_mig_<metric>_seconds_total, each integrated over time as the gpm collector does.
    gpu_mig_multiprocessors{mig_instance,mig_compute_instance,mig_profile}: once per MIG device,
        nvmlDeviceGetAttributes_v2 (multiprocessorCount).

In MIG mode NVML has no whole-GPU utilization; per-instance GPM is the load signal.
A MIG device handle is one compute instance of a GPU instance (nvml.h): a GPU instance split into
compute instances has one handle per compute instance, all with its GPU instance id, sharing its
memory and GPM. So memory and GPM are exported once per GPU instance, never per compute instance.
`mig_instance` is the GPU instance id and `mig_profile` its profile (e.g. 3g.71gb); on
gpu_mig_multiprocessors `mig_compute_instance` is the compute instance id and `mig_profile` the
MIG device's (1c.3g.71gb for a compute instance of 1 of the GPU instance's 3 slices).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from exporter.collectors.base import Family, Reader, Sample, SlowReads, register, seconds_family
from exporter.collectors.gpm import ACTIVITY, HELP, GpmSeconds
from exporter.names import GPM_METRICS
from exporter.nvml import Device, GpmSampler, MigDevice

_MIG_LABELS = ("mig_instance", "mig_profile")
_MIG_DEVICE_LABELS = ("mig_instance", "mig_compute_instance", "mig_profile")

FAMILIES = (
    Family(
        "gpu_mig_mode_enabled",
        "gauge",
        "1 if the GPU is in MIG mode (nvmlDeviceGetMigMode), else 0. Absent on GPUs without MIG.",
    ),
    Family(
        "gpu_mig_memory_used_bytes",
        "gauge",
        "Memory used in a MIG GPU instance, shared by its compute instances, in bytes "
        "(nvmlDeviceGetMemoryInfo on its MIG device).",
        _MIG_LABELS,
    ),
    Family(
        "gpu_mig_memory_total_bytes",
        "gauge",
        "Memory of a MIG GPU instance, shared by its compute instances, in bytes "
        "(nvmlDeviceGetMemoryInfo on its MIG device).",
        _MIG_LABELS,
    ),
    Family(
        "gpu_mig_multiprocessors",
        "gauge",
        "Streaming multiprocessors of a MIG device, one compute instance of a GPU instance "
        "(nvmlDeviceGetAttributes_v2 multiprocessorCount).",
        _MIG_DEVICE_LABELS,
    ),
    *(
        Family(
            f"gpu_mig_{metric}_ratio",
            "gauge",
            f"{HELP[metric]} in a MIG GPU instance, 0..1, "
            "since the previous collection (nvmlGpmMigSampleGet, nvmlGpmMetricsGet).",
            _MIG_LABELS,
        )
        for metric in GPM_METRICS
    ),
)
FAMILIES += tuple(
    seconds_family(family, f"{ACTIVITY[metric]} in a MIG GPU instance")
    for metric in GPM_METRICS
    for family in FAMILIES
    if family.name == f"gpu_mig_{metric}_ratio"
)


def _mode(device: Device, read: Reader) -> Iterator[Sample]:
    enabled = read(device.mig_mode_enabled)
    if enabled is not None:
        yield Sample("gpu_mig_mode_enabled", 1 if enabled else 0)


def _by_gpu_instance(devices: list[MigDevice]) -> dict[int, MigDevice]:
    """The first MIG device of each GPU instance: the one to ask for what they share."""
    first: dict[int, MigDevice] = {}
    for device in sorted(devices, key=lambda d: (d.gpu_instance, d.compute_instance)):
        first.setdefault(device.gpu_instance, device)
    return first


@register("mig", FAMILIES)
class MigCollector:
    """MIG mode, memory and GPM metrics per GPU instance, and SMs per MIG device."""

    def __init__(self) -> None:
        self._gpm: bool | None = None
        self._samplers: dict[int, GpmSampler] = {}
        self._seconds: dict[int, GpmSeconds] = {}
        # Changing MIG mode takes a GPU reset: the mode is read once per slow interval.
        self._mode = SlowReads()

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield MIG mode and, in MIG mode, each instance's memory and GPM metrics."""
        mode = self._mode(read, partial(_mode, device, read))
        if not mode:
            return
        yield from mode
        enabled = mode[0].value == 1
        devices = (read(device.mig_devices) or []) if enabled else []
        for mig in devices:
            if mig.multiprocessors is not None:
                ids = (str(mig.gpu_instance), str(mig.compute_instance), mig.profile)
                yield Sample("gpu_mig_multiprocessors", mig.multiprocessors, ids)
        instances = _by_gpu_instance(devices)
        for instance in instances.values():
            labels = (str(instance.gpu_instance), instance.gpu_instance_profile)
            memory = read(instance.device.memory)
            if memory is not None:
                yield Sample("gpu_mig_memory_used_bytes", memory.used, labels)
                yield Sample("gpu_mig_memory_total_bytes", memory.total, labels)
        yield from self._instance_metrics(device, instances, read)

    def _instance_metrics(
        self, device: Device, instances: dict[int, MigDevice], read: Reader
    ) -> Iterator[Sample]:
        if self._gpm is None:
            supported = read(device.gpm_supported)
            if supported is None and read.last_error is not None:
                return
            self._gpm = bool(supported)
        if not self._gpm:
            return
        for gone in set(self._samplers) - set(instances):
            self._samplers.pop(gone).free()
            self._seconds.pop(gone, None)
        for instance in instances.values():
            sampler = self._samplers.get(instance.gpu_instance)
            if sampler is None:
                sampler = read(device.gpm_sampler, instance.gpu_instance)
                if sampler is None:
                    continue
                self._samplers[instance.gpu_instance] = sampler
            metrics = read(sampler.take, what="gpm_sample")
            if metrics is None:
                continue
            labels = (str(instance.gpu_instance), instance.gpu_instance_profile)
            seconds = self._seconds.setdefault(instance.gpu_instance, GpmSeconds())
            yield from seconds.samples(metrics, read.now, "gpu_mig_", labels)

    def close(self) -> None:
        """Free every instance's GPM samples."""
        for sampler in self._samplers.values():
            sampler.free()
        self._samplers.clear()
