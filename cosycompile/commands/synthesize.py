"""``cosycompile synthesize BUNDLE --text TEXT --out out.wav``: text -> 24 kHz wav on a bundle alone.

Everything comes from the bundle: the front end from ``frontend/``, the engines from
``engines/<stage>/`` (through ``runtime.loading.stage_runtime``, which checks each passport's
digests and hardware), sampling defaults and threads from ``recipe.json``. The text is split
into sentences (and long sentences at commas or spaces) and synthesized piece by piece with the
same prompt. Torch is never imported: this is what a server without the build side runs.

Seeds: piece ``k`` draws its speech tokens and its vocoder noise with seed ``SEED + k``, where
``SEED`` defaults to the recipe's ``validation.sampling.seed``; a one-sentence text with the
default seed therefore reproduces the build's own audio of eval item 0 (the build synthesizes
item ``n`` with the recipe's sampling and vocoder seed ``n``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from cosycompile.commands._bundle import MANIFEST, read_manifest
from cosycompile.errors import UserError

STAGES = ("llm", "flow", "hift")
FRONTEND_DIR = "frontend"  # fixed, never read from the manifest: an archive's manifest is not trusted with paths
SAMPLE_RATE = 24000
DEFAULT_MAX_CHARS = 80

# A sentence ends at 。！？ (a run of them) or at . ! ? followed by a space or the end of the text, so
# that "3.14" and "e.g.x" stay whole; closing quotes and brackets after the mark stay with the sentence.
_SENTENCE_END = re.compile(r"(?:[。！？]+|[.!?]+(?=\s|$))[\"'”’」』)）\]]*")
_SOFT_BREAK = re.compile(r"[,;:，；：、]\s*|\s+")


def text_weight(text: str) -> int:
    """Length in English-character equivalents: a CJK character takes about as long to say as 3 Latin ones."""
    return sum(3 if ord(c) >= 0x2E80 else 1 for c in text)


def split_text(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """Pieces of ``text`` to synthesize one at a time: sentences, long ones cut at soft breaks.

    Whitespace runs become one space (line breaks of a text file are not pauses). Consecutive
    short sentences are joined while they fit in ``max_chars`` (:func:`text_weight`), so a piece
    keeps the prosody of its sentences; a sentence longer than that is cut after the last comma,
    semicolon, colon or space that fits, or hard at the limit when there is none.
    """
    text = " ".join(text.split())
    sentences, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        sentences.append(text[start:m.end()].strip())
        start = m.end()
    sentences.append(text[start:].strip())
    pieces: list[str] = []
    for sentence in filter(None, sentences):
        for part in _cut(sentence, max_chars):
            if pieces and text_weight(pieces[-1]) + 1 + text_weight(part) <= max_chars:
                pieces[-1] = f"{pieces[-1]} {part}" if _spaced(pieces[-1], part) else pieces[-1] + part
            else:
                pieces.append(part)
    return pieces


def _spaced(left: str, right: str) -> bool:
    """Whether two joined pieces need a space between them (not between two CJK characters)."""
    return not (ord(left[-1]) >= 0x2E80 and ord(right[0]) >= 0x2E80)


def _cut(sentence: str, max_chars: int) -> list[str]:
    """``sentence`` in parts of at most ``max_chars`` (weighted), cut at soft breaks where possible."""
    out = []
    while text_weight(sentence) > max_chars:
        # Longest prefix within the limit, then back to its last soft break (keeping the punctuation).
        end, weight = 0, 0
        while end < len(sentence) and weight + text_weight(sentence[end]) <= max_chars:
            weight += text_weight(sentence[end])
            end += 1
        breaks = [m.end() for m in _SOFT_BREAK.finditer(sentence, 0, end) if m.end() > 0]
        cut = breaks[-1] if breaks and breaks[-1] > end // 3 else max(end, 1)
        out.append(sentence[:cut].strip())
        sentence = sentence[cut:].strip()
    if sentence:
        out.append(sentence)
    return [p for p in out if p]


def _read_text(args: argparse.Namespace) -> str:
    if args.text_file is not None:
        try:
            text = args.text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{args.text_file}: cannot read the text file ({exc.__class__.__name__})") from None
        where = str(args.text_file)
    else:
        text, where = args.text, "--text"
    if not text.strip():
        raise UserError(f"{where}: text is empty or whitespace; nothing to synthesize")
    return text


def _bundle_parts(bundle: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, recipe) of ``bundle``, after checking it holds what synthesis needs."""
    if not bundle.is_dir():
        raise UserError(f"{bundle}: not a bundle folder")
    manifest = read_manifest(bundle / MANIFEST)
    try:
        recipe = json.loads((bundle / "recipe.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{bundle / 'recipe.json'}: not a readable recipe ({exc.__class__.__name__})") from None
    for stage in STAGES:
        if not (bundle / "engines" / stage / "engine.json").is_file():
            raise UserError(f"{bundle / 'engines' / stage}: no engine for stage '{stage}' (synthesize needs "
                            f"{', '.join(STAGES)}; the recipe built {', '.join(manifest.get('stages', {})) or 'none'})")
    frontend = bundle / FRONTEND_DIR
    if not frontend.is_dir():
        raise UserError(f"{frontend}: missing (a bundle from before front ends were bundled: rebuild it with: "
                        f"cosycompile build {manifest.get('recipe_source') or '<recipe>'})")
    return manifest, recipe


def _verify_frontend(bundle: Path, manifest: dict[str, Any]) -> None:
    """The front end's files match the manifest (engines are checked by their passports when they load)."""
    import hashlib

    prefix = f"{FRONTEND_DIR}/"
    for rel, digest in sorted(manifest["files"].items()):
        if rel.startswith(prefix):
            path = bundle / rel
            try:
                with path.open("rb") as f:
                    got = hashlib.file_digest(f, "sha256").hexdigest()
            except OSError as exc:
                raise UserError(f"{path}: unreadable ({exc.strerror or exc}); copy the bundle again") from None
            if got != digest:
                raise UserError(f"{path}: digest mismatch with {bundle / MANIFEST} (changed or truncated since the "
                                f"build); copy the bundle again or rebuild with: cosycompile build "
                                f"{manifest.get('recipe_source') or '<recipe>'}")


def _sampling(recipe: dict[str, Any], args: argparse.Namespace) -> Any:
    from cosycompile.runtime.sampling import Sampling

    fields = {f.name for f in dataclasses.fields(Sampling)}
    spec = {k: v for k, v in recipe.get("validation", {}).get("sampling", {}).items() if k in fields}
    sampling = Sampling(**spec)
    if args.sampling is not None:
        sampling = dataclasses.replace(sampling, mode=args.sampling)
    if args.seed is not None:
        sampling = dataclasses.replace(sampling, seed=args.seed)
    if args.max_tokens is not None:
        sampling = dataclasses.replace(sampling, max_tokens=args.max_tokens or None)
    return sampling


def run(args: argparse.Namespace) -> int:
    """The ``synthesize`` command."""
    import numpy as np

    t0 = time.perf_counter()
    text = _read_text(args)
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: needs at least 1")
    if args.max_tokens is not None and args.max_tokens < 0:
        raise UserError(f"--max-tokens {args.max_tokens}: needs 0 (no cap) or more")
    if args.max_chars < 10:
        raise UserError(f"--max-chars {args.max_chars}: too short to hold a phrase (at least 10)")
    if args.prompt_text is not None and args.prompt_wav is None:
        raise UserError("--prompt-text needs --prompt-wav (the prompt's text is what its audio says)")
    out: Path = args.out
    if not out.parent.is_dir():
        raise UserError(f"{out}: its folder does not exist")
    if out.is_dir():
        raise UserError(f"{out}: is a folder; give the wav file's name")
    bundle: Path = args.bundle
    manifest, recipe = _bundle_parts(bundle)
    pieces = split_text(text, args.max_chars)
    sampling = _sampling(recipe, args)
    threads = args.threads or int(recipe.get("validation", {}).get("speed", {}).get("threads", 2))
    _verify_frontend(bundle, manifest)

    from cosycompile.runtime.dataset import read_wav
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Pipeline, Prompt

    prompt_wav = read_wav(args.prompt_wav) if args.prompt_wav is not None else None
    # One front-end thread, as the build's checks use: the prompt features are then the build's bit for bit.
    frontend = Frontend(bundle / FRONTEND_DIR, threads=1)
    pipeline = Pipeline(*(stage_runtime(s, bundle / "engines" / s, threads) for s in STAGES))
    if prompt_wav is not None:
        prompt = frontend.prompt(prompt_wav[0], prompt_wav[1], args.prompt_text or "")
    else:
        prompt = Prompt.empty()
    ids = [frontend.text_ids(p) for p in pieces]  # every piece tokenizes before minutes of synthesis start

    from tqdm import tqdm

    wavs = []
    t1 = time.perf_counter()
    bar = tqdm(list(zip(pieces, ids)), desc="synthesizing", unit="piece", file=sys.stderr,
               disable=not sys.stderr.isatty())
    for k, (piece, text_ids) in enumerate(bar):
        s = pipeline.synthesize(text_ids, prompt, dataclasses.replace(sampling, seed=sampling.seed + k),
                                seed=sampling.seed + k)
        wavs.append(s.wav)
    wav = np.concatenate(wavs) if wavs else np.zeros(0, np.float32)
    synth_s = time.perf_counter() - t1
    _write_wav(out, wav)
    audio_s = len(wav) / SAMPLE_RATE
    rtf = f", RTF {synth_s / audio_s:.2f}" if audio_s else ""
    print(f"wrote {out}: {audio_s:.2f} s of audio from {len(pieces)} piece{'s' if len(pieces) != 1 else ''} "
          f"in {time.perf_counter() - t0:.1f} s (synthesis {synth_s:.1f} s{rtf})")
    return 0


def _write_wav(path: Path, wav: Any) -> None:
    """24 kHz mono PCM16, written next to ``path`` and renamed into place (no half-written file)."""
    import numpy as np
    import soundfile as sf

    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.wav"
    try:
        sf.write(str(tmp), np.asarray(wav, np.float32), SAMPLE_RATE, subtype="PCM_16", format="WAV")
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # soundfile reports write errors as LibsndfileError (a RuntimeError)
        raise UserError(f"{path}: cannot write ({getattr(exc, 'strerror', None) or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
