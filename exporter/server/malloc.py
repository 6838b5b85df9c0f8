"""glibc's malloc, told to keep fewer arenas and to map large blocks: less resident memory.

glibc gives a thread that allocates while another thread holds the arena a new arena, up to 8
per core, and every arena keeps what is freed into it. `gpuload serve` runs a worker per GPU
and the front a thread per connection, but they allocate little and seldom at once (the GIL
takes turns): two arenas are enough. Blocks of 128 KiB and more (encoded /metrics answers,
~0.3 MB each at 16 GPUs) are mapped and unmapped as they come and go instead of raising a
heap's high-water mark; glibc would otherwise raise that threshold after the first such block
is freed. At 16 GPUs this takes the daemon's peak RSS down ~3 MB (bench/OPTIMIZATIONS.md).

A variable already set in the environment (glibc reads it at start) is left as it is.
"""

from __future__ import annotations

import ctypes
import os

# mallopt(3) parameters, and the environment variables glibc reads for the same settings.
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_SETTINGS = {
    "MALLOC_ARENA_MAX": (_M_ARENA_MAX, 2),
    "MALLOC_MMAP_THRESHOLD_": (_M_MMAP_THRESHOLD, 128 * 1024),
}


def tune() -> list[str]:
    """Apply the settings to this process, before it starts threads; returns those applied.

    Nothing is applied where the C library has no ``mallopt`` (musl, macOS).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # The environment is read here because these are glibc's own variables, not gpuload's.
    return [
        name
        for name, (parameter, value) in _SETTINGS.items()
        if name not in os.environ and mallopt(parameter, value) == 1
    ]


def child_environment() -> dict[str, str]:
    """The environment for a child process, with the settings glibc applies when it starts."""
    settings = {name: str(value) for name, (_, value) in _SETTINGS.items()}
    return {**settings, **os.environ}
