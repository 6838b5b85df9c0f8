"""NVML initialisation, shutdown and the node-wide (driver) readings."""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from exporter.nvml.device import Device, _text
from exporter.nvml.errors import NvmlError, translated


@dataclass(frozen=True)
class DriverInfo:
    """Versions of the driver stack; an empty string where the driver cannot tell."""

    driver_version: str
    cuda_driver_version: str
    nvml_version: str


def init() -> None:
    """Initialise NVML, loading libnvidia-ml.so.1 on first use.

    Raises:
        LibraryNotFound: no NVIDIA driver library on this machine.
        NvmlError: the driver is present but did not initialise.
    """
    with translated():
        pynvml.nvmlInit()


def shutdown() -> None:
    """Release NVML. Call only when no other thread is inside an NVML call."""
    with translated():
        pynvml.nvmlShutdown()


def device_count() -> int:
    """How many GPUs NVML reports, including any whose handle cannot be obtained."""
    with translated():
        return int(pynvml.nvmlDeviceGetCount())


def device(index: int) -> Device:
    """The GPU at an NVML index; raises `NvmlError` if it cannot be reached."""
    with translated():
        return Device(index, pynvml.nvmlDeviceGetHandleByIndex(index))


def driver_info() -> DriverInfo:
    """Driver, CUDA driver and NVML versions (e.g. "550.54.15", "12.4", "12.550.54.15")."""
    with translated():
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        nvml = _text(pynvml.nvmlSystemGetNVMLVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
    return DriverInfo(
        driver_version=driver,
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        nvml_version=nvml,
    )


def process_name(pid: int) -> str:
    """The process's name as NVML sees it (from /proc in the host's PID namespace), or ""."""
    try:
        with translated():
            return _text(pynvml.nvmlSystemGetProcessName(pid))
    except NvmlError:
        return ""
