"""Write the fixtures that pin cosycompile's CosyVoice-300M flow and HiFT vocoder to upstream's own classes (FP32).

Runs upstream FunAudioLLM/CosyVoice at commit ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40 with its
Matcha-TTS submodule at shivammehta25/Matcha-TTS dd9105b34bf2be2230f4aa1e4769fb586a3c824e:
``MaskedDiffWithXvec`` with ``ConformerEncoder``, ``InterpolateRegulator``, ``ConditionalCFM`` and the
non-causal ``ConditionalDecoder`` (Matcha's blocks), and ``HiFTGenerator`` with ``ConvRNNF0Predictor``,
all built with the tiny shapes of ``cv1_tiny()`` as ``examples/libritts/cosyvoice/conf/cosyvoice.yaml``
nests them, seeded, and writes to ``tests/data/cv1_upstream/``:

- ``flow.pt``, ``hift.pt``: upstream's state dicts (parameters rounded to float16 values, stored as
  float16; the tests widen them and load them into our classes with strict=True). Upstream's init,
  with every 1-D parameter moved off its init value (zero biases and unit norm gains would hide a
  swapped or missing term), Snake alphas spread around 1, and the F0 head scaled so that the HiFT
  mel gives F0 up to ~300 Hz with a few frames under the 10 Hz voicing threshold;
- ``flow.npz``: two ``flow.inference`` calls with the CFM's start noise passed in (upstream draws
  ``randn_like(mu)``; the draw is replaced by the saved one): ``p_*`` a 4-token prompt with 7 prompt
  frames and 45 new tokens (past 40, so the regulator's head/mid/tail split runs), ``n_*`` no prompt
  and 23 new tokens (39 frames: odd). Each keeps the inputs, the encoder output before the regulator
  (``h``, [1, N, 80]), the regulated mu (``mu``, [1, T, 80]) and the mel (``mel``); ``n_est_*`` the
  inputs and output of the estimator's 4th call. ``pad_*``: the estimator alone, batch 2 at 15
  frames with the second item masked after 11. Arrays that float16 holds exactly are stored so;
- ``hift.npz``: ``HiFTGenerator.inference`` on a 12-frame mel. At 22,050 Hz upstream's source is the
  original ``SineGen``, whose two draws (the initial phases' ``Uniform(-pi, pi)``, i.e. ``torch.rand``,
  and the additive noise, ``torch.randn_like`` of [B, H, L]) are replaced by saved tensors
  (``in_rand_ini`` [1, H], the uniform draw; ``in_noise`` [1, L, H], the normal draw transposed to the
  layout cosycompile takes). Kept: ``f0``, ``source``, ``magnitude`` and ``phase`` (what upstream's
  ``_istft`` reads), ``wav``; and ``source_f64``, ``wav_f64`` (stored as float32): the same upstream
  code run in float64 from the same float32 F0 (default dtype float64, so that the buffers it makes
  with ``torch.zeros`` are float64 too), the reference for the sine phase, which upstream sums in
  float32 over the whole utterance;
- ``shapes_300m.json``: every key and shape of upstream's flow and hift at the 300M config (built
  on the meta device, nothing allocated), under ``flow`` and ``hift``.

Re-run (no network needed once the mirrors and packages are here), from the repository root::

    .venv/bin/python tests/families/cosyvoice/make_upstream_fixtures_flow.py <upstream> <matcha>

``<upstream>`` and ``<matcha>`` are each a source tree or a git directory holding the commit above
(for example the bare mirrors the search tool's ``fetch github:FunAudioLLM/CosyVoice`` and
``fetch github:shivammehta25/Matcha-TTS`` leave under /work/.mirror); from a git directory the
needed folders of that commit are exported to a temporary folder first.

Extra packages, in the venv only (not project dependencies): ``diffusers==0.29.0`` (the version
upstream's requirements.txt pins; Matcha's transformer block is built from its ``Attention``,
``GELU`` and ``LoRACompatibleLinear``; installed with ``--no-deps``, it imports with the venv's
huggingface_hub) and ``einops`` (Matcha's and upstream's decoder rearranges). Upstream imports that
these networks do not run are stubbed, not installed: ``conformer`` (Matcha's ``ConformerWrapper``,
not used by this decoder), ``matcha.utils.pylogger`` (would import lightning), ``cosyvoice.utils.onnx``
(ONNX front ends) and ``cosyvoice.utils.class_utils`` (the registry, rebuilt here from the same
``cosyvoice.transformer`` classes without its imports of the LMs and the CLI).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import tempfile
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "tests" / "data" / "cv1_upstream"
COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"
MATCHA_COMMIT = "dd9105b34bf2be2230f4aa1e4769fb586a3c824e"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cosycompile.families.cosyvoice.config import CosyVoiceConfig, cv1_300m, cv1_tiny  # noqa: E402
from upstream_source import source_tree  # noqa: E402


# -- upstream on sys.path -------------------------------------------------------------------------
def module(name: str, **attrs: object) -> types.ModuleType:
    """Register a stand-in module ``name`` holding ``attrs``."""
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def install_stubs() -> None:
    """Modules upstream imports at module level but never runs on the paths used here."""
    import logging

    class ConformerBlock(torch.nn.Module):
        """Stands in for the ``conformer`` package's block: Matcha subclasses it, this decoder never builds it."""

    module("conformer", ConformerBlock=ConformerBlock)
    module("matcha.utils", __path__=[])
    module("matcha.utils.pylogger", get_pylogger=logging.getLogger)
    module("cosyvoice.utils.onnx", SpeechTokenExtractor=None, EmbeddingExtractor=None, online_feature=False,
           onnx_path=None, embedding_extractor=None)

    from cosyvoice.transformer.activation import Swish
    from cosyvoice.transformer.attention import MultiHeadedAttention, RelPositionMultiHeadedAttention
    from cosyvoice.transformer.embedding import EspnetRelPositionalEncoding, PositionalEncoding, RelPositionalEncoding
    from cosyvoice.transformer.subsampling import LegacyLinearNoSubsampling, LinearNoSubsampling

    module("cosyvoice.utils.class_utils",
           COSYVOICE_ACTIVATION_CLASSES={"relu": torch.nn.ReLU, "swish": getattr(torch.nn, "SiLU", Swish),
                                         "gelu": torch.nn.GELU},
           COSYVOICE_SUBSAMPLE_CLASSES={"linear": LinearNoSubsampling, "linear_legacy": LegacyLinearNoSubsampling},
           COSYVOICE_EMB_CLASSES={"abs_pos": PositionalEncoding, "rel_pos": RelPositionalEncoding,
                                  "rel_pos_espnet": EspnetRelPositionalEncoding},
           COSYVOICE_ATTENTION_CLASSES={"selfattn": MultiHeadedAttention,
                                        "rel_selfattn": RelPositionMultiHeadedAttention})


def import_upstream() -> None:
    """Import the upstream modules used here, with the stubs in place."""
    install_stubs()
    import cosyvoice.flow.decoder  # noqa: F401
    import cosyvoice.flow.flow  # noqa: F401
    import cosyvoice.flow.flow_matching  # noqa: F401
    import cosyvoice.flow.length_regulator  # noqa: F401
    import cosyvoice.hifigan.f0_predictor  # noqa: F401
    import cosyvoice.hifigan.generator  # noqa: F401
    import cosyvoice.transformer.encoder  # noqa: F401


# -- building upstream's networks -----------------------------------------------------------------
def build_flow(cfg: CosyVoiceConfig) -> torch.nn.Module:
    """upstream MaskedDiffWithXvec as cosyvoice.yaml nests it (inner objects first)."""
    from omegaconf import DictConfig

    from cosyvoice.flow.decoder import ConditionalDecoder
    from cosyvoice.flow.flow import MaskedDiffWithXvec
    from cosyvoice.flow.flow_matching import ConditionalCFM
    from cosyvoice.flow.length_regulator import InterpolateRegulator
    from cosyvoice.transformer.encoder import ConformerEncoder

    f, e, est = cfg.flow, cfg.flow.encoder, cfg.flow.estimator
    encoder = ConformerEncoder(input_size=e.input_size, output_size=e.output_size, attention_heads=e.attention_heads,
                               linear_units=e.linear_units, num_blocks=e.num_blocks, dropout_rate=0.1,
                               positional_dropout_rate=0.1, attention_dropout_rate=0.1, normalize_before=True,
                               input_layer="linear", pos_enc_layer_type="rel_pos_espnet",
                               selfattention_layer_type="rel_selfattn", use_cnn_module=False, macaron_style=False)
    regulator = InterpolateRegulator(channels=f.output_size, sampling_ratios=list(f.regulator_sampling_ratios))
    estimator = ConditionalDecoder(in_channels=est.in_channels, out_channels=est.out_channels,
                                   channels=list(est.channels), dropout=0.0, attention_head_dim=est.attention_head_dim,
                                   n_blocks=est.n_blocks, num_mid_blocks=est.num_mid_blocks, num_heads=est.num_heads,
                                   act_fn="gelu")
    cfm_params = DictConfig({"sigma_min": 1e-06, "solver": "euler", "t_scheduler": "cosine", "training_cfg_rate": 0.2,
                             "inference_cfg_rate": f.inference_cfg_rate, "reg_loss_type": "l1"})
    cfm = ConditionalCFM(in_channels=240, n_spks=1, spk_emb_dim=80, cfm_params=cfm_params, estimator=estimator)
    return MaskedDiffWithXvec(input_size=f.input_size, output_size=f.output_size, spk_embed_dim=f.spk_embed_dim,
                              output_type="mel", vocab_size=f.vocab_size, input_frame_rate=f.input_frame_rate,
                              only_mask_loss=True, encoder=encoder, length_regulator=regulator, decoder=cfm)


def build_hift(cfg: CosyVoiceConfig) -> torch.nn.Module:
    """upstream HiFTGenerator with its ConvRNNF0Predictor, as cosyvoice.yaml builds them."""
    from cosyvoice.hifigan.f0_predictor import ConvRNNF0Predictor
    from cosyvoice.hifigan.generator import HiFTGenerator

    h = cfg.hift
    f0 = ConvRNNF0Predictor(num_class=1, in_channels=h.in_channels, cond_channels=h.f0_cond_channels)
    return HiFTGenerator(
        in_channels=h.in_channels, base_channels=h.base_channels, nb_harmonics=h.nb_harmonics,
        sampling_rate=h.sampling_rate, nsf_alpha=h.nsf_alpha, nsf_sigma=h.nsf_sigma,
        nsf_voiced_threshold=h.nsf_voiced_threshold, upsample_rates=list(h.upsample_rates),
        upsample_kernel_sizes=list(h.upsample_kernel_sizes),
        istft_params={"n_fft": h.istft_n_fft, "hop_len": h.istft_hop_len},
        resblock_kernel_sizes=list(h.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in h.resblock_dilation_sizes],
        source_resblock_kernel_sizes=list(h.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(d) for d in h.source_resblock_dilation_sizes],
        lrelu_slope=h.lrelu_slope, audio_limit=h.audio_limit, f0_predictor=f0)


# -- fixtures -------------------------------------------------------------------------------------
def half_exact(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Random float32 values that float16 holds exactly, so inputs are stored at half the size."""
    return (torch.randn(*shape) * scale + shift).half().float()


def vary_and_round(net: torch.nn.Module, spread: float = 0.1) -> None:
    """Move every 1-D parameter (biases, norm gains and shifts, Snake alphas) off its init value, whose
    zeros and ones would hide a swapped or missing term, then round every parameter to a float16 value
    (kept float32): the .pt files then store them as float16 without loss, half the size."""
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * spread)
            p.copy_(p.half().float())


def half_state_dict(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with parameters as float16 (exact after :func:`vary_and_round`), buffers as they are."""
    params = {k for k, _ in net.named_parameters(remove_duplicate=False)}
    return {k: v.half() if k in params and v.is_floating_point() else v for k, v in net.state_dict().items()}


def save_npz(name: str, arrays: dict[str, torch.Tensor]) -> None:
    """Float arrays that float16 holds exactly (the inputs made by :func:`half_exact`) go to disk as
    float16, the others as float32 (float64 references too: they are compared at 1e-5 or coarser)."""
    out = {}
    for k, v in arrays.items():
        a = v.detach().cpu().numpy()
        if a.dtype in (np.float32, np.float64):
            a = a.astype(np.float32)
            if np.array_equal(a.astype(np.float16).astype(np.float32), a):
                a = a.astype(np.float16)
        out[k] = a
    np.savez_compressed(OUT / f"{name}.npz", **out)


@contextmanager
def replaced_draws(rand: dict[tuple[int, ...], torch.Tensor], randn: dict[tuple[int, ...], torch.Tensor],
                   calls: list[str]) -> Iterator[None]:
    """``torch.rand`` / ``torch.randn_like`` return the saved tensor of the requested shape (in the
    requested dtype) instead of a fresh draw; shapes not listed still draw. ``calls`` logs each use."""
    real_rand, real_randn_like = torch.rand, torch.randn_like

    def fake_rand(*size: Any, dtype: torch.dtype | None = None, device: Any = None, **kw: Any) -> torch.Tensor:
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
        if shape in rand:
            calls.append(f"rand{shape}")
            return rand[shape].to(dtype or torch.get_default_dtype()).clone()
        return real_rand(*size, dtype=dtype, device=device, **kw)

    def fake_randn_like(x: torch.Tensor, **kw: Any) -> torch.Tensor:
        if tuple(x.shape) in randn:
            calls.append(f"randn_like{tuple(x.shape)}")
            return randn[tuple(x.shape)].to(x.dtype).clone()
        return real_randn_like(x, **kw)

    with mock.patch.object(torch, "rand", fake_rand), mock.patch.object(torch, "randn_like", fake_randn_like):
        yield


def flow_case(flow: torch.nn.Module, cfg: CosyVoiceConfig, prefix: str, n_prompt: int, prompt_frames: int,
              n_new: int, keep_estimator_call: bool) -> dict[str, torch.Tensor]:
    """One ``flow.inference`` with the start noise replaced, and its intermediate tensors (with the
    estimator's 4th call if ``keep_estimator_call``)."""
    f = cfg.flow
    token = torch.randint(0, f.vocab_size, (1, n_new))
    prompt_token = torch.randint(0, f.vocab_size, (1, n_prompt))
    prompt_feat = half_exact(1, prompt_frames, 80, scale=2.0, shift=-5.0)
    embedding = half_exact(1, f.spk_embed_dim)
    T = prompt_frames + f.mel_frames(n_new)
    noise = half_exact(1, 80, T)
    seen: dict[str, torch.Tensor] = {}
    est_calls: list[int] = []

    def keep_h(_m: torch.nn.Module, _a: Any, out: torch.Tensor) -> None:
        seen["h"] = out.detach().clone()

    def keep_est(_m: torch.nn.Module, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        # The CFM refills the same input buffers on every step: copy them now.
        if keep_estimator_call and len(est_calls) == 3:
            for name, a in zip(("x", "mask", "mu", "t", "spks", "cond"), args):
                seen[f"est_in_{name}"] = a.detach().clone()
            seen["est_out"] = out.detach().clone()
        est_calls.append(1)

    reg = flow.length_regulator
    reg_inference = reg.inference

    def keep_mu(*args: Any, **kwargs: Any) -> Any:
        out = reg_inference(*args, **kwargs)
        seen["mu"] = out[0].detach().clone()
        return out

    hooks = [flow.encoder_proj.register_forward_hook(keep_h),
             flow.decoder.estimator.register_forward_hook(keep_est, with_kwargs=True)]
    reg.inference = keep_mu
    calls: list[str] = []
    try:
        with replaced_draws({}, {(1, 80, T): noise}, calls):
            mel, _ = flow.inference(token, torch.tensor([n_new]), prompt_token, torch.tensor([n_prompt]), prompt_feat,
                                    torch.tensor([prompt_frames]), embedding, torch.zeros(1, 80, 0, 2))
    finally:
        for h in hooks:
            h.remove()
        del reg.inference
    assert calls == [f"randn_like{(1, 80, T)}"], calls
    assert len(est_calls) == f.n_timesteps and seen["mu"].shape == (1, T, 80), (len(est_calls), seen["mu"].shape)
    out = {"token": token, "prompt_token": prompt_token, "in_prompt_feat": prompt_feat, "in_embedding": embedding,
           "in_noise": noise, "mel": mel, **seen}
    return {f"{prefix}_{k}": v for k, v in out.items()}


def padded_estimator_case(flow: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The estimator alone at an odd length with a padded second item (its last 4 frames masked)."""
    T = 15
    args = {"in_x": half_exact(2, 80, T), "mask": torch.ones(2, 1, T), "in_mu": half_exact(2, 80, T),
            "in_t": torch.rand(2).half().float(), "in_spks": half_exact(2, 80), "in_cond": half_exact(2, 80, T)}
    args["mask"][1, :, 11:] = 0
    with torch.inference_mode():
        out = flow.decoder.estimator(args["in_x"], args["mask"], args["in_mu"], args["in_t"], args["in_spks"],
                                     args["in_cond"])
    return {f"pad_{k}": v for k, v in {**args, "out": out}.items()}


def flow_fixtures(flow: torch.nn.Module, cfg: CosyVoiceConfig) -> None:
    """flow.npz: the two inference cases and the padded estimator call."""
    torch.manual_seed(1)
    arrays = flow_case(flow, cfg, "p", n_prompt=4, prompt_frames=7, n_new=45, keep_estimator_call=False)
    arrays |= flow_case(flow, cfg, "n", n_prompt=0, prompt_frames=0, n_new=23, keep_estimator_call=True)
    arrays |= padded_estimator_case(flow)
    save_npz("flow", arrays)
    print("flow: mel", tuple(arrays["p_mel"].shape), tuple(arrays["n_mel"].shape),
          f"std {float(arrays['p_mel'].std()):.3f}")


def voice_like_f0(hift: torch.nn.Module, mel: torch.Tensor) -> None:
    """Scale the F0 head so that ``mel`` gives a few hundred Hz of spread, with frame 3 at 0 Hz: the
    voiced frames run the sine path and the phase integrates a varying F0, frame 3 (and any other
    under the 10 Hz threshold) the noise-only path."""
    head = hift.f0_predictor.classifier
    head.bias.zero_()
    raw = hift.f0_predictor(mel).flatten()  # |w . x|, sign lost: undo with the signed pre-activation
    signed = head(hift.f0_predictor.condnet(mel).transpose(1, 2)).flatten()
    assert torch.allclose(raw, signed.abs())
    head.weight.mul_(120.0 / float(signed.std() + 1e-6))
    head.weight.copy_(head.weight.half().float())
    signed = head(hift.f0_predictor.condnet(mel).transpose(1, 2)).flatten()
    head.bias.fill_(-float(signed[3]))
    head.bias.copy_(head.bias.half().float())


class F0AsFloat64(torch.nn.Module):
    """A float32 F0 predictor whose output is widened to float64 (for the float64 HiFT run)."""

    def __init__(self, predictor: torch.nn.Module) -> None:
        super().__init__()
        self.predictor = predictor

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.predictor(mel.float()).double()


def hift_fixtures(hift: torch.nn.Module, cfg: CosyVoiceConfig) -> None:
    """HiFTGenerator.inference with SineGen's two draws replaced by saved ones, in float32 and float64."""
    T = 12  # voice_like_f0 reads the same mel
    h = cfg.hift.nb_harmonics + 1
    L = T * int(np.prod(cfg.hift.upsample_rates)) * cfg.hift.istft_hop_len
    torch.manual_seed(2)
    mel = half_exact(1, 80, T, scale=2.0, shift=-4.0)
    rand_ini = torch.rand(1, h).half().float()
    noise_hl = half_exact(1, h, L)  # upstream's randn_like(sine_waves) is [B, H, L]
    arrays: dict[str, torch.Tensor] = {"in_mel": mel, "in_rand_ini": rand_ini, "in_noise": noise_hl.transpose(1, 2)}

    def run(net: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        seen: dict[str, torch.Tensor] = {}
        istft = net._istft

        def keep(magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
            # upstream clips the magnitude inside _istft: keep what the iSTFT itself reads.
            seen["magnitude"], seen["phase"] = magnitude.clamp(max=1e2).clone(), phase.clone()
            return istft(magnitude, phase)

        net._istft = keep
        calls: list[str] = []
        # Uniform.sample draws torch.rand((B, H, 1)); the source module's unused noise branch draws
        # randn_like(uv) [B, L, 1] and is left to draw.
        with replaced_draws({(1, h, 1): rand_ini[:, :, None]}, {(1, h, L): noise_hl}, calls), torch.inference_mode():
            f0 = net.f0_predictor(mel.to(dtype))
            wav, source = net.inference(mel.to(dtype))
        assert calls == [f"rand{(1, h, 1)}", f"randn_like{(1, h, L)}"], calls
        return {"f0": f0, "source": source, "wav": wav, **seen}

    out32 = run(hift, torch.float32)
    hift64 = copy.deepcopy(hift).double()
    hift64.stft_window = hift64.stft_window.double()  # a plain attribute, not a buffer: .double() skips it
    # The float64 run reads the float32 F0: the phase sums F0 over the utterance, so the last-bit
    # differences of a float64 predictor would grow to 1e-4 rad and swamp the summation error that
    # this reference is for.
    hift64.f0_predictor = F0AsFloat64(hift.f0_predictor)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # SineGen builds its phase buffer with torch.zeros
    try:
        out64 = run(hift64, torch.float64)
    finally:
        torch.set_default_dtype(default)
    arrays |= out32
    arrays |= {f"{k}_f64": v for k, v in out64.items() if k in ("source", "wav")}
    save_npz("hift", arrays)
    f0 = out32["f0"]
    d_src = float((out32["source"].double() - out64["source"]).abs().max() / out64["source"].abs().max())
    d_wav = float((out32["wav"].double() - out64["wav"]).abs().max() / out64["wav"].abs().max())
    print(f"hift: f0 {float(f0.min()):.1f}..{float(f0.max()):.1f} Hz, voiced "
          f"{float((f0 > cfg.hift.nsf_voiced_threshold).float().mean()):.2f}; upstream float32 vs float64: "
          f"source {d_src:.2e}, wav {d_wav:.2e}")


def shapes(net: torch.nn.Module) -> dict[str, list[int]]:
    """Every state-dict key and its shape."""
    return {k: list(v.shape) for k, v in net.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("upstream", type=Path, help="upstream source tree, or a git dir holding the commit")
    ap.add_argument("matcha", type=Path, help="Matcha-TTS source tree, or a git dir holding its commit")
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("--matcha-commit", default=MATCHA_COMMIT)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree, rev = source_tree(args.upstream.resolve(), args.commit, ["cosyvoice"], Path(tmp) / "cosyvoice")
        mtree, mrev = source_tree(args.matcha.resolve(), args.matcha_commit,
                                  ["matcha/__init__.py", "matcha/models/__init__.py", "matcha/models/components"],
                                  Path(tmp) / "matcha")
        sys.path[:0] = [str(tree), str(mtree)]
        import_upstream()
        torch.set_num_threads(2)
        cfg = cv1_tiny()

        torch.manual_seed(0)
        flow = build_flow(cfg).eval()
        vary_and_round(flow)
        torch.manual_seed(0)
        hift = build_hift(cfg).eval()
        with torch.no_grad():
            vary_and_round(hift)
            for name, p in hift.named_parameters():
                if name.endswith("alpha"):  # Snake's alphas spread around 1 (init 1 would hide 1/alpha)
                    p.copy_((torch.rand(p.shape) + 0.3).half().float())
            torch.manual_seed(2)
            voice_like_f0(hift, half_exact(1, 80, 12, scale=2.0, shift=-4.0))  # hift_fixtures' mel
        for name, net in (("flow", flow), ("hift", hift)):
            torch.save(half_state_dict(net), OUT / f"{name}.pt")
        flow_fixtures(flow, cfg)
        hift_fixtures(hift, cfg)

        big = cv1_300m()
        with torch.device("meta"):
            record = {"flow": shapes(build_flow(big)), "hift": shapes(build_hift(big))}
        record["_source"] = {
            "script": "tests/families/cosyvoice/make_upstream_fixtures_flow.py",
            "repository": "FunAudioLLM/CosyVoice", "commit": rev, "matcha": "shivammehta25/Matcha-TTS",
            "matcha_commit": mrev, "torch": torch.__version__,
            "config": {"flow": dataclasses.asdict(big.flow), "hift": dataclasses.asdict(big.hift)}}
        (OUT / "shapes_300m.json").write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir() if p.stem in ("flow", "hift", "shapes_300m"))
    print(f"wrote {OUT} ({total / 1e6:.2f} MB of flow/hift fixtures) from upstream {rev}, Matcha {mrev}")


if __name__ == "__main__":
    main()
