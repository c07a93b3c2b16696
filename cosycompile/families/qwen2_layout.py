"""The model-dir files of a family whose LM is a Qwen2 body in upstream's ``CosyVoice-BlankEN`` folder
(CosyVoice2, CosyVoice3): which files each stage reads, which the front end needs, which a bundle
carries. A family passes its own yaml and speech tokenizer. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

QWEN_DIR = "CosyVoice-BlankEN"


def qwen2_family_files(config_file: str, speech_tokenizer: str) -> dict[str, Any]:
    """The ``FamilyInfo`` fields that name files, for a Qwen2-LM family with ``config_file`` and
    ``speech_tokenizer``."""
    return {
        "config_file": config_file,
        "speech_tokenizer": speech_tokenizer,
        "stage_files": {"llm": (config_file, "llm.pt", f"{QWEN_DIR}/config.json"),
                        "flow": (config_file, "flow.pt"), "hift": (config_file, "hift.pt")},
        "frontend_files": ("campplus.onnx", speech_tokenizer, "builtin.json", f"{QWEN_DIR}/tokenizer_config.json",
                           f"{QWEN_DIR}/vocab.json", f"{QWEN_DIR}/merges.txt", f"{QWEN_DIR}/tokenizer.json"),
        # The Qwen2 config (vocab size of a built-in's stand-in tokenizer, model_type for a real one) and the
        # tokenizer files transformers also reads when they are present.
        "bundle_files": (f"{QWEN_DIR}/config.json", f"{QWEN_DIR}/special_tokens_map.json",
                         f"{QWEN_DIR}/added_tokens.json"),
    }
