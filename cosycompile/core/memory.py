"""Peak resident memory of one build step.

Linux keeps each process's resident high-water mark and lets the process reset it (``5`` written
to ``/proc/self/clear_refs``), so the peak recorded for a step is the process's peak while that step
ran (what it loaded plus what earlier steps left resident), not the largest of every step before it.
Child processes a step starts (a C++ compiler, a server) are not counted.
"""

from __future__ import annotations

from pathlib import Path

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def reset_peak() -> bool:
    """Start a new peak at the current resident size; False where the system does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_mb() -> float | None:
    """The resident high-water mark (MB) since the last reset or the process start; None where unknown."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None
