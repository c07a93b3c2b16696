"""The LLM check: teacher-forced logits and free-running greedy tokens, engine vs PyTorch FP32."""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def _greedy(params: dict[str, Any]) -> Any:
    from cosycompile.runtime.pipeline import Sampling

    return Sampling(mode="greedy", seed=params["sampling"]["seed"], max_tokens=params["sampling"]["max_tokens"])


def reference(runtime: Any, items: list[tuple[np.ndarray, Any]], spec: dict[str, Any],
              params: dict[str, Any]) -> dict[str, np.ndarray]:
    """Greedy tokens and teacher-forced logits of the PyTorch reference, per eval item."""
    out: dict[str, np.ndarray] = {}
    for n, (text_ids, prompt) in enumerate(items):
        tokens = runtime.generate(text_ids, prompt, _greedy(params))
        out[f"tokens.{n}"] = tokens
        out[f"logits.{n}"] = runtime.teacher_forced_logits(text_ids, prompt, tokens).astype(np.float32)
    return out


def check(ctx: StepContext) -> dict[str, Any]:
    """The ``llm.check`` step."""
    from cosycompile.stages.check_tools import engine_runtime, reference_arrays, speed_vs_fp32, write_check
    from cosycompile.stages.eval_set import eval_inputs
    from cosycompile.validate.metrics import kl_divergence, logit_cosine, top1_agreement

    eng = engine_runtime(ctx, "llm")
    ref = reference_arrays(ctx, "llm")
    inputs = eval_inputs(ctx)
    max_err, same, agree, cos, kl = 0.0, 0, [], [], []
    for n, (text_ids, prompt) in enumerate(ctx.progress(inputs, desc="eval items")):
        ref_tokens, ref_logits = ref[f"tokens.{n}"], ref[f"logits.{n}"]
        eng_tokens = eng.generate(text_ids, prompt, _greedy(ctx.params))
        same += int(np.array_equal(ref_tokens, eng_tokens))
        eng_logits = eng.teacher_forced_logits(text_ids, prompt, ref_tokens)
        max_err = max(max_err, float(np.abs(ref_logits - eng_logits).max()))
        agree.append(top1_agreement(ref_logits, eng_logits))
        cos.append(logit_cosine(ref_logits, eng_logits))
        kl.append(kl_divergence(ref_logits, eng_logits))
    first_ids, first_prompt = inputs[0]

    def decode_steps(rt: Any) -> None:
        # Per-token cost: one-token steps on a growing cache, the decode loop's real shape.
        _, cache = rt.step(rt.prefix(first_ids, first_prompt), rt.empty_cache())
        next_logits = rt.decoding(cache, ctx.spec.speed_tokens)
        for tok in range(ctx.spec.speed_tokens):
            next_logits(rt.speech_embedding[tok][None, None].astype(np.float32))

    speed = speed_vs_fp32(ctx, "llm", eng, decode_steps)
    metrics = {**speed, "max_abs_logit_error": max_err, "greedy_identical_ratio": same / len(inputs),
               "items": len(inputs), "top1_agreement": float(np.mean(agree)), "logit_cosine": float(np.mean(cos)),
               "kl": float(np.mean(kl))}
    return write_check(ctx, metrics)
