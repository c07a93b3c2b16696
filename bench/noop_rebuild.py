"""Benchmark: a no-op rebuild (everything cached) with 1,000 extra entries in the local cache, with
and without a remote cache set.

Builds ``recipes/cpu-int8.yaml`` (``builtin:tiny``) once, commits 1,000 small filler entries into
the same cache through the Store (as other recipes would leave), then runs the same build again
``--runs`` times, each in a fresh process, timing from the first cosycompile import to the exit
code inside that process. With ``--remote``, ``COSYCOMPILE_CACHE_REMOTE`` points at an S3 endpoint
on a closed loopback port: a no-op must not touch the network, so any attempt shows as a
warning line or a delay.

Usage: python bench/noop_rebuild.py [--artifacts DIR] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from builtin_models import machine

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import sys, time
t0 = time.perf_counter()
from cosycompile.cli import main
rc = main(['build', {recipe!r}, '--artifacts', {art!r}, '-q'])
print(json.dumps({{'rc': rc, 'seconds': time.perf_counter() - t0, 'torch': 'torch' in sys.modules,
                  'fsspec': 'fsspec' in sys.modules}}))
"""


def fill(art: Path, n: int) -> None:
    """Commit ``n`` small valid entries, as a cache shared by many recipes holds."""
    from cosycompile.cache.local import Store
    from cosycompile.core.hashing import digest_obj

    store = Store(art)
    for i in range(n):
        key = digest_obj({"filler": i})
        if store.lookup(key, verify=False):
            continue
        with store.staging(key) as stage:
            (stage / "data" / "out.bin").write_bytes(os.urandom(256))
            store.commit(key, stage, {"step": f"filler.{i}", "components": {}, "meta": {}, "seconds": 0.0})


def probe(recipe: Path, art: Path, env: dict[str, str]) -> dict:
    code = "import json\n" + PROBE.format(recipe=str(recipe), art=str(art))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["stderr"] = res.stderr.strip()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", default=None, help="artifacts dir (default: a fresh temp dir)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--entries", type=int, default=1000)
    args = ap.parse_args()
    art = Path(args.artifacts or tempfile.mkdtemp(prefix="noop-"))
    recipe = REPO / "recipes" / "cpu-int8.yaml"
    first = subprocess.run([sys.executable, "-m", "cosycompile", "build", str(recipe), "--artifacts", str(art), "-q"],
                           capture_output=True, text=True, cwd=REPO)
    if first.returncode not in (0, 1):
        sys.exit(first.stderr[-3000:])
    fill(art, args.entries)
    entries = len(list((art / "cache" / "objects").glob("*/*/entry.json")))
    results = {}
    remote_env = {"COSYCOMPILE_CACHE_REMOTE": "s3://cosycompile-noop/cache", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                  "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    for label, extra in (("local only", {}), ("remote set (closed port)", remote_env)):
        env = {**os.environ, **extra}
        runs = [probe(recipe, art, env) for _ in range(args.runs)]
        secs = sorted(r["seconds"] for r in runs)
        results[label] = {"median_s": secs[len(secs) // 2], "min_s": secs[0], "max_s": secs[-1],
                          "rc": sorted({r["rc"] for r in runs}), "torch_imported": any(r["torch"] for r in runs),
                          "fsspec_imported": any(r["fsspec"] for r in runs),
                          "warnings": sorted({r["stderr"] for r in runs if r["stderr"]})}
    out = {"machine": machine(),
           "cache_entries": entries, "runs": args.runs, "results": results}
    dest = REPO / "artifacts" / "bench" / "noop_rebuild.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print(f"no-op rebuild of cpu-int8 (builtin:tiny), {entries} cache entries, {args.runs} runs each")
    print("| setting | median s | min-max s | torch imported | fsspec imported | warnings |")
    print("|---|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['median_s']:.3f} | {r['min_s']:.3f}-{r['max_s']:.3f} | {r['torch_imported']} | "
              f"{r['fsspec_imported']} | {len(r['warnings'])} |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
