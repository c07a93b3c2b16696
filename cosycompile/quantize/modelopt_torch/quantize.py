"""ModelOpt PyTorch PTQ of the speech-token LM, calibrated on the recorded reference inputs.

Outputs (the step's data dir):
- ``graphs.json`` + ``llm_step.onnx`` (+ embedding tables): a quantized decode step ONNX Runtime
  runs on a CPU. int8_sq: ModelOpt's Q/DQ export (static per-tensor activations, per-channel
  weights). int8_wo / int4_awq: ModelOpt's calibrated weights (AWQ scales and clipping applied,
  fake-quant folded), packed into ONNX Runtime's MatMulNBits (8 or 4 bits, same block size).
- ``hf/``: the vocabulary-merge rewrite (``stages/llm/hf_rewrite.py``: speech tokens in the
  vocabulary, ``lm_head`` = the speech head with a -inf bias elsewhere) of the quantized LM, written
  by ModelOpt's unified HF export, so ``config.json`` carries ``quantization_config`` (and
  ``hf_quant_config.json`` its algorithm) for TensorRT-LLM's PyTorch backend, vLLM or SGLang.
- ``trtllm/``: the same rewrite as a TensorRT-LLM checkpoint (``config.json`` + ``rank0.safetensors``)
  for ``trtllm-build`` (TensorRT-LLM <= 1.2).

The speech-token head (``llm_decoder``, the rewrite's ``lm_head``) and the embedding tables are not
quantized: they are small and the head decides every token (the rewrite's new ``lm_head`` and
``embed_tokens`` are plain modules, so ModelOpt never sees them as quantizable).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

# Imported with this module, not inside the step: the first import of ModelOpt's quantization pulls in
# PuLP, whose unavailable solver classes keep their ImportError, and with it the traceback's frames and
# every caller's frame above them. Imported from inside the step, those frames held the step's locals,
# the whole quantized LM (2 GB on the 0.5B model), resident through every later step of the build.
# The exclusion preflight loads this module before any step runs, so ModelOpt's warning about the
# transformers version (the project pins both) would precede a recipe error's one line.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"transformers .* is not tested with current version of modelopt",
                            category=UserWarning)
    import modelopt.torch.quantization as mtq

from cosycompile.errors import ModelError, RecipeError
from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.stages.llm import LLM_STEP
from cosycompile.quantize.calibrate import load_records
from cosycompile.quantize.graphs import op_counts

_CONFIGS = {"int8_sq": "INT8_SMOOTHQUANT_CFG", "int8_wo": "INT8_WEIGHT_ONLY_CFG", "int4_awq": "INT4_AWQ_CFG",
            "w4a8_awq": "W4A8_AWQ_BETA_CFG", "fp8": "FP8_DEFAULT_CFG"}
# Unquantized tensors of the checkpoints: Qwen2 is trained in bf16 (upstream's HF export and
# run.sh's trtllm-build use bfloat16); fp16 risks overflow in the residual stream.
_CHECKPOINT_DTYPE = "bfloat16"


def quant_config(p: dict[str, Any]) -> dict[str, Any]:
    """The ModelOpt config for the recipe's format, with its method, alpha and block size."""
    cfg = copy.deepcopy(getattr(mtq, _CONFIGS[p["format"]]))
    fmt = p["format"]
    if fmt == "int8_sq":
        cfg["algorithm"] = {"method": "smoothquant", "alpha": p["alpha"]}
    elif fmt in ("int4_awq", "w4a8_awq"):
        cfg["algorithm"] = {"method": p["method"]} | ({"alpha_step": 0.1} if p["method"] == "awq_lite" else {})
        rules = cfg["quant_cfg"]
        items = rules if isinstance(rules, list) else [{"quantizer_name": k, "cfg": v} for k, v in rules.items()]
        for rule in items:
            if "weight_quantizer" not in str(rule.get("quantizer_name", "")):
                continue
            q = rule.get("cfg")
            for e in q if isinstance(q, list) else [q]:
                if isinstance(e, dict) and e.get("block_sizes"):
                    bs = e["block_sizes"]
                    bs[next(k for k in bs if str(k) == "-1")] = p["block_size"]
    return cfg


def _check_block_size(hidden: int, inter: int, p: dict[str, Any]) -> None:
    if p["format"] in ("int4_awq", "w4a8_awq") and (hidden % p["block_size"] or inter % p["block_size"]):
        raise RecipeError(f"stages.llm.quantize.block_size: {p['block_size']} does not divide the LM's input "
                          f"features (hidden {hidden}, FFN {inter})")


def check_exclusions(names: list[str], patterns: list[str]) -> None:
    """Every exclusion wildcard must match a module the LLM quantizer quantizes (the family's
    ``llm_quant_target``); a dead pattern is a recipe error."""
    for pat in patterns:
        if not any(fnmatch.fnmatch(n, pat) for n in names):
            raise RecipeError(f"stages.llm.quantize.exclude: '{pat}' matches no module of the LM "
                              f"(names look like: {', '.join(names[5:8])}, ...)")


def exclusion_preflight(model_dir_or_builtin: Any, patterns: list[str]) -> None:
    """Check exclusions against the LM built on the meta device (no weights, no work); the source is a
    model dir or a built-in's name, whose family builds it."""
    from cosycompile.families import BUILTIN_PREFIX, resolve_family

    source = model_dir_or_builtin
    family = resolve_family(BUILTIN_PREFIX + source if isinstance(source, str) else source)
    lm = family.hook("meta_network")(source, "llm")
    check_exclusions([n for n, _ in family.hook("llm_quant_target")(lm).module.named_modules()], patterns)


def _apply_exclusions(model: Any, patterns: list[str]) -> None:
    check_exclusions([n for n, _ in model.named_modules()], patterns)
    for pat in patterns:
        mtq.disable_quantizer(model, lambda n, pat=pat: fnmatch.fnmatch(n.rsplit(".", 1)[0], pat))


def quantize(ctx: StepContext) -> dict[str, Any]:
    """The ``llm.quantize`` step."""
    import torch

    from cosycompile.families import get_family, load_models
    from cosycompile.stages.common import model_dir
    from cosycompile.stages.llm.export import stage_parts

    s = ctx.spec
    p = {**s.model_dump(), "method": s.resolved_method, "alpha": 0.5 if s.alpha is None else s.alpha,
         "block_size": s.block_size or 128, "opset": ctx.params["opset"]}
    torch.manual_seed(0)
    models = load_models(model_dir(ctx), ("llm",), ctx.params.get("family"))
    lm = models.llm
    target = get_family(models.family).hook("llm_quant_target")(lm)
    _check_block_size(*target.widths, p)
    checkpoints = [e for e in ("hf", "trtllm") if e in p["exports"]]
    if checkpoints and not target.checkpoints:
        raise RecipeError(f"stages.llm.quantize.exports: {', '.join(checkpoints)} need a Qwen2 LM; this model's "
                          f"({models.family}) quantizes to an ONNX decode step only (exports: [onnx])")
    records = load_records(ctx.inputs["calib"], LLM_STEP.name)[: p["calib_items"]] if "calib" in ctx.inputs else []

    def forward_loop(_: Any) -> None:
        with torch.no_grad():
            for r in ctx.progress(records, desc="calibration forward"):
                target.calibrate(torch.from_numpy(r["inputs_embeds"]))

    if not records and p["format"] != "int8_wo":
        raise ModelError("llm.quantize: no calibration records (the calibration set produced none)")
    cfg = quant_config(p)
    ctx.log(f"ModelOpt {_CONFIGS[p['format']]} ({cfg['algorithm']}) on {len(records)} sequences")
    mtq.quantize(target.module, cfg, forward_loop if records else None)
    _apply_exclusions(target.module, [*target.keep_fp32, *p["exclude"]])
    meta: dict[str, Any] = {"format": p["format"], "calib_sequences": len(records)}

    if "hf" in p["exports"]:
        meta["hf"] = _export_hf(copy.deepcopy(lm), models.config, model_dir(ctx), ctx.out / "hf", models.family)
    if "trtllm" in p["exports"]:
        meta["trtllm"] = _export_trtllm(copy.deepcopy(lm), models.config, model_dir(ctx), ctx.out / "trtllm",
                                        models.family)
    if "onnx" in p["exports"]:
        meta["onnx"] = _export_onnx(target, models, p, ctx)
        _, assets, info = stage_parts(models)
        gd = GraphsDir(ctx.out, "llm", {LLM_STEP.name: {"file": "llm_step.onnx", "inputs": LLM_STEP.input_names,
                                                        "outputs": LLM_STEP.output_names, "precision": p["format"],
                                                        "spec": LLM_STEP.describe(info)}},
                       {}, dict(info, family=models.family, precision=p["format"]))
        for name, arr in assets.items():
            np.save(ctx.out / f"{name}.npy", arr)
            gd.assets[name] = f"{name}.npy"
        gd.write()
    else:  # checkpoint-only build (GPU recipes): still a graphs dir, with no graphs
        info = dict(stage_parts(models)[2], family=models.family, precision=p["format"])
        if "hf" in p["exports"]:
            info["checkpoint"] = "hf"  # what a checkpoint backend reads (stages/llm/hf_rewrite.py)
        GraphsDir(ctx.out, "llm", {}, {}, info).write()
    (ctx.out / "quantization.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    return meta


def _export_hf(lm: Any, cfg: Any, root: Path, out: Path, family: str | None = None) -> dict[str, Any]:
    """ModelOpt unified HF checkpoint of the rewrite of ``lm`` (a quantized copy, rewritten in place);
    ``family`` None: the model dir's."""
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    from cosycompile.families import detect_family
    from cosycompile.stages.llm.hf_rewrite import finish_dir, rewrite_model, text_tokenizer, token_map

    family = family or detect_family(root).name
    tokenizer = text_tokenizer(root, cfg, family)
    tmap = token_map(cfg, tokenizer, family)
    model = rewrite_model(lm, tmap)
    out.mkdir(parents=True)
    export_hf_checkpoint(model, dtype=getattr(torch, _CHECKPOINT_DTYPE), export_dir=str(out))
    _exclude_lm_head(out)
    config = json.loads((out / "config.json").read_text())
    quant = config.get("quantization_config")
    # ModelOpt 0.47 keeps the unquantized tensors (lm_head, embeddings, norms) in the model's own
    # dtype (float32 here) whatever ``dtype`` says; record what was written, servers cast at load.
    finish_dir(out, lm, cfg, tmap, tokenizer, str(config.get("dtype") or config.get("torch_dtype")), quant)
    return {"quantization_config": quant, "token_map": tmap.as_json()}


def _exclude_lm_head(out: Path) -> None:
    """Name ``lm_head`` among the unquantized modules of both quantization configs.

    ModelOpt lists only modules it wrapped with disabled quantizers; the rewrite's ``lm_head`` is a
    plain Linear it never saw, so a server applying the checkpoint's algorithm to every Linear not
    excluded would quantize the speech head.
    """
    config_path, hf_quant_path = out / "config.json", out / "hf_quant_config.json"
    config = json.loads(config_path.read_text())
    qc = config.get("quantization_config") or {}
    if "lm_head" not in qc.setdefault("ignore", []):
        qc["ignore"].append("lm_head")
    config["quantization_config"] = qc
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    if hf_quant_path.is_file():
        hq = json.loads(hf_quant_path.read_text())
        excl = hq.setdefault("quantization", {}).setdefault("exclude_modules", [])
        if "lm_head" not in excl:
            excl.append("lm_head")
        hf_quant_path.write_text(json.dumps(hq, indent=2, sort_keys=True))


def _export_trtllm(lm: Any, cfg: Any, root: Path, out: Path, family: str | None = None) -> dict[str, Any]:
    """TensorRT-LLM checkpoint of the rewrite of ``lm`` (for ``trtllm-build``, TensorRT-LLM <= 1.2)."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    from cosycompile.families import detect_family
    from cosycompile.stages.llm.hf_rewrite import TOKEN_MAP_FILE, rewrite_model, text_tokenizer, token_map

    family = family or detect_family(root).name
    tmap = token_map(cfg, text_tokenizer(root, cfg, family), family)
    model = rewrite_model(lm, tmap)
    out.mkdir(parents=True)
    export_tensorrt_llm_checkpoint(model, decoder_type="qwen", dtype=getattr(torch, _CHECKPOINT_DTYPE),
                                   export_dir=str(out), inference_tensor_parallel=1)
    (out / TOKEN_MAP_FILE).write_text(json.dumps({"token_map": tmap.as_json()}, indent=1, sort_keys=True))
    cfg_out = json.loads((out / "config.json").read_text())
    return {"quantization": cfg_out.get("quantization"), "token_map": tmap.as_json()}


def _export_onnx(target: Any, models: Any, p: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    import torch

    from cosycompile.onnx.tools import export_onnx

    fmt = p["format"]
    if fmt in ("fp8", "w4a8_awq"):
        raise RecipeError(f"stages.llm.quantize.exports: format '{fmt}' has no CPU ONNX form; "
                          "export 'hf' / 'trtllm' for TensorRT-LLM instead")
    if fmt in ("int8_wo", "int4_awq"):
        # Bake the calibrated weights (AWQ scaling and clipping included) into plain tensors; the
        # activation-side AWQ scale stays as a Mul in front of each layer.
        mtq.fold_weight(target.module)
    stored_int8 = 0
    if fmt == "int8_sq":
        from cosycompile.quantize.modelopt_torch.int8_weights import store_int8_weights

        stored_int8 = store_int8_weights(target.module, target.weights_read)
    step = target.decode_step().eval()
    from cosycompile.stages.llm.export import stage_parts

    dummy = LLM_STEP.dummy_inputs(stage_parts(models)[2])
    args = tuple(torch.from_numpy(dummy[n]) for n in LLM_STEP.input_names)
    raw = ctx.out / ".llm_step.raw.onnx"
    export_onnx(step, args, raw, LLM_STEP.input_names, LLM_STEP.output_names, LLM_STEP.dynamic_axes(), p["opset"])
    dst = ctx.out / "llm_step.onnx"
    if fmt == "int8_sq":
        raw.replace(dst)
        return op_counts(dst) | {"int8_weights": stored_int8}
    bits = 8 if fmt == "int8_wo" else 4
    _pack_matmul_nbits(raw, dst, bits, p["block_size"])
    raw.unlink()
    return op_counts(dst) | {"bits": bits, "block_size": p["block_size"]}


def _pack_matmul_nbits(src: Path, dst: Path, bits: int, block_size: int) -> None:
    """Pack every MatMul weight of the LM body into MatMulNBits; the speech head stays FP32."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from cosycompile.onnx.tools import save_model

    model = onnx.load(str(src))
    producers = {o: n for n in model.graph.node for o in n.output}
    head = producers[LLM_STEP.output_names[0]]
    while head.op_type != "MatMul":  # logits <- Add(bias) <- MatMul(head weight)
        head = next(producers[i] for i in head.input if i in producers)
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=True,
                             nodes_to_exclude=[head.name])
    q.process()
    save_model(q.model.model, dst)

