"""A bundle's speaker cache: named prompts whose costly features are computed once.

A zero-shot prompt costs two ONNX models (the speech tokenizer and the speaker embedding) and a
mel on every request. ``cosycompile speakers add`` computes them once and stores them in the
bundle as ``speakers/<name>.npz`` (speech tokens, mel, embedding, and the prompt's text, which is
tokenized per request because the family's instruction depends on what is said). The file is
listed in the bundle's manifest with its digest and size like every other file, so ``pack``,
``unpack`` and the digest checks carry and guard it, and the build still finds the bundle intact.
A model that ships speakers (CosyVoice-300M-SFT's ``spk2info.pt``: an x-vector per name, no prompt
audio) has them written here when its bundle is assembled (the family's ``model_speakers`` hook).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import unicodedata
import uuid
from contextlib import contextmanager
from urllib.parse import quote, unquote
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cosycompile.errors import UserError
from cosycompile.runtime.bundle import MANIFEST, read_manifest, verify_files

SPEAKERS_DIR = "speakers"
# Letters of any script (an SFT model's speakers are named 中文女, 英文男, ...), digits, '.', '_', '-':
# a file name, never a path.
_NAME = re.compile(r"[^\W_][\w.-]{0,63}")
# A 30 s prompt: 750 tokens, an 80 x 1500 mel, a 192-dim embedding: well under 1 MB.
MAX_SPEAKER_BYTES = 4 << 20
_ARRAYS = ("speech_tokens", "mel", "embedding", "prompt_text")


@dataclass
class Speaker:
    """A cached prompt: its text and the features :meth:`Frontend.prompt_features` made of its audio."""

    name: str
    prompt_text: str
    speech_tokens: np.ndarray
    mel: np.ndarray
    embedding: np.ndarray

    @property
    def features(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.speech_tokens, self.mel, self.embedding


def check_name(name: str) -> str:
    """``name`` if it can name a speaker (a file name: letters, digits, ``.``, ``_``, ``-``; at most 64)."""
    if not _NAME.fullmatch(name or ""):
        raise UserError(f"speaker name {name[:80]!r}: use 1-64 letters, digits, '.', '_' or '-', "
                        f"starting with a letter or digit")
    # Letters of any script, but one spelling per name: NFC, so a file written on one machine is found on another.
    if unicodedata.normalize("NFC", name) != name:
        raise UserError(f"speaker name {name[:80]!r}: not in Unicode normal form C")
    return name


def speaker_file(name: str) -> str:
    """The bundle-relative path of speaker ``name``: percent-encoded past ASCII (``中文女`` ->
    ``%E4%B8%AD%E6%96%87%E5%A5%B3``), since servers may run with an ASCII file-system encoding."""
    return f"{SPEAKERS_DIR}/{quote(check_name(name), safe='')}.npz"


def speaker_names(manifest: dict[str, Any]) -> list[str]:
    """The speakers a bundle's manifest lists, sorted."""
    prefix = f"{SPEAKERS_DIR}/"
    return sorted(unquote(rel[len(prefix):-4]) for rel in manifest["files"]
                  if rel.startswith(prefix) and rel.endswith(".npz"))


def load_speaker(bundle: Path, manifest: dict[str, Any], name: str) -> Speaker:
    """Speaker ``name`` of ``bundle``, its file checked against the manifest's digest first."""
    rel = speaker_file(name)
    if rel not in manifest["files"]:
        known = ", ".join(speaker_names(manifest)) or "none; add one with: cosycompile speakers add"
        raise UserError(f"{bundle}: no speaker {name!r} (speakers: {known})")
    size = manifest.get("sizes", {}).get(rel, 0)
    if size > MAX_SPEAKER_BYTES:
        raise UserError(f"{bundle / rel}: {size} bytes, over the {MAX_SPEAKER_BYTES:,}-byte limit of a speaker")
    verify_files(bundle, manifest, rel)
    try:
        with np.load(bundle / rel, allow_pickle=False) as z:
            arrays = {k: z[k] for k in _ARRAYS}
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{bundle / rel}: not a speaker file ({exc.__class__.__name__})") from None
    tokens, mel, emb = arrays["speech_tokens"], arrays["mel"], arrays["embedding"]
    if not (tokens.ndim == 1 and tokens.dtype == np.int64 and mel.ndim == 2 and _frames_fit(mel.shape[1], len(tokens),
                                                                                          manifest)
            and mel.dtype == np.float32 and emb.ndim == 1 and emb.dtype == np.float32
            and np.isfinite(mel).all() and np.isfinite(emb).all()):
        raise UserError(f"{bundle / rel}: arrays of the wrong shape or type for a speaker")
    return Speaker(name, str(arrays["prompt_text"]), tokens, mel, emb)


def _frames_fit(frames: int, tokens: int, manifest: dict[str, Any]) -> bool:
    """Whether a speaker's prompt mel has as many frames as its tokens make in the bundle's family (CosyVoice2
    and later: 2 per token; the first generation does not trim, so only none with none)."""
    from cosycompile.families import LEGACY_FAMILY, family_infos

    family = family_infos().get(str(manifest.get("family", LEGACY_FAMILY)))
    per = family.prompt_mel_frames_per_token if family is not None else 2
    return frames == per * tokens if per else (frames == 0) == (tokens == 0)


def write_speaker_file(path: Path, speaker: Speaker) -> None:
    """``speaker`` as the npz a bundle's speaker cache holds (written at ``path`` as is: callers rename)."""
    with open(path, "wb") as f:
        np.savez(f, speech_tokens=speaker.speech_tokens.astype(np.int64), mel=speaker.mel.astype(np.float32),
                 embedding=speaker.embedding.astype(np.float32), prompt_text=np.array(speaker.prompt_text))


@contextmanager
def _bundle_lock(bundle: Path) -> Iterator[None]:
    """An exclusive lock on the bundle's folder itself (no lock file: every file in a bundle is listed)."""
    fd = os.open(bundle, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_manifest(bundle: Path, manifest: dict[str, Any]) -> None:
    # A new file renamed over the old: a bundle's manifest may be a hard link into the cache.
    tmp = bundle / f".{MANIFEST}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    try:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, bundle / MANIFEST)
    finally:
        tmp.unlink(missing_ok=True)


def add_speaker(bundle: Path, speaker: Speaker, replace: bool = False) -> str:
    """Write ``speaker`` into ``bundle`` and list it in the manifest; returns its relative path.
    An existing speaker of that name is a UserError unless ``replace``."""
    from cosycompile.core.hashing import sha256_file

    rel = speaker_file(speaker.name)
    with _bundle_lock(bundle):
        manifest = read_manifest(bundle / MANIFEST)
        if rel in manifest["files"] and not replace:
            raise UserError(f"{bundle}: speaker {speaker.name!r} exists (--replace to overwrite it)")
        (bundle / SPEAKERS_DIR).mkdir(exist_ok=True)
        tmp = bundle / SPEAKERS_DIR / f".{uuid.uuid4().hex}.{os.getpid()}.npz"
        try:
            write_speaker_file(tmp, speaker)
            files = dict(manifest["files"], **{rel: sha256_file(tmp)})
            sizes = dict(manifest.get("sizes", {}), **{rel: tmp.stat().st_size})
            os.replace(tmp, bundle / rel)
        finally:
            tmp.unlink(missing_ok=True)
        manifest["files"] = dict(sorted(files.items()))
        if "sizes" in manifest:
            manifest["sizes"] = dict(sorted(sizes.items()))
        _write_manifest(bundle, manifest)
    return rel


def remove_speaker(bundle: Path, name: str) -> None:
    """Drop speaker ``name`` from ``bundle`` (its file and its manifest lines)."""
    rel = speaker_file(name)
    with _bundle_lock(bundle):
        manifest = read_manifest(bundle / MANIFEST)
        if rel not in manifest["files"]:
            raise UserError(f"{bundle}: no speaker {name!r} (speakers: {', '.join(speaker_names(manifest)) or 'none'})")
        del manifest["files"][rel]
        manifest.get("sizes", {}).pop(rel, None)
        _write_manifest(bundle, manifest)
        (bundle / rel).unlink(missing_ok=True)
