"""The ModelOpt LLM quantizer's INT8 SmoothQuant export (``quantize/modelopt_torch``): weights leave as
INT8 initializers, and ONNX Runtime runs the graph exactly as it ran ModelOpt's FP32 Q/DQ export."""

from __future__ import annotations

import copy
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from cosycompile.families import get_family, load_models
from cosycompile.onnx.tools import export_onnx
from cosycompile.quantize.modelopt_torch.int8_weights import Int8Linear, store_int8_weights
from cosycompile.quantize.modelopt_torch.quantize import _apply_exclusions, _export_onnx, quant_config
from cosycompile.stages.llm.export import stage_parts
from cosycompile.stages.llm import LLM_STEP


def _quantized(model_dir: Path) -> tuple[Any, Any]:
    """The tiny LM's decode-step target after INT8 SmoothQuant on random embeddings, as the step does it."""
    import modelopt.torch.quantization as mtq

    models = load_models(model_dir, ("llm",))
    target = get_family(models.family).hook("llm_quant_target")(models.llm)
    info = stage_parts(models)[2]
    torch.manual_seed(0)
    records = [torch.from_numpy(LLM_STEP.dummy_inputs(info, seed=k)["inputs_embeds"]) for k in range(4)]

    def loop(_: Any) -> None:
        with torch.no_grad():
            for r in records:
                target.calibrate(r)

    mtq.quantize(target.module, quant_config({"format": "int8_sq", "method": "max", "alpha": 0.5, "block_size": 128}),
                 loop)
    _apply_exclusions(target.module, list(target.keep_fp32))
    return models, target


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module", params=["builtin:tiny", "builtin:cv1-tiny"])
def exports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """ModelOpt's own export of the quantized decode step, and the step's (INT8 weights), of one model of
    each LM kind: a Qwen2 body, and CosyVoice-300M's Transformer (which reads one weight directly)."""
    from cosycompile.families import builtin_family

    out = tmp_path_factory.mktemp("int8_sq")
    model_dir = out / "model"
    builtin_family(request.param).hook("init_model")(request.param, model_dir, seed=0)
    models, target = _quantized(model_dir)
    info = stage_parts(models)[2]
    dummy = LLM_STEP.dummy_inputs(info)
    stock = out / "stock.onnx"
    export_onnx(copy.deepcopy(target).decode_step().eval(), tuple(torch.from_numpy(dummy[n]) for n in LLM_STEP.input_names),
                stock, LLM_STEP.input_names, LLM_STEP.output_names, LLM_STEP.dynamic_axes(), 18)
    ctx = types.SimpleNamespace(out=out)
    meta = _export_onnx(target, models, {"format": "int8_sq", "opset": 18}, ctx)
    return {"stock": stock, "ours": out / "llm_step.onnx", "meta": meta, "info": info, "target": target}


def test_weights_are_int8_initializers_behind_one_dequantize(exports: dict[str, Any]) -> None:
    model = onnx.load(str(exports["ours"]))
    inits = {t.name: t for t in model.graph.initializer}
    dq_weights = [n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    swapped = [m for m in exports["target"].module.modules() if isinstance(m, Int8Linear)]
    assert swapped and exports["meta"]["int8_weights"] == len(swapped)
    assert len(dq_weights) == len(swapped)
    assert all(inits[w].data_type == onnx.TensorProto.INT8 for w in dq_weights)
    # No weight is quantized in the graph any more: every QuantizeLinear left reads an activation.
    assert not [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in inits]
    # Each swapped weight is stored at one byte an element instead of four.
    saved = exports["stock"].stat().st_size - exports["ours"].stat().st_size
    assert saved >= 0.95 * 3 * sum(m.weight_int8.numel() for m in swapped)


def test_onnx_runtime_computes_the_same_logits_as_from_modelopts_export(exports: dict[str, Any]) -> None:
    """ONNX Runtime folds ModelOpt's QuantizeLinear on each FP32 weight into an INT8 initializer when it
    optimizes; the INT8 weights stored here must be those same bytes, so every output is identical."""
    stock, ours = _session(exports["stock"]), _session(exports["ours"])
    for seed in range(3):
        feeds = LLM_STEP.dummy_inputs(exports["info"], seed=seed)
        feeds = {i.name: feeds[i.name] for i in stock.get_inputs()}
        for a, b in zip(stock.run(None, feeds), ours.run(None, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def test_only_plain_int8_linears_are_swapped(tiny_model_dir: Path) -> None:
    """A linear whose weight quantizer is off (an exclusion) keeps its FP32 weight."""
    _, target = _quantized(tiny_model_dir)
    enabled = [n for n, m in target.module.named_modules()
               if hasattr(m, "weight_quantizer") and m.weight_quantizer.is_enabled]
    off = enabled[0]
    target.module.get_submodule(off).weight_quantizer.disable()
    assert store_int8_weights(target.module) == len(enabled) - 1
    assert not isinstance(target.module.get_submodule(off), Int8Linear)
    assert all(isinstance(target.module.get_submodule(n), Int8Linear) for n in enabled[1:])


_STEP_IN_A_FRESH_PROCESS = """
import gc, sys, types
from pathlib import Path

import torch

from cosycompile.core.plugins import load_object
from cosycompile.quantize.modelopt_torch import Spec


def step(model_dir, out):
    # As the executor runs a step: the step's module is loaded on first use, then called.
    quantize = load_object("cosycompile.quantize.modelopt_torch.quantize:quantize")
    ctx = types.SimpleNamespace(spec=Spec(format="int8_wo"), params={"opset": 18, "family": None},
                                inputs={"model": model_dir}, out=out, progress=lambda it, desc="": it, log=print)
    quantize(ctx)


step(Path(sys.argv[1]), Path(sys.argv[2]))
gc.collect()
print("PARAMETERS", sum(isinstance(o, torch.nn.Parameter) for o in gc.get_objects()))
"""


def test_the_step_leaves_no_model_alive_after_it_returns(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Nothing the step loaded outlives it (a build runs every later step in the same process): in a
    fresh process, where ModelOpt is imported for the first time by loading the step."""
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, "-c", _STEP_IN_A_FRESH_PROCESS, str(tiny_model_dir), str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "llm_step.onnx").is_file()
    (count,) = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("PARAMETERS ")]
    assert count == 0
