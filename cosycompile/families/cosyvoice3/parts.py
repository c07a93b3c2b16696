"""What each stage exports of CosyVoice3's networks: graph modules, numpy assets, runtime constants.

One function per stage (``FamilyInfo.parts``), called on the models this family's loader loaded. The
graphs have the same inputs and outputs as every family's (the stages' graph specs); what is
CosyVoice3's own sits behind them: no ``llm_embedding`` (sos and task_id are speech-embedding rows,
``extra_speech_rows`` of them past the speech tokens), a DiT estimator, an encoder that is an
embedding, the pre-look-ahead layer and a repeat, and the causal HiFT (offline, finalized).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Parts = tuple[Mapping[str, Any], dict[str, np.ndarray], dict[str, Any]]


def llm_parts(models: Any) -> Parts:
    """The Qwen2 decode steps, the text and speech embedding tables, the LM's shape and speech vocabulary."""
    from cosycompile.families.qwen2_steps import decode_step_modules

    lm = models.llm
    c = models.config.lm
    assets = {"text_embedding": lm.qwen.model.embed_tokens.weight.detach().float().numpy(),
              "speech_embedding": lm.speech_embedding.weight.detach().float().numpy()}
    info = {"num_layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "hidden_size": c.hidden_size, "speech_token_size": c.speech_token_size,
            "extra_speech_rows": c.extra_speech_rows, "vocab_size": c.speech_token_size + c.extra_speech_rows}
    return decode_step_modules(lm), assets, info


def flow_parts(models: Any) -> Parts:
    """The token encoder step and the DiT estimator (offline: full attention), the fixed noise, constants."""
    from .flow import FlowEncoderStep

    c = models.config.flow
    flow = models.flow
    modules = {"flow_encoder": FlowEncoderStep(flow).eval(), "flow_estimator": flow.decoder.estimator.eval()}
    assets = {"rand_noise": flow.decoder.rand_noise.detach().float().numpy()}
    info = {"n_timesteps": c.n_timesteps, "cfg_rate": c.inference_cfg_rate, "mel_bins": c.output_size,
            "spk_embed_dim": c.spk_embed_dim, "flow_vocab_size": c.vocab_size, "token_mel_ratio": c.token_mel_ratio}
    return modules, assets, info


def hift_parts(models: Any) -> Parts:
    """The causal vocoder up to the iSTFT (finalized), the iSTFT's and source's constants."""
    from cosycompile.families.hift import vocoder_info

    from .hift import HiFTNetStep

    return {"hift": HiFTNetStep(models.hift).eval()}, {}, vocoder_info(models)


def llm_vocab(cfg: Any) -> dict[str, Any]:
    """CosyVoice3's speech vocabulary after the text ids (``FamilyInfo.llm_vocab``), offsets from the
    first speech id: ``speech_embedding``'s S + 200 rows, all of them ``llm_decoder``'s; sos S,
    task_id S+2 (rows of the speech embedding, so the prefix is ids of that vocabulary); every row
    from S on stops decoding; upstream masks row S (sos) before the minimum length, kept as it runs.
    Names as upstream's ``convert_cosyvoice3_to_hf.py``: ``<|s_N|>`` but sos, eos1, task_id, fill."""
    from cosycompile.families.qwen2_layout import QWEN_DIR
    from .text_tokens import SPECIAL_TOKENS

    c = cfg.lm
    S, n = c.speech_token_size, c.speech_token_size + c.extra_speech_rows
    return {"speech_token_size": S, "rows": n, "head_rows": n, "stop": list(range(S, n)), "eos": S,
            "sos": S, "task_id": S + 2,
            "names": {S: "<|sos|>", S + 1: "<|eos1|>", S + 2: "<|task_id|>", S + 3: "<|fill|>"},
            "text_rows": c.vocab_size, "tokenizer_dir": QWEN_DIR, "special_tokens": SPECIAL_TOKENS,
            "min_token_text_ratio": c.min_token_text_ratio, "max_token_text_ratio": c.max_token_text_ratio,
            "top_p": c.sampling.top_p, "top_k": c.sampling.top_k}


def llm_vocab_rows(lm: Any) -> dict[str, Any]:
    """The tensors of :func:`llm_vocab`'s rows: the speech embedding and the speech head (no bias)."""
    return {"embedding": lm.speech_embedding.weight.detach(), "head_weight": lm.llm_decoder.weight.detach(),
            "head_bias": None}
