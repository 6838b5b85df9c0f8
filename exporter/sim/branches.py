"""What each NVIDIA driver release's NVML has: functions and field ids, one row each, with source.

Features come with driver branches, not GPU models: a driver without a row's function does not
export it (pynvml raises FunctionNotFound); one without a row's field id answers that field with a
per-field INVALID_ARGUMENT (nvml-facts.md: "expect INVALID_ARGUMENT too"; whether an undefined id
below the branch's NVML_FI_MAX answers NOT_SUPPORTED instead is not known, and the collectors
take either). A scenario's ``driver.version`` applies this table; ``driver.lacks`` removes more on
top (a stripped build, or a test of a fallback).

Sources: NS = NVIDIA/nvidia-settings ``src/nvml.h`` at the tag of the driver release named (one
tag per release, 440.26 to 610.43); CL = NVML's change log (docs.nvidia.com/deploy/nvml-api/
change-log.html). Functions and fields not listed are in every release the simulator models
(R450 and later). The recorded 590.48.01 and 610.57.04 libraries (shared/reality/captures,
``nvml-symbols``) export every function listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, ...]


@dataclass(frozen=True)
class Releases:
    """The driver releases that have a function or field: [first, until) spans."""

    spans: tuple[tuple[Version, Version | None], ...]
    source: str

    def include(self, version: Version) -> bool:
        """Whether driver ``version`` is in one of the spans."""
        return any(
            first <= version and (until is None or version < until) for first, until in self.spans
        )


def _from(first: Version, source: str) -> Releases:
    return Releases(((first, None),), source)


_PROCESSES_V3 = Releases(
    (((510, 39, 1), (535, 98)), ((535, 104, 5), None)),
    "NS 510.39.01 :117 `#define nvmlDeviceGetComputeRunningProcesses ..._v3`; NS 535.98 :117 maps "
    "it to _v2 (nvitop #88: FunctionNotFound on 535.98); back in NS 535.104.05",
)
_GPM = "NS 520.56.06 :9030-9089; CL v515->v520 'Added nvmlGpmQueryDeviceSupport() ...'"

FUNCTIONS: dict[str, Releases] = {
    "nvmlDeviceGetComputeRunningProcesses_v3": _PROCESSES_V3,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": _PROCESSES_V3,
    "nvmlDeviceGetComputeRunningProcesses_v2": _from(
        (450, 66), "NS 450.66 :116 (not in 450.51); k8s-device-plugin #331: undefined on 440.59"
    ),
    "nvmlDeviceGetGraphicsRunningProcesses_v2": _from((450, 66), "NS 450.66 :117"),
    "nvmlDeviceGetTemperatureV": _from(
        (565, 57, 1), "NS 565.57.01 :4971; absent up to 560.35.03; nvitop #181 (R525: not found)"
    ),
    "nvmlGpmQueryDeviceSupport": _from((520, 56, 6), _GPM),
    "nvmlGpmMetricsGet": _from((520, 56, 6), _GPM),
    "nvmlGpmSampleGet": _from((520, 56, 6), _GPM),
    "nvmlGpmSampleAlloc": _from((520, 56, 6), _GPM),
    "nvmlGpmSampleFree": _from((520, 56, 6), _GPM),
    "nvmlGpmMigSampleGet": _from((525, 53), "NS 525.53 :9503; absent in 520.56.06"),
    "nvmlDeviceGetProcessesUtilizationInfo": _from(
        (550, 40, 7), "NS 550.40.07 :6615; CL v545->v550 'Added ...ProcessesUtilizationInfo()'"
    ),
    "nvmlDeviceGetCurrentClocksEventReasons": _from(
        (535, 43, 2), "NS 535.43.02 :4458; CL v530->v535 'Introduced ClockEventReasons'"
    ),
    "nvmlDeviceGetSupportedClocksEventReasons": _from((535, 43, 2), "NS 535.43.02 :4487"),
    "nvmlDeviceGetMemoryInfo_v2": _from(
        (510, 39, 1), "NS 510.39.01 :4067; CL v495->v510 'Added nvmlDeviceGetMemoryInfo_v2()'"
    ),
    "nvmlDeviceGetNumFans": _from(
        (510, 39, 1), "NS 510.39.01 :3703; CL v495->v510 'Added nvmlDeviceGetNumFans()'"
    ),
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": _from(
        (525, 53), "NS 525.53 :3524; absent in 520.56.06"
    ),
    "nvmlDeviceGetDriverModel_v2": _from((555, 42, 2), "NS 555.42.02 :127"),
}

_NVLINK_FIELDS = _from(
    (520, 56, 6),
    "NS 520.56.06 :1604-1608 (CL credits v520->v525; CL v520->v525: DL_CRC replaces Hopper's "
    "per-link CRC counters)",
)
_TLIMIT_FIELDS = Releases(
    (((525, 125, 6), (530,)), ((535, 43, 2), None)),
    "NS 535.43.02 :1808-1811, :531 NVML_VALUE_TYPE_SIGNED_INT; NS 525.125.06 :1762-1765, :528; "
    "absent in 525.116.04 and 530.41.03",
)

# Field id -> the releases that know it.
FIELDS: dict[int, Releases] = {
    # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES, "Value can be wrapped": never backported to
    # R535 or R550, whose late headers reach NVML_FI_MAX 228 without them.
    197: _from((555, 42, 2), "NS 555.42.02 :2044; CL v550->v555 'Added two new field IDs'"),
    198: _from((555, 42, 2), "NS 555.42.02 :2045"),
    # NVML_FI_DEV_POWER_AVERAGE / _INSTANT: R535, backported to R525 from 525.105.17, not R530.
    185: Releases(
        (((525, 105, 17), (530,)), ((535, 43, 2), None)), "NS 535.43.02 :1794; NS 525.105.17 :1752"
    ),
    186: Releases(
        (((525, 105, 17), (530,)), ((535, 43, 2), None)), "NS 535.43.02 :1795; NS 525.105.17 :1753"
    ),
    161: _NVLINK_FIELDS,  # NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY
    162: _NVLINK_FIELDS,  # NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY
    163: _NVLINK_FIELDS,  # NVML_FI_DEV_NVLINK_ERROR_DL_CRC (scope = link; Hopper's CRC count)
    # NVML_FI_DEV_TEMPERATURE_*_TLIMIT, signed (NVML_VALUE_TYPE_SIGNED_INT came with them): R535,
    # backported to R525 from 525.125.06, not R530.
    193: _TLIMIT_FIELDS,  # NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT
    194: _TLIMIT_FIELDS,  # NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT
    195: _TLIMIT_FIELDS,  # NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT
    196: _TLIMIT_FIELDS,  # NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT
    165: _NVLINK_FIELDS,  # NVML_FI_DEV_NVLINK_GET_STATE
    138: _from((450, 51), "NS 450.51 :1221 NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX; not in 440.100"),
    139: _from((450, 51), "NS 450.51 :1222 NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
}

# _v3's nvmlProcessInfo_t was 32 bytes (usedGpuCcProtectedMemory added) in 535.43.02, 535.54.03
# and 535.86.05 (NS 535.43.02 :285-296); 24 bytes before and from 535.104.05, when the 32-byte
# record moved to nvmlProcessDetail_v1_t (NS 535.104.05 :278). 535.98 has no _v3 at all.
EARLY_R535_PROCESS_RECORD = Releases(
    (((535, 43, 2), (535, 98)),), "NS 535.43.02 :285-296; nvitop PR #89; go-nvml #75"
)


def parse(version: str) -> Version:
    """``"550.90.07"`` -> (550, 90, 7): the numbers of a driver version string."""
    numbers = tuple(int(part) for part in re.findall(r"\d+", version))
    if not numbers:
        raise ValueError(f"expected a driver version like 550.90.07, got {version!r}")
    return numbers


def lacks_functions(version: str) -> frozenset[str]:
    """The functions of the table that driver ``version`` does not export."""
    have = parse(version)
    return frozenset(name for name, releases in FUNCTIONS.items() if not releases.include(have))


def knows_field(version: str, field_id: int) -> bool:
    """Whether driver ``version`` knows field id ``field_id``."""
    releases = FIELDS.get(field_id)
    return releases is None or releases.include(parse(version))
