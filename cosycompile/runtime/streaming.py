"""Token-chunk streaming: audio in chunks while the LM is still decoding, on the stages' own runtimes.

The schedule is upstream's (``CosyVoice2Model.tts(stream=True)``): once the LM has made a hop of new
tokens plus the flow's look-ahead, the flow runs again over every token so far (the prompt's too) and
the mel frames of the hop are kept; the hop then grows by ``scale`` up to ``max_hop``. When the LM
stops, one last flow call over all tokens gives the rest of the frames. The flow's graphs are the
offline ones, so each chunk's frames see every token decoded so far and later ones never change them.

The vocoder runs over all frames kept so far and emits its samples up to ``hold`` frames before the
end: those last samples wait for the next chunk's frames, which the vocoder's convolutions see across
the boundary. As the source's noise for a longer mel extends the shorter one's (same seed), the
samples emitted are those of the vocoder over the whole streamed mel, so the stream's concatenation
equals ``vocoder(concatenated mel)``; it differs from the offline synthesis only where a chunk's frames
would have seen tokens decoded after it (bounded by the look-ahead, measured by the tests).
Nothing here imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from cosycompile.runtime.pipeline import Prompt, Sampling

__all__ = ["Chunk", "StreamSchedule", "stream_wav"]


@dataclass(frozen=True)
class StreamSchedule:
    """When a streamed chunk is cut, in speech tokens (a model family's flow runtime holds its own)."""

    hop: int  # new tokens of the first chunk
    max_hop: int  # the hop grows to at most this
    scale: int  # each chunk's hop is the previous one's times this
    lookahead: int  # tokens after a hop the flow waits for (its right context)
    hold: int = 8  # mel frames at the end whose samples wait for the next chunk (upstream's mel_cache_len)

    def __post_init__(self) -> None:
        if self.hop < 1 or self.max_hop < self.hop or self.scale < 1 or self.lookahead < 0 or self.hold < 0:
            raise ValueError(f"stream schedule {self}: needs 1 <= hop <= max_hop, scale >= 1, lookahead >= 0, hold >= 0")


@dataclass
class Chunk:
    """One streamed piece of audio and what it took."""

    wav: np.ndarray  # float32 samples at the pipeline's sample rate
    tokens: int  # speech tokens decoded when it was cut
    frames: int  # mel frames kept so far (its samples end ``hold`` frames before, except the last chunk's)
    seconds: float  # since the stream started
    final: bool = False
    timings: dict[str, float] = field(default_factory=dict)  # flow and vocoder seconds so far
    mel: np.ndarray | None = None  # the final chunk's: every frame streamed, concatenated


def stream_wav(pipeline: Any, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling, seed: int = 0) -> Iterator[Chunk]:
    """The audio of ``text_ids`` in chunks (see the module docstring); the last one has ``final`` set.

    ``pipeline`` is a :class:`cosycompile.runtime.pipeline.Pipeline` whose token stage can ``stream``
    and whose mel stage has a ``stream_schedule`` and ``frames_of``.
    """
    stages = {s.product: s for s in pipeline.stages.values()}
    lm, flow, vocoder = stages["tokens"], stages["mel"], stages["wav"]
    sched: StreamSchedule = flow.stream_schedule
    t0 = time.perf_counter()
    tokens: list[int] = []
    kept: list[np.ndarray] = []  # mel frames of the chunks so far
    offset, hop, frames, emitted = 0, sched.hop, 0, 0
    timings = {"flow": 0.0, "hift": 0.0}

    def vocode(final: bool) -> np.ndarray:
        nonlocal emitted
        t = time.perf_counter()
        mel = np.concatenate(kept, axis=1)
        wav = vocoder.wav(mel, seed)
        end = len(wav) if final else max(emitted, (mel.shape[1] - sched.hold) * vocoder.upsample)
        out, emitted = wav[emitted:end], end
        timings["hift"] += time.perf_counter() - t
        return out

    def flow_frames(upto: int | None) -> None:
        nonlocal frames
        t = time.perf_counter()
        mel = flow.mel(np.asarray(tokens, np.int64), prompt)
        end = mel.shape[1] if upto is None else flow.frames_of(upto)
        kept.append(mel[:, frames:end])
        frames = end
        timings["flow"] += time.perf_counter() - t

    for tok in lm.stream(text_ids, prompt, sampling):
        tokens.append(tok)
        if len(tokens) - offset < hop + sched.lookahead:
            continue
        flow_frames(offset + hop)
        offset += hop
        hop = min(sched.max_hop, hop * sched.scale)
        wav = vocode(final=False)
        yield Chunk(wav, len(tokens), frames, time.perf_counter() - t0, timings=dict(timings))
    if tokens:
        flow_frames(None)
    wav = vocode(final=True) if frames else np.zeros(0, np.float32)
    mel = np.concatenate(kept, axis=1) if kept else np.zeros((0, 0), np.float32)
    yield Chunk(wav, len(tokens), frames, time.perf_counter() - t0, final=True, timings=dict(timings), mel=mel)
