"""Peak resident memory of one build step.

Linux keeps each process's resident high-water mark and lets the process reset it (``5`` written
to ``/proc/self/clear_refs``), so the peak recorded for a step is the process's peak while that step
ran (what it loaded plus what earlier steps left resident), not the largest of every step before it.
Child processes a step starts (a C++ compiler, a server) are not counted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from pathlib import Path
from typing import Any, Callable

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def reset_peak() -> bool:
    """Start a new peak at the current resident size; False where the system does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_mb() -> float:
    """The resident high-water mark in MiB (VmHWM / 1024) since the last :func:`reset_peak`, or since the process
    started where the system cannot reset it."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# A full collection takes about 0.2 s in a process that has loaded torch and transformers: worth it
# after a step that held gigabytes, not after each of a small model's many short steps.
COLLECT_AFTER_MB = 2048


def release_free_memory(peak: float | None = None) -> None:
    """Hand memory a finished step freed back to the system before the next step starts.

    glibc is asked to return free heap pages (``malloc_trim``): once large blocks have been freed,
    glibc serves later ones from its heap and keeps the pages, so without this each step of a long
    build starts from the largest footprint any step before it left (a 1.5 GB ONNX graph loaded,
    simplified and optimized leaves several GB behind). After a step whose ``peak`` (MiB, None when
    unknown) reached :data:`COLLECT_AFTER_MB`, Python's reference cycles are collected first. Elsewhere
    than glibc only the collection runs.
    """
    if peak is None or peak >= COLLECT_AFTER_MB:
        gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


_LIBC_NAME = ctypes.util.find_library("c")  # found once: the lookup may run a subprocess (ldconfig)


def _libc_function(symbol: str, argtypes: list[Any]) -> Callable[..., int] | None:
    """``symbol`` from the C library, typed; None where there is no such function (not glibc, not Linux)."""
    try:
        fn = getattr(ctypes.CDLL(_LIBC_NAME), symbol) if _LIBC_NAME else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


_malloc_trim = _libc_function("malloc_trim", [ctypes.c_size_t])

_MAPS = Path("/proc/self/maps")
_MADV_PAGEOUT = 21  # Linux 5.4 and later; older kernels answer EINVAL and nothing changes


def page_out_file_mappings(names: set[str]) -> int:
    """Ask Linux to reclaim the resident pages of this process's mappings of files named ``names``
    (base names); returns how many bytes of mappings were advised (0 where the system cannot).

    For a library whose data a loader copies out once (an AOTInductor package's weights live in its
    ``.so``, and loading copies them onto the heap), the mapped pages are a second resident copy that
    nothing reads again and that stays mapped after the model is dropped. ``MADV_PAGEOUT`` never
    changes what a page holds: clean file pages are dropped and read back from the file if touched
    again; pages the process wrote (relocations) stay, as there is no swap to put them in.
    """
    if _madvise is None or not names:
        return 0
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return 0
    advised = 0
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or Path(parts[5]).name not in names:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if _madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_PAGEOUT) == 0:
            advised += end - start
    return advised


_madvise = _libc_function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
