"""CosyVoice2 (CosyVoice2-0.5B): a Qwen2 LM, a causal conformer + 1-D UNet CFM flow, the HiFT vocoder.

What is this family's own sits in this folder: the networks with upstream's state-dict keys
(``qwen2lm.py``, ``flow*.py``; the HiFT vocoder is upstream's shared class, ``families/hift.py``), the
safe reader of ``cosyvoice2.yaml`` (``yaml_safe.py``, ``config.py``), the model dir's layout check
(``layout.py``), the loader and the built-in models (``loader.py``) and the stage runtimes
(``runtimes.py``). This file stays light: no torch.
"""

from __future__ import annotations

from cosycompile.families import FamilyInfo
from cosycompile.families.qwen2_layout import qwen2_family_files

CONFIG_FILE = "cosyvoice2.yaml"
SPEECH_TOKENIZER = "speech_tokenizer_v2.onnx"

PLUGIN = FamilyInfo(
    summary="CosyVoice2-0.5B: Qwen2 LM, causal conformer + UNet CFM flow, HiFT vocoder (24 kHz)",
    builtins=("tiny", "random-0.5b", "tiny-snake"),
    tiny_builtin="tiny",
    **qwen2_family_files(CONFIG_FILE, SPEECH_TOKENIZER),
    runtimes={"llm": ".runtimes:LLMRuntime", "flow": ".runtimes:FlowRuntime", "hift": ".runtimes:HiFTRuntime"},
    parts={"llm": ".parts:llm_parts", "flow": ".parts:flow_parts", "hift": "cosycompile.families.hift:hift_parts"},
)
