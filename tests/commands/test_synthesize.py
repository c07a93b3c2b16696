"""``cosycompile synthesize --stream`` (issue 39, item 3) through the real CLI on a built bundle: the
token chunks a streaming server sends, a line each as they are ready, written as one wav."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from hostile_harness import CachedBuild

# Two text pieces; the tiny model decodes each up to the recipe's cap (150 tokens, 6 s of audio).
TEXT = ("Hello there, this is the first sentence of a small streaming test for the command line. "
        "And here is a second sentence, which comes after it.")


def _cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_stream_writes_the_chunks_the_runtime_cuts_and_says_when_each_was_ready(followup: CachedBuild,
                                                                                 tmp_path: Path) -> None:
    import soundfile as sf

    from cosycompile.runtime.bundle import load_bundle, recipe_sampling, stream_pieces
    from cosycompile.runtime.text import DEFAULT_MAX_CHARS, split_text

    (bundle,) = (followup.art / "builds").glob("followup-*")
    res = _cli("synthesize", bundle, "--text", TEXT, "--stream", "--out", tmp_path / "s.wav")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("chunk ")]
    ready = [float(m.group(1)) for m in (re.search(r"ready at ([0-9.]+) s$", ln) for ln in lines) if m]
    assert len(ready) == len(lines) >= 6 and ready == sorted(ready), res.stderr[-2000:]
    assert {ln.split("(piece ")[1][0] for ln in lines} == {"1", "2"}
    assert re.search(rf"{len(lines)} chunks, first audio after [0-9.]+ s\)$", res.stdout.strip()), res.stdout

    streamed, sr = sf.read(str(tmp_path / "s.wav"), dtype="float32")
    loaded = load_bundle(bundle, None)
    assert sr == loaded.pipeline.sample_rate
    frontend = loaded.frontend
    ids = [frontend.text_ids(p) for p in split_text(TEXT, DEFAULT_MAX_CHARS)]
    chunks = list(stream_pieces(loaded.pipeline, ids, frontend.no_prompt(TEXT),
                                recipe_sampling(loaded.recipe, None, None, None)))
    assert len(chunks) == len(lines)
    wav = np.concatenate([c.wav for c in chunks])
    assert streamed.shape == wav.shape and np.abs(streamed - wav).max() <= 1.01 / 32768  # PCM16 apart

    res = _cli("synthesize", bundle, "--text", TEXT, "--out", tmp_path / "o.wav")
    assert res.returncode == 0, res.stderr[-3000:]
    offline, _ = sf.read(str(tmp_path / "o.wav"), dtype="float32")
    assert offline.shape == streamed.shape and "chunk" not in res.stderr
