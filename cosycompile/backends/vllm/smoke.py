"""Run in vLLM's Python by file path (it imports nothing of cosycompile): load an engine dir's
checkpoint with vLLM under the build's options and decode greedily from a prompt.

``python smoke.py REQUEST_JSON``. The request: ``model`` (the checkpoint dir), ``options``
(``vllm.LLM`` keyword arguments), ``prompt_ids``, ``stop_ids``, ``min_tokens``, ``max_tokens``,
``logprob_ids`` (ids whose first-step log-probability to report). Prints one line
``RESULT {json}``: ``tokens`` (stop ids excluded), ``first_logprobs`` (id -> log-probability,
None where vLLM's top 20 lacks it), ``vllm`` (its version), ``architecture`` (the model class vLLM
ran) and ``seconds`` (the generate call)."""

from __future__ import annotations

import json
import sys
import time


def main(req: dict) -> dict:
    """Load, decode, report."""
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=req["model"], seed=0, **req["options"])
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], min_tokens=req["min_tokens"],
                            stop_token_ids=req["stop_ids"], logprobs=20, detokenize=False)
    t0 = time.perf_counter()
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=req["prompt_ids"])], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    stop = set(req["stop_ids"])
    comp = out.outputs[0]
    first = comp.logprobs[0] if comp.logprobs else {}
    return {"tokens": [t for t in comp.token_ids if t not in stop], "vllm": vllm.__version__,
            "first_logprobs": {str(i): (first[i].logprob if i in first else None) for i in req["logprob_ids"]},
            "architecture": llm.llm_engine.model_config.architectures, "seconds": round(seconds, 3)}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))))
