"""CosyVoice-300M's LM equals upstream's own ``TransformerLM`` in FP32 and loads its state dict strictly.

The fixtures under tests/data/cv1_upstream/ (lm.pt, lm.npz, shapes_300m_lm.json) were written by
make_upstream_fixtures_lm.py (beside this file) running upstream FunAudioLLM/CosyVoice's code at the
commit it names, with the tiny shapes of ``cv1_tiny()``: the text encoding, the prefix ``inference``
builds, ``forward_chunk``'s prefill and cached steps, and greedy tokens of ``inference`` itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cosycompile.families.cosyvoice.config import LMConfig, cv1_300m, cv1_tiny
from cosycompile.families.cosyvoice.lm import (DecodeStep, TransformerLM, step_info, text_encoder_info,
                                               text_encoder_weights)
from cosycompile.families.cosyvoice.text_encoder import text_features
from cosycompile.runtime.stage_graphs.llm import LLM_STEP
from families.upstream_fixtures import read_state, rel_err

DATA = Path(__file__).resolve().parents[2] / "data" / "cv1_upstream"
TOL = 1e-5


def empty_cache(cfg: LMConfig, batch: int = 1) -> torch.Tensor:
    info = step_info(cfg)
    return torch.zeros(info["num_layers"], 2, batch, info["kv_heads"], 0, info["head_dim"])


@pytest.fixture(scope="module")
def cfg() -> LMConfig:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return cv1_tiny().lm


@pytest.fixture(scope="module")
def lm(cfg: LMConfig) -> TransformerLM:
    net = TransformerLM(cfg).eval()
    net.load_state_dict(read_state(DATA, "lm"), strict=True)
    return net


@pytest.fixture(scope="module")
def up() -> dict[str, torch.Tensor]:
    with np.load(DATA / "lm.npz") as z:
        return {k: torch.from_numpy(z[k]) for k in z.files}


@pytest.fixture(scope="module")
def step(lm: TransformerLM) -> DecodeStep:
    return DecodeStep(lm).eval()


def text_ids(up: dict[str, torch.Tensor]) -> torch.Tensor:
    """The prompt text then the text, as ``inference`` encodes them."""
    return torch.cat([up["prompt_text"], up["text"]], dim=1)


# -- loading ---------------------------------------------------------------------------------------
def test_strict_load_catches_a_wrong_key(cfg: LMConfig) -> None:
    sd = read_state(DATA, "lm")
    renamed = dict(sd)
    renamed["llm.encoders.0.norm_mha.weight"] = renamed.pop("llm.encoders.0.norm1.weight")
    with pytest.raises(RuntimeError, match="norm_mha"):
        TransformerLM(cfg).load_state_dict(renamed, strict=True)
    missing = {k: v for k, v in sd.items() if k != "llm_embedding.weight"}
    with pytest.raises(RuntimeError, match="llm_embedding"):
        TransformerLM(cfg).load_state_dict(missing, strict=True)


def test_300m_keys_and_shapes_are_upstreams() -> None:
    record = json.loads((DATA / "shapes_300m_lm.json").read_text())
    with torch.device("meta"):
        ours = TransformerLM(cv1_300m().lm)
    assert {k: list(v.shape) for k, v in ours.state_dict().items()} == record["lm"]


# -- text path -------------------------------------------------------------------------------------
def test_encode_text_equals_upstream(lm: TransformerLM, up: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        out = lm.encode_text(text_ids(up))
    assert rel_err(out, up["encode"]) <= TOL


def test_numpy_text_features_equal_upstream(lm: TransformerLM, cfg: LMConfig, up: dict[str, torch.Tensor]) -> None:
    weights = text_encoder_weights(lm)
    assert all(a.dtype == np.float32 for a in weights.values())
    assert {"text_embedding.weight", "text_encoder.encoders.0.self_attn.linear_q.weight",
            "text_encoder_affine_layer.weight"} <= set(weights)
    out = text_features(text_ids(up)[0].numpy(), weights, text_encoder_info(cfg))
    assert out.dtype == np.float32
    assert rel_err(out[None], up["encode"]) <= TOL


def test_numpy_text_encoder_imports_no_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import cosycompile.families.cosyvoice.text_encoder\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])


# -- prefix ----------------------------------------------------------------------------------------
def test_prefix_equals_upstreams_lm_input(lm: TransformerLM, up: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        with_spk = lm.prefix(up["text"], up["prompt_text"], up["prompt_speech_token"], up["embedding"])
        without = lm.prefix(up["text"], up["prompt_text"], up["prompt_speech_token"], None)
    assert rel_err(with_spk, up["lm_input"]) <= TOL
    assert rel_err(without, up["lm_input_nospk"]) <= TOL


# -- decode step -----------------------------------------------------------------------------------
def test_prefill_and_cached_steps_equal_upstream(lm: TransformerLM, step: DecodeStep, cfg: LMConfig,
                                                 up: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        logits, kv = step(up["lm_input"], empty_cache(cfg))
        assert rel_err(logits, up["prefill_logits"]) <= TOL
        for i, tok in enumerate(up["step_tokens"].tolist()):
            logits, kv = step(lm.speech_embedding.weight[tok].reshape(1, 1, -1), kv)
            assert rel_err(logits, up[f"step{i}_logits"]) <= TOL, i
    # Upstream's cache holds keys then values along the last axis: [L, heads, T, 2 * head_dim].
    keys, values = up["att_cache"].chunk(2, dim=-1)
    assert rel_err(kv[:, 0, 0], keys) <= TOL
    assert rel_err(kv[:, 1, 0], values) <= TOL


def greedy(lm: TransformerLM, step: DecodeStep, cfg: LMConfig, prefix: torch.Tensor, text_len: int,
           max_tokens: int) -> list[int]:
    """Upstream's ``inference`` loop with an argmax sampler, over the decode step: eos barred before
    ``min_len`` tokens, decoding stops at eos."""
    min_len = int(text_len * cfg.min_token_text_ratio)
    kv, x, out = empty_cache(cfg), prefix, []
    with torch.no_grad():
        for i in range(max_tokens):
            logits, kv = step(x, kv)
            scores = logits[0, -1].log_softmax(dim=-1)
            if i < min_len:
                scores[lm.eos_token] = -float("inf")
            tok = int(scores.argmax())
            if tok == lm.eos_token:
                break
            out.append(tok)
            x = lm.speech_embedding.weight[tok].reshape(1, 1, -1)
    return out


@pytest.mark.parametrize("speaker", [True, False], ids=["speaker", "no_speaker"])
def test_greedy_tokens_equal_upstreams_inference(lm: TransformerLM, step: DecodeStep, cfg: LMConfig,
                                                  up: dict[str, torch.Tensor], speaker: bool) -> None:
    expected = up["greedy_tokens" if speaker else "greedy_tokens_nospk"].tolist()
    with torch.no_grad():
        prefix = lm.prefix(up["text"], up["prompt_text"], up["prompt_speech_token"],
                           up["embedding"] if speaker else None)
    assert greedy(lm, step, cfg, prefix, up["text"].shape[1], len(expected)) == expected


# -- export ----------------------------------------------------------------------------------------
def chained_inputs(lm: TransformerLM, step: DecodeStep, cfg: LMConfig, up: dict[str, torch.Tensor],
                   past: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A real cache of ``past`` positions (the prefix and speech tokens) and ``seq`` new speech rows."""
    rows = torch.cat([up["lm_input"][0], lm.speech_embedding.weight[: past + seq]], dim=0).detach()
    kv = empty_cache(cfg)
    if past:
        with torch.no_grad():
            _, kv = step(rows[None, :past], kv)
    return rows[None, past: past + seq].contiguous(), kv


def test_step_exports_with_dynamic_seq_and_past(lm: TransformerLM, step: DecodeStep, cfg: LMConfig,
                                                up: dict[str, torch.Tensor]) -> None:
    from cosycompile.stages.common import export_program

    program, raised = export_program(step, LLM_STEP, step_info(cfg))
    assert raised == {}
    module = program.module()
    # Traced at seq 2 and past 512 (the spec's optimisation points): run at other sizes, P = 0 included.
    for past, seq in ((0, up["lm_input"].shape[1]), (23, 1), (9, 5)):
        x, kv = chained_inputs(lm, step, cfg, up, past, seq)
        with torch.no_grad():
            want, want_kv = step(x, kv)
            got, got_kv = module(x, kv)
        assert got.shape == (1, seq, cfg.speech_token_size + 1)
        assert got_kv.shape == (*kv.shape[:4], past + seq, kv.shape[5])
        assert rel_err(got, want) <= TOL
        assert rel_err(got_kv, want_kv) <= TOL


def test_step_exports_to_onnx(lm: TransformerLM, step: DecodeStep, cfg: LMConfig, up: dict[str, torch.Tensor],
                              tmp_path: Path) -> None:
    import onnxruntime as ort

    from cosycompile.onnx.tools import export_onnx

    info = step_info(cfg)
    dummy = LLM_STEP.dummy_inputs(info)
    path = tmp_path / "llm_step.onnx"
    export_onnx(step, tuple(torch.from_numpy(dummy[n]) for n in LLM_STEP.input_names), path,
                LLM_STEP.input_names, LLM_STEP.output_names, LLM_STEP.dynamic_axes(), 17)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for past, seq in ((0, up["lm_input"].shape[1]), (23, 1), (9, 5)):
        x, kv = chained_inputs(lm, step, cfg, up, past, seq)
        with torch.no_grad():
            want, want_kv = step(x, kv)
        got, got_kv = sess.run(None, {"inputs_embeds": x.numpy(), "past_key_values": kv.numpy()})
        assert rel_err(got, want) <= TOL
        assert rel_err(got_kv, want_kv) <= TOL
