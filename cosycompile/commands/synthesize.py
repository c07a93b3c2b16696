"""``cosycompile synthesize BUNDLE --text TEXT --out out.wav``: text -> wav on a bundle alone.

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
import sys
import time
from pathlib import Path
from typing import Any

from cosycompile.commands._output import check_out_file
from cosycompile.core.atomic import write_atomic
from cosycompile.errors import UserError
from cosycompile.runtime.bundle import bundle_parts, load_bundle, recipe_sampling, synthesize_pieces
from cosycompile.runtime.text import DEFAULT_MAX_CHARS, split_text

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
    from cosycompile.runtime.dataset import speakable

    if not speakable(text):
        raise UserError(f"{where}: text has no letter or digit in any script; nothing to synthesize")
    return text


ORDER = 110
EXAMPLES = (
    ('cosycompile synthesize DIR --text "Hello." --out hello.wav', 'text -> wav with the bundle alone'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("synthesize", help="text -> wav on a CPU bundle alone (no torch, no model dir)",
                       description="Synthesize TEXT with the bundle's engines and front end. Long texts are split "
                                   "into sentences and synthesized piece by piece with the same prompt. Sampling "
                                   "defaults are the recipe's validation.sampling.")
    p.add_argument("bundle", type=Path, help="bundle dir (a build's, or one from cosycompile unpack)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to say")
    src.add_argument("--text-file", type=Path, metavar="FILE", help="UTF-8 file with the text to say")
    p.add_argument("--prompt-wav", type=Path, metavar="WAV", help="zero-shot prompt audio (the voice to imitate)")
    p.add_argument("--prompt-text", metavar="TEXT", help="what the prompt audio says (needs --prompt-wav)")
    p.add_argument("--speaker", metavar="NAME", help="a voice cached in the bundle by `cosycompile speakers add` "
                                                     "(instead of --prompt-wav and --prompt-text)")
    p.add_argument("--seed", type=int, default=None, help="sampling and vocoder seed of the first piece; piece k "
                                                          "uses SEED+k (default: the recipe's sampling seed)")
    p.add_argument("--sampling", choices=("greedy", "ras"), default=None,
                   help="speech-token sampling (default: the recipe's validation.sampling.mode)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="cap on speech tokens per piece, 0 for none (default: the recipe's)")
    p.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS, metavar="N",
                   help="longest piece in English-character equivalents; a CJK character counts 3 (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="intra-op threads of the engines (default: the recipe's validation.speed.threads)")
    p.add_argument("--stream", action="store_true",
                   help="token-chunk streaming, as a streaming server runs it: each piece's audio in chunks cut "
                        "while the LM decodes (a line per chunk on stderr, with when it was ready); the wav is "
                        "written at the end")
    p.add_argument("--out", type=Path, required=True, metavar="WAV", help="wav file to write (PCM16 at the model's sample rate)")
    return p


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
    if args.speaker is not None and (args.prompt_wav is not None or args.prompt_text is not None):
        raise UserError("--speaker replaces --prompt-wav and --prompt-text (the speaker is a cached prompt)")
    if args.prompt_text is not None and args.prompt_wav is None:
        raise UserError("--prompt-text needs --prompt-wav (the prompt's text is what its audio says)")
    if args.prompt_text is not None:
        from cosycompile.runtime.dataset import check_prompt_text

        check_prompt_text(args.prompt_text, "--prompt-text")
    out: Path = args.out
    check_out_file(out, "--out", "give the wav file's name")
    bundle: Path = args.bundle
    manifest, _ = bundle_parts(bundle)  # layout errors before the text is split or the engines load
    speaker = None
    if args.speaker is not None:
        from cosycompile.runtime.speakers import load_speaker

        speaker = load_speaker(bundle, manifest, args.speaker)
    from cosycompile.runtime.dataset import speakable

    # A piece of only punctuation or symbols says nothing and costs a whole LLM and flow call.
    pieces = [p for p in split_text(text, args.max_chars) if speakable(p)]

    from cosycompile.runtime.dataset import read_wav

    prompt_wav = read_wav(args.prompt_wav) if args.prompt_wav is not None else None
    loaded = load_bundle(bundle, args.threads)
    sampling = recipe_sampling(loaded.recipe, args.sampling, args.seed, args.max_tokens)
    frontend = loaded.frontend
    if speaker is not None:
        prompt = frontend.prompt_from_features(speaker.features, speaker.prompt_text, text)
    elif prompt_wav is not None:
        prompt = frontend.prompt(prompt_wav[0], prompt_wav[1], args.prompt_text or "", text)
    else:
        prompt = frontend.no_prompt(text)
    ids = [frontend.text_ids(p) for p in pieces]  # every piece tokenizes before minutes of synthesis start

    t1 = time.perf_counter()
    sample_rate = loaded.pipeline.sample_rate
    if args.stream:
        wavs, first = _streamed(loaded.pipeline, ids, prompt, sampling, sample_rate)
    else:
        from tqdm import tqdm

        wavs = list(tqdm(synthesize_pieces(loaded.pipeline, ids, prompt, sampling), total=len(ids),
                         desc="synthesizing", unit="piece", file=sys.stderr, disable=not sys.stderr.isatty()))
    wav = np.concatenate(wavs) if wavs else np.zeros(0, np.float32)
    synth_s = time.perf_counter() - t1
    _write_wav(out, wav, sample_rate)
    audio_s = len(wav) / sample_rate
    rtf = f", RTF {synth_s / audio_s:.2f}" if audio_s else ""
    streamed = f", {len(wavs)} chunks, first audio after {first:.2f} s" if args.stream else ""
    print(f"wrote {out}: {audio_s:.2f} s of audio from {len(pieces)} piece{'s' if len(pieces) != 1 else ''} "
          f"in {time.perf_counter() - t0:.1f} s (synthesis {synth_s:.1f} s{rtf}{streamed})")
    return 0


def _streamed(pipeline: Any, ids: list[Any], prompt: Any, sampling: Any, sample_rate: int) -> tuple[list[Any], float]:
    """Every chunk of every piece, a line each on stderr as it is ready; and the seconds to the first audio."""
    from cosycompile.runtime.bundle import stream_pieces

    t0 = time.perf_counter()
    wavs: list[Any] = []
    first = 0.0
    piece = 1
    for chunk in stream_pieces(pipeline, ids, prompt, sampling):
        now = time.perf_counter() - t0
        if len(chunk.wav) and not first:
            first = now
        wavs.append(chunk.wav)
        print(f"chunk {len(wavs)} (piece {piece}): {len(chunk.wav) / sample_rate:.2f} s of audio after "
              f"{chunk.tokens} tokens, ready at {now:.2f} s", file=sys.stderr, flush=True)
        piece += chunk.final
    return wavs, first


def _write_wav(path: Path, wav: Any, sample_rate: int) -> None:
    """Mono PCM16 at ``sample_rate``, encoded in memory, then written next to ``path`` and renamed into place (no
    half-written file). The target is checked again first: synthesis takes long enough for a plain
    file to have been swapped for a device or a FIFO meanwhile."""
    import io

    import numpy as np
    import soundfile as sf

    buf = io.BytesIO()
    try:
        sf.write(buf, np.asarray(wav, np.float32), sample_rate, subtype="PCM_16", format="WAV")
    except RuntimeError as exc:  # soundfile reports encoding errors as LibsndfileError (a RuntimeError)
        raise UserError(f"{path}: cannot encode the wav ({exc})") from None
    check_out_file(path, "--out", "give the wav file's name")
    try:
        write_atomic(path, buf.getvalue())
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
