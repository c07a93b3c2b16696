"""What each stage exports of CosyVoice2's networks: graph modules, numpy assets, runtime constants.

One function per stage (``FamilyInfo.parts``), called on the models this family's loader loaded; the
stage's export, the reference and the checkpoint exports read the networks only through these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Parts = tuple[Mapping[str, Any], dict[str, np.ndarray], dict[str, Any]]


def llm_parts(models: Any) -> Parts:
    """The decode steps, the text, speech and sos/task_id embedding tables, the LM's shape."""
    from cosycompile.families.qwen2_steps import decode_step_modules

    lm = models.llm
    c = models.config.llm
    assets = {
        "text_embedding": lm.llm.model.model.embed_tokens.weight.detach().float().numpy(),
        "speech_embedding": lm.speech_embedding.weight.detach().float().numpy(),
        "llm_embedding": lm.llm_embedding.weight.detach().float().numpy(),
    }
    info = {"num_layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.hidden_size // c.num_heads,
            "hidden_size": c.hidden_size, "speech_token_size": models.config.speech_token_size,
            "vocab_size": models.config.speech_token_size + 3}
    return decode_step_modules(lm), assets, info


def flow_parts(models: Any) -> Parts:
    """The token encoder step and the UNet CFM estimator, the solver's fixed noise and constants."""
    from .flow import FlowEncoderStep

    c = models.config.flow
    modules = {"flow_encoder": FlowEncoderStep(models.flow).eval(), "flow_estimator": models.flow.decoder.estimator.eval()}
    assets = {"rand_noise": models.flow.decoder.rand_noise.detach().float().numpy()}
    info = {"n_timesteps": c.n_timesteps, "cfg_rate": c.inference_cfg_rate, "mel_bins": c.output_size,
            "spk_embed_dim": c.spk_embed_dim, "flow_vocab_size": c.vocab_size, "token_mel_ratio": models.config.token_mel_ratio}
    return modules, assets, info


# The special tokens CosyVoice2's front end adds to the Qwen tokenizer before any speech token
# (upstream's pretrained_to_huggingface.py and cosyvoice/tokenizer/tokenizer.py): they fix the
# text vocabulary of the HF rewrite (stages/llm/hf_rewrite.py).
TEXT_SPECIAL_TOKENS: dict[str, Any] = {
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "additional_special_tokens": [
        "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]",
        "[laughter]", "[cough]", "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>",
        "[hissing]", "[sigh]", "[vocalized-noise]", "[lipsmack]", "[mn]"],
}


def llm_vocab(cfg: Any) -> dict[str, Any]:
    """CosyVoice2's speech vocabulary after the text ids (``FamilyInfo.llm_vocab``), offsets from the
    first speech id: the S speech tokens, the three stop tokens (``llm_decoder``'s S+3 rows, the first
    masked before the minimum length), then sos and task_id from ``llm_embedding`` (S+5 rows)."""
    from cosycompile.families.qwen2_layout import QWEN_DIR

    S = cfg.speech_token_size
    return {"speech_token_size": S, "rows": S + 5, "head_rows": S + 3, "stop": [S, S + 1, S + 2], "eos": S,
            "sos": S + 3, "task_id": S + 4,
            "names": {S: "<|eos1|>", S + 1: "<|eos2|>", S + 2: "<|eos3|>", S + 3: "<|sos|>", S + 4: "<|task_id|>"},
            "text_rows": cfg.llm.vocab_size, "tokenizer_dir": QWEN_DIR, "special_tokens": TEXT_SPECIAL_TOKENS,
            "min_token_text_ratio": cfg.llm.min_token_text_ratio,
            "max_token_text_ratio": cfg.llm.max_token_text_ratio,
            "top_p": cfg.llm.sampling.top_p, "top_k": cfg.llm.sampling.top_k}


def llm_vocab_rows(lm: Any) -> dict[str, Any]:
    """The tensors of :func:`llm_vocab`'s rows: the speech embedding then ``llm_embedding`` (sos, task_id),
    and the speech head (``llm_decoder``, with its bias)."""
    import torch

    return {"embedding": torch.cat([lm.speech_embedding.weight.detach(), lm.llm_embedding.weight.detach()]),
            "head_weight": lm.llm_decoder.weight.detach(), "head_bias": lm.llm_decoder.bias.detach()}
