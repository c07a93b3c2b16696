"""Calibration and evaluation sets: a folder with ``manifest.jsonl`` and prompt audio.

Each manifest line is ``{"id", "lang", "text", "prompt_text", "prompt_wav"}`` with
``prompt_wav`` relative to the folder. Reading the manifest is light (no audio decoding), so the
planner can hash the set's files; audio is decoded only when a step runs.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where arrays are made: planning a cached build needs none
    import numpy as np

from cosycompile.core.bounded_read import MAX_MANIFEST_BYTES
from cosycompile.errors import DataError
from cosycompile.runtime.text import split_text, text_weight

MANIFEST = "manifest.jsonl"
_REQUIRED = ("id", "text")
_OPTIONAL = ("lang", "prompt_text", "prompt_wav")
# Ids name files (``audio/<id>.built.wav``): no separators, no leading dot.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A text longer than this (English-character equivalents) is synthesized as several items, split
# at sentence ends, as CosyVoice's front end does: one LLM sequence stays bounded in length and
# memory whatever a manifest holds. Every text of the shipped sets is shorter.
MAX_ITEM_WEIGHT = 400
PIECE_WEIGHT = 300
MAX_PROMPT_SECONDS = 30.0  # CosyVoice's speech tokenizer takes prompts of up to 30 s
# Prompt rates read: telephone audio up to studio masters (a 1 Hz header would resample to nonsense).
MIN_PROMPT_RATE, MAX_PROMPT_RATE = 8000, 192000


@dataclass(frozen=True)
class Item:
    """One utterance to synthesize."""

    id: str
    text: str
    lang: str = ""
    prompt_text: str = ""
    prompt_wav: Path | None = None


@dataclass(frozen=True)
class DataSet:
    root: Path
    items: tuple[Item, ...]

    def files(self) -> list[Path]:
        """Every file whose content defines the set (for content keys)."""
        wavs = sorted({i.prompt_wav for i in self.items if i.prompt_wav is not None})
        return [self.root / MANIFEST, *wavs]

    def head(self, n: int) -> tuple[Item, ...]:
        return self.items[:n]


def load_dataset(root: Path, what: str = "eval set") -> DataSet:
    """Parse and check a set's manifest; every problem is a DataError naming the file and line."""
    manifest = root / MANIFEST
    if not root.is_dir():
        raise DataError(f"{root}: {what} folder not found")
    if not manifest.exists():
        raise DataError(f"{manifest}: {what} has no {MANIFEST}")
    from cosycompile.core.bounded_read import BoundError, read_text

    try:
        text = read_text(manifest, MAX_MANIFEST_BYTES, f"a {what} manifest")
    except BoundError as exc:
        raise DataError(f"{manifest}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{manifest}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{manifest}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
    items: list[Item] = []
    seen: set[str] = set()
    real_root = root.resolve()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise DataError(f"{manifest}:{n}: not valid JSON ({getattr(exc, 'msg', 'nested too deeply')})") from None
        items.extend(_items(row, f"{manifest}:{n}", real_root, seen))
    if not items:
        raise DataError(f"{manifest}: {what} is empty")
    return DataSet(root.resolve(), tuple(items))


def _items(row: object, where: str, root: Path, seen: set[str]) -> list[Item]:
    """The item(s) of one manifest line, every field checked; a long text becomes several items."""
    if not isinstance(row, dict) or any(not isinstance(row.get(k), str) or not row.get(k) for k in _REQUIRED):
        raise DataError(f"{where}: each line needs non-empty string fields {', '.join(_REQUIRED)}")
    for key in _OPTIONAL:
        if key in row and not isinstance(row[key], str):
            raise DataError(f"{where}: '{key}' must be a string, not {type(row[key]).__name__}")
    item_id, text = row["id"], row["text"]
    if not _ID.match(item_id):
        raise DataError(f"{where}: id '{item_id[:40]}' must be 1-128 letters, digits, '.', '_' or '-' "
                        "(it names files), starting with a letter or digit")
    if item_id in seen:
        raise DataError(f"{where}: duplicate id '{item_id}'")
    seen.add(item_id)
    if not speakable(text):
        raise DataError(f"{where}: text {text[:20]!r} has nothing to speak (no letters or digits)")
    wav = _prompt_path(row.get("prompt_wav") or "", where, root)
    lang, prompt_text = row.get("lang", ""), row.get("prompt_text", "")
    check_prompt_text(prompt_text, f"{where}: 'prompt_text'")
    if text_weight(text) <= MAX_ITEM_WEIGHT:
        return [Item(item_id, text, lang, prompt_text, wav)]
    pieces = [p for p in split_text(text, PIECE_WEIGHT) if speakable(p)]
    out = []
    for k, piece in enumerate(pieces, 1):
        pid = f"{item_id}.part{k}"
        if pid in seen:
            raise DataError(f"{where}: id '{pid}' (piece {k} of the long text of '{item_id}') is also an id")
        seen.add(pid)
        out.append(Item(pid, piece, lang, prompt_text, wav))
    return out


def check_prompt_text(prompt_text: str, where: str) -> None:
    """A prompt's text says what its audio (at most 30 s) says: longer than one item's bound, it is
    not that text, and the LM's prefix would grow with it. DataError naming ``where``."""
    weight = text_weight(prompt_text)
    if weight > MAX_ITEM_WEIGHT:
        raise DataError(f"{where}: {weight} English-character equivalents; a prompt's text (what at most "
                        f"{MAX_PROMPT_SECONDS:.0f} s of audio says) is at most {MAX_ITEM_WEIGHT}")


def _prompt_path(rel: str, where: str, root: Path) -> Path | None:
    """``prompt_wav`` resolved inside the set's folder: absolute paths, ``..`` and links that lead
    out of it are refused (a manifest must not make a build read arbitrary files)."""
    if not rel:
        return None
    if Path(rel).is_absolute() or "\\" in rel:
        raise DataError(f"{where}: prompt_wav '{rel}' must be a path relative to the set's folder")
    wav = (root / rel).resolve()
    if not wav.is_relative_to(root):
        raise DataError(f"{where}: prompt_wav '{rel}' leads outside the set's folder {root}")
    if not wav.is_file():
        raise DataError(f"{where}: prompt_wav '{rel}' not found (or not a regular file)")
    return wav


def speakable(text: str) -> bool:
    """Whether ``text`` has anything to say: a letter or a digit in any script (not only spaces,
    punctuation, symbols or emoji)."""
    return any(unicodedata.category(c)[0] in "LN" for c in text)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 audio and its sample rate, any container soundfile reads; a DataError naming the
    file for unreadable audio, no samples, a rate outside 8-192 kHz, more than 30 s (from the header,
    before a sample is read) or a NaN / Inf sample."""
    import numpy as np
    import soundfile as sf

    from cosycompile.core.bounded_read import BoundError, require_regular

    try:
        require_regular(path)  # soundfile would open a FIFO and wait for a writer
    except (BoundError, OSError) as exc:
        raise DataError(f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    try:
        info = sf.info(str(path))
    except Exception as exc:  # soundfile raises several types for bad files
        raise DataError(f"{path}: unreadable audio ({_first_line(exc)})") from None
    if info.frames <= 0:
        raise DataError(f"{path}: audio file has no samples")
    if not MIN_PROMPT_RATE <= info.samplerate <= MAX_PROMPT_RATE:
        raise DataError(f"{path}: audio at {info.samplerate} Hz; prompts are read at "
                        f"{MIN_PROMPT_RATE // 1000}-{MAX_PROMPT_RATE // 1000} kHz")
    if info.frames > MAX_PROMPT_SECONDS * info.samplerate:
        raise DataError(f"{path}: prompt audio is {info.frames / info.samplerate:.1f} s; CosyVoice takes prompts "
                        f"of up to {MAX_PROMPT_SECONDS:.0f} s")
    try:
        # At most the header's frame count: a header that under-reports cannot make this read grow.
        wav, sr = sf.read(str(path), frames=int(info.frames), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises several types for bad files
        raise DataError(f"{path}: unreadable audio ({_first_line(exc)})") from None
    if wav.shape[0] == 0:
        raise DataError(f"{path}: audio file has no samples")
    if not np.isfinite(wav).all():
        raise DataError(f"{path}: audio holds NaN or Inf samples")
    return wav.mean(axis=1), int(sr)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def check_audio(paths: list[Path]) -> None:
    """Every prompt read as :func:`read_wav` reads it (prompts are at most 30 s, so this is cheap):
    bad audio is a DataError before any step runs. The set's manifest, listed beside them, is skipped."""
    for p in paths:
        if p.name != MANIFEST:
            read_wav(p)
