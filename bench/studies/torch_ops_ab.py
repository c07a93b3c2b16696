"""Study: is a change to the project's operators (``cosycompile/runtime/torch_ops``) faster? The
operators as they are in the working tree against the same sources at a git revision, both loaded in
one process and timed in interleaved pairs on the same inputs.

The revision's sources are read with ``git show`` and compiled with the build's own command, their
operators registered under the namespace ``cosycompile_base`` so that both libraries load side by side.
Workloads:
- ``decode``: one decode step's linears of the 0.5B LM (the shapes of ``int8_linear_stream.py``),
  ``--rows`` rows, through ``int8_linear_with`` and ``--kernel``; reported with the weights' read rate;
- ``attention``: one flow-estimator attention (batch 2, 8 heads of 64, ``--frames`` frames) through
  ``int8_attention``, on contiguous heads and on heads as the projections leave them, with the
  estimator's padding mask (``--mask padding``) or a mask row per query (``--mask row``).
Each says whether the two builds' outputs are bit-identical.

Usage: python bench/studies/torch_ops_ab.py --base REV [--workload decode|attention] [--rows 1]
       [--kernel vnni] [--frames 632] [--mask padding] [--threads 2] [--pairs 15] [--min-seconds 20]
Writes artifacts/bench/torch_ops_ab.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "studies"))

OPS_DIR = "cosycompile/runtime/torch_ops"
BASE_NAMESPACE = "cosycompile_base"


def build_base(rev: str, dest: Path) -> Path:
    """The operator library of ``rev``'s sources under ``BASE_NAMESPACE`` (compiled once per commit)."""
    from cosycompile.runtime.torch_ops import compile_command

    commit = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    lib = dest / commit[:12] / f"libcosycompile_base-{commit[:12]}.so"
    if lib.exists():
        return lib
    names = subprocess.run(["git", "ls-tree", "--name-only", commit, f"{OPS_DIR}/"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    lib.parent.mkdir(parents=True, exist_ok=True)
    sources = []
    for name in names:
        if not name.endswith((".cpp", ".h")):
            continue
        text = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout
        path = lib.parent / Path(name).name
        path.write_text(re.sub(r"(TORCH_LIBRARY\w*)\(cosycompile,", rf"\1({BASE_NAMESPACE},", text))
        if name.endswith(".cpp"):
            sources.append(path)
    tmp = lib.with_suffix(".tmp")
    subprocess.run(compile_command(tuple(sources), tmp), check=True, timeout=600)
    tmp.replace(lib)
    return lib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision whose operators are the reference side")
    ap.add_argument("--workload", choices=("decode", "attention"), default="decode")
    ap.add_argument("--rows", type=int, default=1, help="decode: rows per linear (the batch)")
    ap.add_argument("--kernel", default="vnni", help="decode: the int8_linear kernel (vnni, avx2, int_mm, fp32)")
    ap.add_argument("--frames", type=int, default=632, help="attention: frames of the estimator's attention")
    ap.add_argument("--mask", choices=("padding", "row"), default="padding",
                    help="attention: one mask row for all queries ([B, 1, 1, S], the estimator's) or one per query")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--min-seconds", type=float, default=20.0)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    import torch

    from builtin_models import machine
    from cosycompile.runtime.torch_ops import build_library, load_library
    from cosycompile.validate.speed import paired_ratio
    from int8_linear_stream import LAYERS, SHAPES

    out = Path(args.artifacts) / "bench"
    torch.ops.load_library(str(build_base(args.base, out / "torch_ops_ab")))
    load_library(build_library(out / "torch_ops"))
    torch.set_num_threads(args.threads)
    base, head = getattr(torch.ops, BASE_NAMESPACE), torch.ops.cosycompile
    gen = torch.Generator().manual_seed(0)
    cases = []
    if args.workload == "decode":
        linears = [(torch.randn(args.rows, k, generator=gen), torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen),
                    torch.rand(n, generator=gen) * 1e-3) for _ in range(LAYERS) for k, n in SHAPES]
        mb = sum(w.numel() for _, w, _ in linears) / 1e6

        def step(ops):
            return [ops.int8_linear_with(x, w, s, None, args.kernel) for x, w, s in linears]

        cases.append((f"decode step, {args.rows} row(s), kernel {args.kernel}", step, mb))
    else:
        B, H, T, D = 2, 8, args.frames, 64
        q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
        # The padding mask as the estimator passes it ([B, 1, 1, S], one row for every query), or one
        # row per query ([B, 1, T, S], as it passed it before the quantizer moved its expand).
        mask = torch.zeros(B, 1, 1 if args.mask == "padding" else T, T)
        projected = [x.transpose(1, 2).reshape(B, T, H * D).view(B, T, H, D).transpose(1, 2) for x in (q, k, v)]
        cases.append((f"attention, {T} frames, {args.mask} mask, contiguous heads",
                      lambda ops: ops.int8_attention(q, k, v, mask, D ** -0.5), None))
        cases.append((f"attention, {T} frames, {args.mask} mask, projected heads",
                      lambda ops: ops.int8_attention(*projected, mask, D ** -0.5), None))
    rows = []
    for name, work, mb in cases:
        a, b = work(base), work(head)
        same = all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, list) else torch.equal(a, b)
        r = paired_ratio(lambda: work(base), lambda: work(head), pairs=args.pairs, min_seconds=args.min_seconds,
                         max_pairs=400)
        row = {"case": name, "base_ms": 1e3 * r.reference_s, "head_ms": 1e3 * r.candidate_s, "speedup": r.ratio,
               "spread": list(r.spread), "pairs": r.pairs, "bit_identical": same}
        if mb:
            row["base_gb_per_s"], row["head_gb_per_s"] = mb / 1e3 / r.reference_s, mb / 1e3 / r.candidate_s
        rows.append(row)
    print(f"{machine()}, torch {torch.__version__}, {args.threads} threads; base {args.base}, head: the working tree")
    print("| case | base ms | head ms | head over base (median of pairs, spread, pairs) | bit-identical |")
    print("|---|---|---|---|---|")
    for r in rows:
        rate = f" ({r['base_gb_per_s']:.1f} / {r['head_gb_per_s']:.1f} GB/s)" if "base_gb_per_s" in r else ""
        print(f"| {r['case']}{rate} | {r['base_ms']:.2f} | {r['head_ms']:.2f} | {r['speedup']:.3f}x "
              f"({r['spread'][0]:.2f}-{r['spread'][1]:.2f}, {r['pairs']}) | {'yes' if r['bit_identical'] else 'no'} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "torch_ops_ab.json").write_text(json.dumps({"machine": machine(), "base": args.base, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
