"""CosyVoice2's stage runtimes: the control flow around its graphs, in numpy and torch-free.

The decode loop with CosyVoice2's prefix and stop tokens, the 10-step Euler CFM with
classifier-free guidance on a cosine schedule, and the HiFT's iSTFT with its Gaussian source noise
(the control flow every generation shares is in :mod:`cosycompile.runtime.speech_runtimes`). The reference and every
build run these over their own Runners, so a comparison measures the compiled graphs only.
Each runtime turns the previous stage's product into its own (``product``, ``produce``), which is
all :class:`cosycompile.runtime.pipeline.Pipeline` needs to compose them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.runtime.pipeline import Prompt
from cosycompile.runtime.runner import Runner
from cosycompile.runtime.speech_runtimes import CFMFlowRuntime, ISTFTVocoderRuntime, SpeechLMRuntime, log_softmax

__all__ = ["FlowRuntime", "HiFTRuntime", "LLMRuntime", "log_softmax"]


class LLMRuntime(SpeechLMRuntime):
    """CosyVoice2's speech-token LM: sos and task_id from its own ``llm_embedding``; the three ids
    after the speech tokens stop decoding."""

    def __init__(self, runner: Runner, assets: dict[str, np.ndarray], info: dict[str, Any],
                 static: Runner | None = None) -> None:
        super().__init__(runner, assets, info, static)
        self.llm_embedding = assets["llm_embedding"]
        self.stop_ids = {self.speech_token_size, self.speech_token_size + 1, self.speech_token_size + 2}

    def prefix(self, text_ids: np.ndarray, prompt: Prompt) -> np.ndarray:
        """[sos | text embeddings (prompt text + text) | task_id | prompt speech tokens] as [1, S, H]."""
        ids = np.concatenate([prompt.text_ids, text_ids]).astype(np.int64)
        parts = [self.llm_embedding[0:1], self.text_embedding[ids], self.llm_embedding[1:2],
                 self.speech_embedding[prompt.speech_tokens.astype(np.int64)]]
        return np.ascontiguousarray(np.concatenate(parts, axis=0)[None].astype(np.float32))


class FlowRuntime(CFMFlowRuntime):
    """CosyVoice2's flow: the conformer encoder graph, then 10 Euler CFM steps over the UNet estimator."""


class HiFTRuntime(ISTFTVocoderRuntime):
    """CosyVoice2's HiFT: Gaussian source noise drawn per utterance from the seed."""
