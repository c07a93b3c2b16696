"""What a CosyVoice3 model dir must hold, checked before any build step runs.

Upstream's layout (Fun-CosyVoice3-0.5B): ``cosyvoice3.yaml``, ``llm.pt``, ``flow.pt``, ``hift.pt``,
the Qwen2 body's config and tokenizer in ``CosyVoice-BlankEN/``, and the front end's
``campplus.onnx`` and ``speech_tokenizer_v3.onnx``. The checks are the ones every family shares
(:mod:`cosycompile.families.model_dir`): files only, nothing loaded, no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from cosycompile.families.model_dir import check_model_files, check_onnx_models
from cosycompile.families.qwen2_layout import QWEN_DIR

from . import CONFIG_FILE, SPEECH_TOKENIZER

FRONTEND_MODELS = {"campplus.onnx": "speaker embedding (CAM++) of the front end",
                   SPEECH_TOKENIZER: "speech tokenizer of the front end"}


def check_model_dir(root: Path, stages: Sequence[str]) -> None:
    """Raise a one-line :class:`~cosycompile.errors.ModelError` for the first file of ``root`` that a
    build with ``stages`` needs and cannot read (the file's full path, what is wrong, what needs it)."""
    check_model_files(Path(root), stages, CONFIG_FILE, "CosyVoice3", QWEN_DIR, FRONTEND_MODELS)


def check_frontend_models(root: Path) -> None:
    """Parse the front end's ONNX models (structure only): a truncated or foreign file is a
    :class:`~cosycompile.errors.ModelError` naming it. Imports onnx, so a preflight, not planning."""
    check_onnx_models(root, FRONTEND_MODELS)
