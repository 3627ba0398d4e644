"""One process setting that dpfl's own processes make on purpose: keep freed memory.

A DP-SGD step of the small CNN allocates and frees dozens of 1-3 MB temporaries. With
glibc's default thresholds, many of them are fresh pages from the kernel each time, which
it zero-fills on first touch: 5,100 page faults (20 MB) a step of 64 images, and the step
took 43 ms instead of 26 ms (issue 18; plain torch steps suffer less, having fewer
temporaries). PyTorch's tuning guide recommends another allocator (jemalloc, tcmalloc)
for the same reason; this asks glibc's own to keep what it frees instead.

The `dpfl` command and its sweep workers call `keep_freed_memory()` at start; a notebook
or script that trains in its own process may call it too. The cost: memory freed at the
top of the heap (up to 256 MiB) stays with the process for reuse.
"""

from __future__ import annotations

import ctypes

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20  # the largest glibc takes: blocks up to 32 MiB come from the heap
_TRIM_THRESHOLD = 256 << 20  # the heap's free top returned to the OS only beyond 256 MiB


def keep_freed_memory() -> bool:
    """Have the C library's malloc reuse freed blocks rather than map and unmap them (glibc,
    Linux). Returns whether both settings were taken: False on other C libraries, where
    nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
