"""CosyVoice3's networks equal upstream's own classes in FP32, and load upstream's state dicts strictly.

The fixtures under tests/data/cv3_upstream/ were written by make_upstream_fixtures.py (beside this
file) running upstream FunAudioLLM/CosyVoice's code at the commit it names, with the tiny shapes of
``cv3_tiny()``; shapes_0_5b.json holds upstream's keys and shapes at the 0.5B config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosycompile.families.cosyvoice3.config import CosyVoice3Config, cv3_0_5b, cv3_tiny
from cosycompile.families.cosyvoice3.flow import CausalMaskedDiffWithDiT
from cosycompile.families.cosyvoice3.hift import CausalHiFTGenerator, Snake
from cosycompile.families.cosyvoice3.lm import CosyVoice3LM
from families.upstream_fixtures import read_npz, read_state, rel_err

DATA = Path(__file__).resolve().parents[2] / "data" / "cv3_upstream"
TOL = 1e-5


@pytest.fixture(scope="module")
def cfg() -> CosyVoice3Config:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return cv3_tiny()


@pytest.fixture(scope="module")
def flow(cfg: CosyVoice3Config) -> CausalMaskedDiffWithDiT:
    net = CausalMaskedDiffWithDiT(cfg.flow).eval()
    net.load_state_dict(read_state(DATA, "flow"), strict=True)
    return net


@pytest.fixture(scope="module")
def hift(cfg: CosyVoice3Config) -> CausalHiFTGenerator:
    net = CausalHiFTGenerator(cfg.hift).eval()
    net.load_state_dict(read_state(DATA, "hift"), strict=True)
    d = read_npz(DATA, "hift")
    net.set_noise(d["in_rand_ini"], d["in_sine_waves"])
    return net


@pytest.fixture(scope="module")
def lm(cfg: CosyVoice3Config) -> CosyVoice3LM:
    net = CosyVoice3LM(cfg.lm).eval()
    net.load_state_dict(read_state(DATA, "lm"), strict=True)
    return net


# -- numerics ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [16, 100, 500])
@pytest.mark.parametrize("streaming", [False, True], ids=["full", "stream"])
def test_dit_estimator_equals_upstream(flow: CausalMaskedDiffWithDiT, T: int, streaming: bool) -> None:
    d = read_npz(DATA, "dit")
    with torch.inference_mode():
        out = flow.decoder.estimator(d[f"in_x_{T}"], d[f"mask_{T}"], d[f"in_mu_{T}"], d[f"in_t_{T}"],
                                     d[f"in_spks_{T}"], d[f"in_cond_{T}"], streaming=streaming)
    assert rel_err(out, d[f"out_{T}_{'stream' if streaming else 'full'}"]) <= TOL


def test_streaming_mask_matters_at_100_frames() -> None:
    """The chunked mask must change the output past one 50-frame chunk, else the streaming check proves nothing."""
    d = read_npz(DATA, "dit")
    assert rel_err(d["out_100_stream"], d["out_100_full"]) > 1e-3
    assert rel_err(d["out_100_stream"][..., :50], d["out_100_full"][..., :50]) > 1e-3  # chunk 1 no longer sees chunk 2


@pytest.mark.parametrize("streaming", [False, True], ids=["full", "stream"])
@pytest.mark.parametrize("finalize", [True, False], ids=["final", "chunk"])
def test_cfm_mel_equals_upstream(flow: CausalMaskedDiffWithDiT, streaming: bool, finalize: bool) -> None:
    d = read_npz(DATA, "flow")
    mel = flow.inference(d["token"], d["prompt_token"], d["in_prompt_feat"], d["in_embedding"],
                         streaming=streaming, finalize=finalize)
    ref = d[f"mel_{'stream' if streaming else 'full'}_{'final' if finalize else 'chunk'}"]
    assert rel_err(mel, ref) <= TOL


def test_cfm_streaming_matters() -> None:
    """72 frames span two chunks: upstream's streaming mel differs from the full-context one."""
    d = read_npz(DATA, "flow")
    assert d["mel_full_final"].shape[-1] == 60
    assert rel_err(d["mel_stream_final"], d["mel_full_final"]) > 1e-3


def test_hift_f0_equals_upstream(hift: CausalHiFTGenerator) -> None:
    d = read_npz(DATA, "hift")
    with torch.inference_mode():
        f0 = hift.predict_f0(d["in_mel"])
    assert rel_err(f0, d["f0"]) <= TOL
    # Upstream turns its predictor float64 in place; ours must stay float32 for exports.
    assert {p.dtype for p in hift.f0_predictor.parameters()} == {torch.float32}


@pytest.mark.parametrize("finalize", [True, False], ids=["final", "chunk"])
def test_hift_waveform_equals_upstream(hift: CausalHiFTGenerator, finalize: bool) -> None:
    d = read_npz(DATA, "hift")
    wav, source = hift.inference(d["in_mel"], finalize=finalize)
    suffix = "" if finalize else "_chunk"
    assert rel_err(source, d["source" + suffix]) <= TOL
    assert rel_err(wav, d["wav" + suffix]) <= TOL


def test_lm_prefill_and_decode_equal_upstream(lm: CosyVoice3LM) -> None:
    d = read_npz(DATA, "lm")
    with torch.inference_mode():
        emb = lm.prompt_embeddings(d["text"], d["prompt_text"], d["prompt_speech_token"])
        prefill, cache = lm.step(emb)
        assert rel_err(prefill, d["prefill_logits"]) <= TOL
        token = int(prefill[0, -1].argmax())
        assert token == int(d["next_token"][0])
        decode, _ = lm.step(lm.speech_embedding.weight[token].reshape(1, 1, -1), cache)
    assert rel_err(decode, d["decode_logits"]) <= TOL
    # Upstream's own decode call, whose mask covers only the new position, is honoured by
    # transformers >= 5 and then differs: the fixture must be able to tell the two apart.
    assert rel_err(d["decode_logits_short_mask"], d["decode_logits"]) > 1e-3


def test_lm_special_ids() -> None:
    lm_cfg = cv3_0_5b().lm
    with torch.device("meta"):
        lm = CosyVoice3LM(lm_cfg)
    assert (lm.sos, lm.eos_token, lm.task_id, lm.fill_token) == (6561, 6562, 6563, 6564)
    assert lm.stop_token_ids == list(range(6561, 6761))
    assert lm.llm_decoder.bias is None
    logp = torch.zeros(2, 6761)
    masked = lm.mask_before_min_len(logp)
    assert torch.isinf(masked[:, 6561]).all() and torch.isfinite(masked[:, 6562]).all()


def test_snake_keeps_tiny_alphas_finite_in_fp32() -> None:
    """hift.pt has alphas below 1.6e-5, whose reciprocal overflows FP16; FP32 must stay finite and exact."""
    snake = Snake(3)
    with torch.no_grad():
        snake.alpha.copy_(torch.tensor([8e-6, 1.2e-5, 1.0]))
    x = torch.linspace(-3, 3, 7).repeat(1, 3, 1)
    y = snake(x)
    assert torch.isfinite(y).all()
    a = snake.alpha.double()[None, :, None]
    ref = x.double() + (1.0 / (a + 1e-9)) * torch.sin(x.double() * a) ** 2
    assert rel_err(y, ref) <= 1e-6
    assert torch.isinf(1.0 / (snake.alpha.half() + 1e-9)).any()  # the hazard a FP16 build must avoid


# -- keys -------------------------------------------------------------------------------------------
def test_0_5b_shapes_equal_upstream() -> None:
    """Our 0.5B networks (built on the meta device) have exactly upstream's keys and shapes."""
    ref = json.loads((DATA / "shapes_0_5b.json").read_text())
    big = cv3_0_5b()
    with torch.device("meta"):
        nets = {"flow": CausalMaskedDiffWithDiT(big.flow), "hift": CausalHiFTGenerator(big.hift),
                "lm": CosyVoice3LM(big.lm)}
    for name, net in nets.items():
        ours = {k: list(v.shape) for k, v in net.state_dict().items()}
        assert sorted(set(ours) ^ set(ref[name])) == [], name
        assert {k: s for k, s in ours.items() if s != ref[name][k]} == {}, name
    assert ref["flow"]["decoder.estimator.transformer_blocks.21.attn.to_q.weight"] == [1024, 1024]
    assert ref["flow"]["pre_lookahead_layer.conv1.weight"] == [1024, 80, 4]
    assert ref["lm"]["llm_decoder.weight"] == [6761, 896]
    assert ref["lm"]["speech_embedding.weight"] == [6761, 896]
    assert ref["hift"]["conv_pre.parametrizations.weight.original1"] == [512, 80, 5]
