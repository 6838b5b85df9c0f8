"""Names that several parts of gpuload share, with no imports: the one list of each.

The GPM profiling metrics (Hopper and newer) are read by ``exporter/nvml/gpm.py``, published by
the gpm and mig collectors, simulated by ``exporter/sim/gpm.py`` and judged by the rules; the
metrics profiles are chosen by the configuration and applied by the collectors. Each list lives
here so that none of them keeps a second copy.
"""

from __future__ import annotations

# GPM metric -> its NVML metric id (nvml.h, NVML_GPM_METRIC_*), in the order the rules read them.
GPM_METRICS: dict[str, int] = {
    "sm_active": 2,  # NVML_GPM_METRIC_SM_UTIL
    "sm_occupancy": 3,  # NVML_GPM_METRIC_SM_OCCUPANCY
    "tensor_active": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "dram_active": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
    "fp16_active": 13,  # NVML_GPM_METRIC_FP16_UTIL
    "fp32_active": 12,  # NVML_GPM_METRIC_FP32_UTIL
    "fp64_active": 11,  # NVML_GPM_METRIC_FP64_UTIL
    "integer_active": 4,  # NVML_GPM_METRIC_INTEGER_UTIL
    "graphics_active": 1,  # NVML_GPM_METRIC_GRAPHICS_UTIL
}

# The metrics profiles, fewest series first (exporter/collectors/profiles.py says what each keeps).
PROFILES = ("minimal", "default", "full")
DEFAULT_PROFILE = "default"

# The host label of dcgm-exporter's fields (`metrics.dcgm_compat`): its name up to dcgm-exporter
# 4.8.2, renamed `hostname` after it (its pull request 655); `metrics.dcgm_hostname_label`.
DEFAULT_HOSTNAME_LABEL = "Hostname"
# dcgm-exporter's other labels, which the host label must not take (exporter/server/dcgm.py).
DCGM_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "DCGM_FI_DRIVER_VERSION",
    "GPU_I_ID",
    "GPU_I_PROFILE",
    "pod",
    "namespace",
    "container",
)
