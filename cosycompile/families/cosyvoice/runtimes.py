"""CosyVoice-300M's stage runtimes: the control flow around its graphs, in numpy and torch-free.

What is the first generation's own (upstream ``TransformerLM``, ``MaskedDiffWithXvec`` at
FunAudioLLM/CosyVoice ace7c47) on top of the control flow every generation shares
(:mod:`cosycompile.runtime.speech_runtimes`):

- the LM's prefix is [sos, speaker, encoded text, task_id, prompt speech]: the text goes through the
  causal Conformer text encoder first (:mod:`.text_encoder`, numpy: it runs once per utterance, and
  the decode step is the graph an engine speeds up), the speaker x-vector is normalized and projected;
  the one id after the speech tokens stops decoding and is masked before the minimum length;
- the flow's encoder graph makes one frame per token; the length regulator (:mod:`.regulator`)
  interpolates the prompt's and the new tokens' frames to the prompt mel's length and to upstream's
  ``int(n / rate * 22050 / 256)`` frames, then 10 Euler CFM steps with CFG run the UNet estimator
  from a fixed draw of noise (upstream draws fresh noise on every call);
- the HiFT's source reads Gaussian noise drawn from the seed, as CosyVoice2's (the same vocoder class).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.runtime.pipeline import Prompt
from cosycompile.runtime.runner import Runner
from cosycompile.runtime.speech_runtimes import CFMFlowRuntime, ISTFTVocoderRuntime, SpeechLMRuntime
from cosycompile.runtime.streaming import StreamSchedule

from .config import FlowConfig
from .regulator import regulate
from .text_encoder import text_features

TEXT_PREFIXES = ("text_encoder.", "text_encoder_affine_layer.")
# The flow's settings the length regulator reads, passed from parts.py through the graphs' info.
REGULATOR_INFO = ("input_frame_rate", "mel_sample_rate", "mel_hop", "regulator_edge_tokens")
# Upstream CosyVoiceModel's streaming (cli/model.py): hops of 2 seconds of tokens (up to 4, scale 1:
# upstream's stream_scale_factor), each waiting for 20 overlap tokens after it; the first chunk holds
# back the overlap's mel frames for the next chunk's fade, and the vocoder 20 frames (mel_cache_len).
STREAM_HOP_SECONDS = 2
STREAM_MAX_HOP_SECONDS = 4
STREAM_OVERLAP_TOKENS = 20
STREAM_HOLD_FRAMES = 20


class LLMRuntime(SpeechLMRuntime):
    """The 300M LM over a decode-step runner: numpy text encoder, sos/task_id rows, speaker projection."""

    def __init__(self, runner: Runner, assets: dict[str, np.ndarray], info: dict[str, Any],
                 static: Runner | None = None) -> None:
        super().__init__(runner, assets, info, static)
        self.llm_embedding = assets["llm_embedding"]
        self.spk_weight, self.spk_bias = assets["spk_embed_affine_layer.weight"], assets["spk_embed_affine_layer.bias"]
        self.text_weights = {k: v for k, v in assets.items() if k.startswith(TEXT_PREFIXES)}
        self.text_weights["text_embedding.weight"] = self.text_embedding
        self.text_info = {k: info[k] for k in ("text_encoder_heads", "text_encoder_blocks", "text_encoder_chunk")}
        self.stop_ids = {self.speech_token_size}

    def speaker_row(self, embedding: np.ndarray) -> np.ndarray:
        """The x-vector L2-normalized (as F.normalize, eps 1e-12) and projected: [1, H]."""
        e = embedding.astype(np.float32).reshape(1, -1)
        e = e / max(float(np.sqrt((e.astype(np.float64) ** 2).sum())), 1e-12)
        return (e @ self.spk_weight.T + self.spk_bias).astype(np.float32)

    def prefix(self, text_ids: np.ndarray, prompt: Prompt) -> np.ndarray:
        """[sos | speaker | encoded text (prompt text + text) | task_id | prompt speech tokens] as [1, S, H]."""
        ids = np.concatenate([prompt.text_ids, text_ids]).astype(np.int64)
        parts = [self.llm_embedding[0:1], self.speaker_row(prompt.embedding),
                 text_features(ids, self.text_weights, self.text_info), self.llm_embedding[1:2],
                 self.speech_embedding[prompt.speech_tokens.astype(np.int64)]]
        return np.ascontiguousarray(np.concatenate(parts, axis=0)[None].astype(np.float32))


class FlowRuntime(CFMFlowRuntime):
    """The 300M flow: token-rate encoder graph, numpy length regulator, 10 Euler CFM steps over the UNet."""

    def __init__(self, encoder: Runner, estimator: Runner, assets: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        super().__init__(encoder, estimator, assets, info)
        prefix = "length_regulator.model."
        self.regulator = {k[len(prefix):]: v for k, v in assets.items() if k.startswith(prefix)}
        # The regulator's settings as the flow's config holds them (config.py is torch-free).
        self.reg_cfg = FlowConfig(**{k: info[k] for k in REGULATOR_INFO},
                                  regulator_sampling_ratios=tuple(info["regulator_sampling_ratios"]))

    @property
    def stream_schedule(self) -> StreamSchedule:
        """Upstream's hops at this model's token rate (the overlap is the look-ahead; see the module's constants)."""
        rate = self.reg_cfg.input_frame_rate
        return StreamSchedule(hop=STREAM_HOP_SECONDS * rate, max_hop=STREAM_MAX_HOP_SECONDS * rate, scale=1,
                              lookahead=STREAM_OVERLAP_TOKENS, hold=STREAM_HOLD_FRAMES)

    def frames_of(self, tokens: int) -> int:
        """Mel frames of the first ``tokens`` new speech tokens (the regulator's rate, not a whole ratio)."""
        return self.reg_cfg.mel_frames(tokens)

    @property
    def first_chunk(self) -> tuple[int, int]:
        """(speech tokens the first streamed chunk waits for, mel frames it emits), upstream's schedule."""
        tokens = self.stream_schedule.hop + STREAM_OVERLAP_TOKENS
        return tokens, self.reg_cfg.mel_frames(tokens) - self.reg_cfg.mel_frames(STREAM_OVERLAP_TOKENS)

    def mel(self, tokens: np.ndarray, prompt: Prompt) -> np.ndarray:
        """Mel [80, frames of the new tokens] (the prompt's frames are conditioning only)."""
        h, spks = self.encode(tokens, prompt)
        n_prompt = prompt.mel.shape[1]
        mu = regulate(h[0], len(prompt.speech_tokens), n_prompt, self.reg_cfg.mel_frames(len(tokens)), self.regulator,
                      self.reg_cfg)[None].astype(np.float32)
        cond = np.zeros_like(mu)
        cond[0, :, :n_prompt] = prompt.mel
        return self.solve(mu, spks, cond)[0, :, n_prompt:]


class HiFTRuntime(ISTFTVocoderRuntime):
    """The 300M HiFT (upstream's HiFTGenerator at 22,050 Hz): Gaussian source noise drawn from the seed."""
