"""CosyVoice3 (Fun-CosyVoice3-0.5B): a Qwen2 LM with CosyVoice3's speech vocabulary, a DiT CFM flow
with a pre-look-ahead layer, the causal HiFT vocoder (24 kHz).

What is this family's own sits in this folder: the networks with upstream's state-dict keys
(``lm.py``, ``flow.py``, ``dit.py``, ``hift.py``), the safe reader of ``cosyvoice3.yaml``
(``yaml_read.py``, ``config.py``), the model dir's layout check (``layout.py``), the loader and the
built-in models (``loader.py``) and the stage runtimes (``runtimes.py``). This file stays light: no torch.
"""

from __future__ import annotations

from cosycompile.families import FamilyInfo
from cosycompile.families.qwen2_layout import qwen2_family_files

CONFIG_FILE = "cosyvoice3.yaml"
SPEECH_TOKENIZER = "speech_tokenizer_v3.onnx"

PLUGIN = FamilyInfo(
    summary="Fun-CosyVoice3-0.5B: Qwen2 LM, DiT CFM flow with pre-look-ahead, causal HiFT vocoder (24 kHz)",
    builtins=("cv3-tiny", "cv3-random-0.5b"),
    tiny_builtin="cv3-tiny",
    **qwen2_family_files(CONFIG_FILE, SPEECH_TOKENIZER),
    runtimes={"llm": ".runtimes:LLMRuntime", "flow": ".runtimes:FlowRuntime", "hift": ".runtimes:HiFTRuntime"},
    parts={"llm": ".parts:llm_parts", "flow": ".parts:flow_parts", "hift": ".parts:hift_parts"},
    # Upstream's examples start every prompt text with this instruction (cosyvoice/cli/frontend.py asserts
    # the marker is in the text or the prompt text).
    prompt_instruction="You are a helpful assistant.<|endofprompt|>",
    prompt_marker="<|endofprompt|>",
)
