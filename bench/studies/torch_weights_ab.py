"""Study: what does keeping an unfrozen CPU package's weights in a file beside it (``weights_beside`` in
``cosycompile/backends/torch/build.py``) change, against linking them into its shared object?

- ``compile SRC OUT``: compile a stage's programs dir (an ``llm.export`` or ``llm.quantize`` step's
  output) with the torch backend's ``build`` in this process, as the engine step does; prints the
  seconds, the process's peak RSS and the files written. ``--inside`` links the weights in, as every
  package was before. Run each side in its own process: the peak is the process's.
- ``step A B``: two LLM engine dirs with the static-cache step (``static_cache: true``), both loaded in
  one process; after a 150-token prefill, ``--steps`` decode steps of each in interleaved pairs. Prints
  each load's seconds and resident memory (anonymous and file-backed), each pair's ms/token and the
  median of per-pair ratios A/B (above 1: B is faster).

``--tree DIR`` (before the subcommand) imports cosycompile from DIR instead of this checkout, e.g. a
``git worktree`` of the revision before the change.

Usage: python bench/studies/torch_weights_ab.py [--tree DIR] compile SRC OUT [--inside]
       python bench/studies/torch_weights_ab.py [--tree DIR] step ENGINE_A ENGINE_B [--pairs 9] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def use_tree(tree: Path | None) -> None:
    """Import cosycompile from ``tree``: the editable install's import hook would otherwise win."""
    if tree is None:
        sys.path.insert(0, str(REPO))
        return
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
    sys.path.insert(0, str(tree.resolve()))


def resident_mib() -> dict[str, int]:
    """This process's resident memory by kind, MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(line.split()[1]) >> 10
    return fields


def compile_dir(src: Path, out: Path, inside: bool) -> dict[str, Any]:
    import cosycompile.backends.torch.build as torch_build
    from cosycompile.backends.torch import Options
    from cosycompile.core.targets import TARGETS

    if inside and hasattr(torch_build, "weights_beside"):
        torch_build.weights_beside = lambda options, device: False
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    start = time.perf_counter()
    # A cache dir of its own: a kernel cache shared with the other side would shorten its compile.
    fields = torch_build.build(src, Options(), TARGETS["cpu"], out, cache_dir=out.parent / f"{out.name}.inductor")
    seconds = time.perf_counter() - start
    (out / "engine.json").write_text(json.dumps({"backend": "torch", **fields}))  # what `step` loads it by
    return {"seconds": round(seconds, 1),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10,
            "files_mib": {p.name: p.stat().st_size >> 20 for p in sorted(out.iterdir())}}


def step_ab(dirs: list[Path], pairs: int, steps: int) -> dict[str, Any]:
    import numpy as np

    from cosycompile.backends.torch.build import load
    from cosycompile.runtime.graphs_dir import read_graphs_dir

    sides, loads = [], []
    for d in dirs:
        before = resident_mib()
        start = time.perf_counter()
        runners = load(d, 2)
        seconds = time.perf_counter() - start
        info = read_graphs_dir(d).info
        hidden, layers, kv_heads, head_dim = (info[k] for k in ("hidden_size", "num_layers", "kv_heads", "head_dim"))
        rng = np.random.default_rng(0)
        prefill = runners["llm_step"].run({"inputs_embeds": rng.standard_normal((1, 150, hidden), np.float32),
                                           "past_key_values": np.zeros((layers, 2, 1, kv_heads, 0, head_dim), np.float32)})
        decoder = runners["llm_step_static"].decoder()
        decoder.start(prefill["present_key_values"], steps * (2 * pairs + 2))
        sides.append((decoder, rng.standard_normal((1, 1, hidden), np.float32), runners))
        loads.append({"engine": str(d), "load_seconds": round(seconds, 2), "before_mib": before,
                      "after_prefill_mib": resident_mib()})

    def timed(side: int) -> float:
        decoder, embedding, _ = sides[side]
        start = time.perf_counter()
        for _ in range(steps):
            decoder.step(embedding)
        return (time.perf_counter() - start) / steps * 1e3

    timed(0), timed(1)  # first touches of both sides' weights and caches
    rows = []
    for p in range(pairs):
        a, b = timed(0), timed(1)
        rows.append({"a_ms": round(a, 3), "b_ms": round(b, 3), "a_over_b": round(a / b, 4)})
        print(f"pair {p}: A {a:.2f} ms, B {b:.2f} ms, A/B {a / b:.3f}", flush=True)
    ratios = sorted(r["a_over_b"] for r in rows)
    return {"loads": loads, "pairs": rows, "a_over_b_median": ratios[len(ratios) // 2],
            "a_over_b_spread": [ratios[0], ratios[-1]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, help="import cosycompile from this source tree")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a programs dir with the torch backend; peak RSS and seconds")
    c.add_argument("src", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--inside", action="store_true", help="link the weights into the packages")
    s = sub.add_parser("step", help="interleaved decode steps of two LLM engine dirs")
    s.add_argument("a", type=Path)
    s.add_argument("b", type=Path)
    s.add_argument("--pairs", type=int, default=9)
    s.add_argument("--steps", type=int, default=30, help="decode steps per side in each pair")
    args = ap.parse_args()
    use_tree(args.tree)
    import cosycompile

    result = (compile_dir(args.src, args.out, args.inside) if args.cmd == "compile"
              else step_ab([args.a, args.b], args.pairs, args.steps))
    result["cosycompile"] = str(Path(cosycompile.__file__).parent)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
