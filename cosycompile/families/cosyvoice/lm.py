"""CosyVoice-300M's speech-token LM (upstream ``cosyvoice/llm/llm.py::TransformerLM``), for inference.

A causal Conformer encodes the text; a Transformer with relative positions (``llm``) decodes speech
tokens after the prefix [sos, speaker, prompt text + text, task_id, prompt speech tokens]. Both are
:mod:`.encoder`'s classes; the keys are upstream's, so ``llm.pt`` loads with ``strict=True``.

What inference needs of it, and what differs from the Qwen2 generations:
- the text path (embedding, encoder, affine) runs once per request, before decoding; the stage
  runtime runs it without torch (:mod:`.text_encoder`, fed by :func:`text_encoder_weights`);
- ``llm_embedding`` holds two rows, sos (0) and task_id (1); eos is the head's last output
  (``speech_token_size``), and the head's rows are logits, not log-probabilities;
- the decoder's inputs go through a Linear, LayerNorm and ReLU and are scaled by sqrt(d) before the
  layers (upstream's ``linear_legacy`` input layer), so each new position is embedded by the step
  itself: :class:`DecodeStep` takes the same ``inputs_embeds`` as every family's LLM step.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import LMConfig
from .encoder import ConformerEncoder, TransformerEncoder

# Prefixes of the state-dict keys the text path reads (the numpy text encoder's weights).
TEXT_KEYS = ("text_embedding.", "text_encoder.", "text_encoder_affine_layer.")


class TransformerLM(nn.Module):
    """The LM of CosyVoice-300M (-SFT, -Instruct), the modules upstream's ``TransformerLM`` holds
    (less the training loss, which has no weights)."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        H = cfg.llm_input_size
        self.llm_input_size = H
        self.speech_token_size = cfg.speech_token_size
        self.sos, self.task_id, self.eos_token = 0, 1, cfg.speech_token_size
        self.text_embedding = nn.Embedding(cfg.text_token_size, cfg.text_encoder_input_size)
        self.text_encoder = ConformerEncoder(cfg.text_encoder)
        self.text_encoder_affine_layer = nn.Linear(cfg.text_encoder.output_size, H)
        self.llm_embedding = nn.Embedding(2, H)
        self.llm = TransformerEncoder(cfg.decoder)
        self.llm_decoder = nn.Linear(cfg.decoder.output_size, cfg.speech_token_size + 1)
        self.speech_embedding = nn.Embedding(cfg.speech_token_size, H)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, H)

    def encode_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        """[1, N] int64 text ids -> [1, N, llm_input_size]: embedding, the causal text encoder, affine."""
        return self.text_encoder_affine_layer(self.text_encoder(self.text_embedding(text_ids)))

    def speaker_row(self, embedding: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """[1, 1, H] from a [1, spk_embed_dim] speaker embedding (L2-normalized, then projected), or
        [1, 0, H] when there is none (``None`` or zero rows: upstream's test for "no speaker")."""
        if embedding is None or embedding.shape[0] == 0:
            return like.new_zeros(1, 0, self.llm_input_size)
        return self.spk_embed_affine_layer(F.normalize(embedding.to(like.dtype), dim=1)).unsqueeze(1)

    def prefix(self, text_ids: torch.Tensor, prompt_text_ids: torch.Tensor | None = None,
               prompt_speech_tokens: torch.Tensor | None = None, embedding: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The rows decoding starts from, as upstream's ``inference`` builds them: [1, S, H] of sos,
        the speaker (only with an embedding), the encoded prompt text and text (encoded together:
        the encoder is causal, so the text's rows depend on the prompt's), task_id, the prompt's
        speech tokens. ``text_ids``, ``prompt_text_ids`` and ``prompt_speech_tokens`` are [1, n] int64."""
        if prompt_text_ids is not None and prompt_text_ids.shape[1] > 0:
            text_ids = torch.cat([prompt_text_ids, text_ids], dim=1)
        text = self.encode_text(text_ids)
        rows = self.llm_embedding.weight
        parts = [rows[self.sos].reshape(1, 1, -1), self.speaker_row(embedding, text), text,
                 rows[self.task_id].reshape(1, 1, -1)]
        if prompt_speech_tokens is not None and prompt_speech_tokens.shape[1] > 0:
            parts.append(self.speech_embedding(prompt_speech_tokens))
        return torch.cat(parts, dim=1)


class DecodeStep(nn.Module):
    """The LLM stage's ``llm_step`` graph over the LM's own ``llm`` and ``llm_decoder``.

    ``forward(inputs_embeds [B, S, H], past_key_values [L, 2, B, heads, P, head_dim])`` returns the
    logits ``[B, S, speech_token_size + 1]`` of every new position (the head's output, eos last) and
    ``present_key_values [L, 2, B, heads, P + S, head_dim]``. New positions P..P+S-1 see the cache and
    each other causally: with P = 0 it is upstream's prefill (a tril mask), with S = 1 its decode step,
    and one graph serves both. Relative positions come from the lengths alone, so a cache needs no
    offset beside it.
    """

    def __init__(self, lm: TransformerLM) -> None:
        super().__init__()
        self.llm, self.llm_decoder = lm.llm, lm.llm_decoder
        self.num_layers = len(lm.llm.encoders)

    def forward(self, inputs_embeds: torch.Tensor, past_key_values: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        past = [(past_key_values[i, 0], past_key_values[i, 1]) for i in range(self.num_layers)]
        h, present = self.llm.step(inputs_embeds, past)
        # One flat stack: nesting a stack per layer exports as two Concats, two copies of the cache.
        flat = [t for kv in present for t in kv]
        return self.llm_decoder(h), torch.stack(flat).unflatten(0, (self.num_layers, 2))


def step_info(cfg: LMConfig) -> dict[str, int]:
    """The ``llm_step`` graph spec's model constants (``LLM_STEP``'s shape keys) for ``cfg``."""
    d = cfg.decoder
    return {"num_layers": d.num_blocks, "kv_heads": d.attention_heads, "head_dim": d.output_size // d.attention_heads,
            "hidden_size": d.input_size, "vocab_size": cfg.speech_token_size + 1}


def text_encoder_info(cfg: LMConfig) -> dict[str, int]:
    """What :func:`.text_encoder.text_features` reads besides the weights."""
    e = cfg.text_encoder
    return {"text_encoder_heads": e.attention_heads, "text_encoder_blocks": e.num_blocks,
            "text_encoder_chunk": e.static_chunk_size}


def text_encoder_weights(lm: TransformerLM) -> dict[str, np.ndarray]:
    """The text path's weights as float32 arrays named by their state-dict keys (``text_embedding.weight``,
    ``text_encoder.encoders.0.self_attn.linear_q.weight``, ``text_encoder_affine_layer.weight``, ...)."""
    return {k: v.detach().to("cpu", torch.float32).numpy().copy()
            for k, v in lm.state_dict().items() if k.startswith(TEXT_KEYS)}

