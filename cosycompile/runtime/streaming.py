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

__all__ = ["Chunk", "ChunkCutter", "StreamSchedule", "stream_wav"]


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


class ChunkCutter:
    """The schedule's state for one utterance: speech tokens in as they are decoded, chunks out.

    ``flow`` is a mel-stage runtime with ``stream_schedule``, ``frames_of`` and ``mel``; ``vocoder`` a
    wav-stage runtime with ``wav`` and ``upsample``. Wherever the tokens come from (the bundle's own LM,
    a TensorRT-LLM stream), the chunks are cut the same way.
    """

    def __init__(self, flow: Any, vocoder: Any, prompt: Prompt, seed: int) -> None:
        self.flow, self.vocoder, self.prompt, self.seed = flow, vocoder, prompt, seed
        self.sched: StreamSchedule = flow.stream_schedule
        self.t0 = time.perf_counter()
        self.tokens: list[int] = []
        self.kept: list[np.ndarray] = []  # mel frames of the chunks so far
        self.offset, self.hop, self.frames, self.emitted = 0, self.sched.hop, 0, 0
        self.timings = {"flow": 0.0, "hift": 0.0}

    def push(self, token: int) -> Chunk | None:
        """Take the next speech token; the chunk it completes, if it completes one."""
        self.tokens.append(int(token))
        if len(self.tokens) - self.offset < self.hop + self.sched.lookahead:
            return None
        self._flow_frames(self.offset + self.hop)
        self.offset += self.hop
        self.hop = min(self.sched.max_hop, self.hop * self.sched.scale)
        return self._chunk(final=False)

    def finish(self) -> Chunk:
        """The last chunk, once the tokens have ended: every frame and sample not yet sent."""
        if self.tokens:
            self._flow_frames(None)
        return self._chunk(final=True)

    def _flow_frames(self, upto: int | None) -> None:
        t = time.perf_counter()
        mel = self.flow.mel(np.asarray(self.tokens, np.int64), self.prompt)
        end = mel.shape[1] if upto is None else self.flow.frames_of(upto)
        self.kept.append(mel[:, self.frames:end])
        self.frames = end
        self.timings["flow"] += time.perf_counter() - t

    def _chunk(self, final: bool) -> Chunk:
        t = time.perf_counter()
        mel = np.concatenate(self.kept, axis=1) if self.kept else None
        if mel is None or not mel.shape[1]:
            wav = np.zeros(0, np.float32)
        else:
            full = self.vocoder.wav(mel, self.seed)
            end = len(full) if final else max(self.emitted, (mel.shape[1] - self.sched.hold) * self.vocoder.upsample)
            wav, self.emitted = full[self.emitted:end], end
        self.timings["hift"] += time.perf_counter() - t
        return Chunk(wav, len(self.tokens), self.frames, time.perf_counter() - self.t0, final=final,
                     timings=dict(self.timings), mel=mel if final else None)


def stream_wav(pipeline: Any, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling, seed: int = 0) -> Iterator[Chunk]:
    """The audio of ``text_ids`` in chunks (see the module docstring); the last one has ``final`` set.

    ``pipeline`` is a :class:`cosycompile.runtime.pipeline.Pipeline` whose token stage can ``stream``.
    """
    stages = {s.product: s for s in pipeline.stages.values()}
    cutter = ChunkCutter(stages["mel"], stages["wav"], prompt, seed)
    for tok in stages["tokens"].stream(text_ids, prompt, sampling):
        chunk = cutter.push(tok)
        if chunk is not None:
            yield chunk
    yield cutter.finish()
