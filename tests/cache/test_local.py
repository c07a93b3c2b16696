"""The local store (cosycompile/cache/local.py): an entry.json of any wrong shape is a broken entry
that every cache tool reports and removes, never a traceback, and a build runs the step again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KEY = "ab" * 32


def _store_with_entry(root: Path) -> Path:
    """A store holding one real entry (one data file); returns its entry.json."""
    from cosycompile.cache.local import Store

    store = Store(root)
    with store.staging(KEY) as stage:
        (stage / "data" / "out.bin").write_bytes(b"payload")
        entry = store.commit(KEY, stage, {"step": "demo.step", "seconds": 1.5})
    return entry.path / "entry.json"


BROKEN = {
    "a list": "[]",
    "files a number": json.dumps({"version": 1, "key": KEY, "files": 3}),
    "not json": "{not json",
    "deep json": "[" * 100_000 + "]" * 100_000,
    "other key": json.dumps({"version": 1, "key": "cd" * 32, "files": {}}),
    "path climbs out": json.dumps({"version": 1, "key": KEY, "files": {"../../x": [1, "a" * 64]}}),
    "size a boolean": json.dumps({"version": 1, "key": KEY, "files": {"out.bin": [True, "a" * 64]}}),
    "digest short": json.dumps({"version": 1, "key": KEY, "files": {"out.bin": [7, "abc"]}}),
}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("body", list(BROKEN.values()), ids=list(BROKEN))
def test_cache_tools_report_and_remove_a_malformed_entry(tmp_path: Path, body: str) -> None:
    from cosycompile.cache.local import Store

    entry_file = _store_with_entry(tmp_path / "art")
    assert Store(tmp_path / "art").lookup(KEY) is not None  # the intact entry is found
    entry_file.write_text(body)
    listing = _cli("cache", "ls", "--artifacts", str(tmp_path / "art"))
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    assert f"{KEY[:12]}  BROKEN" in listing.stdout and "cache verify" in listing.stdout
    gc = _cli("cache", "gc", "--older-than", "0s", "--dry-run", "--artifacts", str(tmp_path / "art"))
    assert gc.returncode == 0 and "Traceback" not in gc.stderr, gc.stderr
    verify = _cli("cache", "verify", "--artifacts", str(tmp_path / "art"))
    assert verify.returncode == 1 and f"1 bad (removed: {KEY[:12]})" in verify.stdout, verify.stdout + verify.stderr
    assert not entry_file.parent.exists()


def test_lookup_of_a_malformed_entry_is_a_miss_and_removes_it(tmp_path: Path) -> None:
    """What a build sees: the step's entry is absent (so the step runs again), and the broken one is gone."""
    from cosycompile.cache.local import Store

    entry_file = _store_with_entry(tmp_path / "art")
    entry_file.write_text(BROKEN["files a number"])
    assert Store(tmp_path / "art").lookup(KEY) is None
    assert not entry_file.parent.exists()


def test_no_build_step_changes_an_entry_it_read(seed: Path, tmp_path: Path) -> None:
    """Every entry of the seed store (cpu-fp32 and cpu-int8 of the tiny model, built from empty) still
    matches every digest after the builds that read it. A step, or a library it calls, that writes into
    its input shows here: ModelOpt's ONNX quantizer once wrote its shape inference over the cached
    flow.simplify graph, and the next build found that entry corrupt and built it again."""
    from helpers import run_cli
    from seed_store import seeded

    art = seeded(seed, tmp_path / "art")
    res = run_cli("cache", "verify", "--full", "--artifacts", str(art))
    assert res.returncode == 0 and ", 0 bad" in res.stdout, res.stdout + res.stderr
