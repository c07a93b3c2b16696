"""Benchmark: the LM's decode through a real vLLM (its CPU build, loading the HF rewrite with the
shipped plug-in) against the ONNX Runtime engine of ``recipes/cpu-fp32.yaml``, pairs interleaved.

Both decode greedily from the same prompt (the model's text ids, no prompt speech) for exactly
``--tokens`` new tokens (vLLM with ``min_tokens`` set to it; the engine's cap, on a model that does
not stop earlier). Each pair times one ONNX Runtime decode, then one vLLM decode (the vLLM engine is
loaded once in a worker process of the vLLM venv and kept warm); ms/token is the whole generate call
(prefill included) over the tokens. Reported: each side's median ms/token, the median of per-pair
ratios (vLLM / ONNX Runtime) with its range, and the quality of the same decodes: how many of vLLM's
tokens equal the engine's (the engine's are the reference's: its check gates that).

With ``--int8``: the ONNX Runtime engine of ``recipes/cpu-int8.yaml`` (SmoothQuant W8A8) against
vLLM on the ``int8_dyn`` checkpoint of ``recipes/vllm-cpu-int8.yaml`` (per-token W8A8), and vLLM's
tokens are also compared with that checkpoint's quantized reference on the same prompt (the two
INT8 schemes differ, so agreement with the other engine is not their quality).

Usage: python bench/vllm_decode.py [--model builtin:tiny] [--tokens 100] [--pairs 5] [--threads 2]
       [--int8] [--vllm-python .venv-vllm/bin/python] [--artifacts artifacts]
Writes ``<artifacts>/bench/vllm_decode-<model>[-int8].json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench")]

from builtin_models import build_steps, machine  # noqa: E402

LOAD_TIMEOUT_S, DECODE_TIMEOUT_S = 900.0, 600.0
TEXT = ("This sentence gives the speech-token model something to say, long enough for a hundred tokens "
        "and more, with commas, clauses and a full stop.")


class Worker:
    """bench/vllm_worker.py in the vLLM venv, the rewrite loaded with the plug-in installed beside it.
    Its stdout is read by a thread, so every wait on it is bounded."""

    def __init__(self, python: str, rewrite: Path, site: Path) -> None:
        from cosycompile.stages.llm.vllm_model import ARCHITECTURE

        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=str(site), VLLM_TARGET_DEVICE="cpu")
        # An explicit KV cache size: vLLM's CPU backend otherwise sizes it as a share of the NUMA node's RAM
        # minus what the process holds, which fails on machines whose node is small. The 0.5B shapes at
        # the worker's 1024 tokens in FP32 need a tenth of this.
        cfg = json.dumps({"model": str(rewrite), "architecture": ARCHITECTURE, "kv_cache_bytes": 256 * 2**20})
        self.log = tempfile.TemporaryFile(mode="w+")  # vLLM's own output, shown if the worker dies
        self.proc = subprocess.Popen([python, str(REPO / "bench" / "vllm_worker.py"), cfg], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._wait("READY", LOAD_TIMEOUT_S)

    def _read(self) -> None:
        for line in self.proc.stdout or []:
            self.lines.put(line)

    def _wait(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is None and time.monotonic() < deadline:
                    continue
                self.proc.kill()
                self.log.seek(0)
                tail = self.log.read()[-3000:]
                sys.exit(f"vLLM worker: no {prefix.strip()} (exit {self.proc.wait()}, {timeout:.0f} s allowed):\n{tail}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def decode(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._wait("RESULT ", DECODE_TIMEOUT_S))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def quantized_reference_tokens(models: Any, quantize_dir: Path, prompt_ids: list[int], stop_ids: list[int],
                               tokens: int) -> list[int]:
    """The int8_dyn quantized reference's greedy ids after ``prompt_ids``, exactly ``tokens`` of them
    (stop ids masked, as vLLM's ``min_tokens`` does), with the quantize step's weight range and kept layers."""
    from cosycompile.quantize.compressed_tensors.quantize import greedy_decode
    from cosycompile.quantize.compressed_tensors.w8a8 import quantize_reference
    from cosycompile.stages.llm.hf_rewrite import rewrite_model, token_map

    meta = json.loads((quantize_dir / "quantization.json").read_text())
    model = rewrite_model(copy.deepcopy(models.llm), token_map(models.config, None, models.family))
    quantize_reference(model, tuple(n for n in meta["ignore"] if n != "lm_head"), meta["weight_qmax"])
    return greedy_decode(model, prompt_ids, stop_ids, tokens, tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="the ONNX Runtime engine's intra-op threads")
    ap.add_argument("--int8", action="store_true", help="INT8 on both sides (cpu-int8 engine, int8_dyn checkpoint)")
    ap.add_argument("--vllm-python", default=os.environ.get("COSYCOMPILE_VLLM_PYTHON",
                                                            str(REPO / ".venv-vllm" / "bin" / "python")))
    ap.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = ap.parse_args()
    if not Path(args.vllm_python).is_file():
        sys.exit(f"no vLLM venv at {args.vllm_python}: run `make test-vllm` (it builds one)")

    from cosycompile.families import load_models
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Prompt, Sampling
    from cosycompile.backends.vllm.build import identical_prefix, install_plugin
    from cosycompile.stages.llm.hf_rewrite import token_map, write_hf_rewrite

    tag = args.model.replace("builtin:", "") + ("-int8" if args.int8 else "")
    only_llm = {"flow": {"enabled": False}, "hift": {"enabled": False}}
    dirs = build_steps({"extends": str(REPO / "recipes" / ("cpu-int8.yaml" if args.int8 else "cpu-fp32.yaml")),
                        "model": args.model, "stages": only_llm}, f"bench-vllm-{tag}", ["model", "llm.engine"],
                       args.artifacts)
    model_dir = dirs["model"]
    engine = stage_runtime("llm", dirs["llm.engine"], args.threads)
    text_ids = Frontend(model_dir).text_ids(TEXT)
    models = load_models(model_dir, ("llm",))
    tmap = token_map(models.config, None, models.family)
    reference = None
    with tempfile.TemporaryDirectory(prefix="vllm-decode-") as tmp:
        rewrite, site = Path(tmp) / "hf", Path(tmp) / "site"
        if args.int8:
            q = build_steps({"extends": str(REPO / "recipes" / "vllm-cpu-int8.yaml"), "model": args.model,
                             "stages": only_llm}, f"bench-vllm-{tag}-q", ["llm.quantize"], args.artifacts)
            rewrite = q["llm.quantize"] / "hf"
            ids = tmap.prompt_ids([int(i) for i in text_ids])
            reference = quantized_reference_tokens(models, q["llm.quantize"], ids, tmap.stop_ids, args.tokens)
        else:
            write_hf_rewrite(copy.deepcopy(models.llm), models.config, model_dir, rewrite, "float32")
        del models
        install_plugin(args.vllm_python, rewrite, site)
        worker = Worker(args.vllm_python, rewrite, site)
        req = {"ids": tmap.prompt_ids([int(i) for i in text_ids]), "max_tokens": args.tokens,
               "min_tokens": args.tokens, "stop": tmap.stop_ids}
        sampling = Sampling(mode="greedy", max_tokens=args.tokens)
        try:
            worker.decode(req)  # warm-up on both sides
            engine.generate(text_ids, Prompt.empty(), sampling)
            pairs = []
            for i in range(args.pairs):
                t0 = time.perf_counter()
                ort_tokens = engine.generate(text_ids, Prompt.empty(), sampling)
                ort_s = time.perf_counter() - t0
                got = worker.decode(req)
                vllm_tokens = [t - tmap.text_vocab for t in got["tokens"]]
                pairs.append({"ort_ms_per_token": 1000 * ort_s / max(len(ort_tokens), 1),
                              "vllm_ms_per_token": 1000 * got["seconds"] / max(len(vllm_tokens), 1),
                              "ort_tokens": len(ort_tokens), "vllm_tokens": len(vllm_tokens),
                              "identical": int(sum(a == b for a, b in zip(ort_tokens.tolist(), vllm_tokens))),
                              **({"identical_prefix_vs_quantized_reference": identical_prefix(got["tokens"], reference),
                                  "quantized_reference_tokens": len(reference)} if reference is not None else {})})
                print(f"pair {i + 1}/{args.pairs}: ONNX Runtime {pairs[-1]['ort_ms_per_token']:.2f} ms/token, "
                      f"vLLM {pairs[-1]['vllm_ms_per_token']:.2f} ms/token", file=sys.stderr, flush=True)
        finally:
            worker.close()

    ratios = [p["vllm_ms_per_token"] / p["ort_ms_per_token"] for p in pairs]
    summary = {
        "machine": machine(), "model": args.model, "tokens": args.tokens, "pairs": pairs, "threads": args.threads,
        "ort_ms_per_token": statistics.median(p["ort_ms_per_token"] for p in pairs),
        "vllm_ms_per_token": statistics.median(p["vllm_ms_per_token"] for p in pairs),
        "vllm_over_ort": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "identical_tokens": min(p["identical"] for p in pairs), "compared_tokens": min(p["ort_tokens"] for p in pairs),
        "int8": args.int8,
    }
    out = args.artifacts / "bench" / f"vllm_decode-{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    r = summary["vllm_over_ort"]
    print(f"| model | ONNX Runtime ms/token | vLLM (CPU) ms/token | vLLM / ORT (per pair) | identical tokens |\n"
          f"|---|---|---|---|---|\n| {args.model} | {summary['ort_ms_per_token']:.2f} | "
          f"{summary['vllm_ms_per_token']:.2f} | {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}, {args.pairs} pairs) | "
          f"{summary['identical_tokens']} of {summary['compared_tokens']} |")
    if reference is not None:
        same = min(p["identical_prefix_vs_quantized_reference"] for p in pairs)
        print(f"vLLM's greedy tokens equal the int8_dyn quantized reference's for the first {same} of {len(reference)}")


if __name__ == "__main__":
    main()
