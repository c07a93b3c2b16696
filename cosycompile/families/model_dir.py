"""File checks of a model dir shared by every family's ``layout.py``: present, a file, readable, not
empty, JSON that parses, a Qwen tokenizer that will really load, ONNX models that parse.

A missing or empty file would otherwise surface only when the step that reads it runs, after
minutes of export and engine building (or, for tokenizer files, never: a Qwen tokenizer built from
default files loads fine and turns every text into no ids). Every error is one line: the file's full
path, what is wrong with it, and what needs it. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from cosycompile.errors import ModelError

_TOKENIZER = "the front end's Qwen tokenizer"
BUILTIN_MARKER = "builtin.json"
STAGE_CHECKPOINTS = {"llm": "llm.pt", "flow": "flow.pt", "hift": "hift.pt"}


def check_model_files(root: Path, stages: Sequence[str], config_file: str, family: str, qwen_dir: str,
                      frontend_models: Mapping[str, str]) -> None:
    """Raise :class:`ModelError` for the first file of ``root`` that a build with ``stages`` needs and cannot read.

    A model dir of any CosyVoice generation holds its config (``config_file``), one checkpoint per
    stage, the Qwen2 body's ``config.json`` and tokenizer under ``qwen_dir`` (a built-in's stand-in
    tokenizer needs only the config's vocab size) and the front end's ONNX models. The front end
    runs in every build (validation and calibration tokenize text and embed prompts), so its files
    are required whatever ``stages`` holds.
    """
    need_file(root / config_file, f"the model config: without it this is not a {family} model dir")
    for stage in stages:
        name = STAGE_CHECKPOINTS.get(stage)
        if name is not None:
            need_file(root / name, f"checkpoint of stage '{stage}'")
    qdir = root / qwen_dir
    builtin = (root / BUILTIN_MARKER).is_file()
    # read_model_config reads the Qwen2 config for every stage, not only for the LLM, and a built-in
    # model's stand-in tokenizer takes its vocab size from it: every build needs it.
    why = "Qwen2 config of the LLM" if "llm" in stages else f"Qwen2 config, read with {config_file} for every stage"
    qcfg = need_json(qdir / "config.json", why)
    if builtin:
        need_json(root / BUILTIN_MARKER, "marker of a built-in model, read by the front end")
        vocab = qcfg.get("vocab_size")
        if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
            raise ModelError(f"{qdir / 'config.json'}: needs a positive integer vocab_size "
                             f"(the built-in model's stand-in tokenizer folds bytes into it)")
    else:
        check_tokenizer(qdir, qcfg)
    for name, why in frontend_models.items():
        need_file(root / name, why)


def check_tokenizer(qdir: Path, qcfg: dict[str, Any]) -> None:
    """The files ``AutoTokenizer.from_pretrained(qdir, local_files_only=True)`` loads a working tokenizer from.

    transformers 5 takes ``tokenizer.json`` when it is there (vocab.json / merges.txt are then not
    read); otherwise it builds the BPE from ``vocab.json`` + ``merges.txt`` and needs a class for it,
    from ``tokenizer_config.json``'s ``tokenizer_class`` or ``config.json``'s ``model_type``. With
    none of those files it still "loads" a tokenizer whose vocab is one special token, which is the
    failure this check exists for. ``tokenizer_config.json`` is read whenever present.
    """
    tcfg_path = qdir / "tokenizer_config.json"
    tcfg = need_json(tcfg_path, _TOKENIZER) if tcfg_path.exists() else {}
    tok_json = qdir / "tokenizer.json"
    if tok_json.exists():
        data = need_json(tok_json, _TOKENIZER)
        model = data.get("model")
        if not isinstance(model, dict) or not model.get("vocab") or not isinstance(data.get("added_tokens"), list):
            raise ModelError(f"{tok_json}: not a tokenizers file (needs 'model' with a vocab and 'added_tokens') "
                             f"({_TOKENIZER})")
        return
    vocab, merges = qdir / "vocab.json", qdir / "merges.txt"
    need = f"{_TOKENIZER}, which needs vocab.json and merges.txt, or tokenizer.json"
    # Name vocab.json first: it is the file a released CosyVoice2-0.5B dir has (it has no tokenizer.json).
    data = need_json(vocab, need)
    if not data:
        raise ModelError(f"{vocab}: vocabulary is empty ({_TOKENIZER})")
    need_file(merges, need)
    check_merges(merges)
    if not isinstance(tcfg.get("tokenizer_class"), str) and not isinstance(qcfg.get("model_type"), str):
        raise ModelError(f"{tcfg_path}: {'has no tokenizer_class' if tcfg_path.exists() else 'missing'} and "
                         f"{qdir / 'config.json'} has no model_type, so {_TOKENIZER} class is unknown")


def check_merges(path: Path) -> None:
    """Every line must be one merge ``a b``, as tokenizers' BPE reader requires (``#version`` lines skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: unreadable ({exc.__class__.__name__}) ({_TOKENIZER})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a final newline ends the last line; it does not start an empty one
    n_merges = 0
    for n, line in enumerate(lines, 1):
        line = line.removesuffix("\r")
        if line.startswith("#version"):
            continue
        if len(line.split(" ")) != 2:
            raise ModelError(f"{path}:{n}: not a BPE merge 'a b' ({_TOKENIZER})")
        n_merges += 1
    if n_merges == 0:
        # Loads, but every byte becomes its own token: silently wrong text ids.
        raise ModelError(f"{path}: has no merges ({_TOKENIZER})")


def check_onnx_models(root: Path, models: Mapping[str, str]) -> None:
    """Parse each ONNX model ``name -> why`` of ``root`` (structure only, no session): a truncated or
    foreign file is a :class:`ModelError` naming it. Imports onnx, so not for planning time."""
    import onnx

    for name, why in models.items():
        path = Path(root) / name
        try:
            onnx.checker.check_model(onnx.load(str(path), load_external_data=False))
        except Exception as exc:  # onnx raises DecodeError, ValidationError, OSError, ...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"{path}: not a valid ONNX model ({first[:200]}) ({why})") from None


def need_file(path: Path, why: str) -> None:
    """A :class:`ModelError` unless ``path`` is a readable, non-empty file (``why``: what needs it)."""
    if not path.exists():
        raise ModelError(f"{path}: missing ({why})")
    if not path.is_file():
        raise ModelError(f"{path}: not a file ({why})")
    try:
        with path.open("rb") as f:
            empty = not f.read(1)
    except OSError as exc:
        raise ModelError(f"{path}: unreadable ({exc.strerror or exc.__class__.__name__}) ({why})") from None
    if empty:
        raise ModelError(f"{path}: empty file ({why})")


MAX_JSON_BYTES = 64 << 20  # Qwen's tokenizer.json is 7 MB; a config is kB


def need_json(path: Path, why: str) -> dict[str, Any]:
    """The JSON object in ``path`` (checked as :func:`need_file`, bounded in size, parsed)."""
    from cosycompile.core.bounded_read import BoundError, read_text

    need_file(path, why)
    try:
        data = json.loads(read_text(path, MAX_JSON_BYTES, "a model-dir JSON file"))
    except BoundError as exc:
        raise ModelError(f"{path}: {exc} ({why})") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}) ({why})") from None
    except RecursionError:
        raise ModelError(f"{path}: JSON nested too deep ({why})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: unreadable ({exc.__class__.__name__}) ({why})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object ({why})")
    return data
