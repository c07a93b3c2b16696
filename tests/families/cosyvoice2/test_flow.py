"""Flow: encoder and estimator ONNX export against ONNX Runtime, streaming causality, CFM reference."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from cosycompile.families.cosyvoice2.flow import FlowEncoderStep
from cosycompile.families.cosyvoice2.flow_encoder import EspnetRelPositionalEncoding

EST_INPUTS = ["x", "mask", "mu", "t", "spks", "cond"]


def _export(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]]) -> ort.InferenceSession:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=axes,
                          opset_version=18, dynamo=False, do_constant_folding=True)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _est_args(T: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return r(2, 80, T), torch.ones(2, 1, T), r(2, 80, T), torch.rand(2, generator=g), r(2, 80), r(2, 80, T)


def test_estimator_exports_and_matches_ort(tiny_models: Any, tmp_path: Path) -> None:
    est = tiny_models.flow.decoder.estimator.eval()
    axes = {n: {2: "seq_len"} for n in ("x", "mask", "mu", "cond", "estimator_out")}
    sess = _export(est, _est_args(64), tmp_path / "estimator.onnx", EST_INPUTS, ["estimator_out"], axes)
    for T in (16, 100, 512):
        args = _est_args(T, seed=T)
        with torch.inference_mode():
            ref = est(*args)
        out = sess.run(None, {n: a.numpy() for n, a in zip(EST_INPUTS, args)})[0]
        assert out.shape == (2, 80, T)
        assert float(ref.std()) > 1e-2, "estimator output should not be degenerate"
        assert np.abs(out - ref.numpy()).max() < 1e-4, T


def test_estimator_streaming_mask_is_chunk_causal(tiny_models: Any) -> None:
    est = tiny_models.flow.decoder.estimator.eval()
    args = _est_args(100)
    short = tuple(a[..., :60] if a.dim() == 3 else a for a in args)
    with torch.inference_mode():
        full = est(*args, streaming=True)
        part = est(*short, streaming=True)
        full_ns = est(*args)
        part_ns = est(*short)
    # The first 50-frame chunk cannot see later chunks when streaming; without streaming it can.
    torch.testing.assert_close(full[..., :50], part[..., :50], atol=1e-5, rtol=1e-5)
    assert float((full_ns[..., :50] - part_ns[..., :50]).abs().max()) > 1e-4


def test_relative_positions_equal_upstream_table() -> None:
    """Upstream slices a table of max_len rows each way; ours computes the same rows on the fly."""
    d, max_len, T = 64, 100, 37
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * -(math.log(10000.0) / d))
    pe_pos, pe_neg = torch.zeros(max_len, d), torch.zeros(max_len, d)
    pe_pos[:, 0::2], pe_pos[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    pe_neg[:, 0::2], pe_neg[:, 1::2] = torch.sin(-1 * pos * div), torch.cos(-1 * pos * div)
    table = torch.cat([torch.flip(pe_pos, [0]), pe_neg[1:]], dim=0)[None]
    centre = table.size(1) // 2
    x, pe = EspnetRelPositionalEncoding(d)(torch.ones(1, T, d))
    assert torch.equal(pe, table[:, centre - T + 1: centre + T])
    assert torch.allclose(x, torch.full_like(x, math.sqrt(d)))


def test_encoder_context_reproduces_the_streamed_prefix(tiny_models: Any) -> None:
    """A chunk encoded with its look-ahead tokens as context equals the same chunk inside a longer stream."""
    flow = tiny_models.flow
    chunk, look = flow.cfg.encoder_chunk_size, flow.cfg.pre_lookahead_len
    tokens = torch.randint(0, flow.cfg.vocab_size, (1, 2 * chunk + 5), generator=torch.Generator().manual_seed(3))
    x = flow.input_embedding(tokens)
    with torch.inference_mode():
        long = flow.encoder(x, streaming=True)
        first = flow.encoder(x[:, :chunk], context=x[:, chunk: chunk + look], streaming=True)
    assert first.shape[1] == 2 * chunk
    torch.testing.assert_close(first, long[:, : 2 * chunk], atol=1e-5, rtol=1e-5)


def test_flow_encoder_step_exports_and_matches_ort(tiny_models: Any, tmp_path: Path) -> None:
    step = FlowEncoderStep(tiny_models.flow).eval()
    example = (torch.randint(0, 6561, (1, 20)), torch.randn(1, 192))
    sess = _export(step, example, tmp_path / "flow_encoder.onnx", ["token", "embedding"], ["mu", "spks"],
                   {"token": {1: "tokens"}, "mu": {2: "frames"}})
    for N in (3, 50, 300):
        token = torch.randint(0, 6561, (1, N), generator=torch.Generator().manual_seed(N))
        emb = torch.randn(1, 192, generator=torch.Generator().manual_seed(N))
        with torch.inference_mode():
            mu, spks = step(token, emb)
        o_mu, o_spks = sess.run(None, {"token": token.numpy(), "embedding": emb.numpy()})
        assert o_mu.shape == tuple(mu.shape) == (1, 80, 2 * N)
        assert spks.shape == (1, 80)
        assert np.abs(o_mu - mu.numpy()).max() < 1e-4
        assert np.abs(o_spks - spks.numpy()).max() < 1e-5


def test_fixed_noise_is_upstreams_seed_zero_draw(tiny_models: Any) -> None:
    noise = tiny_models.flow.decoder.rand_noise
    with torch.random.fork_rng():
        torch.manual_seed(0)
        expected = torch.randn(1, 80, 50 * 300)
    assert torch.equal(noise, expected)


def test_inference_matches_the_pipeline_solver(tiny_models: Any) -> None:
    """flow.inference (torch CFM) and the build pipeline's numpy CFM give the same mel."""
    from cosycompile.runtime.pipeline import Prompt
    from cosycompile.reference.runners import reference_runtime

    flow = tiny_models.flow
    g = torch.Generator().manual_seed(5)
    token = torch.randint(0, 6561, (1, 30), generator=g)
    prompt_token = torch.randint(0, 6561, (1, 8), generator=g)
    prompt_mel = torch.randn(1, 80, 16, generator=g) - 4
    emb = torch.randn(1, 192, generator=g)
    mel = flow.inference(token, prompt_token, prompt_mel.transpose(1, 2), emb)
    assert mel.shape == (1, 80, 60)
    assert torch.isfinite(mel).all() and float(mel.std()) > 1e-2
    prompt = Prompt(np.zeros(0, np.int64), prompt_token[0].numpy(), prompt_mel[0].numpy(), emb[0].numpy())
    ref = reference_runtime("flow", tiny_models).mel(token[0].numpy(), prompt)
    assert np.abs(ref - mel[0].numpy()).max() < 1e-4


@pytest.mark.parametrize("streaming", [False, True])
def test_unfinalized_chunk_holds_back_the_look_ahead_tokens(tiny_models: Any, streaming: bool) -> None:
    flow = tiny_models.flow
    g = torch.Generator().manual_seed(9)
    token, prompt_token = torch.randint(0, 6561, (1, 20), generator=g), torch.randint(0, 6561, (1, 4), generator=g)
    prompt_feat, emb = torch.randn(1, 8, 80, generator=g), torch.randn(1, 192, generator=g)
    done = flow.inference(token, prompt_token, prompt_feat, emb, finalize=True, streaming=streaming)
    part = flow.inference(token, prompt_token, prompt_feat, emb, finalize=False, streaming=streaming)
    assert done.shape == (1, 80, 40)
    assert part.shape == (1, 80, 40 - 2 * flow.cfg.pre_lookahead_len)
    assert torch.isfinite(part).all()
