"""CosyVoice2's speech-token LM: a Qwen2 body plus speech embedding and speech-token head.

State-dict keys match CosyVoice2-0.5B's ``llm.pt``: ``llm.model.model.*`` (the Qwen2 body),
``llm.model.lm_head.weight`` (tied, unused), ``llm_embedding``, ``speech_embedding``, ``llm_decoder``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from cosycompile.families.qwen2_body import Qwen2Encoder
from cosycompile.families.qwen2_body import qwen2_config as shared_qwen2_config

from .config import LLMConfig
from cosycompile.runtime.sampling import SAMPLING_MODES, Sampling, sampling_ids


def qwen2_config(cfg: LLMConfig) -> Any:
    """The shared ``transformers.Qwen2Config`` of the body; CosyVoice2's also names float32 as its dtype."""
    return shared_qwen2_config(cfg, torch_dtype="float32")


class Qwen2LM(nn.Module):
    """The LM of CosyVoice2 (only what inference needs; no training losses)."""

    def __init__(self, cfg: LLMConfig, speech_token_size: int = 6561) -> None:
        super().__init__()
        self.cfg = cfg
        self.speech_token_size = speech_token_size
        self.llm_embedding = nn.Embedding(2, cfg.hidden_size)  # row 0: sos, row 1: task_id
        self.llm = Qwen2Encoder(qwen2_config(cfg))
        self.llm_decoder = nn.Linear(cfg.hidden_size, speech_token_size + 3)
        self.speech_embedding = nn.Embedding(speech_token_size + 3, cfg.hidden_size)

    @property
    def qwen(self) -> nn.Module:
        """The ``transformers`` Qwen2ForCausalLM."""
        return self.llm.model

    def prompt_embeddings(self, text: torch.Tensor, prompt_text: torch.Tensor | None = None,
                          prompt_speech_token: torch.Tensor | None = None) -> torch.Tensor:
        """``[sos | text (prompt text first) | task_id | prompt speech tokens]`` embeddings, [1, S, H]."""
        if prompt_text is not None:
            text = torch.cat([prompt_text, text], dim=1)
        parts = [self.llm_embedding.weight[0:1], self.qwen.model.embed_tokens(text)[0], self.llm_embedding.weight[1:2]]
        if prompt_speech_token is not None and prompt_speech_token.shape[1] > 0:
            parts.append(self.speech_embedding(prompt_speech_token)[0])
        return torch.cat(parts, dim=0)[None]

    @torch.inference_mode()
    def inference(self, text: torch.Tensor, prompt_text: torch.Tensor | None = None,
                  prompt_speech_token: torch.Tensor | None = None, sampling: str = "ras", seed: int = 0,
                  max_tokens: int | None = None) -> list[int]:
        """Speech tokens for ``text`` [1, N] as upstream's ``Qwen2LM.inference`` decodes them.

        Between 2x and 20x as many tokens as text tokens (prompt text excluded); the end token is
        masked until the minimum is reached; decoding stops at any of the three stop tokens.
        ``sampling`` is ``"ras"`` (CosyVoice's repetition-aware sampling, drawn from
        ``np.random.default_rng(seed)``) or ``"greedy"``. Tokens are picked by the same numpy
        :func:`~cosycompile.runtime.sampling.sampling_ids` as the pipeline runtime, so the two agree
        draw for draw. Reference only: one token per full transformers forward with its own KV
        cache, no batching.
        """
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling must be 'ras' or 'greedy', not {sampling!r}")
        s = self.cfg.sampling
        how = Sampling(mode=sampling, seed=seed, max_tokens=max_tokens, top_p=s.top_p, top_k=s.top_k,
                       win_size=s.win_size, tau_r=s.tau_r)
        rng = np.random.default_rng(seed)
        n_text = text.shape[1]
        min_len = int(n_text * self.cfg.min_token_text_ratio)
        max_len = int(n_text * self.cfg.max_token_text_ratio)
        if max_tokens is not None:
            max_len = min(max_len, max_tokens)
        stop = {self.speech_token_size, self.speech_token_size + 1, self.speech_token_size + 2}
        lm_input = self.prompt_embeddings(text, prompt_text, prompt_speech_token)
        out: list[int] = []
        cache = None
        for i in range(max_len):
            res = self.qwen(inputs_embeds=lm_input, past_key_values=cache, use_cache=True, output_hidden_states=True)
            cache = res.past_key_values
            logp = self.llm_decoder(res.hidden_states[-1][:, -1]).log_softmax(dim=-1)[0]
            logp_np = logp.detach().cpu().numpy().astype(np.float64)
            token = sampling_ids(logp_np, out, how, rng, self.speech_token_size, ignore_eos=i < min_len)
            if token in stop:
                break
            out.append(token)
            lm_input = self.speech_embedding.weight[token].reshape(1, 1, -1)
        return out
