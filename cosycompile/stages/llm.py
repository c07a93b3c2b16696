"""LLM stage: the Qwen2 LM as a decode step with KV cache (inputs_embeds + past -> logits + present).

Embedding lookups stay outside the graph as numpy tables, which keeps the engine's inputs the
same for prefill and decode and lets the prompt mix text and speech embeddings freely.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.stages.common import engine_runtime, eval_items, export_stage, model_dir, speed_vs_fp32, write_check


def graph_modules(models: Any) -> dict[str, Any]:
    from cosycompile.models.qwen2lm import LLMDecodeStep

    return {"llm_step": LLMDecodeStep(models.llm).eval()}


def assets(models: Any) -> dict[str, np.ndarray]:
    lm = models.llm
    return {
        "text_embedding": lm.llm.model.model.embed_tokens.weight.detach().float().numpy(),
        "speech_embedding": lm.speech_embedding.weight.detach().float().numpy(),
        "llm_embedding": lm.llm_embedding.weight.detach().float().numpy(),
    }


def info(models: Any) -> dict[str, Any]:
    c = models.config.llm
    return {"num_layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.hidden_size // c.num_heads,
            "hidden_size": c.hidden_size, "speech_token_size": models.config.speech_token_size}


def export(ctx: StepContext) -> dict[str, Any]:
    import torch

    from cosycompile.models.loader import load_models

    models = load_models(model_dir(ctx), ("llm",))
    inf = info(models)
    embeds = torch.randn(1, 3, inf["hidden_size"])
    past = torch.randn(inf["num_layers"], 2, 1, inf["kv_heads"], 2, inf["head_dim"])
    axes = {"llm_step": {"inputs_embeds": {0: "batch", 1: "seq"}, "past_key_values": {2: "batch", 4: "past"},
                         "logits": {0: "batch", 1: "seq"}, "present_key_values": {2: "batch", 4: "total"}}}
    return export_stage(ctx, "llm", graph_modules(models), {"llm_step": (embeds, past)}, axes, assets(models), inf)


def check(ctx: StepContext) -> dict[str, Any]:
    """Teacher-forced logits and free-running greedy tokens, engine vs PyTorch, on the eval texts."""
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.pipeline import Sampling
    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.validate.metrics import kl_divergence, logit_cosine, top1_agreement

    p = ctx.params
    mdir = model_dir(ctx)
    ref = reference_runtime("llm", load_reference(mdir, ("llm",), p["threads"]))
    eng = engine_runtime(ctx, "llm")
    frontend = Frontend(mdir)
    sampling = Sampling(mode="greedy", seed=p["sampling"]["seed"], max_tokens=p["sampling"]["max_tokens"])
    max_err, same, items, agree, cos, kl = 0.0, 0, 0, [], [], []
    for item in ctx.progress(eval_items(ctx), desc="eval items"):
        text_ids, prompt = frontend.item_inputs(item)
        ref_tokens = ref.generate(text_ids, prompt, sampling)
        eng_tokens = eng.generate(text_ids, prompt, sampling)
        same += int(np.array_equal(ref_tokens, eng_tokens))
        items += 1
        ref_logits = ref.teacher_forced_logits(text_ids, prompt, ref_tokens)
        eng_logits = eng.teacher_forced_logits(text_ids, prompt, ref_tokens)
        max_err = max(max_err, float(np.abs(ref_logits - eng_logits).max()))
        agree.append(top1_agreement(ref_logits, eng_logits))
        cos.append(logit_cosine(ref_logits, eng_logits))
        kl.append(kl_divergence(ref_logits, eng_logits))
    c = p["check"]

    def decode_steps(rt: Any, n: int = 32) -> None:
        # Per-token cost: one-token steps on a growing cache, the decode loop's real shape.
        _, cache = rt.step(rt.prefix(first_ids, first_prompt), rt.empty_cache())
        for tok in range(n):
            _, cache = rt.step(rt.speech_embedding[tok][None, None].astype(np.float32), cache)

    first_ids, first_prompt = frontend.item_inputs(eval_items(ctx)[0])
    speed = speed_vs_fp32(ctx, "llm", eng, decode_steps)
    metrics = {**speed, "max_abs_logit_error": max_err, "identical_greedy_sequences": same, "items": items,
               "top1_agreement": float(np.mean(agree)), "logit_cosine": float(np.mean(cos)),
               "kl": float(np.mean(kl))}
    failures = []
    if c["max_abs_logit_error"] is not None and max_err >= c["max_abs_logit_error"]:
        failures.append(f"max abs logit error {max_err:.2e} >= {c['max_abs_logit_error']:.0e}")
    if c["identical_greedy_tokens"] and same != items:
        failures.append(f"greedy token sequences identical on {same}/{items} items")
    for key, value, higher in (("min_top1_agreement", metrics["top1_agreement"], True),
                               ("min_logit_cosine", metrics["logit_cosine"], True),
                               ("max_kl", metrics["kl"], False)):
        limit = c[key]
        if limit is not None and (value < limit if higher else value > limit):
            failures.append(f"{key.split('_', 1)[1]} {value:.4g} {'<' if higher else '>'} {limit}")
    return write_check(ctx, metrics, failures)
