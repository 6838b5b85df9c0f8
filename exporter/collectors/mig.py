"""MIG: the instances of a GPU partitioned with Multi-Instance GPU.

Families:
    gpu_mig_mode_enabled: nvmlDeviceGetMigMode (current mode).
    gpu_mig_memory_used_bytes{mig_instance,mig_profile}, gpu_mig_memory_total_bytes:
        nvmlDeviceGetMemoryInfo on each MIG device handle.
    gpu_mig_<metric>_ratio{mig_instance,mig_profile}: GPM per GPU instance
        (nvmlGpmMigSampleGet), on GPUs with GPM, for the metrics of the gpm collector.

In MIG mode NVML has no whole-GPU utilization; per-instance GPM is the load signal.
`mig_instance` is the GPU instance id, `mig_profile` e.g. 1g.10gb.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from exporter.collectors.base import Family, Reader, Sample, SlowReads, register
from exporter.collectors.gpm import HELP, gpm_samples
from exporter.nvml import GPM_METRICS, Device, GpmSampler, MigDevice

_MIG_LABELS = ("mig_instance", "mig_profile")

FAMILIES = (
    Family(
        "gpu_mig_mode_enabled",
        "gauge",
        "1 if the GPU is in MIG mode (nvmlDeviceGetMigMode), else 0. Absent on GPUs without MIG.",
    ),
    Family(
        "gpu_mig_memory_used_bytes",
        "gauge",
        "Memory used in a MIG instance, in bytes (nvmlDeviceGetMemoryInfo on the MIG device).",
        _MIG_LABELS,
    ),
    Family(
        "gpu_mig_memory_total_bytes",
        "gauge",
        "Memory of a MIG instance, in bytes (nvmlDeviceGetMemoryInfo on the MIG device).",
        _MIG_LABELS,
    ),
    *(
        Family(
            f"gpu_mig_{metric}_ratio",
            "gauge",
            f"{HELP[metric]} in a MIG instance, 0..1, "
            "since the previous collection (nvmlGpmMigSampleGet, nvmlGpmMetricsGet).",
            _MIG_LABELS,
        )
        for metric in GPM_METRICS
    ),
)


def _mode(device: Device, read: Reader) -> Iterator[Sample]:
    enabled = read(device.mig_mode_enabled)
    if enabled is not None:
        yield Sample("gpu_mig_mode_enabled", 1 if enabled else 0)


@register("mig", FAMILIES)
class MigCollector:
    """MIG mode, and memory and GPM metrics per MIG instance."""

    def __init__(self) -> None:
        self._gpm: bool | None = None
        self._samplers: dict[int, GpmSampler] = {}
        # Changing MIG mode takes a GPU reset: the mode is read once per slow interval.
        self._mode = SlowReads()

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield MIG mode and, in MIG mode, each instance's memory and GPM metrics."""
        mode = self._mode(read, partial(_mode, device, read))
        if not mode:
            return
        yield from mode
        enabled = mode[0].value == 1
        instances = (read(device.mig_devices) or []) if enabled else []
        for instance in instances:
            labels = (str(instance.gpu_instance), instance.profile)
            memory = read(instance.device.memory)
            if memory is not None:
                yield Sample("gpu_mig_memory_used_bytes", memory.used, labels)
                yield Sample("gpu_mig_memory_total_bytes", memory.total, labels)
        yield from self._instance_metrics(device, instances, read)

    def _instance_metrics(
        self, device: Device, instances: list[MigDevice], read: Reader
    ) -> Iterator[Sample]:
        if self._gpm is None:
            supported = read(device.gpm_supported)
            if supported is None and read.last_error is not None:
                return
            self._gpm = bool(supported)
        if not self._gpm:
            return
        present = {instance.gpu_instance for instance in instances}
        for gone in set(self._samplers) - present:
            self._samplers.pop(gone).free()
        for instance in instances:
            sampler = self._samplers.get(instance.gpu_instance)
            if sampler is None:
                sampler = read(partial(device.gpm_sampler, instance.gpu_instance))
                if sampler is None:
                    continue
                self._samplers[instance.gpu_instance] = sampler
            metrics = read(sampler.take, what="gpm_sample") or {}
            labels = (str(instance.gpu_instance), instance.profile)
            for sample in gpm_samples(metrics, prefix="gpu_mig_"):
                yield Sample(sample.family, sample.value, labels)

    def close(self) -> None:
        """Free every instance's GPM samples."""
        for sampler in self._samplers.values():
            sampler.free()
        self._samplers.clear()
