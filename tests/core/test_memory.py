"""The build process's peak resident memory while each step ran: the executor resets the process's
high-water mark as a step starts, records the peak with the entry, and prints it with the step's time."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from cosycompile.cache.local import Store
from cosycompile.core.graph import Executor, Reporter, StateFile, Step, StepContext
from cosycompile.core.memory import peak_mb, reset_peak

MB = 1 << 20


def _touch(mb: int) -> None:
    """Hold ``mb`` MB resident for a moment (written, so every page is really there), then free it."""
    block = np.ones(mb * MB, np.uint8)
    assert int(block[::4096].sum()) == len(block[::4096])


pytestmark = pytest.mark.skipif(not reset_peak(), reason="this system cannot reset a process's peak RSS")


def test_a_reset_starts_the_peak_again_from_what_is_resident() -> None:
    reset_peak()
    before = peak_mb()
    _touch(300)
    high = peak_mb()
    assert before is not None and high is not None and high - before >= 280
    reset_peak()
    low = peak_mb()
    assert low is not None and low < high - 250


def _big(ctx: StepContext) -> dict:
    _touch(int(ctx.params["mb"]))
    (ctx.out / "out.txt").write_text(str(ctx.params["mb"]))
    return {}


def test_each_step_records_its_own_peak(tmp_path: Path) -> None:
    big = Step("big", "memory-test.big", _big, params={"mb": 300})
    small = Step("small", "memory-test.small", _big, params={"mb": 1}, deps={"big": big})
    out = io.StringIO()
    result = Executor(Store(tmp_path), [small], StateFile(tmp_path / "state.json"), Reporter(stream=out)).run()
    assert result.ran == ["big", "small"]
    peaks = {n: e.meta["peak_rss_mb"] for n, e in result.entries.items()}
    # The small step ran after the big one in the same process, and its peak is not the big one's.
    assert peaks["big"] - peaks["small"] >= 250, peaks
    for name, entry in result.entries.items():
        assert json.loads((entry.path / "entry.json").read_text())["peak_rss_mb"] == peaks[name]
    assert f"peak {peaks['big']:,.0f} MiB" in out.getvalue()


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


def test_freed_heap_pages_go_back_to_the_system_between_steps() -> None:
    """Blocks under glibc's mmap threshold come from its heap; freed behind one still in use they stay
    resident until ``malloc_trim``, which ``release_free_memory`` calls after each step."""
    import ctypes
    import ctypes.util

    from cosycompile.core.memory import release_free_memory

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = 64 * 1024  # under the mmap threshold: heap memory
    blocks = [libc.malloc(block) for _ in range(4000)]  # about 250 MB
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, block)
    last = blocks.pop()  # still in use at the top of the heap: free() alone cannot shrink it
    before = _rss_mb()
    for b in blocks:
        libc.free(b)
    held = _rss_mb()
    release_free_memory()
    after = _rss_mb()
    libc.free(last)
    assert held > before - 50, (before, held)  # freeing alone kept the pages
    assert held - after >= 200, (before, held, after)


def _mapping_rss_kb(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            inside = len(head) >= 6 and head[5] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_a_file_mapping_read_once_is_paged_out_and_reads_the_same(tmp_path: Path) -> None:
    """What a loader copied out of a mapped file stops counting as resident; reading it again gives
    the same bytes (paged back in from the file)."""
    import mmap

    from cosycompile.core.memory import page_out_file_mappings

    data = np.arange(64 * MB // 8, dtype=np.int64)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, dtype=np.int64)
        assert int(view[::512].sum()) == int(data[::512].sum())  # every page touched
        resident = _mapping_rss_kb(path)
        assert resident >= 60 * 1024, resident
        assert page_out_file_mappings({"another.so"}) == 0  # only the named files
        assert _mapping_rss_kb(path) == resident
        advised = page_out_file_mappings({path.name})
        if advised == 0:
            pytest.skip("this kernel has no MADV_PAGEOUT")
        assert advised >= 64 * MB
        assert _mapping_rss_kb(path) < resident // 4, (resident, _mapping_rss_kb(path))
        assert np.array_equal(view, data)
        del view
