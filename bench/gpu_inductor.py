"""Benchmark for a short GPU lease: the LLM decode step and the whole pipeline compiled in this process
by Inductor (``torch.compile``) and replayed as CUDA graphs, against the PyTorch FP32 eager networks on
the same device, with the quality of the same networks next to every time.

``bench/llm_decode.py`` and ``bench/pipeline_speed.py`` time what a recipe deploys: AOTInductor
packages built through the cached build graph. On the 0.5B shapes those builds take most of a
10-minute call each (docs/bench-log/2026-11-25-h100-first-lease.md), more than a 15-minute lease holds. This
script skips export and packaging: it compiles the same static-cache step (``LLMStaticStep``) with
``torch.compile`` (the kernels Inductor would put in the package; the CUDA graph removes the wrapper
that differs) and captures the flow and HiFT networks as CUDA graphs without compiling them. Phases,
each written to the JSON as soon as it ends, so a call stopped at its limit keeps what it measured:

- ``decode``: ms/token at batch 1 of the FP32 eager growing-cache step (the reference, in interleaved
  pairs), the eager BF16 static step in a CUDA graph and the compiled BF16 static step, with the
  bandwidth floor and the logit cosine against the FP32 step over teacher-forced decode steps;
- ``pipeline``: end-to-end RTF and first chunk (25 + 3 tokens) on the first eval item, the LLM as the
  compiled BF16 step, flow (BF16) and HiFT (FP32) as CUDA graphs (with ``--compile-flow`` compiled
  first), against the FP32 eager pipeline on the same GPU, in interleaved pairs; quality as
  bench/pipeline_speed.py reports it;
- ``formats``: the compiled step in each of ``--formats`` (fp8, int8: the BF16 step whose linears go
  through ``torch._scaled_mm`` / ``torch._int_mm`` as the ``torch_dynamic`` quantizer writes them;
  a ``-tuned`` suffix: Inductor's coordinate-descent search of its kernels' launch configurations).
  The step reads q/k/v and gate/up as one matrix each, as ``LLMStaticStep`` does since the H100 lease
  of 2026-11-27 (commit 026b594 measured them apart as ``bf16`` and merged as ``bf16-fused``);
- ``format=fused-WEIGHTS[/TILING][@B+B...]``: the step as hand-fused Triton kernels
  (``cosycompile/backends/torch/fused_decode.py``: five a layer), weights bf16, fp8 or int8 (one scale
  per row, activations float32), at each of ``--fused-batches`` (or the batches after ``@``); the
  tiling ``best`` is the one of the fastest batch-1 fused row timed so far in the run (a sweep of
  tilings, then ``fused-fp8/best``); ``--pipeline-llm fused-bf16/best`` runs the pipeline phase on it;
- ``batch8``: the compiled BF16 step at batch 8; ``aoti``: the BF16 static step as an AOTInductor
  package (what the torch backend builds), if time is left.

Every batch-1 row also profiles one step outside the graph: how many kernels it launches and their
summed time, which, beside the step's time in the graph, tells kernel count from kernel time.

Usage: python bench/gpu_inductor.py [--phases decode,pipeline,formats,batch8,aoti] [--budget 500]
Writes artifacts/bench/gpu_inductor-<device>.json and prints Markdown tables. On a CPU it runs the
same code without CUDA graphs (a check of the script, not a figure).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from builtin_models import load_builtin, machine
from llm_decode import stream_bytes_per_s, decoder, sync
from pipeline_speed import synthesis_quality, time_cases

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class DeviceRunner:
    """A Runner over a module on ``device``: numpy in (floats cast to ``dtype``), float32 numpy out.
    With ``autocast`` the module stays FP32 and runs under BF16 autocast instead (the flow builds its
    time embedding in FP32, as ``torch_autocast`` exports it). With ``graphs`` on CUDA each input
    signature is captured once as a CUDA graph and replayed; a module that cannot be captured (a host
    sync inside) runs eagerly, and ``eager_reason`` says why."""

    def __init__(self, torch: Any, module: Any, spec: Any, device: str, dtype: Any, graphs: bool,
                 autocast: bool = False) -> None:
        self.torch, self.device, self.dtype = torch, device, dtype
        self.module = _Autocast(torch, module.eval(), device) if autocast else module.eval()
        self.input_names, self.output_names = spec.input_names, spec.output_names
        self.graphs = graphs and device == "cuda"
        self.eager_reason: str | None = None
        self._captured: dict[tuple, tuple[Any, list[Any], tuple[Any, ...]]] = {}

    def _args(self, feeds: dict[str, Any]) -> list[Any]:
        torch = self.torch
        args = []
        for n in self.input_names:
            t = torch.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device)
            args.append(t.to(self.dtype) if t.is_floating_point() else t)
        return args

    def _capture(self, args: list[Any]) -> tuple[Any, list[Any], tuple[Any, ...]]:
        torch = self.torch
        static = [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.module(*static)  # lazy initialisation must not happen inside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = self.module(*static)
        return graph, static, outs if isinstance(outs, (tuple, list)) else (outs,)

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            args = self._args(feeds)
            outs: Any = None
            if self.graphs and self.eager_reason is None:
                key = tuple((tuple(a.shape), a.dtype) for a in args)
                try:
                    if key not in self._captured:
                        self._captured[key] = self._capture(args)
                    graph, static, outs = self._captured[key]
                    for s, a in zip(static, args):
                        s.copy_(a)
                    graph.replay()
                except RuntimeError as e:  # not capturable: run this module eagerly from now on
                    self.eager_reason = str(e).splitlines()[0][:200]
                    outs = None
            if outs is None:
                outs = self.module(*args)
                outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            return {n: o.float().cpu().numpy() for n, o in zip(self.output_names, outs)}


class _Autocast:
    def __init__(self, torch: Any, module: Any, device: str) -> None:
        self.torch, self.module, self.device = torch, module, device

    def __call__(self, *args: Any) -> Any:
        # No autocast weight cache: a CUDA graph must cast inside the replay, not reuse a cast of capture time.
        with self.torch.autocast(self.device, dtype=self.torch.bfloat16, cache_enabled=False):
            return self.module(*args)


class StaticSteps:
    """What ``LLMRuntime`` asks of a static-cache runner: ``decoder()``, one per thread and kept, as the
    torch backend's runner gives; the prefill's FP32 cache is cast to the step's dtype on the way in."""

    def __init__(self, torch: Any, step: Callable[..., Any], device: str, dtype: Any) -> None:
        from cosycompile.backends.torch.static_decode import DecoderPerThread, StaticCacheDecoder

        self._decoders = DecoderPerThread(lambda: _CastingDecoder(StaticCacheDecoder(step, device), torch, dtype))

    def decoder(self) -> Any:
        return self._decoders.get()


class _CastingDecoder:
    def __init__(self, inner: Any, torch: Any, dtype: Any) -> None:
        self.inner, self.torch, self.dtype = inner, torch, dtype
        self.fits, self.step = inner.fits, inner.step

    def start(self, present: Any, max_new: int) -> None:
        if isinstance(present, np.ndarray):
            present = self.torch.from_numpy(np.ascontiguousarray(present))
        self.inner.start(present.to(self.dtype), max_new)


def quantize_linears(torch: Any, module: Any, fmt: str) -> int:
    """Replace, in place, the aligned ``nn.Linear`` layers of ``module`` with the ``torch_dynamic``
    quantizer's INT8 or FP8 linear (weights quantized once, activations per call); returns how many."""
    from cosycompile.quantize.torch_dynamic.quantize import ALIGN, CUDA_INT8_PAD_ROWS, LINEARS, quantize_weight

    class Quantized(torch.nn.Module):
        def __init__(self, lin: Any) -> None:
            super().__init__()
            q, scale = quantize_weight(lin.weight, fmt)
            self.register_buffer("w", q)
            self.register_buffer("scale", scale.to(lin.weight.device))
            self.bias = lin.bias
            self.pad = CUDA_INT8_PAD_ROWS if fmt == "int8" and lin.weight.is_cuda else 0

        def forward(self, x: Any) -> Any:
            return LINEARS[fmt](x, self.w, self.scale, self.bias, self.pad).to(x.dtype)

    done = 0
    for _, child in list(module.named_modules()):
        for attr, lin in list(child.named_children()):
            if isinstance(lin, torch.nn.Linear) and not (lin.out_features % ALIGN[fmt] or lin.in_features % ALIGN[fmt]):
                setattr(child, attr, Quantized(lin))
                done += 1
    return done


def weight_bytes(step: Any) -> int:
    """Bytes of the parameters and buffers ``step`` (a static step, maybe quantized) reads every token."""
    if hasattr(step, "weight_bytes"):  # the fused Triton step counts its own
        return int(step.weight_bytes)
    tensors = {id(t): t for t in [*step.parameters(), *step.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--phases", default="decode,pipeline,formats,batch8,aoti",
                    help="in this order; format=NAME times one format where it stands in the list")
    ap.add_argument("--formats", default="fp8,bf16-tuned,fp8-tuned,int8",
                    help="the formats phase's formats, in this order: a linear format (bf16; fp8 and int8 as the "
                         "torch_dynamic quantizer writes them), '-tuned' for Inductor's coordinate-descent tuning "
                         "of its kernels")
    ap.add_argument("--fused-batches", default="1,8", help="batches each fused-* format is timed at")
    ap.add_argument("--pipeline-llm", default="bf16",
                    help="the pipeline phase's LLM step: a format timed earlier in the run (bf16, fused-bf16, ...)")
    ap.add_argument("--past", type=int, default=120, help="positions already in the KV cache")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per timed run")
    ap.add_argument("--speech-tokens", type=int, default=250, help="tokens of the eval item (250 = 10 s)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0, help="seconds; a phase that cannot fit is skipped (0: none)")
    ap.add_argument("--compile-flow", action="store_true",
                    help="pipeline phase: compile flow and HiFT with torch.compile too (a compile per input shape), "
                         "not only capture them")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    t_start = time.perf_counter()
    art = Path(args.artifacts)

    import torch

    from cosycompile.backends.torch.static_decode import StaticCacheDecoder
    from cosycompile.families.qwen2_steps import LLMDecodeStep, LLMStaticStep
    from cosycompile.stages import get_stage
    from cosycompile.validate import metrics as M
    from cosycompile.validate.speed import paired_ratio

    torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    gpu = device == "cuda"
    phases = args.phases.split(",")
    dest = art / "bench" / f"gpu_inductor-{device}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "model": args.model, "device": device, "torch": torch.__version__, "past": args.past, "tokens": args.tokens,
        "machine": (f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}, {machine()}" if gpu
                    else f"{machine()}, {args.threads} threads"), "decode": [], "skipped": []}

    def save() -> None:
        out["seconds"] = time.perf_counter() - t_start
        dest.write_text(json.dumps(out, indent=1, default=float))

    def left() -> float:
        return float("inf") if not args.budget else args.budget - (time.perf_counter() - t_start)

    models = load_builtin(args.model, ("llm", "flow", "hift"), art, args.threads, "gpu-inductor")
    # The stages' modules and numpy assets, taken while the networks are still on the CPU.
    parts = {s: get_stage(s).hook("modules")(models) for s in ("llm", "flow", "hift")}
    out["setup_seconds"] = time.perf_counter() - t_start
    print(f"model ready in {out['setup_seconds']:.0f} s", flush=True)
    lm = models.llm.to(device).eval()
    c = lm.cfg
    shape = dict(layers=c.num_layers, kv_heads=c.num_kv_heads, head_dim=c.head_dim, hidden=c.hidden_size)
    bf16 = copy.deepcopy(lm).to(torch.bfloat16)
    streams = stream_bytes_per_s(torch, device)
    bandwidth = streams["floor"]
    out["copy_gb_per_s"], out["read_gb_per_s"] = streams["copy"] / 1e9, streams["read"] / 1e9

    # Teacher-forced quality: a prefill of 24 random embeddings, then 32 speech-token embeddings one step
    # at a time; the FP32 growing-cache step's logits are the reference.
    gen = torch.Generator().manual_seed(3)
    prefix = (0.02 * torch.randn(1, 24, c.hidden_size, generator=gen)).to(device)
    speech = torch.randint(0, lm.speech_token_size, (32,), generator=gen).to(device)
    follow = lm.speech_embedding.weight[speech][:, None, None, :].detach()
    ref_step = LLMDecodeStep(lm).eval()
    with torch.inference_mode():
        empty = torch.zeros(c.num_layers, 2, 1, c.num_kv_heads, 0, c.head_dim, device=device)
        _, present = ref_step(prefix, empty)
        cache, ref_logits = present, []
        for e in follow:
            logits, cache = ref_step(e, cache)
            ref_logits.append(logits[0, -1].float().cpu().numpy())

    def cosine(step: Any, dtype: Any) -> float:
        dec = StaticCacheDecoder(step, device)
        dec.start(present.to(dtype), len(follow))
        got = [np.asarray(dec.step(e.to(dtype))[0, -1].float().cpu()) for e in follow]
        return M.logit_cosine(np.stack(ref_logits), np.stack(got))

    def reference_run(batch: int) -> Callable[[], None]:
        return decoder(lambda e, cc: ref_step(e, cc), torch, device, batch, args.past, args.tokens, **shape)

    def decode_row(fmt: str, loop: str, step: Any, module: Any, batch: int, dtype: Any, compile_s: float) -> None:
        t0 = time.perf_counter()
        cos = cosine(step, dtype)
        cand = decoder(None, torch, device, batch, args.past, args.tokens, **shape, dtype=dtype,
                       static=StaticCacheDecoder(step, device))
        cand()  # the capture, outside the pairs
        r = paired_ratio(reference_run(batch), cand, pairs=args.pairs)
        profile = step_profile(step, dtype) if batch == 1 else None
        weights = weight_bytes(module)
        kv = batch * c.num_layers * 2 * c.num_kv_heads * c.head_dim * torch.finfo(dtype).bits // 8 \
            * (args.past + args.tokens / 2)
        row = {"format": fmt, "loop": loop, "batch": batch, "ms_per_token": 1000 * r.candidate_s / args.tokens,
               "fp32_eager_ms_per_token": 1000 * r.reference_s / args.tokens, "speedup": r.ratio,
               "spread": r.spread, "pairs": r.pairs, "weight_bytes": weights,
               "floor_ms_per_token": 1000 * (weights + kv) / bandwidth, "logit_cosine": cos,
               "compile_seconds": compile_s, "profile": profile, "measure_seconds": time.perf_counter() - t0}
        out["decode"].append(row)
        save()
        print(f"  decode {fmt} {loop} batch {batch}: {row['ms_per_token']:.3f} ms/token (floor "
              f"{row['floor_ms_per_token']:.3f}), cosine {cos:.4f}, compile {compile_s:.0f} s", flush=True)

    def step_profile(step: Any, dtype: Any) -> dict[str, Any]:
        """What one step launches, outside a CUDA graph: the kernels (on a CPU, the profiler's CPU
        events: a check of this code, not a figure), their summed time and the five costliest names.
        With the step's time in a graph, this says whether kernel count or kernel time bounds it."""
        from torch.profiler import ProfilerActivity, profile

        dec = StaticCacheDecoder(step, device, cuda_graph=False)
        with torch.inference_mode():
            dec.start(present.to(dtype), 2)
            dec.step(follow[0].to(dtype))
            sync(torch, device)
            with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
                dec.step(follow[1].to(dtype))
                sync(torch, device)
        kind = "cuda" if gpu else "cpu"
        events = [e for e in prof.events() if e.device_type.name.lower() == kind]
        by_name: dict[str, list[float]] = {}
        for e in events:
            by_name.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1000)
        top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:5]
        return {"events": kind, "kernels": len(events), "kernel_ms": sum(sum(v) for v in by_name.values()),
                "top": [{"name": k[:80], "count": len(v), "ms": sum(v)} for k, v in top]}

    def compiled_step(step: Any) -> tuple[Any, float]:
        """``step`` (a BF16 static step, its linears maybe quantized) under torch.compile, compiled now."""
        step = torch.compile(step.eval(), fullgraph=True, dynamic=False)
        t0 = time.perf_counter()
        dec = StaticCacheDecoder(step, device, cuda_graph=False)
        with torch.inference_mode():
            dec.start(present.to(torch.bfloat16), 1)
            dec.step(follow[0].to(torch.bfloat16))
        sync(torch, device)
        return step, time.perf_counter() - t0

    loop_name = "static cache, CUDA graph" if gpu else "static cache"
    compiled: dict[str, Any] = {}

    def compiled_format(fmt: str) -> None:
        """One decode row for ``fmt``: a linear format (bf16, fp8, int8), then '-tuned' for Inductor's
        coordinate-descent search of its kernels' launch configurations (gpt-fast's setting)."""
        linear, *mods = fmt.split("-")
        if linear not in ("bf16", "fp8", "int8") or set(mods) - {"tuned"}:
            raise SystemExit(f"unknown format '{fmt}' (bf16, fp8 or int8, then -tuned)")
        if linear == "fp8" and not gpu:
            out["skipped"].append(f"{fmt}: torch._scaled_mm is an emulation on a CPU")
            return
        eager = LLMStaticStep(bf16).eval()  # its own merged matrices: quantizing them leaves bf16 alone
        n = 0 if linear == "bf16" else quantize_linears(torch, eager, linear)
        with torch._inductor.config.patch(coordinate_descent_tuning="tuned" in mods):
            step, compile_s = compiled_step(eager)
        compiled[fmt] = step
        decode_row(fmt + (f" ({n} linears)" if n else ""), loop_name + ", compiled", step, eager, 1,
                   torch.bfloat16, compile_s)

    def fused_name(fmt: str) -> tuple[str, str, str, list[int]]:
        """``fused-WEIGHTS[/TILING][@B+B]`` as (row name, weights, tiling, batches), ``best`` resolved."""
        fmt, _, at = fmt.partition("@")
        weights, _, tiling = fmt.partition("-")[2].partition("/")
        tiling = tiling or "default"
        if tiling == "best":
            rows = [r for r in out["decode"] if r["format"].startswith("fused-") and r["batch"] == 1]
            if not rows:
                raise ValueError("tiling 'best' needs a fused batch-1 row timed before it")
            tiling = min(rows, key=lambda r: r["ms_per_token"])["format"].partition("/")[2] or "default"
        if tiling not in _tilings():
            raise ValueError(f"unknown tiling '{tiling}' (known: {', '.join(_tilings())})")
        batches = [int(b) for b in (at.split("+") if at else args.fused_batches.split(","))]
        weights = weights or "bf16"
        return f"fused-{weights}" + ("" if tiling == "default" else f"/{tiling}"), weights, tiling, batches

    def fused_format(fmt: str) -> str:
        """Decode rows (one per batch) of the hand-fused Triton step ``fmt`` (see ``fused_name``);
        returns the row name, under which ``compiled`` keeps the step."""
        from cosycompile.backends.torch.fused_decode import FusedDecodeStep

        fmt, weights, tiling, batches = fused_name(fmt)
        t0 = time.perf_counter()
        step = FusedDecodeStep(LLMStaticStep(bf16).eval(), weights, _tilings()[tiling])
        dec = StaticCacheDecoder(step, device, cuda_graph=False)
        with torch.inference_mode():  # Triton compiles each kernel at its first launch
            dec.start(present.to(torch.bfloat16), 1)
            dec.step(follow[0].to(torch.bfloat16))
        sync(torch, device)
        compiled[fmt] = step
        for batch in batches:
            decode_row(fmt, loop_name + ", Triton kernels", step, step, batch, torch.bfloat16,
                       time.perf_counter() - t0 if batch == 1 else 0.0)
        return fmt

    def run_phase(phase: str) -> None:
        """One entry of --phases."""
        if phase == "decode":
            plain = LLMStaticStep(bf16).eval()
            decode_row("bf16", loop_name + " (eager, no compile)", plain, plain, 1, torch.bfloat16, 0.0)
            compiled_format("bf16")
        elif phase == "pipeline":
            name = fused_name(args.pipeline_llm)[0] if args.pipeline_llm.startswith("fused") else args.pipeline_llm
            if name not in compiled:
                if name.startswith("fused"):
                    fused_format(name + "@1")
                else:
                    compiled[name] = compiled_step(LLMStaticStep(bf16))[0]
            out["pipeline"] = pipeline_phase(torch, models, parts, device, compiled[name], args)
            out["pipeline"]["llm_step"] = name
        elif phase.startswith("format=fused"):
            fused_format(phase.split("=", 1)[1])
        elif phase.startswith("format="):
            compiled_format(phase.split("=", 1)[1])
        elif phase == "formats":
            for fmt in (f for f in args.formats.split(",") if f not in compiled):
                if left() < need["formats"]:
                    out["skipped"].append(f"decode {fmt}: {left():.0f} s left")
                    continue
                compiled_format(fmt)
        elif phase == "batch8":
            step = compiled["bf16"] if "bf16" in compiled else compiled_step(LLMStaticStep(bf16))[0]
            t0 = time.perf_counter()
            warm = decoder(None, torch, device, 8, args.past, 1, **shape, dtype=torch.bfloat16,
                           static=StaticCacheDecoder(step, device, cuda_graph=False))
            warm()  # batch 8 is a new shape: a recompile
            decode_row("bf16", loop_name + ", compiled", step, getattr(step, "_orig_mod", step), 8, torch.bfloat16,
                       time.perf_counter() - t0)
        elif phase == "aoti":
            t0 = time.perf_counter()
            pkg = aoti_step(torch, bf16, present, follow, art, device)
            decode_row("bf16", loop_name + ", AOTInductor package", pkg, LLMStaticStep(bf16), 1, torch.bfloat16,
                       time.perf_counter() - t0)
        else:
            raise SystemExit(f"unknown phase '{phase}' (known: decode, pipeline, formats, format=NAME, batch8, aoti)")

    # Rough costs on an H100-class machine, for the budget: a compile 60-150 s, the pipeline ~90 s.
    need = {"decode": 80, "pipeline": 100, "formats": 45, "batch8": 45, "aoti": 200}
    for phase in phases:
        if left() < need.get(phase.split("=")[0].replace("format", "formats"), 60):
            out["skipped"].append(f"{phase}: {left():.0f} s left")
            save()
            print(f"SKIP {phase}: {left():.0f} s left", flush=True)
            continue
        t_phase = time.perf_counter()
        try:
            run_phase(phase)
        except Exception as e:  # noqa: BLE001 - a phase's failure must not cost the lease's later phases
            out.setdefault("errors", []).append(f"{phase}: {type(e).__name__}: {str(e)[:400]}")
            print(f"FAILED {phase}: {type(e).__name__}: {str(e)[:400]}", flush=True)
        out.setdefault("phase_seconds", {})[phase] = time.perf_counter() - t_phase
        save()
    save()
    print_tables(out)
    print(f"result: {dest}")
    for e in out.get("errors", []):
        print(f"FAILED {e}")
    return 1 if out.get("errors") else 0


def _tilings() -> dict[str, Any]:
    """Launch shapes the fused-* formats may name after a slash (``fused-bf16/wide``)."""
    from cosycompile.backends.torch.fused_decode import Tiling

    # "k256" is the default the first lease (H200, 2026-11-28) timed; "wide" and "narrow" its variants.
    k256 = Tiling(qkv_k=256, o_k=256, gate_up_k=256, down_k=512, head_k=256, num_warps=4)
    one = Tiling()
    return {
        "default": one,
        "k256": k256,
        "wide": replace(k256, qkv_pairs=8, o_rows=8, gate_up_rows=16, down_rows=8, head_rows=32),
        "narrow": replace(k256, qkv_pairs=2, o_rows=2, gate_up_rows=4, down_rows=2, head_rows=8, num_warps=2),
        # Variants of the default: programmatic dependent launches, down_proj's 4864-long reduction
        # split in four (or both o and down in two), half the rows a program, four warps, twice the
        # gate/up rows.
        "op-pdl": replace(one, pdl=True),
        "op-split": replace(one, down_k=512, down_split=4),
        "op-split-pdl": replace(one, down_k=512, down_split=4, pdl=True),
        "op-narrow": replace(one, qkv_pairs=2, o_rows=2, gate_up_rows=4, down_rows=2, head_rows=8, num_warps=4),
        "op-narrow-pdl": replace(one, qkv_pairs=2, o_rows=2, gate_up_rows=4, down_rows=2, head_rows=8, num_warps=4,
                                 pdl=True),
        "op-w4": replace(one, num_warps=4),
        "op-w4-pdl": replace(one, num_warps=4, pdl=True),
        "op-gu16-pdl": replace(one, gate_up_rows=16, pdl=True),
        "op-split2-pdl": replace(one, o_k=512, o_split=2, down_split=2, pdl=True),
        # Three launches a layer: attention with o_proj, the MLP with down_proj (fo-/fm- one of the two,
        # the other as op-split2-pdl); then rows per fused program halved or doubled.
        "f3": replace(one, fuse_o=True, fuse_mlp=True),
        "f3-pdl": replace(one, fuse_o=True, fuse_mlp=True, pdl=True),
        "fo-pdl": replace(one, fuse_o=True, down_split=2, pdl=True),
        "fm-pdl": replace(one, fuse_mlp=True, o_k=512, o_split=2, pdl=True),
        "f3-pdl-m8": replace(one, fuse_o=True, fuse_mlp=True, mlp_rows=8, pdl=True),
        "f3-pdl-m32": replace(one, fuse_o=True, fuse_mlp=True, mlp_rows=32, pdl=True),
        "f3-pdl-o64": replace(one, fuse_o=True, fuse_o_rows=64, fuse_mlp=True, pdl=True),
        "f3-pdl-o256": replace(one, fuse_o=True, fuse_o_rows=256, fuse_mlp=True, pdl=True),
        "f3-pdl-w4": replace(one, fuse_o=True, fuse_mlp=True, mlp_sub=4, num_warps=4, pdl=True),
        # The fused MLP at other program counts (rows a program need not be a power of two), one pipeline
        # stage, four warps (the second lease of 2026-12-04 timed these with a kernel since reverted).
        "fm": replace(one, fuse_mlp=True, o_k=512, o_split=2),
        "fm-r24": replace(one, fuse_mlp=True, mlp_rows=24, o_k=512, o_split=2),
        "fm-r40": replace(one, fuse_mlp=True, mlp_rows=40, o_k=512, o_split=2),
        "fm-s1": replace(one, fuse_mlp=True, o_k=512, o_split=2, num_stages=1),
        "fm-w4": replace(one, fuse_mlp=True, mlp_sub=4, o_k=512, o_split=2, num_warps=4),
        "fm-r24-pdl": replace(one, fuse_mlp=True, mlp_rows=24, o_k=512, o_split=2, pdl=True),
        "f3-w4-s1": replace(one, fuse_o=True, fuse_mlp=True, mlp_sub=4, num_warps=4, num_stages=1),
    }


def aoti_step(torch: Any, module: Any, present: Any, follow: Any, art: Path, device: str) -> Any:
    """The static step of ``module`` exported and compiled as an AOTInductor package, loaded back."""
    from cosycompile.families.qwen2_steps import LLMStaticStep

    dtype = next(module.parameters()).dtype
    L, two, B, KVH, _, D = present.shape
    example = (follow[0].to(dtype), torch.zeros(L, two, B, KVH, 256, D, dtype=dtype, device=device),
               torch.tensor([present.shape[4]], device=device))
    with torch.inference_mode():
        program = torch.export.export(LLMStaticStep(module).eval(), example)
    path = art / "bench" / "gpu_inductor_step.pt2"
    torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return torch._inductor.aoti_load_package(str(path))


def pipeline_phase(torch: Any, models: Any, parts: dict[str, Any], device: str, llm_step: Any,
                   args: Any) -> dict[str, Any]:
    """End to end and first chunk of the GPU pipeline against the FP32 eager pipeline on the same device."""
    from cosycompile.families import get_family
    from cosycompile.reference.step import workloads
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.pipeline import Pipeline, Sampling
    from cosycompile.stages import get_stage

    t0 = time.perf_counter()
    bf16, fp32 = torch.bfloat16, torch.float32

    def runtime(stage: str, dtypes: dict[str, Any], graphs: bool, static: Any = None, autocast: bool = False,
                compiled: bool = False) -> Any:
        sinfo = get_stage(stage)
        modules, assets, info = parts[stage]
        runners = {}
        for g in sinfo.graphs:
            if g.name not in modules or g.torch_program_only:  # the static step is passed in
                continue
            dtype = dtypes.get(g.name, fp32)
            mod = modules[g.name].to(device)
            if dtype != fp32 and not autocast:
                mod = copy.deepcopy(mod).to(dtype)
            if compiled:  # one compile per input shape, at the capture's warm-up call
                mod = torch.compile(mod, dynamic=False)
            runners[g.name] = DeviceRunner(torch, mod, g, device, fp32 if autocast else dtype, graphs,
                                           autocast and dtype != fp32)
        if static is not None:
            runners["llm_step_static"] = static
        else:
            runners.pop("llm_step_static", None)
        return get_family(models.family).hook("runtimes", stage).from_runners(runners, assets, info)

    ref = Pipeline({s: runtime(s, {}, False) for s in ("llm", "flow", "hift")})
    built = Pipeline({"llm": runtime("llm", {"llm_step": bf16}, True, StaticSteps(torch, llm_step, device, bf16)),
                      "flow": runtime("flow", {"flow_encoder": bf16, "flow_estimator": bf16}, True, autocast=True,
                                      compiled=args.compile_flow),
                      "hift": runtime("hift", {}, True, compiled=args.compile_flow)})
    item = load_dataset(REPO / "calib_data" / "eval").head(1)[0]
    first = Frontend(models.model_dir).item_inputs(item)
    sampling = Sampling(mode="greedy", seed=0, max_tokens=args.speech_tokens)
    r = ref.synthesize(*first, sampling)
    built.synthesize(*first, sampling)  # captures the graphs; the second call's part times are the warm ones
    b = built.synthesize(*first, sampling)
    quality = synthesis_quality(r, b, built, first[1])
    eager = {f"{s}.{n}": getattr(rn, "eager_reason", None) for s, rt in (("flow", built.flow), ("hift", built.hift))
             for n, rn in vars(rt).items() if hasattr(rn, "eager_reason") and rn.eager_reason}
    w = workloads(built, first, sampling, b.tokens, b.mel)
    audio_s = b.wav.size / built.hift.sample_rate  # the vocoder's rate: the family's
    speed = time_cases(ref, built, w["cases"], ["first_chunk", "end_to_end", "flow", "hift"], args.pairs)
    parts = dict(b.seconds)
    return {"flow_hift_compiled": bool(args.compile_flow), "tokens": int(len(b.tokens)),
            "mel_frames": int(b.mel.shape[1]), "audio_seconds": audio_s,
            "rtf_built": speed["end_to_end"]["built_s"] / audio_s,
            "rtf_reference": speed["end_to_end"]["reference_s"] / audio_s, "speed": speed, "quality": quality,
            "parts_of_one_synthesis_s": parts, "ran_eagerly": eager, "seconds": time.perf_counter() - t0}


def print_tables(out: dict[str, Any]) -> None:
    print(f"{out['model']} on {out['machine']}, torch {out['torch']}; copy {out.get('copy_gb_per_s', 0):.0f} GB/s "
          f"(read + write), GEMV read {out.get('read_gb_per_s', 0):.0f} GB/s (the floor takes the larger); "
          f"past {out['past']}, {out['tokens']} tokens a run")
    print("| format | decode loop | batch | ms/token | vs FP32 eager growing cache (median, spread, pairs) | "
          "floor ms/token (weights MB) | logit cosine | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out["decode"]:
        print(f"| {r['format']} | {r['loop']} | {r['batch']} | {r['ms_per_token']:.3f} | {r['speedup']:.2f}x "
              f"({r['spread'][0]:.2f}-{r['spread'][1]:.2f}, {r['pairs']}; FP32 {r['fp32_eager_ms_per_token']:.2f} ms) | "
              f"{r['floor_ms_per_token']:.3f} ({r['weight_bytes'] / 1e6:.0f}) | {r['logit_cosine']:.4f} | "
              f"{r['compile_seconds']:.0f} |")
    p = out.get("pipeline")
    if p:
        print(f"pipeline: {p['tokens']} tokens, {p['audio_seconds']:.1f} s audio; RTF built {p['rtf_built']:.4f}, "
              f"FP32 eager {p['rtf_reference']:.3f}")
        print("| workload | FP32 eager ms | built ms | speed-up (median, spread, pairs) |")
        print("|---|---|---|---|")
        for case, s in p["speed"].items():
            print(f"| {case} | {1000 * s['reference_s']:.1f} | {1000 * s['built_s']:.1f} | {s['speedup']:.1f}x "
                  f"({s['spread'][0]:.1f}-{s['spread'][1]:.1f}, {s['pairs']}) |")
        print("quality: " + json.dumps(p["quality"], default=float))
        if p["ran_eagerly"]:
            print("ran eagerly: " + json.dumps(p["ran_eagerly"]))
    for r in out["decode"]:
        prof = r.get("profile")
        if prof:
            top = ", ".join(f"{t['name'][:40]} x{t['count']} {t['ms']:.3f} ms" for t in prof["top"])
            print(f"profile {r['format']} ({r['loop']}): {prof['kernels']} {prof['events']} events a step, "
                  f"{prof['kernel_ms']:.3f} ms in them; top: {top}")
    if out["skipped"]:
        print("skipped: " + "; ".join(out["skipped"]))


if __name__ == "__main__":
    sys.exit(main())
