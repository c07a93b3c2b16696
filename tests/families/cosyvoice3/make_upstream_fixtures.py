"""Write the fixtures that pin cosycompile's CosyVoice3 networks to upstream's own classes (FP32).

Runs upstream FunAudioLLM/CosyVoice at commit ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40
("Merge pull request #1850 from yuekaizhang/cosy3_pr", 2026-03-16): ``CosyVoice3LM`` with its
``Qwen2Encoder``, ``CausalMaskedDiffWithDiT`` with ``PreLookaheadLayer``, ``CausalConditionalCFM`` and
the ``DiT`` estimator, ``CausalHiFTGenerator`` with ``CausalConvRNNF0Predictor``, all built with the
tiny shapes of ``cv3_tiny()``, seeded, and writes to ``tests/data/cv3_upstream/``:

- ``{lm,flow,hift}.pt``: upstream's state dicts (the tests load them into our classes with strict=True);
- ``{lm,dit,flow,hift}.npz``: inputs and upstream's outputs;
- ``shapes_0_5b.json``: every key and shape of upstream's three networks at the 0.5B config
  (built on the meta device, nothing allocated).

Re-run (no network needed once the mirror and packages are here), from the repository root::

    .venv/bin/python tests/families/cosyvoice3/make_upstream_fixtures.py <upstream>

``<upstream>`` is a source tree of upstream or a git directory holding the commit above (for
example the bare mirror the search tool's ``fetch github:FunAudioLLM/CosyVoice`` leaves under
/work/.mirror); from a git directory the ``cosyvoice/`` folder of that commit is exported to a
temporary folder first. ``--commit`` picks another commit (the tests then compare against it).

Extra packages, in the venv only (not project dependencies): ``x-transformers==2.11.24`` (the
version upstream's requirements.txt pins; it brings ``einops``, ``einx``, ``loguru``), for the DiT's
rotary embedding. Upstream imports that the networks do not run are stubbed, not installed:
``torchaudio`` (mel front end), ``cosyvoice.utils.onnx`` (ONNX front ends), ``omegaconf.DictConfig``
(a dict with attribute access), ``matcha...BASECFM`` (only sets attributes; Matcha-TTS is a
submodule upstream) and ``cosyvoice.utils.class_utils`` (a registry that imports the whole CLI).

The LM runs on the transformers in the venv (>= 5); upstream pins 4.51.3, which ignored the
attention mask that ``Qwen2Encoder.forward_one_step`` passes. Upstream's decode step passes a mask
as long as the new positions only; the script records the decode logits with upstream's call and
also with the cache fully visible (what 4.51 computed) and writes the latter, after checking
whether the two agree (it prints the difference).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "tests" / "data" / "cv3_upstream"
COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cosycompile.families.cosyvoice3.config import CosyVoice3Config, cv3_0_5b, cv3_tiny  # noqa: E402
from upstream_source import source_tree  # noqa: E402


# -- upstream on sys.path -------------------------------------------------------------------------
def install_stubs() -> None:
    """Modules upstream imports at module level but never runs on the paths used here."""

    def module(name: str, **attrs: object) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    if "torchaudio" not in sys.modules:
        try:
            import torchaudio  # noqa: F401
        except ImportError:
            ta = module("torchaudio")
            ta.compliance = module("torchaudio.compliance")
            ta.compliance.kaldi = module("torchaudio.compliance.kaldi")
            ta.transforms = module("torchaudio.transforms")

    class DictConfig(dict):
        """omegaconf.DictConfig as far as upstream reads it: attribute access to keys."""

        def __getattr__(self, key: str) -> object:
            try:
                return self[key]
            except KeyError as e:
                raise AttributeError(key) from e

    module("omegaconf", DictConfig=DictConfig)

    class BASECFM(torch.nn.Module):
        """Matcha-TTS's BASECFM.__init__: stores the settings, holds no weights."""

        def __init__(self, n_feats: int, cfm_params: DictConfig, n_spks: int = 1, spk_emb_dim: int = 128) -> None:
            super().__init__()
            self.n_feats, self.n_spks, self.spk_emb_dim = n_feats, n_spks, spk_emb_dim
            self.solver = cfm_params.solver
            self.sigma_min = cfm_params.get("sigma_min", 1e-4)
            self.estimator = None

    module("matcha")
    module("matcha.models")
    module("matcha.models.components")
    module("matcha.models.components.flow_matching", BASECFM=BASECFM)
    module("cosyvoice.utils.onnx", SpeechTokenExtractor=None, EmbeddingExtractor=None, online_feature=False,
           onnx_path=None, embedding_extractor=None)
    module("cosyvoice.utils.class_utils", COSYVOICE_EMB_CLASSES={}, COSYVOICE_SUBSAMPLE_CLASSES={},
           COSYVOICE_ATTENTION_CLASSES={}, COSYVOICE_ACTIVATION_CLASSES={})


def import_upstream() -> None:
    """Import the upstream modules used here with the stubs in place, then take the ``torchaudio``
    stub out again: transformers probes for torchaudio lazily and would trip over a stub."""
    import transformers
    from transformers import Qwen2ForCausalLM  # noqa: F401  (resolved before any stub exists)

    install_stubs()
    import cosyvoice.flow.DiT.dit  # noqa: F401
    import cosyvoice.flow.flow  # noqa: F401
    import cosyvoice.flow.flow_matching  # noqa: F401
    import cosyvoice.hifigan.f0_predictor  # noqa: F401
    import cosyvoice.hifigan.generator  # noqa: F401
    import cosyvoice.llm.llm  # noqa: F401
    import cosyvoice.transformer.upsample_encoder  # noqa: F401

    for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
        if getattr(sys.modules[name], "__spec__", None) is None:
            del sys.modules[name]
    assert transformers


# -- building upstream's networks -----------------------------------------------------------------
def cfm_params(cfg: CosyVoice3Config) -> object:
    from omegaconf import DictConfig

    f = cfg.flow
    return DictConfig({"sigma_min": f.sigma_min, "solver": "euler", "t_scheduler": f.t_scheduler,
                       "training_cfg_rate": 0.2, "inference_cfg_rate": f.inference_cfg_rate, "reg_loss_type": "l1"})


def build_flow(cfg: CosyVoice3Config) -> torch.nn.Module:
    """upstream CausalMaskedDiffWithDiT as cosyvoice3.yaml nests it (inner objects first)."""
    from cosyvoice.flow.DiT.dit import DiT
    from cosyvoice.flow.flow import CausalMaskedDiffWithDiT
    from cosyvoice.flow.flow_matching import CausalConditionalCFM
    from cosyvoice.transformer.upsample_encoder import PreLookaheadLayer

    f, e = cfg.flow, cfg.flow.estimator
    pre = PreLookaheadLayer(in_channels=f.input_size, channels=f.pre_lookahead_channels,
                            pre_lookahead_len=f.pre_lookahead_len)
    dit = DiT(dim=e.dim, depth=e.depth, heads=e.heads, dim_head=e.dim_head, ff_mult=e.ff_mult, mel_dim=e.mel_dim,
              mu_dim=e.mu_dim, spk_dim=e.spk_dim, out_channels=e.out_channels, static_chunk_size=e.static_chunk_size,
              num_decoding_left_chunks=e.num_decoding_left_chunks)
    cfm = CausalConditionalCFM(in_channels=240, cfm_params=cfm_params(cfg), n_spks=1, spk_emb_dim=80, estimator=dit)
    return CausalMaskedDiffWithDiT(input_size=f.input_size, output_size=f.output_size, spk_embed_dim=f.spk_embed_dim,
                                   output_type="mel", vocab_size=f.vocab_size, input_frame_rate=cfg.token_frame_rate,
                                   only_mask_loss=True, token_mel_ratio=f.token_mel_ratio,
                                   pre_lookahead_len=f.pre_lookahead_len, pre_lookahead_layer=pre, decoder=cfm)


def build_hift(cfg: CosyVoice3Config) -> torch.nn.Module:
    from cosyvoice.hifigan.f0_predictor import CausalConvRNNF0Predictor
    from cosyvoice.hifigan.generator import CausalHiFTGenerator

    h = cfg.hift
    f0 = CausalConvRNNF0Predictor(num_class=h.f0_num_class, in_channels=h.in_channels, cond_channels=h.f0_cond_channels)
    return CausalHiFTGenerator(
        in_channels=h.in_channels, base_channels=h.base_channels, nb_harmonics=h.nb_harmonics,
        sampling_rate=h.sampling_rate, nsf_alpha=h.nsf_alpha, nsf_sigma=h.nsf_sigma,
        nsf_voiced_threshold=h.nsf_voiced_threshold, upsample_rates=list(h.upsample_rates),
        upsample_kernel_sizes=list(h.upsample_kernel_sizes),
        istft_params={"n_fft": h.istft_n_fft, "hop_len": h.istft_hop_len},
        resblock_kernel_sizes=list(h.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in h.resblock_dilation_sizes],
        source_resblock_kernel_sizes=list(h.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(d) for d in h.source_resblock_dilation_sizes],
        lrelu_slope=h.lrelu_slope, audio_limit=h.audio_limit, conv_pre_look_right=h.conv_pre_look_right,
        f0_predictor=f0)


def qwen_config(cfg: CosyVoice3Config) -> object:
    from transformers import Qwen2Config

    c = cfg.lm
    return Qwen2Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                       num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                       num_key_value_heads=c.num_kv_heads, hidden_act="silu",
                       max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
                       rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings, use_sliding_window=False)


def build_lm(cfg: CosyVoice3Config, qwen_dir: Path | None) -> torch.nn.Module:
    """upstream CosyVoice3LM. With ``qwen_dir`` its Qwen2Encoder loads that folder as upstream does;
    without (the meta-device 0.5B build) the encoder is given a freshly built body instead."""
    from cosyvoice.llm.llm import CosyVoice3LM, Qwen2Encoder

    if qwen_dir is not None:
        enc = Qwen2Encoder(str(qwen_dir))
    else:
        from transformers import Qwen2ForCausalLM

        enc = Qwen2Encoder.__new__(Qwen2Encoder)
        torch.nn.Module.__init__(enc)
        enc.model = Qwen2ForCausalLM(qwen_config(cfg))
    c = cfg.lm
    return CosyVoice3LM(llm_input_size=c.hidden_size, llm_output_size=c.hidden_size,
                        speech_token_size=c.speech_token_size, llm=enc, sampling=None)


# -- fixtures -------------------------------------------------------------------------------------
def half_exact(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Random float32 values that float16 holds exactly, so inputs are stored at half the size."""
    return (torch.randn(*shape) * scale + shift).half().float()


def round_to_half(net: torch.nn.Module) -> None:
    """Round every parameter to a float16 value (kept float32): the .pt files then store them as
    float16 without loss, half the size. Buffers (the DiT's rotary ``inv_freq``) keep upstream's values."""
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(p.half().float())


def half_state_dict(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with parameters as float16 (exact after :func:`round_to_half`), buffers as they are."""
    params = {k for k, _ in net.named_parameters(remove_duplicate=False)}
    return {k: v.half() if k in params and v.is_floating_point() else v for k, v in net.state_dict().items()}


def voice_like_f0(hift: torch.nn.Module, cfg: CosyVoice3Config) -> None:
    """Scale the F0 head so a random mel gives 100..200 Hz or so: the voiced sine path runs, and the
    phase integrates a varying F0 (random weights alone give a few Hz, all unvoiced)."""
    torch.manual_seed(5)
    mel = half_exact(1, 80, 16, scale=2.0, shift=-4.0)
    head = hift.f0_predictor.classifier
    head.bias.zero_()
    raw = hift.f0_predictor(mel).flatten()
    head.weight.mul_(30.0 / float(raw.std() + 1e-6))
    head.bias.fill_(150.0)


def save_npz(name: str, arrays: dict[str, torch.Tensor]) -> None:
    out = {}
    for k, v in arrays.items():
        a = v.detach().cpu().numpy()
        # Inputs made by half_exact go to disk as float16 (exact); outputs stay float32.
        out[k] = a.astype(np.float16) if k.startswith("in_") and a.dtype == np.float32 else a
    np.savez_compressed(OUT / f"{name}.npz", **out)


def dit_fixtures(flow: torch.nn.Module) -> None:
    """The estimator alone: batch 2 (second item padded) at T = 16 and 100, batch 1 at T = 500; both masks."""
    dit = flow.decoder.estimator
    arrays: dict[str, torch.Tensor] = {}
    for T, B in ((16, 2), (100, 2), (500, 1)):
        torch.manual_seed(T)
        x, mu, cond = half_exact(B, 80, T), half_exact(B, 80, T), half_exact(B, 80, T)
        spks, t = half_exact(B, 80), torch.rand(B).half().float()
        mask = torch.ones(B, 1, T)
        if B == 2:
            mask[1, :, T - T // 4:] = 0
        arrays |= {f"in_x_{T}": x, f"in_mu_{T}": mu, f"in_cond_{T}": cond, f"in_spks_{T}": spks, f"in_t_{T}": t,
                   f"mask_{T}": mask}
        with torch.inference_mode():
            for streaming in (False, True):
                arrays[f"out_{T}_{'stream' if streaming else 'full'}"] = dit(x, mask, mu, t, spks, cond,
                                                                             streaming=streaming)
    save_npz("dit", arrays)


def flow_fixtures(flow: torch.nn.Module, cfg: CosyVoice3Config) -> None:
    """The whole flow.inference: 10-step CFM mel from the CFM's fixed noise; streaming and not, finalized and not."""
    torch.manual_seed(1)
    token = torch.randint(0, cfg.flow.vocab_size, (1, 30))  # 72 frames with the prompt: past one 50-frame chunk
    prompt_token = torch.randint(0, cfg.flow.vocab_size, (1, 6))
    prompt_feat = half_exact(1, 12, 80)
    embedding = half_exact(1, cfg.flow.spk_embed_dim)
    arrays = {"token": token, "prompt_token": prompt_token, "in_prompt_feat": prompt_feat, "in_embedding": embedding}
    for streaming in (False, True):
        for finalize in (True, False):
            mel, _ = flow.inference(token, torch.tensor([token.shape[1]]), prompt_token,
                                    torch.tensor([prompt_token.shape[1]]), prompt_feat,
                                    torch.tensor([prompt_feat.shape[1]]), embedding, streaming=streaming,
                                    finalize=finalize)
            arrays[f"mel_{'stream' if streaming else 'full'}_{'final' if finalize else 'chunk'}"] = mel
    save_npz("flow", arrays)


def hift_fixtures(hift: torch.nn.Module, cfg: CosyVoice3Config) -> None:
    """The causal vocoder, finalized and streaming, with the source's fixed randomness replaced by
    small seeded tensors (saved) so that both sides read the same phases and noise."""
    T = 16
    torch.manual_seed(2)
    gen = hift.m_source.l_sin_gen
    h = cfg.hift.nb_harmonics + 1
    rand_ini = torch.rand(1, h).half().float()
    rand_ini[:, 0] = 0
    sine_waves = torch.rand(1, T * 480, h).half().float()
    gen.rand_ini, gen.sine_waves = rand_ini, sine_waves
    hift.m_source.uv = torch.rand(1, T * 480, 1)  # upstream's noise branch; the generator never reads it
    mel = half_exact(1, 80, T, scale=2.0, shift=-4.0)
    arrays: dict[str, torch.Tensor] = {"in_rand_ini": rand_ini, "in_sine_waves": sine_waves, "in_mel": mel}
    with torch.inference_mode():
        f0 = hift.f0_predictor.to(torch.float64)(mel.to(torch.float64)).float()
        wav, s = hift.inference(mel, finalize=True)
        wav_chunk, s_chunk = hift.inference(mel, finalize=False)
    arrays |= {"f0": f0, "source": s, "wav": wav, "source_chunk": s_chunk, "wav_chunk": wav_chunk}
    save_npz("hift", arrays)
    print(f"hift: f0 {f0.min():.1f}..{f0.max():.1f} Hz, voiced {(f0 > cfg.hift.nsf_voiced_threshold).float().mean():.2f}")


def lm_fixtures(lm: torch.nn.Module, cfg: CosyVoice3Config) -> None:
    """Prefill logits of [sos | prompt text, text | task_id | prompt speech], then one KV-cache decode step,
    built and run with upstream's own modules and calls (``inference`` minus its sampling and assert)."""
    torch.manual_seed(3)
    c = cfg.lm
    text = torch.randint(0, c.vocab_size, (1, 7))
    prompt_text = torch.randint(0, c.vocab_size, (1, 4))
    prompt_speech = torch.randint(0, c.speech_token_size, (1, 5))
    with torch.inference_mode():
        text_emb = lm.llm.model.model.embed_tokens(torch.cat([prompt_text, text], dim=1))
        sos_emb = lm.speech_embedding.weight[lm.sos].reshape(1, 1, -1)
        task_id_emb = lm.speech_embedding.weight[lm.task_id].reshape(1, 1, -1)
        lm_input = torch.cat([sos_emb, text_emb, task_id_emb, lm.speech_embedding(prompt_speech)], dim=1)
        S = lm_input.shape[1]
        y, cache = lm.llm.forward_one_step(lm_input, masks=torch.tril(torch.ones(1, S, S)).to(torch.bool), cache=None)
        prefill = lm.llm_decoder(y)
        next_token = int(prefill[0, -1].argmax())
        step_in = lm.speech_embedding.weight[next_token].reshape(1, 1, -1)
        # Upstream's own call: a mask of the new position only.
        y_up, _ = lm.llm.forward_one_step(step_in, masks=torch.ones(1, 1, 1, dtype=torch.bool), cache=cache_copy(cache))
        # The cache fully visible (what transformers 4.51 computed for that call).
        y_full, _ = lm.llm.forward_one_step(step_in, masks=torch.ones(1, 1, S + 1, dtype=torch.bool), cache=cache)
        decode_up, decode = lm.llm_decoder(y_up), lm.llm_decoder(y_full)
    diff = float((decode_up - decode).abs().max() / decode.abs().max())
    print(f"lm: decode logits, upstream's short mask vs full cache: relative difference {diff:.2e}")
    save_npz("lm", {"text": text, "prompt_text": prompt_text, "prompt_speech_token": prompt_speech,
                    "prefill_logits": prefill, "next_token": torch.tensor([next_token]), "decode_logits": decode,
                    "decode_logits_short_mask": decode_up})


def cache_copy(cache: object) -> object:
    import copy

    return copy.deepcopy(cache)


def shapes(module: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in module.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("upstream", type=Path, help="upstream source tree, or a git dir holding the commit")
    ap.add_argument("--commit", default=COMMIT)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree, rev = source_tree(args.upstream.resolve(), args.commit, ["cosyvoice"], Path(tmp))
        sys.path.insert(0, str(tree))
        import_upstream()
        torch.set_num_threads(2)
        cfg = cv3_tiny()

        torch.manual_seed(0)
        flow = build_flow(cfg).eval()
        torch.manual_seed(0)
        hift = build_hift(cfg).eval()
        with torch.no_grad():  # varied alphas, a few below 1.6e-5 like the released hift.pt
            for name, p in hift.named_parameters():
                if name.endswith("alpha"):
                    p.copy_(torch.rand(p.shape) + 0.3)
            hift.resblocks[0].activations1[0].alpha[:2] = torch.tensor([1.2e-5, 8e-6])
            voice_like_f0(hift, cfg)
        from transformers import Qwen2ForCausalLM

        torch.manual_seed(0)
        qwen_dir = Path(tmp) / "qwen"
        Qwen2ForCausalLM(qwen_config(cfg)).save_pretrained(qwen_dir)
        lm = build_lm(cfg, qwen_dir).eval()
        for net in (flow, hift, lm):
            round_to_half(net)

        for name, net in (("flow", flow), ("hift", hift), ("lm", lm)):
            # Saved before the run: upstream's HiFT turns its F0 predictor float64 at inference.
            torch.save(half_state_dict(net), OUT / f"{name}.pt")
        dit_fixtures(flow)
        flow_fixtures(flow, cfg)
        hift_fixtures(hift, cfg)
        lm_fixtures(lm, cfg)

        big = cv3_0_5b()
        with torch.device("meta"):
            record = {"flow": shapes(build_flow(big)), "hift": shapes(build_hift(big)), "lm": shapes(build_lm(big, None))}
        record["_source"] = {"repository": "FunAudioLLM/CosyVoice", "commit": rev,
                             "config": dataclasses.asdict(big)["flow"]["estimator"]}
        (OUT / "shapes_0_5b.json").write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
        (OUT / "SOURCE.txt").write_text(
            f"Written by tests/families/cosyvoice3/make_upstream_fixtures.py from FunAudioLLM/CosyVoice {rev}\n"
            f"(torch {torch.__version__}; transformers {__import__('transformers').__version__}).\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT} ({total / 1e6:.2f} MB) from upstream {rev}")


if __name__ == "__main__":
    main()
