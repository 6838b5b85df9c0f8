"""NVML errors translated into gpuload's own exception types.

pynvml raises one class per NVML return code. The rest of gpuload only needs
to know three things about an error: is the value simply absent on this GPU
(not supported), has the GPU or driver gone away (re-initialise), or is it
something unexpected (count it). The error's short name becomes the `error`
label of `gpuload_nvml_errors_total`, a bounded set of NVML's return codes.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pynvml

# Return codes that mean "this value does not exist here": an old driver, a
# GPU without the feature, or a vGPU guest. Not an error: the series is absent.
_ABSENT_CODES = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_NO_DATA,
    }
)

# Return codes after which handles are no longer valid: the GPU fell off the
# bus, the driver was reloaded or upgraded. The cure is a fresh nvmlInit.
_LIFECYCLE_CODES = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
        pynvml.NVML_ERROR_RESET_REQUIRED,
    }
)

_CODE_NAMES = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}


class NvmlError(Exception):
    """An NVML call failed with a return code other than success."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def name(self) -> str:
        """Short snake_case name of the return code, e.g. ``gpu_is_lost``."""
        return _CODE_NAMES.get(self.code, "unknown")

    @property
    def lifecycle(self) -> bool:
        """True when the GPU or driver went away and NVML must be re-initialised."""
        return self.code in _LIFECYCLE_CODES


class NotSupported(NvmlError):
    """The value does not exist on this GPU or driver: the series is absent."""


class ValueUnavailable(NotSupported):
    """NVML answered with its "unavailable" sentinel instead of a value."""

    def __init__(self, what: str) -> None:
        super().__init__(pynvml.NVML_ERROR_NO_DATA, f"{what}: NVML answered 'unavailable'")


class LibraryNotFound(NvmlError):
    """libnvidia-ml.so.1 could not be loaded: no driver on this machine."""


def error_from_pynvml(error: pynvml.NVMLError) -> NvmlError:
    """Translate a pynvml exception into gpuload's exception type."""
    code = int(error.value)
    message = _describe(error)
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return LibraryNotFound(code, message)
    if code in _ABSENT_CODES:
        return NotSupported(code, message)
    return NvmlError(code, message)


def _describe(error: pynvml.NVMLError) -> str:
    # str() of an NVMLError asks the library for the text; when the library is
    # absent or stuck that call fails too, so fall back to the class name.
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - any failure here must not hide the original error
        return re.sub(r"^NVMLError_", "", type(error).__name__)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise pynvml errors inside the block as `NvmlError` subclasses."""
    try:
        yield
    except pynvml.NVMLError as error:
        raise error_from_pynvml(error) from None
