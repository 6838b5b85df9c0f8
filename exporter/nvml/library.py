"""NVML initialisation, shutdown and the node-wide (driver) readings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pynvml

from exporter.nvml.device import Device, _text
from exporter.nvml.errors import NvmlError, error_from_pynvml, translated


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


def cuda_driver_version() -> int:
    """The CUDA version the driver supports, as NVML gives it: 12040 for CUDA 12.4."""
    with translated():
        return int(pynvml.nvmlSystemGetCudaDriverVersion())


def exported_functions(names: Iterable[str]) -> frozenset[str]:
    """Which of the C functions ``names`` the loaded NVML library exports (after `init`).

    An older driver lacks newer entry points; pynvml then answers FUNCTION_NOT_FOUND.
    """
    exported = set()
    for name in names:
        try:
            pynvml._nvmlGetFunctionPointer(name)
        except pynvml.NVMLError_FunctionNotFound:
            continue
        except pynvml.NVMLError as error:
            raise error_from_pynvml(error) from None
        exported.add(name)
    return frozenset(exported)


def process_name(pid: int) -> str:
    """The process's name as NVML sees it (from /proc in the host's PID namespace), or ""."""
    try:
        with translated():
            return _text(pynvml.nvmlSystemGetProcessName(pid))
    except NvmlError:
        return ""
