"""Concurrent builds, kills at every step boundary, bit rot, a full disk and garbage collection:
after each, the next build succeeds and `cosycompile cache verify` finds a clean cache."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers import EVAL_SET, REPO, run_cli, write_recipe


def _recipe(tmp: Path, name: str, hift_only: bool = False) -> Path:
    body: dict = {"extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": name,
                  "validation": {"eval_set": str(EVAL_SET), "max_items": 1,
                                 "speed": {"warmup": 0, "runs": 1, "throughput": []}}}
    if hift_only:  # the smallest real build: model, reference, HiFT's steps and the pipeline check
        body["stages"] = {"llm": {"enabled": False}, "flow": {"enabled": False}}
    return write_recipe(tmp / f"{name}.yaml", body, base=False)


def _build_cmd(recipe: Path, art: Path) -> list[str]:
    return [sys.executable, "-u", "-m", "cosycompile", "build", str(recipe), "--artifacts", str(art), "-q"]


def _ran(stdout: str) -> list[str]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("built "))
    ran = line.split("ran: ", 1)[1]
    return [] if ran.startswith("nothing") else ran.split(", ")


def _verify_clean(art: Path) -> None:
    res = run_cli("cache", "verify", "--full", "--artifacts", str(art))
    assert res.returncode == 0 and ", 0 bad" in res.stdout, res.stdout + res.stderr


def _entries(art: Path) -> dict[str, Path]:
    return {json.loads(p.read_text())["step"]: p.parent for p in (art / "cache" / "objects").glob("*/*/entry.json")}


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Four `cosycompile build` processes started together on one recipe and one artifacts dir."""
    tmp = tmp_path_factory.mktemp("concurrent")
    art, recipe = tmp / "art", _recipe(tmp, "four")
    procs = [subprocess.Popen(_build_cmd(recipe, art), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=1800) for p in procs]
    return {"art": art, "recipe": recipe, "codes": [p.returncode for p in procs], "outs": outs}


def test_four_concurrent_builds_run_each_step_once(concurrent: dict) -> None:
    assert concurrent["codes"] == [0, 0, 0, 0], [e[-2000:] for _, e in concurrent["outs"]]
    runs = Counter(step for out, _ in concurrent["outs"] for step in _ran(out))
    steps = set(_entries(concurrent["art"]))
    assert set(runs) == steps and all(n == 1 for n in runs.values()), runs  # each body ran exactly once
    bundles = {next(ln for ln in out.splitlines() if ln.startswith("bundle: ")) for out, _ in concurrent["outs"]}
    assert len(bundles) == 1
    bundle = Path(bundles.pop().split(": ", 1)[1])
    assert json.loads((bundle / "manifest.json").read_text())["files"]
    assert not [p for p in (concurrent["art"] / "cache" / "tmp").iterdir() if not p.name.startswith(".")]
    _verify_clean(concurrent["art"])


def test_bit_flip_in_cached_engine_is_detected_and_rebuilt(concurrent: dict) -> None:
    art = concurrent["art"]
    engine = _entries(art)["llm.engine"] / "data"
    onnx_file = max(engine.rglob("*.onnx"), key=lambda p: p.stat().st_size)
    data = bytearray(onnx_file.read_bytes())
    data[len(data) // 2] ^= 0x10
    onnx_file.unlink()  # the bundle hard-links this file: write a new one, as bit rot in the cache would look
    onnx_file.write_bytes(bytes(data))
    res = subprocess.run(_build_cmd(concurrent["recipe"], art), capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "llm.engine" in _ran(res.stdout)
    _verify_clean(art)


def test_silent_bit_rot_is_found_by_full_verify(concurrent: dict) -> None:
    """A flip that keeps size and mtime passes the stat-cached check; --full re-hashes and removes it."""
    art = concurrent["art"]
    entry = _entries(art)["hift.engine"]
    f = max((entry / "data").rglob("*.onnx"), key=lambda p: p.stat().st_size)
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[-100] ^= 0x01
    f.unlink()
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = run_cli("cache", "verify", "--full", "--artifacts", str(art))
    assert res.returncode == 1 and "1 bad" in res.stdout and entry.name[:12] in res.stdout
    assert not entry.exists()
    res = subprocess.run(_build_cmd(concurrent["recipe"], art), capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0 and "hift.engine" in _ran(res.stdout), res.stderr[-2000:]
    _verify_clean(art)


def test_gc_keeps_what_bundles_need_and_drops_least_recently_used(concurrent: dict) -> None:
    art = concurrent["art"]
    res = run_cli("cache", "gc", "--max-size", "1", "--artifacts", str(art))
    assert res.returncode == 0 and res.stdout.startswith("removed 0 entries"), res.stdout + res.stderr
    entries = _entries(art)
    for bundle in (art / "builds").iterdir():  # without bundles nothing is pinned
        bundle.rename(art / f"kept-aside-{bundle.name}")
    old = time.time() - 10 * 86400
    for step in ("llm.export", "flow.export"):
        os.utime(entries[step], (old, old))
    res = run_cli("cache", "gc", "--older-than", "7d", "--artifacts", str(art))
    assert res.returncode == 0 and res.stdout.startswith("removed 2 entries"), res.stdout
    assert set(_entries(art)) == set(entries) - {"llm.export", "flow.export"}
    res = run_cli("cache", "gc", "--max-size", "10G", "--artifacts", str(art))
    assert res.stdout.startswith("removed 0 entries")
    bad = run_cli("cache", "gc", "--max-size", "lots", "--artifacts", str(art))
    assert bad.returncode == 2 and "'lots' is not a size" in bad.stderr
    res = subprocess.run(_build_cmd(concurrent["recipe"], art), capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    assert set(_ran(res.stdout)) == {"llm.export", "flow.export"}  # same keys downstream: all else cached
    _verify_clean(art)


@pytest.mark.extended
def test_sigkill_at_every_step_boundary(tmp_path: Path) -> None:
    """Kill the build the moment each step reports done; every restart picks up where the last
    one stopped, no step runs twice, and the cache is clean after every kill."""
    art, recipe = tmp_path / "art", _recipe(tmp_path, "kills", hift_only=True)
    done: list[str] = []
    for _ in range(30):
        proc = subprocess.Popen(_build_cmd(recipe, art)[:-1], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        assert proc.stderr is not None
        killed = False
        for line in proc.stderr:
            if " done " in line:
                done.append(line.split("]", 1)[1].split()[0])
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
        proc.communicate(timeout=600)
        if not killed:
            assert proc.returncode == 0
            break
        assert proc.returncode == -signal.SIGKILL
        _verify_clean(art)
    else:
        pytest.fail("the build never finished")
    assert len(done) >= 5 and len(done) == len(set(done)), done  # each step finished once, none redone
    assert set(done) == set(_entries(art))


def test_no_space_left_is_one_line_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root): the full-disk case is not exercised")
    try:
        art, recipe = mnt / "art", _recipe(tmp_path, "full", hift_only=True)
        res = subprocess.run(_build_cmd(recipe, art), capture_output=True, text=True, timeout=1800)
        err = res.stderr.strip().splitlines()
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
        assert err[-1].startswith("cosycompile: error: ") and "no space left while step" in err[-1], err[-1]
        assert not [p for p in (art / "cache" / "tmp").iterdir() if not p.name.startswith(".")]
        _verify_clean(art)
        subprocess.run(["mount", "-o", "remount,size=400m", str(mnt)], check=True)
        res = subprocess.run(_build_cmd(recipe, art), capture_output=True, text=True, timeout=1800)
        assert res.returncode == 0, res.stderr[-2000:]
        _verify_clean(art)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_sigkill_in_the_middle_of_an_upload(tmp_path: Path) -> None:
    """Kill the build while it pushes its first entry's blobs (a file:// remote, written by the real
    fsspec code path): no action entry names a blob that is missing or short, the next build
    finishes and pushes, and a fresh machine pulls a complete, verified cache from it."""
    remote = tmp_path / "remote"
    env = {**os.environ, "COSYCOMPILE_CACHE_REMOTE": f"file://{remote}"}
    recipe = _recipe(tmp_path, "upload", hift_only=True)
    art = tmp_path / "art"
    proc = subprocess.Popen(_build_cmd(recipe, art), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 900
    while not list(remote.glob("cas/*/*")):  # the first blob of the first push has landed
        assert proc.poll() is None and time.time() < deadline, "the build ended before pushing"
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def consistent() -> int:
        n = 0
        for ac in remote.glob("ac/*.json"):
            for size, sha in json.loads(ac.read_text())["files"].values():
                blob = remote / "cas" / sha[:2] / sha
                assert blob.is_file() and blob.stat().st_size == size, (ac.name, sha)
            n += 1
        return n

    consistent()
    _verify_clean(art)
    res = subprocess.run(_build_cmd(recipe, art), capture_output=True, text=True, timeout=1800, env=env)
    assert res.returncode == 0 and "warning" not in res.stderr.lower(), res.stderr[-2000:]
    assert consistent() == len(_entries(art))
    fresh = tmp_path / "fresh"
    res = subprocess.run(_build_cmd(recipe, fresh), capture_output=True, text=True, timeout=1800, env=env)
    assert res.returncode == 0 and _ran(res.stdout) == [], res.stdout + res.stderr[-2000:]
    _verify_clean(fresh)
