"""Benchmark: the LLM decode step as torch-backend packages (AOTInductor), ms/token at batch 1 and 8
against the PyTorch FP32 eager step, with the memory-bandwidth floor and the logit cosine.

For each format (fp32; bf16 from torch_autocast; int8 and fp8 from torch_dynamic) the LLM engine
of recipes/cpu-torch.yaml is built for this machine's device through the cached build graph (a CUDA
target is the GPU's own, e.g. h100; CUDA packages are compiled on that GPU). Then, same inputs:
- decode: a past of ``--past`` positions, ``--tokens`` one-token steps with the cache kept on the
  device, timed in interleaved pairs against the FP32 eager step (the project's ratio method),
  through ``llm_step`` on the growing cache and, on a GPU (or a CPU with ``--static-cache``), through
  ``llm_step_static`` over a cache of fixed size written in place, replayed as a CUDA graph on a GPU
  (backends/torch/static_decode.py); with both, also the static loop against the growing one, paired;
- floor: bytes one step reads (the program's weights + the mean KV cache) / the device's memory
  throughput measured in the same run: the larger of a large tensor copy's (read + write bytes)
  and a large GEMV's (matrix bytes), since on some CPUs the GEMV streams faster (stream_bytes_per_s);
- quality: teacher-forced logit cosine against the PyTorch FP32 reference.

Usage: python bench/llm_decode.py [--device auto|cpu|cuda] [--formats fp32,bf16,int8,fp8]
       [--batches 1,8] [--model builtin:random-0.5b] [--static-cache]
Writes artifacts/bench/llm_decode-<device>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from builtin_models import add_min_seconds, machine, machine_probes

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def gpu_target(torch: Any) -> str:
    """The cosycompile target of this GPU (its compute capability, the data-center card first)."""
    from cosycompile.core.targets import targets_with_sm

    sm = tuple(torch.cuda.get_device_capability())
    found = sorted(targets_with_sm(sm), key=lambda t: t.rtx_class)
    if not found:
        raise SystemExit(f"no cosycompile target for sm{sm[0]}{sm[1]}")
    return found[0].name


def stream_bytes_per_s(torch: Any, device: str, mib: int = 512, reps: int = 5) -> dict[str, float]:
    """The device's memory throughput two ways, each the best of ``reps`` passes over ``mib`` MiB.

    ``copy``: a tensor copy, counted as read + write bytes (the issue's definition of the floor's
    denominator). ``read``: a GEMV over a matrix of that size, counted as the matrix's bytes, which
    is how a decode step's linears touch memory. ``floor`` is the larger: a copy also reads its
    destination before writing it, which the 2x count does not see, so on the Xeon VM a decode step
    beat the copy-based floor (docs/bench-log/2026-11-27-xeon-make-bench-twice.md), and a floor that a
    step beats bounds nothing.
    """
    x = torch.empty(mib << 18, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)
    matrix = x.view(-1, 4096)
    vector = torch.ones(4096, dtype=torch.float32, device=device)

    def best(work: Callable[[], Any]) -> float:
        fastest = float("inf")
        for _ in range(reps + 1):  # the first pass also faults the pages in
            sync(torch, device)
            t0 = time.perf_counter()
            work()
            sync(torch, device)
            fastest = min(fastest, time.perf_counter() - t0)
        return fastest

    nbytes = x.numel() * 4
    out = {"copy": 2 * nbytes / best(lambda: y.copy_(x)), "read": nbytes / best(lambda: torch.mv(matrix, vector))}
    out["floor"] = max(out["copy"], out["read"])
    return out


def sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def program_bytes(graphs_dir: Path) -> int:
    """Bytes of weights one decode step reads, from its program: only the tensors some node uses
    (the Qwen2 token embedding is in the state dict, but the step takes embeddings as input), each
    counted in the dtype it is cast to where casts are all that read it (autocast's BF16 weights,
    which AOTInductor's freezing folds into BF16 constants)."""
    import torch

    from cosycompile.runtime.graphs_dir import read_graphs_dir
    from cosycompile.runtime.torch_programs import load_program

    gd = read_graphs_dir(graphs_dir)
    program = load_program(gd.graph_path("llm_step"))
    tensors = {**program.state_dict, **program.constants}
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    casts = (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype)
    total = 0
    for spec in program.graph_signature.input_specs:
        tensor = tensors.get(spec.target) if spec.target else None
        node = nodes.get(getattr(spec.arg, "name", ""))
        if not isinstance(tensor, torch.Tensor) or node is None or not node.users:
            continue
        size = tensor.element_size()
        if all(u.target in casts for u in node.users):
            cast = {u.kwargs.get("dtype", u.args[1] if len(u.args) > 1 else None) for u in node.users}
            if len(cast) == 1 and isinstance(next(iter(cast)), torch.dtype):
                size = min(size, next(iter(cast)).itemsize)
        total += tensor.numel() * size
    return total


def decoder(step: Callable[..., Any] | None, torch: Any, device: str, batch: int, past: int, tokens: int,
            layers: int, kv_heads: int, head_dim: int, hidden: int, static: Any = None,
            dtype: Any = None) -> Callable[[], None]:
    """A run of ``tokens`` one-token steps from a random past of ``past`` positions, on the device
    (cache and inputs in ``dtype``, float32 by default): through ``step(embeds, cache) -> (logits,
    present)`` on the growing cache, or through a ``StaticCacheDecoder`` (``static``; its CUDA graph
    on a GPU), started from the same past."""
    dtype = dtype or torch.float32
    gen = torch.Generator().manual_seed(0)
    cache0 = torch.randn(layers, 2, batch, kv_heads, past, head_dim, generator=gen).to(device, dtype)
    embeds = (0.02 * torch.randn(tokens, batch, 1, hidden, generator=gen)).to(device, dtype)

    def run() -> None:
        cache = cache0
        with torch.inference_mode():
            if static is not None:
                static.start(cache0, tokens)
            for i in range(tokens):
                if static is not None:
                    static.step(embeds[i])
                else:
                    _, cache = step(embeds[i], cache)
        sync(torch, device)

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--formats", default=None, help="comma list (default: fp32,bf16,int8 on a CPU, and fp8 on sm89+); "
                                                    "int8-cosycompile: INT8 on the project's own operator")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--past", type=int, default=120, help="positions already in the KV cache")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps per timed run")
    ap.add_argument("--pairs", type=int, default=3)
    add_min_seconds(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    ap.add_argument("--build-only", action="store_true", help="build (or find cached) the engines and stop")
    ap.add_argument("--static-cache", action="store_true",
                    help="on a CPU, build the static-cache step too (the torch backend's static_cache option)")
    args = ap.parse_args()
    art = Path(args.artifacts)

    import torch

    from builtin_models import build_steps
    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Prompt
    from cosycompile.stages import get_stage
    from cosycompile.validate.machine_state import ratio_by_state
    from cosycompile.validate.metrics import logit_cosine
    from cosycompile.validate.speed import paired_ratio

    torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    target = gpu_target(torch) if device == "cuda" else "cpu"
    sm = torch.cuda.get_device_capability() if device == "cuda" else None
    formats = (args.formats.split(",") if args.formats else
               ["fp32", "bf16", "int8"] + (["fp8"] if sm is not None and tuple(sm) >= (8, 9) else []))
    batches = [int(b) for b in args.batches.split(",")]

    t0 = time.perf_counter()
    built: dict[str, dict[str, Path]] = {}
    for fmt in formats:
        stages: dict[str, Any] = {"flow": {"enabled": False}, "hift": {"enabled": False}}
        if fmt != "fp32":
            # "int8-cosycompile": INT8 linears on the project's own operator instead of torch._int_mm.
            base, _, kernel = fmt.partition("-")
            stages["llm"] = {"quantize": {"format": base, **({"kernel": kernel} if kernel else {})}}
        if args.static_cache and device == "cpu":
            stages.setdefault("llm", {})["engine"] = {"backend": "torch", "options": {"static_cache": True}}
        body = {"extends": str(REPO / "recipes" / "cpu-torch.yaml"), "model": args.model, "target": target,
                "stages": stages}
        graphs = "llm.quantize" if fmt != "fp32" else "llm.export"
        name = f"bench-llm-{target}-{fmt}" + ("-static" if "engine" in stages.get("llm", {}) else "")
        built[fmt] = build_steps(body, name, ["llm.engine", graphs, "model"], art)
        built[fmt]["graphs"] = built[fmt][graphs]
    build_s = time.perf_counter() - t0
    print(f"engines {', '.join(formats)} for {target}: {build_s:.0f} s (build or cache)", flush=True)
    if args.build_only:
        return 0

    models = load_reference(built[formats[0]]["model"], ("llm",), args.threads)
    modules, _, info = get_stage("llm").hook("modules")(models)
    ref = reference_runtime("llm", models)
    rng = np.random.default_rng(0)
    text = rng.integers(0, ref.text_embedding.shape[0], 24)
    speech = rng.integers(0, int(info["speech_token_size"]), 48)
    ref_logits = ref.teacher_forced_logits(text, Prompt.empty(), speech)  # on the CPU, before the move
    eager = modules["llm_step"].to(device).eval()
    shape = dict(layers=int(info["num_layers"]), kv_heads=int(info["kv_heads"]), head_dim=int(info["head_dim"]),
                 hidden=ref.text_embedding.shape[1])
    streams = stream_bytes_per_s(torch, device)
    bandwidth = streams["floor"]
    kv_bytes_per_position = shape["layers"] * 2 * shape["kv_heads"] * shape["head_dim"] * 4
    out: dict[str, Any] = {
        "model": args.model, "device": device, "target": target, "threads": args.threads, "past": args.past,
        "tokens": args.tokens, "pairs": args.pairs, "min_seconds": args.min_seconds, "torch": torch.__version__,
        "build_seconds": build_s,
        "machine": (torch.cuda.get_device_name() if device == "cuda" else
                    f"{machine()}, {torch.get_num_threads()} threads"),
        "copy_gb_per_s": streams["copy"] / 1e9, "read_gb_per_s": streams["read"] / 1e9, "rows": []}
    # On the CPU, the VM's state before each pair (a bandwidth-bound side moves with it:
    # docs/bench-log/2026-11-26-zen5-machine-states.md).
    square = torch.randn(1024, 1024)
    probe = (lambda: machine_probes(torch, args.threads, square)) if device == "cpu" else None
    for fmt in formats:
        rt = stage_runtime("llm", built[fmt]["llm.engine"], args.threads)
        runner = rt.runner
        names = get_stage("llm").graph("llm_step")
        cosine = logit_cosine(ref_logits, rt.teacher_forced_logits(text, Prompt.empty(), speech))
        weights = program_bytes(built[fmt]["graphs"])

        def package_step(embeds: Any, cache: Any) -> Any:
            o = runner.run({names.input_names[0]: embeds, names.input_names[1]: cache})
            return o[names.output_names[0]], o[names.output_names[1]]

        # The static-cache package (GPU targets' engines, CPU ones with static_cache) decodes as a CUDA
        # graph on a GPU.
        loops = {"growing cache": None, "static cache" + (", CUDA graph" if device == "cuda" else ""): rt.kept}
        for batch in batches:
            run_eager = decoder(lambda e, c: eager(e, c), torch, device, batch, args.past, args.tokens, **shape)
            kv = batch * kv_bytes_per_position * (args.past + args.tokens / 2)
            floor_ms = 1000 * (weights + kv) / bandwidth
            for loop, static in loops.items():
                if loop != "growing cache" and static is None:
                    continue
                run_pkg = decoder(package_step, torch, device, batch, args.past, args.tokens, **shape,
                                  static=static.decoder() if static is not None else None)
                r = paired_ratio(run_eager, run_pkg, pairs=args.pairs, min_seconds=args.min_seconds, probe=probe)
                # Each probe's median over the row's pairs: which machine speed a row's move follows.
                medians = {k: float(np.median([q[k] for q in r.probes])) for k in (r.probes[0] if r.probes else {})}
                out["rows"].append({**({"by_state": ratio_by_state(r), "probe_medians": medians} if probe else {}),
                                    "format": fmt, "loop": loop, "batch": batch,
                                    "ms_per_token": 1000 * r.candidate_s / args.tokens,
                                    "eager_fp32_ms_per_token": 1000 * r.reference_s / args.tokens,
                                    "speedup_vs_eager_fp32": r.ratio, "spread": r.spread, "pairs": r.pairs,
                                    "weight_bytes": weights, "bytes_per_token": weights + kv,
                                    "floor_ms_per_token": floor_ms, "logit_cosine": cosine})
            if rt.kept is not None:
                # The two loops of one package head to head: what keeping the cache in place gives.
                grow = decoder(package_step, torch, device, batch, args.past, args.tokens, **shape)
                kept = decoder(package_step, torch, device, batch, args.past, args.tokens, **shape,
                               static=rt.kept.decoder())
                r = paired_ratio(grow, kept, pairs=args.pairs, min_seconds=args.min_seconds)
                out["head_to_head"] = [*out.get("head_to_head", []), {
                    "format": fmt, "batch": batch, "growing_ms_per_token": 1000 * r.reference_s / args.tokens,
                    "static_ms_per_token": 1000 * r.candidate_s / args.tokens, "static_vs_growing": r.ratio,
                    "spread": r.spread, "pairs": r.pairs}]
    dest = art / "bench" / f"llm_decode-{device}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=float))
    print(f"{args.model} LLM decode step on {out['machine']} ({target}), past {args.past}, {args.tokens} tokens a run, "
          f"copy throughput {out['copy_gb_per_s']:.1f} GB/s (read + write), GEMV read {out['read_gb_per_s']:.1f} GB/s; "
          "the floor divides by the larger")
    print("| format | decode loop | batch | ms/token | vs FP32 eager (median of pairs, spread) | "
          "floor ms/token (weights MB) | logit cosine |")
    print("|---|---|---|---|---|---|---|")
    for row in out["rows"]:
        print(f"| {row['format']} | {row['loop']} | {row['batch']} | {row['ms_per_token']:.3f} | "
              f"{row['speedup_vs_eager_fp32']:.2f}x "
              f"({row['spread'][0]:.2f}-{row['spread'][1]:.2f}, {row['pairs']} pairs; eager "
              f"{row['eager_fp32_ms_per_token']:.3f} ms) | {row['floor_ms_per_token']:.3f} ({row['weight_bytes'] / 1e6:.0f}) | "
              f"{row['logit_cosine']:.4f} |")
    for row in out["rows"]:
        if row.get("probe_medians"):
            print(f"  {row['format']} {row['loop']} batch {row['batch']}, probes (median): " + ", ".join(
                f"{k} {v:.1f}" for k, v in row["probe_medians"].items() if k != "threads_lose"))
        for state, st in row.get("by_state", {}).items():
            print(f"  {row['format']} {row['loop']} batch {row['batch']}, {state.replace('_', ' ')} ({st['pairs']} pairs, "
                  f"copy {st['copy_gb_per_s']:.0f} GB/s): {1000 * st['built_s'] / args.tokens:.2f} ms/token, eager "
                  f"{1000 * st['reference_s'] / args.tokens:.2f}, {st['speedup']:.2f}x")
    for row in out.get("head_to_head", []):
        print(f"  {row['format']} batch {row['batch']}: static cache {row['static_ms_per_token']:.3f} ms/token against "
              f"growing {row['growing_ms_per_token']:.3f}, {row['static_vs_growing']:.3f}x ({row['spread'][0]:.3f}-"
              f"{row['spread'][1]:.3f}, {row['pairs']} pairs)")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
