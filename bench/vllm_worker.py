"""Run by bench/vllm_decode.py inside the vLLM venv (not collected by pytest): load an HF rewrite dir
once with the real vLLM (CPU) and answer timed greedy decodes, one JSON request per stdin line.

argv[1]: JSON with ``model`` (dir), ``architecture`` and ``kv_cache_bytes`` (the KV cache's size).
Each stdin line: ``ids``, ``max_tokens``, ``min_tokens``, ``stop``. Each answer, one stdout line: ``RESULT``
and JSON with ``tokens`` (generated ids, stop excluded) and ``seconds`` (wall time of generate). ``READY`` once
the model is loaded."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    cfg = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=cfg["model"], skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=1024,
              kv_cache_memory_bytes=cfg["kv_cache_bytes"], hf_overrides={"architectures": [cfg["architecture"]]},
              seed=0)
    print("READY", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], min_tokens=req["min_tokens"],
                                stop_token_ids=req["stop"], detokenize=False)
        t0 = time.perf_counter()
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=req["ids"])], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = [t for t in out.outputs[0].token_ids if t not in req["stop"]]
        print("RESULT " + json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
