"""The ONNX Runtime backend's kv_cache rewrite on the tiny LM's real exported decode step: per-layer
cache inputs and outputs, the stacked Runner contract kept, and a decoder that keeps the cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from cosycompile.backends.onnxruntime import Options
from cosycompile.backends.onnxruntime.build import KVCacheRunner, OrtRunner, build, load
from cosycompile.backends.onnxruntime.kv_cache import KeptCacheDecoder, layer_names, split_kv_cache
from cosycompile.families.cosyvoice2.loader import load_models
from cosycompile.onnx.tools import export_onnx
from cosycompile.core.targets import Target
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.runtime.loading import PASSPORT
from cosycompile.families.cosyvoice2.runtimes import LLMRuntime
from cosycompile.runtime.pipeline import Prompt, Sampling
from cosycompile.stages.llm import LLM_STEP
from cosycompile.stages.llm.export import stage_parts


@pytest.fixture(scope="module")
def parts(tiny_model_dir: Path) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    modules, assets, info = stage_parts(load_models(tiny_model_dir))
    return modules["llm_step"], assets, info


@pytest.fixture(scope="module")
def engines(parts: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny LM's step exported as the LLM stage exports it, built by the real backend with the
    default rewrites and with none."""
    import torch

    step, assets, info = parts
    src = tmp_path_factory.mktemp("llm_graphs")
    dummy = LLM_STEP.dummy_inputs(info)
    export_onnx(step, tuple(torch.from_numpy(dummy[n]) for n in LLM_STEP.input_names), src / "llm_step.onnx",
                LLM_STEP.input_names, LLM_STEP.output_names, LLM_STEP.dynamic_axes(), 18)
    for name, table in assets.items():
        np.save(src / f"{name}.npy", table)
    GraphsDir(src, "llm", {"llm_step": {"file": "llm_step.onnx", "inputs": LLM_STEP.input_names,
                                        "outputs": LLM_STEP.output_names}},
              {n: f"{n}.npy" for n in assets}, info).write()
    out = {}
    for name, opts in (("rewritten", Options()), ("plain", Options(rewrites=()))):
        out[name] = tmp_path_factory.mktemp(name)
        passport = build(src, opts, Target("cpu", "cpu"), out[name])
        (out[name] / PASSPORT).write_text(json.dumps({"backend": "onnxruntime", **passport}))
    return out


def _runtime(engine: Path, info: dict[str, Any]) -> LLMRuntime:
    runners = load(engine, threads=2)
    assets = {n: np.load(engine / f"{n}.npy") for n in ("text_embedding", "speech_embedding", "llm_embedding")}
    return LLMRuntime.from_runners(runners, assets, info)


def test_the_step_gets_one_cache_tensor_per_layer(engines: dict[str, Path], parts: Any) -> None:
    layers = parts[2]["num_layers"]
    graph = onnx.load(str(engines["rewritten"] / "llm_step.onnx")).graph
    assert [i.name for i in graph.input] == ["inputs_embeds", *layer_names("past_key_values", layers)]
    assert [o.name for o in graph.output] == ["logits", *layer_names("present_key_values", layers)]
    # Only the per-layer Concats touch the cache: the layer and key/value Splits and the stack are gone.
    ops = [n.op_type for n in graph.node]
    plain_ops = [n.op_type for n in onnx.load(str(engines["plain"] / "llm_step.onnx")).graph.node]
    assert ops.count("Split") < plain_ops.count("Split") and ops.count("Split") == 0
    passport = json.loads((engines["rewritten"] / PASSPORT).read_text())
    assert passport["rewrites"] == {"llm_step": {"kv_cache": layers}}
    assert isinstance(load(engines["rewritten"], 2)["llm_step"], KVCacheRunner)
    assert type(load(engines["plain"], 2)["llm_step"]) is OrtRunner


@pytest.mark.parametrize(("seq", "past"), [(6, 0), (1, 9), (3, 5)])
def test_stacked_calls_match_the_plain_engine_bit_for_bit(engines: dict[str, Path], parts: Any, seq: int,
                                                          past: int) -> None:
    info = parts[2]
    feeds = LLM_STEP.dummy_inputs(info, seed=seq + past, sizes={"batch": 2, "seq": seq, "past": past})
    got = load(engines["rewritten"], 2)["llm_step"].run(feeds)
    want = load(engines["plain"], 2)["llm_step"].run(feeds)
    assert got.keys() == want.keys() == {"logits", "present_key_values"}
    assert got["present_key_values"].shape == (info["num_layers"], 2, 2, info["kv_heads"], past + seq, info["head_dim"])
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    # The past positions come back unchanged in every layer's slot: the mapping is not a coincidence.
    assert np.array_equal(got["present_key_values"][..., :past, :], feeds["past_key_values"])


def test_the_kept_cache_decoder_steps_like_the_growing_cache(engines: dict[str, Path], parts: Any) -> None:
    info = parts[2]
    rt, plain = _runtime(engines["rewritten"], info), _runtime(engines["plain"], info)
    assert isinstance(rt.kept, KVCacheRunner) and plain.kept is None
    text = np.arange(4, 13)
    _, cache = rt.step(rt.prefix(text, Prompt.empty()), rt.empty_cache())
    kept, growing = rt.decoding(cache, 20), plain.decoding(cache, 20)
    assert isinstance(getattr(kept, "__self__", None), KeptCacheDecoder)
    for tok in np.random.default_rng(1).integers(0, rt.speech_token_size, 12):
        emb = rt.speech_embedding[tok][None, None].astype(np.float32)
        assert np.array_equal(kept(emb), growing(emb))
    sampling = Sampling(mode="greedy", seed=0, max_tokens=40)
    tokens = rt.generate(text, Prompt.empty(), sampling)
    assert len(tokens) > 0 and np.array_equal(tokens, plain.generate(text, Prompt.empty(), sampling))


def test_a_cache_wired_otherwise_is_left_alone(engines: dict[str, Path]) -> None:
    """Stacking layer 0's values before its keys breaks the [L, 2, ...] order the per-layer names
    promise: the rewrite must notice and keep the stacked graph."""
    from cosycompile.backends.onnxruntime.graph_index import GraphIndex

    model = onnx.load(str(engines["plain"] / "llm_step.onnx"))
    ix = GraphIndex(model.graph)
    stack = ix.producer[ix.producer["present_key_values"].input[0]]
    stack.input[0], stack.input[1] = stack.input[1], stack.input[0]
    assert split_kv_cache(model) == 0
    assert [i.name for i in model.graph.input] == LLM_STEP.input_names
    # The unchanged graph is rewritten (the refusal above is the swap's doing).
    assert split_kv_cache(onnx.load(str(engines["plain"] / "llm_step.onnx"))) > 0


def test_a_cache_read_elsewhere_is_left_alone(engines: dict[str, Path]) -> None:
    """A reader of the stacked cache other than its slices and Shape would lose its input if the
    input went away: the rewrite must refuse rather than build a graph ONNX Runtime rejects."""
    from onnx import helper

    model = onnx.load(str(engines["plain"] / "llm_step.onnx"))
    model.graph.node.append(helper.make_node("ReduceMax", ["past_key_values"], ["cache_max"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("cache_max", onnx.TensorProto.FLOAT, []))
    assert split_kv_cache(model) == 0
    assert "past_key_values" in [i.name for i in model.graph.input]
