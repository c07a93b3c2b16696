"""Calibration and evaluation sets: a folder with ``manifest.jsonl`` and prompt audio.

Each manifest line is ``{"id", "lang", "text", "prompt_text", "prompt_wav"}`` with
``prompt_wav`` relative to the folder. Reading the manifest is light (no audio decoding), so the
planner can hash the set's files; audio is decoded only when a step runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where arrays are made: planning a cached build needs none
    import numpy as np

from cosycompile.errors import DataError

MANIFEST = "manifest.jsonl"
_REQUIRED = ("id", "text")


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
    if not manifest.is_file():
        raise DataError(f"{manifest}: {what} has no {MANIFEST}")
    items: list[Item] = []
    seen: set[str] = set()
    for n, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{manifest}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or any(not isinstance(row.get(k), str) or not row.get(k) for k in _REQUIRED):
            raise DataError(f"{manifest}:{n}: each line needs non-empty string fields {', '.join(_REQUIRED)}")
        if row["id"] in seen:
            raise DataError(f"{manifest}:{n}: duplicate id '{row['id']}'")
        seen.add(row["id"])
        wav = None
        if row.get("prompt_wav"):
            wav = (root / row["prompt_wav"]).resolve()
            if not wav.is_file():
                raise DataError(f"{manifest}:{n}: prompt_wav '{row['prompt_wav']}' not found")
        items.append(Item(row["id"], row["text"], row.get("lang", ""), row.get("prompt_text", ""), wav))
    if not items:
        raise DataError(f"{manifest}: {what} is empty")
    return DataSet(root.resolve(), tuple(items))


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 audio and its sample rate; unreadable audio is a DataError naming the file."""
    import soundfile as sf

    try:
        wav, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises several types for bad files
        raise DataError(f"{path}: unreadable audio ({exc})") from None
    if wav.shape[0] == 0:
        raise DataError(f"{path}: audio file has no samples")
    return wav.mean(axis=1), int(sr)


def check_audio(paths: list[Path]) -> None:
    """Header check of every wav (cheap): unreadable audio is a DataError before any step runs."""
    import soundfile as sf

    for p in paths:
        if p.suffix.lower() != ".wav":
            continue
        try:
            info = sf.info(str(p))
        except Exception as exc:  # soundfile raises several types for bad files
            raise DataError(f"{p}: unreadable audio ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        if info.frames == 0:
            raise DataError(f"{p}: audio file has no samples")
