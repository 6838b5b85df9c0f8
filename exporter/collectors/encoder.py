"""Video encoder (NVENC) sessions: how many streams a GPU encodes, how fast and how late.

Families:
    gpu_encoder_sessions: nvmlDeviceGetEncoderStats sessionCount.
    gpu_encoder_average_fps: its averageFps, over all sessions (only while there are sessions).
    gpu_encoder_average_latency_seconds: its averageLatency, NVML's microseconds in seconds, over
        all sessions (only while there are sessions).

With no session NVML reports 0 for both averages: an average over no frames, so they are left
out rather than published as a frame rate and a latency of 0. NVML has no session call for the
decoder (NVDEC): its load is ``gpu_decoder_utilization_ratio`` (utilization collector) only. A GPU
without NVENC (H100 SXM, A100) answers NOT_SUPPORTED and has none of these series. The default
profile keeps all three (at most three series per GPU, on GPUs that encode video); the minimal
profile leaves them out.
"""

from __future__ import annotations

from collections.abc import Iterator

from exporter.collectors.base import Family, Reader, Sample, register
from exporter.nvml import Device

_MICROSECONDS_PER_SECOND = 1_000_000

FAMILIES = (
    Family(
        "gpu_encoder_sessions",
        "gauge",
        "Video encoder (NVENC) sessions running on the GPU (nvmlDeviceGetEncoderStats "
        "sessionCount). NVML has no decoder-session call.",
    ),
    Family(
        "gpu_encoder_average_fps",
        "gauge",
        "Average frames per second over all encoder sessions (nvmlDeviceGetEncoderStats "
        "averageFps); absent while no session runs.",
    ),
    Family(
        "gpu_encoder_average_latency_seconds",
        "gauge",
        "Average encode latency in seconds over all encoder sessions (nvmlDeviceGetEncoderStats "
        "averageLatency, microseconds); absent while no session runs.",
    ),
)


@register("encoder", FAMILIES)
class EncoderCollector:
    """Video encoder sessions, their average frame rate and latency."""

    def collect(self, device: Device, read: Reader) -> Iterator[Sample]:
        """Yield the session count and, while sessions run, their averages."""
        stats = read(device.encoder_stats, what="encoder.stats")
        if stats is None:
            return
        yield Sample("gpu_encoder_sessions", float(stats.sessions))
        if stats.sessions:
            yield Sample("gpu_encoder_average_fps", float(stats.average_fps))
            latency = stats.average_latency_us / _MICROSECONDS_PER_SECOND
            yield Sample("gpu_encoder_average_latency_seconds", latency)
