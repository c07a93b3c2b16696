"""Run inside the vLLM venv (not collected by pytest): load an HF rewrite dir with the real vLLM and
decode greedily from prompt ids. Reads one JSON object from argv[1], prints one JSON object.

Input: ``model`` (dir), ``ids`` (prompt ids), ``max_tokens``, ``min_tokens``, ``stop`` (stop ids),
``architecture`` (None: the one config.json names), ``logprob_ids`` (ids whose first-step
log-probability to report). Output: ``tokens`` (generated ids, stop excluded), ``first_logprobs``
(id -> log-probability at the first step, ``None`` where vLLM gives none), ``seconds`` (wall time of
generate) and ``architecture`` (the model class vLLM ran)."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    req = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    overrides = {"architectures": [req["architecture"]]} if req.get("architecture") else None
    # An explicit KV cache size: on the CPU backend gpu_memory_utilization is a share of the NUMA node's
    # RAM minus what the process already holds, which goes negative on a machine with a small node.
    # 64 MiB holds far more than max_model_len tokens of any model these tests load.
    llm = LLM(model=req["model"], skip_tokenizer_init=True, dtype=req.get("dtype", "float32"), enforce_eager=True,
              max_model_len=512, kv_cache_memory_bytes=64 * 2**20, hf_overrides=overrides, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], min_tokens=req["min_tokens"],
                            stop_token_ids=req["stop"], logprobs=20, detokenize=False)
    t0 = time.perf_counter()
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=req["ids"])], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    comp = out.outputs[0]
    tokens = [t for t in comp.token_ids if t not in req["stop"]]
    first = comp.logprobs[0] if comp.logprobs else {}
    arch = llm.llm_engine.model_config.architectures
    print("RESULT " + json.dumps({"tokens": tokens, "seconds": seconds, "architecture": arch,
                                  "first_logprobs": {str(i): (first[i].logprob if i in first else None)
                                                     for i in req.get("logprob_ids", [])}}))


if __name__ == "__main__":
    main()
