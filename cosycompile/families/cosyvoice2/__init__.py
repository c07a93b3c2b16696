"""CosyVoice2 (CosyVoice2-0.5B): a Qwen2 LM, a causal conformer + 1-D UNet CFM flow, the HiFT vocoder.

What is this family's own sits in this folder: the networks with upstream's state-dict keys
(``qwen2lm.py``, ``flow*.py``; the HiFT vocoder is upstream's shared class, ``families/hift.py``), the
safe reader of ``cosyvoice2.yaml`` (``yaml_safe.py``, ``config.py``), the model dir's layout check
(``layout.py``), the loader and the built-in models (``loader.py``) and the stage runtimes
(``runtimes.py``). This file stays light: no torch.
"""

from __future__ import annotations

from cosycompile.families import FamilyInfo

QWEN_DIR = "CosyVoice-BlankEN"
CONFIG_FILE = "cosyvoice2.yaml"
SPEECH_TOKENIZER = "speech_tokenizer_v2.onnx"

PLUGIN = FamilyInfo(
    summary="CosyVoice2-0.5B: Qwen2 LM, causal conformer + UNet CFM flow, HiFT vocoder (24 kHz)",
    config_file=CONFIG_FILE,
    builtins=("tiny", "random-0.5b", "tiny-snake"),
    tiny_builtin="tiny",
    stage_files={"llm": (CONFIG_FILE, "llm.pt", f"{QWEN_DIR}/config.json"),
                 "flow": (CONFIG_FILE, "flow.pt"), "hift": (CONFIG_FILE, "hift.pt")},
    frontend_files=("campplus.onnx", SPEECH_TOKENIZER, "builtin.json",
                    f"{QWEN_DIR}/tokenizer_config.json", f"{QWEN_DIR}/vocab.json",
                    f"{QWEN_DIR}/merges.txt", f"{QWEN_DIR}/tokenizer.json"),
    # The Qwen2 config (vocab size of a built-in's stand-in tokenizer, model_type for a real one) and the
    # tokenizer files transformers also reads when they are present.
    bundle_files=(f"{QWEN_DIR}/config.json", f"{QWEN_DIR}/special_tokens_map.json", f"{QWEN_DIR}/added_tokens.json"),
    runtimes={"llm": ".runtimes:LLMRuntime", "flow": ".runtimes:FlowRuntime", "hift": ".runtimes:HiFTRuntime"},
    parts={"llm": ".parts:llm_parts", "flow": ".parts:flow_parts", "hift": ".parts:hift_parts"},
    speech_tokenizer=SPEECH_TOKENIZER,
)
