"""Remote ``cache gc`` (issue 40, item 0): the retention rule on a real S3 server (moto, its own
LastModified times) and on a file:// remote through the CLI (times set on the files)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cosycompile.cache.gc import BLOB_GRACE_S, collect_remote
from cosycompile.cache.local import Entry, Store
from cosycompile.cache.remote import RemoteCache
from s3_servers import DROP_VARS, MotoServer, client_vars

DAY = 86400.0


def _commit(store: Store, label: str) -> Entry:
    """An entry of two files whose bytes are its own (no blob shared with another entry)."""
    key = hashlib.sha256(label.encode()).hexdigest()
    store.ensure_writable()
    with store.lock(key), store.staging(key) as stage:
        (stage / "data").mkdir(parents=True, exist_ok=True)
        (stage / "data" / "model.onnx").write_bytes(f"graph of {label}".encode() * 100)
        (stage / "data" / "meta.json").write_text(json.dumps({"label": label}))
        return store.commit(key, stage, {"step": label, "meta": {}})


def _shas(entry: Entry) -> set[str]:
    return {sha for _, sha in entry.meta["files"].values()}


def _pushed(store: Store, remote: RemoteCache, labels: list[str]) -> dict[str, Entry]:
    entries = {label: _commit(store, label) for label in labels}
    for entry in entries.values():
        remote.push(store, entry)
    return entries


def test_old_unpinned_entries_and_the_blobs_only_they_named_go(moto_server: MotoServer, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for var in DROP_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in client_vars(moto_server.endpoint).items():
        monkeypatch.setenv(var, value)
    remote = RemoteCache(f"s3://{moto_server.new_bucket()}/cc")
    store = Store(tmp_path / "art")
    e = _pushed(store, remote, ["kept-bundle", "old-a", "old-b"])
    assert len(remote.listing("ac")) == 3 and len(remote.listing("cas")) == 6

    # Today nothing is older than 30 days: nothing goes, and a dry run never removes.
    assert collect_remote(remote, 30 * DAY, set()).removed == []
    later = time.time() + 40 * DAY
    dry = collect_remote(remote, 30 * DAY, {e["kept-bundle"].key}, dry_run=True, now=later)
    assert sorted(dry.removed) == sorted([e["old-a"].key, e["old-b"].key]) and dry.removed_blobs == 4
    assert len(remote.listing("ac")) == 3 and len(remote.listing("cas")) == 6

    res = collect_remote(remote, 30 * DAY, {e["kept-bundle"].key}, now=later)
    assert sorted(res.removed) == sorted([e["old-a"].key, e["old-b"].key])
    assert res.pinned == 1 and res.kept == 1 and res.removed_blobs == 4
    assert set(remote.listing("ac")) == {e["kept-bundle"].key}
    assert set(remote.listing("cas")) == _shas(e["kept-bundle"])
    # What stays is whole: it pulls and verifies into an empty store.
    fresh = Store(tmp_path / "other")
    fresh.ensure_writable()
    with fresh.lock(e["kept-bundle"].key):
        pulled = remote.pull(fresh, e["kept-bundle"].key)
    assert pulled is not None and pulled.meta["files"] == e["kept-bundle"].meta["files"]


def _cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_keeps_named_bundles_and_young_blobs(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    remote = RemoteCache(root.as_uri())
    store = Store(tmp_path / "art")
    e = _pushed(store, remote, ["kept-bundle", "old"])
    orphan_old, orphan_young = "aa" * 32, "bb" * 32  # blobs no entry names: a push cut off, long ago or now
    for sha in (orphan_old, orphan_young):
        (root / "cas" / sha[:2]).mkdir(parents=True, exist_ok=True)
        (root / "cas" / sha[:2] / sha).write_bytes(b"half a push")
    past = time.time() - 40 * DAY
    for p in root.rglob("*"):
        if p.is_file() and p.name != orphan_young:
            os.utime(p, (past, past))
    assert time.time() - (root / "cas" / "bb" / orphan_young).stat().st_mtime < BLOB_GRACE_S
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"files": {}, "steps": {"kept": {"key": e["kept-bundle"].key}}}))
    env = {k: v for k, v in os.environ.items() if k not in DROP_VARS}

    # $COSYCOMPILE_CACHE_REMOTE alone never makes gc delete from a shared remote.
    res = _cli("cache", "gc", "--older-than", "1s", "--artifacts", tmp_path / "empty",
               env={**env, "COSYCOMPILE_CACHE_REMOTE": root.as_uri()})
    assert res.returncode == 0 and len(remote.listing("ac")) == 2, res.stderr

    res = _cli("cache", "gc", "--cache-remote", root.as_uri(), "--older-than", "30d", "--keep", bundle,
               "--artifacts", tmp_path / "empty", env=env)
    assert res.returncode == 0, res.stderr
    assert "removed 1 entries and 3 blobs" in res.stdout and "1 unnamed blobs younger" in res.stdout, res.stdout
    assert set(remote.listing("ac")) == {e["kept-bundle"].key}
    assert set(remote.listing("cas")) == _shas(e["kept-bundle"]) | {orphan_young}


@pytest.mark.parametrize("extra,expected", [
    ([], "give --older-than AGE"),
    (["--older-than", "30d", "--max-size", "1G"], "--max-size is for the local cache"),
    (["--older-than", "30d", "--keep", "{tmp}/not-a-bundle"], "not-a-bundle/manifest.json: missing"),
    (["--older-than", "thirty days"], "is not an age"),
])
def test_cli_refuses_a_remote_gc_it_cannot_decide(tmp_path: Path, extra: list[str], expected: str) -> None:
    root = tmp_path / "remote"
    remote = RemoteCache(root.as_uri())
    _pushed(Store(tmp_path / "art"), remote, ["one"])
    res = _cli("cache", "gc", "--cache-remote", root.as_uri(), *[a.replace("{tmp}", str(tmp_path)) for a in extra],
               "--artifacts", tmp_path / "art")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and expected in lines[0], res.stderr
    assert len(remote.listing("ac")) == 1 and len(remote.listing("cas")) == 2
