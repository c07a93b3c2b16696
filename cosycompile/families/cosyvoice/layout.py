"""What a CosyVoice-300M model dir must hold, checked before any build step runs.

Upstream's layout (CosyVoice-300M, -SFT, -Instruct, -25Hz): ``cosyvoice.yaml``, ``llm.pt``,
``flow.pt``, ``hift.pt``, the front end's ``campplus.onnx`` and ``speech_tokenizer_v1.onnx``, and for
the SFT model ``spk2info.pt`` (its built-in speakers). There is no Qwen2 body: the text tokenizer is
upstream's tiktoken vocabulary (:mod:`.tokenizer`). Files only, nothing loaded, no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from cosycompile.families.model_dir import BUILTIN_MARKER, STAGE_CHECKPOINTS, check_onnx_models, need_file, need_json

from . import CONFIG_FILE, SPEECH_TOKENIZER

FRONTEND_MODELS = {"campplus.onnx": "speaker embedding (CAM++) of the front end",
                   SPEECH_TOKENIZER: "speech tokenizer of the front end"}


def check_model_dir(root: Path, stages: Sequence[str]) -> None:
    """Raise a one-line :class:`~cosycompile.errors.ModelError` for the first file of ``root`` that a
    build with ``stages`` needs and cannot read (the file's full path, what is wrong, what needs it)."""
    root = Path(root)
    need_file(root / CONFIG_FILE, "the model config: without it this is not a CosyVoice-300M model dir")
    for stage in stages:
        name = STAGE_CHECKPOINTS.get(stage)
        if name is not None:
            need_file(root / name, f"checkpoint of stage '{stage}'")
    if (root / BUILTIN_MARKER).is_file():
        need_json(root / BUILTIN_MARKER, "marker of a built-in model, read by the front end")
    else:
        from .tokenizer import check_tokenizer_file

        check_tokenizer_file(root)
    for name, why in FRONTEND_MODELS.items():
        need_file(root / name, why)


def check_frontend_models(root: Path) -> None:
    """Parse the front end's ONNX models (structure only): a truncated or foreign file is a
    :class:`~cosycompile.errors.ModelError` naming it. Imports onnx, so a preflight, not planning."""
    check_onnx_models(root, FRONTEND_MODELS)
