"""What the driver refuses to an unprivileged caller, and hides outside the host's PID namespace.

A scenario's ``caller`` says who calls NVML: ``root``, ``unprivileged`` (the Helm chart's default
user), or ``unprivileged-no-host-pid`` (a container without ``hostPID``). Sources:
- nvml.h, nvmlDeviceGetMemoryInfo(_v2) and the process lists: on a MIG-enabled GPU the whole-GPU
  values are given "only if the caller has appropriate privileges"; both list NO_PERMISSION.
  nvmlDeviceGetBAR1MemoryInfo does not, so it is not refused here.
- DCGM issue 214 (driver 550.90.07): nvmlGpmSampleGet answered NO_PERMISSION (4) in a container
  without ``--privileged``. nvml.h does not document it; this is the plausible answer to show.
- nvml.h, nvmlDeviceGetGpuInstanceById: "Requires privileged user"; it lists NO_PERMISSION.
- open-gpu-kernel-modules ``_gpuConvertPid`` / ``os_find_ns_pid``: a process outside the caller's
  PID namespace is skipped, so such a caller sees empty process lists.
- nvml.h, nvmlEventSetWait_v2: "In MIG mode, if device handle is provided, the API reports all
  the events for the available instances, only if the caller has appropriate privileges. In
  absence of required privileges, only the events which affect all the instances (i.e. whole
  device) are reported." Registration itself does not fail (nvmlDeviceRegisterEvents lists no
  NO_PERMISSION), so the events are withheld at the wait (see `events`).
"""

from __future__ import annotations

# Refused on a MIG-enabled GPU's whole-GPU handle to any caller but root.
_MIG_ROOT_ONLY = frozenset(
    {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
    }
)
_ROOT_ONLY = frozenset({"nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlDeviceGetGpuInstanceById"})


def refused(caller: str, function: str, *, mig_enabled: bool, on_mig_handle: bool) -> bool:
    """Whether the driver answers NO_PERMISSION to ``caller`` for this call."""
    if caller == "root":
        return False
    if function in _ROOT_ONLY:
        return True
    return function in _MIG_ROOT_ONLY and mig_enabled and not on_mig_handle


def sees_processes(caller: str) -> bool:
    """Whether the caller's PID namespace is the host's, where the GPU's processes run."""
    return caller != "unprivileged-no-host-pid"


def sees_instance_events(caller: str) -> bool:
    """Whether XID events attributed to a MIG instance reach ``caller`` (nvml.h, above)."""
    return caller == "root"
