"""The ``llm.quantize`` step for compressed-tensors: the HF rewrite with INT8 W8A8 layers, and the
quantized reference's greedy tokens for a server to be compared with.

Outputs (the step's data dir):
- ``hf/``: the vocabulary-merge rewrite (``stages/llm/hf_rewrite.py``), its decoder-layer Linears
  as INT8 ``weight`` + ``weight_scale`` and ``config.json``'s ``quantization_config`` in
  compressed-tensors form (``w8a8.py``), loaded by vLLM through the dir's plug-in;
- ``reference_decode.json``: a prompt, the ids the quantized reference decodes greedily from it (the
  rewrite with :class:`~cosycompile.quantize.compressed_tensors.w8a8.W8A8Linear` layers, decoding as a
  server does) and its first step's most likely ids with their log-probabilities, which the vLLM
  backend's build decodes and compares;
- ``graphs.json`` (no graphs; ``checkpoint: hf``) and ``quantization.json``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.errors import RecipeError
from cosycompile.quantize.modelopt_torch.quantize import check_exclusions
from cosycompile.runtime.graphs_dir import GraphsDir


# The reference prompt: this many text ids (fixed, drawn below the text vocabulary) and at most
# this many decoded tokens, enough for greedy decoding to show a divergence.
REFERENCE_TEXT_IDS = 16
REFERENCE_MAX_TOKENS = 64
REFERENCE_LOGPROBS = 5  # first-step log-probabilities compared (the reference's most likely ids)
# Projections vLLM fuses into one layer (its qkv_proj, gate_up_proj): they are quantized or
# kept together, since one fused layer has one scheme.
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def check_fused(names: list[str], kept: list[str]) -> None:
    """A recipe exclusion that keeps part of a fused group in full precision is a recipe error."""
    quantized = set(names)
    for name in names + kept:
        parent, _, leaf = name.rpartition(".")
        for group in FUSED:
            if leaf in group:
                split = {f"{parent}.{g}" in quantized for g in group}
                if len(split) > 1:
                    raise RecipeError(f"stages.llm.quantize.exclude: {parent}.{{{','.join(group)}}} are one fused "
                                      "layer in vLLM; exclude all of them or none")


def layer_plan(target: Any, exclude: list[str]) -> tuple[list[str], list[str]]:
    """(quantized, kept) Linear names of the family's LM target under a recipe's ``exclude``; a dead
    pattern or a split fused layer is a recipe error."""
    from cosycompile.quantize.compressed_tensors.w8a8 import quantized_names

    check_exclusions([n for n, _ in target.module.named_modules()], exclude)
    names = quantized_names(target.module, (*target.keep_fp32, *exclude))
    kept = [n for n in quantized_names(target.module, ()) if n not in names]
    check_fused(names, kept)
    return names, kept


def exclusion_preflight(model_dir_or_builtin: Any, patterns: list[str]) -> None:
    """Check exclusions against the LM built on the meta device (no weights) before any step runs."""
    from cosycompile.families import BUILTIN_PREFIX, resolve_family

    source = model_dir_or_builtin
    family = resolve_family(BUILTIN_PREFIX + source if isinstance(source, str) else source)
    layer_plan(family.hook("llm_quant_target")(family.hook("meta_network")(source, "llm")), patterns)


def greedy_decode(model: Any, prompt_ids: list[int], stop_ids: list[int], min_tokens: int, max_tokens: int,
                  ) -> list[int]:
    """The ids ``model`` (an HF rewrite) decodes greedily after ``prompt_ids`` as a server does with
    ``min_tokens``: every stop id masked until then, decoding ending at one (not returned) or after
    ``max_tokens``."""
    import torch

    ids, past, out = torch.tensor([prompt_ids]), None, []
    with torch.no_grad():
        for i in range(max_tokens):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past, logits = res.past_key_values, res.logits[0, -1].clone()
            if i < min_tokens:
                logits[stop_ids] = float("-inf")
            tok = int(logits.argmax())
            if tok in stop_ids:
                break
            out.append(tok)
            ids = torch.tensor([[tok]])
    return out


def reference_decode(model: Any, tmap: Any) -> dict[str, Any]:
    """A fixed prompt (text ids drawn below the text vocabulary, no prompt speech), the ids ``model``
    (the quantized reference as an HF rewrite) decodes greedily from it, and its first step's most
    likely ids with their log-probabilities."""
    import torch

    gen = torch.Generator().manual_seed(0)
    text = torch.randint(0, min(tmap.text_vocab, 4096), (REFERENCE_TEXT_IDS,), generator=gen).tolist()
    prompt = tmap.prompt_ids(text)
    n = len(text)
    decode = {"prompt_ids": prompt, "stop_ids": tmap.stop_ids, "min_tokens": int(n * tmap.min_token_text_ratio),
              "max_tokens": min(int(n * tmap.max_token_text_ratio), REFERENCE_MAX_TOKENS)}
    return {**decode, "tokens": greedy_decode(model, **decode), "first_logprobs": first_logprobs(model, prompt)}


def first_logprobs(model: Any, prompt_ids: list[int], top: int = REFERENCE_LOGPROBS) -> dict[str, float]:
    """The ``top`` most likely ids after ``prompt_ids`` and their log-probabilities, under ``model``
    (an HF rewrite: merged-vocabulary ids in, logits out)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].double()
    best = torch.topk(torch.log_softmax(logits, -1), top)
    return {str(i): float(v) for i, v in zip(best.indices.tolist(), best.values.tolist())}


def quantize(ctx: StepContext) -> dict[str, Any]:
    """The ``llm.quantize`` step."""
    import torch
    from safetensors.torch import load_file, save_file

    from cosycompile.families import get_family, load_models
    from cosycompile.quantize.compressed_tensors.w8a8 import (QMAX, QMAX_REDUCED, quantization_config,
                                                              quantize_reference, quantize_state)
    from cosycompile.stages.common import model_dir
    from cosycompile.stages.llm.export import stage_parts
    from cosycompile.stages.llm.hf_rewrite import (REFERENCE_DECODE_FILE, TOKEN_MAP_FILE, finish_dir, rewrite_model,
                                                   text_tokenizer, token_map)

    s = ctx.spec
    torch.manual_seed(0)
    models = load_models(model_dir(ctx), ("llm",), ctx.params.get("family"))
    lm = models.llm
    target = get_family(models.family).hook("llm_quant_target")(lm)
    if not target.checkpoints:
        raise RecipeError(f"stages.llm.quantize.format: {s.format} is a checkpoint for vLLM and needs a "
                          f"Qwen2 LM; this model's ({models.family}) is not one")
    names, kept = layer_plan(target, list(s.exclude))
    keep = (*target.keep_fp32, *s.exclude)
    qmax = QMAX_REDUCED if s.reduce_range else QMAX
    ctx.log(f"INT8 W8A8 (weights within ±{qmax}, dynamic per-token activations) on {len(names)} Linear layers")

    tokenizer = text_tokenizer(model_dir(ctx), models.config, models.family)
    tmap = token_map(models.config, tokenizer, models.family)
    out = ctx.out / "hf"
    out.mkdir(parents=True)
    model = rewrite_model(copy.deepcopy(lm), tmap)
    model.config.dtype = "float32"
    model.save_pretrained(str(out))
    for f in sorted(out.glob("model*.safetensors")):
        state = load_file(str(f))
        save_file(quantize_state(state, [n for n in names if f"{n}.weight" in state], qmax), str(f), metadata={"format": "pt"})
    ignore = ["lm_head", *kept]
    quant = quantization_config(ignore)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = quant
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    finish_dir(out, lm, models.config, tmap, tokenizer, "float32", quant)

    quantize_reference(model, keep, qmax)  # the rewrite now computes what the checkpoint says
    ref = reference_decode(model, tmap)
    (ctx.out / REFERENCE_DECODE_FILE).write_text(json.dumps(ref, indent=1))
    info = dict(stage_parts(models)[2], family=models.family, precision=s.format, checkpoint="hf")
    GraphsDir(ctx.out, "llm", {}, {}, info).write()
    meta = {"format": s.format, "weight_qmax": qmax, "quantized_layers": len(names), "ignore": sorted(ignore),
            "reference_tokens": len(ref["tokens"]), "token_map": json.loads((out / TOKEN_MAP_FILE).read_text())["token_map"]}
    (ctx.out / "quantization.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return meta
