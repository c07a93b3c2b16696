"""The hostile harness can fail: each of its checks catches what it is there to catch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hostile_harness import MAX_RSS_MB, CachedBuild, cached_build, refused, run_bounded, store_state, tree_state


def test_a_command_that_succeeds_is_not_a_refusal(tmp_path: Path, followup: CachedBuild) -> None:
    with pytest.raises(AssertionError, match="exit 0"):
        refused(["recipe", "--options"], cwd=tmp_path, followup=followup)


def test_a_refusal_without_the_expected_text_fails(tmp_path: Path, followup: CachedBuild) -> None:
    with pytest.raises(AssertionError, match="not-in-the-line"):
        refused(["build", tmp_path / "absent.yaml"], "not-in-the-line", cwd=tmp_path, followup=followup)


def test_a_file_rewritten_in_place_is_seen(tmp_path: Path) -> None:
    f = tmp_path / "recipe.yaml"
    f.write_text("name: a\n")
    before = tree_state(tmp_path)
    os.utime(f, ns=(1, 1))  # same size, times changed back: the change time still moves
    with f.open("r+") as h:
        h.write("name: b\n")
    assert tree_state(tmp_path) != before


def test_a_new_cache_entry_or_staging_dir_is_seen(tmp_path: Path) -> None:
    before = store_state(tmp_path)
    (tmp_path / "cache" / "objects" / "ab" / "ab12").mkdir(parents=True)
    (tmp_path / "cache" / "objects" / "ab" / "ab12" / "entry.json").write_text("{}")
    middle = store_state(tmp_path)
    (tmp_path / "cache" / "tmp" / "step-1").mkdir(parents=True)
    assert before != middle != store_state(tmp_path)


def test_a_case_that_damages_the_shared_store_fails_the_follow_up_build(tmp_path: Path, seed: Path) -> None:
    # A refused command that also appends a byte to one cached file: no entry.json or bundle changes,
    # so only the follow-up build (the store drops the damaged entry and builds its step again) sees it.
    # The file is one of the follow-up's own final step (its bundle folder names that key): the seeded
    # store also holds other recipes' entries, which the follow-up never reads.
    private = cached_build(tmp_path / "private", seed)
    (bundle,) = private.art.glob("builds/followup-*")
    key = bundle.name.rsplit("-", 1)[1]
    damaged = next(p for p in sorted(private.art.glob(f"cache/objects/{key[:2]}/{key}*/data/**/*")) if p.is_file())
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"open({str(damaged)!r}, 'ab').write(b'x')\n")
    case = tmp_path / "case"
    case.mkdir()
    env = {**os.environ, "PYTHONPATH": str(hook)}
    with pytest.raises(AssertionError, match="the follow-up build failed"):
        refused(["report", case / "absent"], cwd=case, followup=private, env=env)


def test_the_peak_memory_is_the_commands_own_not_the_test_process(tmp_path: Path) -> None:
    # Linux hands a process's high-water mark on across fork and exec: a CLI started straight from a
    # worker that holds GBs used to report the worker's peak as its own.
    held = bytearray(MAX_RSS_MB * 1024 * 1024)
    held[::4096] = b"\x01" * len(held[::4096])  # resident, not just reserved
    run = run_bounded(["recipe", "--options"], tmp_path)
    assert run.rc == 0, run.err
    assert run.rss_mb < MAX_RSS_MB / 3, f"{run.rss_mb:.0f} MB"
    del held
