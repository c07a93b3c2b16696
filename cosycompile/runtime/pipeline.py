"""Text -> speech tokens -> mel -> wav: the stage runtimes of a model family, composed in pipeline order.

Each stage runtime (a model family's, e.g. ``families/cosyvoice2/runtimes.py``) holds its own
control flow around its graphs and turns the previous stage's product into its own; this module
only chains them and names no stage. The reference and every build run the same runtimes over
their own Runners, so a comparison measures the compiled graphs and nothing else. Nothing here
imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import numpy as np

from cosycompile.runtime.sampling import Sampling

__all__ = ["Pipeline", "Prompt", "Sampling", "StageRuntime", "Synthesis"]


@dataclass
class Prompt:
    """Zero-shot prompt features (or empty ones for prompt-free synthesis)."""

    text_ids: np.ndarray  # int64 [Np]
    speech_tokens: np.ndarray  # int64 [Ns]
    mel: np.ndarray  # float32 [80, 2*Ns]
    embedding: np.ndarray  # float32 [192] speaker x-vector

    @staticmethod
    def empty(mel_bins: int = 80, spk_dim: int = 192) -> "Prompt":
        return Prompt(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((mel_bins, 0), np.float32),
                      np.zeros(spk_dim, np.float32))


@dataclass
class Synthesis:
    tokens: np.ndarray
    mel: np.ndarray
    wav: np.ndarray
    seconds: dict[str, float] = field(default_factory=dict)


class StageRuntime(Protocol):
    """What the pipeline asks of a stage runtime: the name of what it makes (``tokens``, ``mel`` or
    ``wav``, a field of :class:`Synthesis`) and the call that makes it from the previous product."""

    product: str

    def produce(self, upstream: np.ndarray, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling,
                seed: int) -> np.ndarray: ...


# What the stages make, in pipeline order: text -> tokens -> mel -> wav (Synthesis holds one of each).
PRODUCTS = ("tokens", "mel", "wav")


def in_pipeline_order(stages: Mapping[str, StageRuntime]) -> dict[str, StageRuntime]:
    """``stages`` ordered by what each makes, when together they make every product; else a
    ValueError saying what is missing (a bundle's manifest lists its stages in no particular order)."""
    made = {s.product for s in stages.values()}
    missing = [p for p in PRODUCTS if p not in made]
    if missing:
        raise ValueError(f"no stage makes {', '.join(missing)} (stages: {', '.join(stages) or 'none'})")
    return dict(sorted(stages.items(), key=lambda kv: PRODUCTS.index(kv[1].product)))


class Pipeline:
    """The stage runtimes in pipeline order (see :func:`in_pipeline_order`); timings per stage on every call.

    A stage runtime is also reachable as an attribute by its stage name (``pipe.flow``), for callers
    that time or drive one stage.
    """

    def __init__(self, stages: Mapping[str, StageRuntime]) -> None:
        self.stages = dict(stages)

    def __getattr__(self, name: str) -> Any:
        stages = self.__dict__.get("stages", {})
        if name in stages:
            return stages[name]
        raise AttributeError(name)

    @property
    def sample_rate(self) -> int:
        """Samples a second of the wav the pipeline makes (its last stage's, from the model's config)."""
        return int(self._wav_stage().sample_rate)

    @property
    def samples_per_frame(self) -> int:
        """Wav samples per mel frame."""
        return int(self._wav_stage().upsample)

    def _wav_stage(self) -> Any:
        return next(s for s in self.stages.values() if s.product == "wav")

    def synthesize(self, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling, seed: int = 0) -> Synthesis:
        """Text ids -> each stage's product in turn, with the seconds each stage took and the total."""
        products: dict[str, np.ndarray] = {}
        seconds: dict[str, float] = {}
        value = text_ids
        t0 = t = time.perf_counter()
        for name, stage in self.stages.items():
            value = stage.produce(value, text_ids, prompt, sampling, seed)
            products[stage.product] = value
            now = time.perf_counter()
            seconds[name] = now - t
            t = now
        seconds["total"] = t - t0
        return Synthesis(*(products[p] for p in PRODUCTS), seconds)
