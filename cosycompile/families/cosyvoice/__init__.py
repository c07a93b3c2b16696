"""CosyVoice-300M (the first generation; also -SFT, -Instruct, -25Hz): a Transformer LM over a Conformer
text encoder, a Conformer + interpolating length regulator + UNet CFM flow, the HiFT vocoder (22.05 kHz).

What is this family's own sits in this folder: the networks with upstream's state-dict keys
(``encoder.py``, ``lm.py``, ``flow*.py``; the HiFT vocoder is upstream's shared class,
``families/hift.py``), the torch-free pieces its runtimes run around the graphs (the LM's text
encoder, ``text_encoder.py``; the flow's length regulator, ``regulator.py``), the safe reader of
``cosyvoice.yaml`` (``yaml_read.py``, ``config.py``), the model dir's layout (``layout.py``), the loader
and the built-in models (``loader.py``), what each stage exports (``parts.py``) and the stage runtimes
(``runtimes.py``). This file stays light: no torch.
"""

from __future__ import annotations

from cosycompile.families import FamilyInfo

CONFIG_FILE = "cosyvoice.yaml"
SPEECH_TOKENIZER = "speech_tokenizer_v1.onnx"

PLUGIN = FamilyInfo(
    summary="CosyVoice-300M: Transformer LM, conformer + length regulator + UNet CFM flow, HiFT vocoder (22.05 kHz)",
    config_file=CONFIG_FILE,
    builtins=("cv1-tiny", "cv1-random-300m"),
    tiny_builtin="cv1-tiny",
    stage_files={"llm": (CONFIG_FILE, "llm.pt"), "flow": (CONFIG_FILE, "flow.pt"), "hift": (CONFIG_FILE, "hift.pt")},
    # The text tokenizer's vocabulary is package data of Whisper or of upstream, copied into the model dir
    # (tokenizer.py): the 50 Hz models' and the 25 Hz model's.
    frontend_files=("campplus.onnx", SPEECH_TOKENIZER, "builtin.json", "spk2info.pt", "multilingual.tiktoken",
                    "multilingual_zh_ja_yue_char_del.tiktoken"),
    bundle_files=(),
    speech_tokenizer=SPEECH_TOKENIZER,
    runtimes={"llm": ".runtimes:LLMRuntime", "flow": ".runtimes:FlowRuntime", "hift": ".runtimes:HiFTRuntime"},
    parts={"llm": ".parts:llm_parts", "flow": ".parts:flow_parts", "hift": "cosycompile.families.hift:hift_parts"},
    # Upstream's feat_extractor in cosyvoice.yaml: 22,050 Hz, n_fft = window 1024, hop 256; the
    # first generation does not trim the prompt mel to its tokens (50 Hz tokens, 86 Hz frames).
    prompt_mel=(22050, 1024, 256),
    prompt_mel_frames_per_token=0,
    text_tokenizer=".tokenizer:load_text_tokenizer",
    model_speakers=".speakers:model_speakers",
    llm_quant_target=".parts:llm_quant_target",
    llm_checkpoint=False,
)
