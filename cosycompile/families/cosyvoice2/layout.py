"""What a CosyVoice2 model dir must hold, checked before any build step runs.

A missing or empty file would otherwise surface only when the step that reads it runs, after
minutes of export and engine building (or, for tokenizer files, never: a Qwen tokenizer built from
default files loads fine and turns every text into no ids). The checks (shared by every family, in
:mod:`cosycompile.families.model_dir`) look at files only: existence, type, size, and for JSON files
that they parse. Nothing is loaded, and this module imports neither torch nor transformers, so
planning stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from cosycompile.families.model_dir import check_model_files, check_onnx_models
from cosycompile.families.qwen2_layout import QWEN_DIR

from . import CONFIG_FILE

FRONTEND_MODELS = {"campplus.onnx": "speaker embedding (CAM++) of the front end",
                   "speech_tokenizer_v2.onnx": "speech tokenizer of the front end"}


def check_model_dir(root: Path, stages: Sequence[str]) -> None:
    """Raise :class:`ModelError` for the first file of ``root`` that a build with ``stages`` needs and cannot read.

    Checked: ``cosyvoice2.yaml``; each enabled stage's checkpoint; ``CosyVoice-BlankEN/config.json``;
    the front end's tokenizer files, ``campplus.onnx`` and ``speech_tokenizer_v2.onnx``. The front
    end runs in every build (validation and calibration tokenize text and embed prompts), so its
    files are required whatever ``stages`` holds. The message is one line: the file's full path,
    what is wrong with it, and what needs it.
    """
    check_model_files(Path(root), stages, CONFIG_FILE, "CosyVoice2", QWEN_DIR, FRONTEND_MODELS)


def check_frontend_models(root: Path) -> None:
    """Parse the front end's ONNX models (structure only, no session): a truncated or foreign file
    is a :class:`ModelError` naming it. Run by the preflight of the steps that use the front end,
    not at planning time, since it imports onnx."""
    check_onnx_models(root, FRONTEND_MODELS)
