"""CosyVoice3's stage runtimes: the control flow around its graphs, in numpy and torch-free.

What is CosyVoice3's own (upstream ``CosyVoice3LM``, ``CausalMaskedDiffWithDiT``,
``CausalHiFTGenerator`` at FunAudioLLM/CosyVoice ace7c47) on top of the control flow every
generation shares (:mod:`cosycompile.runtime.speech_runtimes`):

- the LM's prefix takes sos and task_id from rows of its speech embedding (there is no
  ``llm_embedding``), and every one of the 200 ids after the speech tokens stops decoding; before the
  minimum length upstream masks row ``speech_token_size`` (which in CosyVoice3 is sos), kept as is;
- the flow's encoder graph repeats each token ``token_mel_ratio`` times after the pre-look-ahead
  layer, and 10 Euler steps with classifier-free guidance run the DiT estimator;
- the causal HiFT's source reads uniform noise (upstream's fixed ``torch.rand`` tensors, read from
  their start), drawn here from the seed so that the same seed gives the same prefix of noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.runtime.pipeline import Prompt
from cosycompile.runtime.runner import Runner
from cosycompile.runtime.speech_runtimes import CFMFlowRuntime, ISTFTVocoderRuntime, SpeechLMRuntime

# Rows of the speech embedding past the speech tokens (upstream's ``speech_token_size + 200``).
EXTRA_SPEECH_ROWS = 200
SOS, EOS, TASK_ID, FILL = 0, 1, 2, 3  # offsets past speech_token_size


class LLMRuntime(SpeechLMRuntime):
    """CosyVoice3's speech-token LM over a decode-step runner, its text and speech embedding tables."""

    def __init__(self, runner: Runner, assets: dict[str, np.ndarray], info: dict[str, Any],
                 static: Runner | None = None) -> None:
        super().__init__(runner, assets, info, static)
        extra = int(info.get("extra_speech_rows", EXTRA_SPEECH_ROWS))
        S = self.speech_token_size
        if self.speech_embedding.shape[0] != S + extra:
            raise ValueError(f"speech_embedding has {self.speech_embedding.shape[0]} rows, expected "
                             f"speech_token_size + {extra} = {S + extra}")
        self.stop_ids = set(range(S, S + extra))
        self.ignore_eos_id = S + SOS  # upstream's ``ignore_eos`` masks this row (sos in CosyVoice3)

    def prefix(self, text_ids: np.ndarray, prompt: Prompt) -> np.ndarray:
        """[sos | text embeddings (prompt text + text) | task_id | prompt speech tokens] as [1, S, H]."""
        ids = np.concatenate([prompt.text_ids, text_ids]).astype(np.int64)
        S = self.speech_token_size
        parts = [self.speech_embedding[S + SOS:S + SOS + 1], self.text_embedding[ids],
                 self.speech_embedding[S + TASK_ID:S + TASK_ID + 1],
                 self.speech_embedding[prompt.speech_tokens.astype(np.int64)]]
        return np.ascontiguousarray(np.concatenate(parts, axis=0)[None].astype(np.float32))


class FlowRuntime(CFMFlowRuntime):
    """CosyVoice3's flow: the token encoder graph (embedding, pre-look-ahead, repeat), then 10 Euler
    CFM steps with CFG over the DiT estimator."""

    def __init__(self, encoder: Runner, estimator: Runner, assets: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        super().__init__(encoder, estimator, assets, info)
        self.token_mel_ratio = int(info.get("token_mel_ratio", self.token_mel_ratio))

    def encode(self, tokens: np.ndarray, prompt: Prompt) -> tuple[np.ndarray, np.ndarray]:
        """(mu [1, 80, ratio * (prompt + new tokens)], spks [1, 80]); a graph whose frames are not
        ``token_mel_ratio`` per token is refused rather than silently misaligning the prompt mel."""
        mu, spks = super().encode(tokens, prompt)
        expected = self.token_mel_ratio * (len(prompt.speech_tokens) + len(tokens))
        if mu.shape[2] != expected:
            raise ValueError(f"flow encoder made {mu.shape[2]} frames for {len(prompt.speech_tokens) + len(tokens)} "
                             f"tokens; CosyVoice3 makes {self.token_mel_ratio} per token ({expected})")
        return mu, spks


class HiFTRuntime(ISTFTVocoderRuntime):
    """CosyVoice3's causal HiFT up to the iSTFT; its source's noise is uniform, as upstream's fixed tensors
    (``torch.rand``; a longer draw extends a shorter one of the same seed)."""

    uniform_noise = True
