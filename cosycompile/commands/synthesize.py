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
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from cosycompile.commands._bundle import MANIFEST, read_manifest
from cosycompile.commands._output import check_out_file
from cosycompile.core.atomic import write_atomic
from cosycompile.errors import UserError
from cosycompile.runtime.text import DEFAULT_MAX_CHARS, split_text, text_weight  # noqa: F401 - re-exported

FRONTEND_DIR = "frontend"  # fixed, never read from the manifest: an archive's manifest is not trusted with paths
SAMPLE_RATE = 24000
MAX_TEXT_FILE_BYTES = 1 << 20  # a book chapter is ~100 kB; synthesis is split into pieces anyway

def _read_text(args: argparse.Namespace) -> str:
    if args.text_file is not None:
        from cosycompile.core.bounded_read import BoundError, read_text

        try:
            text = read_text(args.text_file, MAX_TEXT_FILE_BYTES, "--text-file")
        except BoundError as exc:
            raise UserError(f"{args.text_file}: {exc}") from None
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
    from cosycompile.stages import pipeline_stages

    stages = pipeline_stages()
    for stage in stages:
        if not (bundle / "engines" / stage / "engine.json").is_file():
            raise UserError(f"{bundle / 'engines' / stage}: no engine for stage '{stage}' (synthesize needs "
                            f"{', '.join(stages)}; the recipe built {', '.join(manifest.get('stages', {})) or 'none'})")
    frontend = bundle / FRONTEND_DIR
    if not frontend.is_dir():
        raise UserError(f"{frontend}: missing (a bundle from before front ends were bundled: rebuild it with: "
                        f"cosycompile build {manifest.get('recipe_source') or '<recipe>'})")
    return manifest, recipe


def _verify_frontend(bundle: Path, manifest: dict[str, Any]) -> None:
    """The front end's files match the manifest (engines are checked by their passports when they load)."""
    from cosycompile.core.hashing import sha256_file

    prefix = f"{FRONTEND_DIR}/"
    for rel, digest in sorted(manifest["files"].items()):
        if rel.startswith(prefix):
            path = bundle / rel
            try:
                got = sha256_file(path)
            except OSError as exc:
                raise UserError(f"{path}: unreadable ({exc.strerror or exc}); copy the bundle again") from None
            if got != digest:
                raise UserError(f"{path}: digest mismatch with {bundle / MANIFEST} (changed or truncated since the "
                                f"build); copy the bundle again or rebuild with: cosycompile build "
                                f"{manifest.get('recipe_source') or '<recipe>'}")


def recipe_sampling(recipe: dict[str, Any], mode: str | None = None, seed: int | None = None,
                    max_tokens: int | None = None) -> Any:
    """The recipe's ``validation.sampling`` as a :class:`~cosycompile.runtime.sampling.Sampling`, with overrides.

    ``max_tokens=0`` means no cap; ``None`` keeps the recipe's value (as for ``mode`` and ``seed``).
    """
    from cosycompile.runtime.sampling import Sampling

    fields = {f.name for f in dataclasses.fields(Sampling)}
    spec = {k: v for k, v in recipe.get("validation", {}).get("sampling", {}).items() if k in fields}
    sampling = Sampling(**spec)
    if mode is not None:
        sampling = dataclasses.replace(sampling, mode=mode)
    if seed is not None:
        sampling = dataclasses.replace(sampling, seed=seed)
    if max_tokens is not None:
        sampling = dataclasses.replace(sampling, max_tokens=max_tokens or None)
    return sampling


@dataclasses.dataclass
class LoadedBundle:
    """A bundle opened for synthesis: what ``synthesize`` and the Triton models run."""

    path: Path
    manifest: dict[str, Any]
    recipe: dict[str, Any]
    frontend: Any  # cosycompile.runtime.frontend.Frontend
    pipeline: Any  # cosycompile.runtime.pipeline.Pipeline
    threads: int


def recipe_threads(recipe: dict[str, Any]) -> int:
    """The intra-op threads the recipe validated its engines with (``validation.speed.threads``)."""
    return int(recipe.get("validation", {}).get("speed", {}).get("threads", 2))


def load_bundle(bundle: Path, threads: int | None = None) -> LoadedBundle:
    """Check ``bundle`` (layout, front-end digests) and load its front end and engines (no torch).

    Engines are checked by their passports as they load. Bad input is a one-line UserError.
    """
    manifest, recipe = _bundle_parts(bundle)
    threads = threads or recipe_threads(recipe)
    _verify_frontend(bundle, manifest)

    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Pipeline

    # One front-end thread, as the build's checks use: the prompt features are then the build's bit for bit.
    frontend = Frontend(bundle / FRONTEND_DIR, threads=1)
    from cosycompile.stages import pipeline_stages

    pipeline = Pipeline({s: stage_runtime(s, bundle / "engines" / s, threads) for s in pipeline_stages()})
    return LoadedBundle(bundle, manifest, recipe, frontend, pipeline, threads)


def synthesize_pieces(pipeline: Any, ids: list[Any], prompt: Any, sampling: Any) -> Iterator[Any]:
    """The wav (float32, 24 kHz) of each piece's text ids in turn; piece ``k`` uses seed ``sampling.seed + k``."""
    for k, text_ids in enumerate(ids):
        seed = sampling.seed + k
        yield pipeline.synthesize(text_ids, prompt, dataclasses.replace(sampling, seed=seed), seed=seed).wav


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
    if args.prompt_text is not None:
        from cosycompile.runtime.dataset import check_prompt_text

        check_prompt_text(args.prompt_text, "--prompt-text")
    out: Path = args.out
    check_out_file(out, "--out", "give the wav file's name")
    bundle: Path = args.bundle
    _bundle_parts(bundle)  # layout errors before the text is split or the engines load
    pieces = split_text(text, args.max_chars)

    from cosycompile.runtime.dataset import read_wav

    prompt_wav = read_wav(args.prompt_wav) if args.prompt_wav is not None else None
    loaded = load_bundle(bundle, args.threads)
    sampling = recipe_sampling(loaded.recipe, args.sampling, args.seed, args.max_tokens)
    frontend = loaded.frontend
    if prompt_wav is not None:
        prompt = frontend.prompt(prompt_wav[0], prompt_wav[1], args.prompt_text or "", text)
    else:
        prompt = frontend.no_prompt(text)
    ids = [frontend.text_ids(p) for p in pieces]  # every piece tokenizes before minutes of synthesis start

    from tqdm import tqdm

    t1 = time.perf_counter()
    wavs = list(tqdm(synthesize_pieces(loaded.pipeline, ids, prompt, sampling), total=len(ids), desc="synthesizing",
                     unit="piece", file=sys.stderr, disable=not sys.stderr.isatty()))
    wav = np.concatenate(wavs) if wavs else np.zeros(0, np.float32)
    synth_s = time.perf_counter() - t1
    _write_wav(out, wav)
    audio_s = len(wav) / SAMPLE_RATE
    rtf = f", RTF {synth_s / audio_s:.2f}" if audio_s else ""
    print(f"wrote {out}: {audio_s:.2f} s of audio from {len(pieces)} piece{'s' if len(pieces) != 1 else ''} "
          f"in {time.perf_counter() - t0:.1f} s (synthesis {synth_s:.1f} s{rtf})")
    return 0


def _write_wav(path: Path, wav: Any) -> None:
    """24 kHz mono PCM16, encoded in memory, then written next to ``path`` and renamed into place (no
    half-written file). The target is checked again first: synthesis takes long enough for a plain
    file to have been swapped for a device or a FIFO meanwhile."""
    import io

    import numpy as np
    import soundfile as sf

    buf = io.BytesIO()
    try:
        sf.write(buf, np.asarray(wav, np.float32), SAMPLE_RATE, subtype="PCM_16", format="WAV")
    except RuntimeError as exc:  # soundfile reports encoding errors as LibsndfileError (a RuntimeError)
        raise UserError(f"{path}: cannot encode the wav ({exc})") from None
    check_out_file(path, "--out", "give the wav file's name")
    try:
        write_atomic(path, buf.getvalue())
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
