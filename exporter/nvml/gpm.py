"""GPU performance monitoring (GPM): profiling metrics between two samples (Hopper and newer).

A sampler owns two sample buffers, allocated once and freed by `free`; each
`take` fills one and computes the metrics between it and the previous one.
NVML needs the two samples more than 100 ms apart.
"""

from __future__ import annotations

import threading
from typing import Any

import pynvml

from exporter.names import GPM_METRICS
from exporter.nvml.errors import NotSupported, translated


class GpmSampler:
    """Alternating GPM samples for one GPU or one MIG GPU instance."""

    def __init__(self, handle: Any, gpu_instance: int | None = None) -> None:
        self._handle = handle
        self._gpu_instance = gpu_instance
        self._lock = threading.Lock()
        with translated():
            self._samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        self._have_previous = False

    def take(self) -> dict[str, float]:
        """Take a sample; return the metrics (percent 0-100) since the previous one.

        The first call returns an empty mapping. A metric NVML could not compute
        (e.g. not available on this GPU) is left out.
        """
        with self._lock:
            current, previous = self._samples[1], self._samples[0]
            with translated():
                if self._gpu_instance is None:
                    pynvml.nvmlGpmSampleGet(self._handle, current)
                else:
                    pynvml.nvmlGpmMigSampleGet(self._handle, self._gpu_instance, current)
            self._samples.reverse()
            if not self._have_previous:
                self._have_previous = True
                return {}
            return _metrics_between(previous, current)

    def free(self) -> None:
        """Release both sample buffers; the sampler is unusable afterwards."""
        with self._lock:
            for sample in self._samples:
                try:
                    with translated():
                        pynvml.nvmlGpmSampleFree(sample)
                except NotSupported:
                    continue
            self._samples = []


def _metrics_between(first: Any, second: Any) -> dict[str, float]:
    # exporter.names holds the ids as plain ints; tests/test_gpm_names.py checks that they equal
    # pynvml's NVML_GPM_METRIC_* constants.
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1 = first
    request.sample2 = second
    for slot, metric_id in enumerate(GPM_METRICS.values()):
        request.metrics[slot].metricId = metric_id
    with translated():
        pynvml.nvmlGpmMetricsGet(request)
    values = {}
    for slot, name in enumerate(GPM_METRICS):
        metric = request.metrics[slot]
        if metric.nvmlReturn == pynvml.NVML_SUCCESS:
            values[name] = float(metric.value)
    return values
