"""The stage runtimes every CosyVoice generation shares, in numpy and torch-free.

The decode loop over a KV-cached LM step, the Euler CFM solver with classifier-free guidance on a
cosine schedule, and the vocoder's iSTFT. A family's ``runtimes.py`` subclasses these with what is
its own (the LM's prefix and stop ids, the source's noise), so the reference and every build run
one control flow over their own Runners and a comparison measures the compiled graphs only.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from cosycompile.runtime.dsp import istft
from cosycompile.runtime.pipeline import Prompt
from cosycompile.runtime.runner import Runner
from cosycompile.runtime.sampling import Sampling, sampling_ids
from cosycompile.runtime.streaming import StreamSchedule
from cosycompile.runtime.stage_graphs.flow import FLOW_ENCODER, FLOW_ESTIMATOR
from cosycompile.runtime.stage_graphs.hift import HIFT
from cosycompile.runtime.stage_graphs.llm import LLM_STEP, LLM_STEP_STATIC


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


class SpeechLMRuntime:
    """A CosyVoice speech-token LM over a decode-step runner plus its embedding tables.

    The decode loop is every generation's (upstream's ``Qwen2LM.inference_wrapper``); a family says
    what differs: the prefix (:meth:`prefix`), the ids that stop decoding (``stop_ids``) and the one
    row masked before the minimum length (``ignore_eos_id``).
    """

    product = "tokens"

    def __init__(self, runner: Runner, assets: dict[str, np.ndarray], info: dict[str, Any],
                 static: Runner | None = None) -> None:
        self.runner = runner
        # One-token steps go through a runner that keeps the cache itself (``decoder()``): the torch
        # backend's static-cache program, or an ONNX Runtime step with per-layer cache tensors. The
        # reference's PyTorch runner has none and passes the growing cache back into ``llm_step``.
        self.kept = next((r for r in (static, runner) if hasattr(r, "decoder")), None)
        self.text_embedding = assets["text_embedding"]
        self.speech_embedding = assets["speech_embedding"]
        self.num_layers = int(info["num_layers"])
        self.kv_heads = int(info["kv_heads"])
        self.head_dim = int(info["head_dim"])
        self.speech_token_size = int(info["speech_token_size"])
        self.stop_ids: set[int] = set()  # a family's runtime sets its own
        self.ignore_eos_id = self.speech_token_size  # the row upstream masks before the minimum length

    @classmethod
    def from_runners(cls, runners: dict[str, Runner], assets: dict[str, np.ndarray], info: dict[str, Any]) -> "SpeechLMRuntime":
        """The stage runtime from its graphs' runners (the one constructor every loader uses)."""
        return cls(runners[LLM_STEP.name], assets, info, runners.get(LLM_STEP_STATIC.name))

    def produce(self, upstream: np.ndarray, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling,
                seed: int) -> np.ndarray:
        """The pipeline's call: speech tokens of ``text_ids`` (the LM is the first stage: ``upstream`` is the text)."""
        return self.generate(text_ids, prompt, sampling)

    def empty_cache(self) -> np.ndarray:
        return np.zeros((self.num_layers, 2, 1, self.kv_heads, 0, self.head_dim), np.float32)

    def prefix(self, text_ids: np.ndarray, prompt: Prompt) -> np.ndarray:
        """The prefill embeddings [1, S, H] of ``text_ids`` after the prompt (the family's layout)."""
        raise NotImplementedError

    def step(self, embeds: np.ndarray, cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self.runner.run({LLM_STEP.input_names[0]: embeds, LLM_STEP.input_names[1]: cache})
        return out[LLM_STEP.output_names[0]], out[LLM_STEP.output_names[1]]

    def generate(self, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling) -> np.ndarray:
        """Decode speech tokens one at a time, as upstream's Qwen2LM.inference does."""
        return np.asarray(list(self.stream(text_ids, prompt, sampling)), np.int64)

    def stream(self, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling) -> Iterator[int]:
        """The speech tokens of :meth:`generate`, each as soon as it is decoded."""
        rng = np.random.default_rng(sampling.seed)
        min_len = 2 * len(text_ids)
        max_len = 20 * len(text_ids)
        if sampling.max_tokens is not None:
            max_len = min(max_len, sampling.max_tokens)
            min_len = min(min_len, max_len)
        logits, cache = self.step(self.prefix(text_ids, prompt), self.empty_cache())
        next_logits = self.decoding(cache, max_len)
        out: list[int] = []
        for i in range(max_len):
            logp = log_softmax(logits[0, -1])
            tok = sampling_ids(logp, out, sampling, rng, self.ignore_eos_id, ignore_eos=i < min_len)
            if tok in self.stop_ids:
                return
            out.append(tok)
            yield tok
            if i + 1 < max_len:  # the step after the last kept token would be wasted work
                emb = self.speech_embedding[tok][None, None].astype(np.float32)
                logits = next_logits(emb)

    def decoding(self, cache: np.ndarray, max_new: int) -> Callable[[np.ndarray], np.ndarray]:
        """The one-token step that follows a prefill whose present cache is ``cache``: embedding
        [1, 1, H] in, logits [1, 1, V] out. Over a decoder that keeps the cache where the engine has
        one and ``max_new`` more positions fit it, else ``llm_step`` on the growing cache."""
        if self.kept is not None:
            decoder = self.kept.decoder()
            if decoder.fits(cache.shape[4] + max_new):
                decoder.start(cache, max_new)
                return decoder.step
        state = {"cache": cache}

        def step(embeds: np.ndarray) -> np.ndarray:
            logits, state["cache"] = self.step(embeds, state["cache"])
            return logits

        return step

    def teacher_forced_logits(self, text_ids: np.ndarray, prompt: Prompt, tokens: np.ndarray) -> np.ndarray:
        """Logits predicting each of ``tokens`` and the end: [len(tokens)+1, V], in one prefill."""
        embeds = np.concatenate([self.prefix(text_ids, prompt)[0], self.speech_embedding[tokens]], axis=0)
        logits, _ = self.step(np.ascontiguousarray(embeds[None].astype(np.float32)), self.empty_cache())
        start = embeds.shape[0] - len(tokens) - 1
        return logits[0, start:]


class CFMFlowRuntime:
    """Tokens -> mel: encoder graph, then the Euler CFM solver calling the estimator graph."""

    product = "mel"
    # Streaming as upstream's CosyVoice2Model schedules it for CosyVoice2 and CosyVoice3: hops of 25
    # tokens (the flow's training chunk), doubling up to 100, each waiting for the flow's 3 look-ahead
    # tokens (pre_lookahead_len). A family with another schedule overrides it.
    stream_schedule = StreamSchedule(hop=25, max_hop=100, scale=2, lookahead=3)
    token_mel_ratio = 2  # mel frames per speech token

    def __init__(self, encoder: Runner, estimator: Runner, assets: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        self.encoder = encoder
        self.estimator = estimator
        self.rand_noise = assets["rand_noise"]
        self.n_timesteps = int(info.get("n_timesteps", 10))
        self.cfg_rate = float(info.get("cfg_rate", 0.7))

    @classmethod
    def from_runners(cls, runners: dict[str, Runner], assets: dict[str, np.ndarray], info: dict[str, Any]) -> "CFMFlowRuntime":
        """The stage runtime from its graphs' runners (the one constructor every loader uses)."""
        return cls(runners[FLOW_ENCODER.name], runners[FLOW_ESTIMATOR.name], assets, info)

    def frames_of(self, tokens: int) -> int:
        """Mel frames of the first ``tokens`` new speech tokens."""
        return self.token_mel_ratio * tokens

    @property
    def first_chunk(self) -> tuple[int, int]:
        """(speech tokens the first streamed chunk waits for, mel frames it emits)."""
        s = self.stream_schedule
        return s.hop + s.lookahead, self.frames_of(s.hop)

    def produce(self, upstream: np.ndarray, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling,
                seed: int) -> np.ndarray:
        """The pipeline's call: the mel of the LM's tokens (no frames when it made none)."""
        return self.mel(upstream, prompt) if len(upstream) else np.zeros((80, 0), np.float32)

    def encode(self, tokens: np.ndarray, prompt: Prompt) -> tuple[np.ndarray, np.ndarray]:
        token = np.concatenate([prompt.speech_tokens, tokens]).astype(np.int64)[None]
        out = self.encoder.run({FLOW_ENCODER.input_names[0]: token,
                                FLOW_ENCODER.input_names[1]: prompt.embedding[None].astype(np.float32)})
        return out[FLOW_ENCODER.output_names[0]], out[FLOW_ENCODER.output_names[1]]

    def estimator_call(self, x: np.ndarray, mask: np.ndarray, mu: np.ndarray, t: np.ndarray, spks: np.ndarray,
                       cond: np.ndarray) -> np.ndarray:
        feeds = dict(zip(FLOW_ESTIMATOR.input_names, (x, mask, mu, t, spks, cond)))
        return self.estimator.run(feeds)[FLOW_ESTIMATOR.output_names[0]]

    def solve(self, mu: np.ndarray, spks: np.ndarray, cond: np.ndarray) -> np.ndarray:
        """10 Euler steps on a cosine schedule from the fixed noise, CFG batch 2 (row 1 unconditional)."""
        T = mu.shape[2]
        x = self.rand_noise[:, :, :T].astype(np.float32).copy()
        mask = np.ones((1, 1, T), np.float32)
        t_span = 1.0 - np.cos(np.linspace(0.0, 1.0, self.n_timesteps + 1, dtype=np.float32) * 0.5 * np.pi)
        t_span = t_span.astype(np.float32)
        t, dt = t_span[0], t_span[1] - t_span[0]
        zeros_mu = np.zeros_like(mu)
        mask2 = np.concatenate([mask, mask])
        mu2 = np.concatenate([mu, zeros_mu])
        spks2 = np.concatenate([spks, np.zeros_like(spks)])
        cond2 = np.concatenate([cond, np.zeros_like(cond)])
        for step in range(1, len(t_span)):
            v = self.estimator_call(np.concatenate([x, x]), mask2, mu2, np.full((2,), t, np.float32), spks2, cond2)
            v = (1.0 + self.cfg_rate) * v[:1] - self.cfg_rate * v[1:]
            x = (x + dt * v).astype(np.float32)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x

    def mel(self, tokens: np.ndarray, prompt: Prompt) -> np.ndarray:
        """Mel [80, 2*len(tokens)] of the new tokens (prompt frames are conditioning only)."""
        mu, spks = self.encode(tokens, prompt)
        n_prompt = prompt.mel.shape[1]
        cond = np.zeros_like(mu)
        cond[0, :, :n_prompt] = prompt.mel
        return self.solve(mu, spks, cond)[0, :, n_prompt:]


class ISTFTVocoderRuntime:
    """Mel -> wav at the model's ``sample_rate``: the vocoder graph up to the iSTFT, then the iSTFT in numpy.

    The NSF source's random draws are graph inputs; drawn from the seed (:meth:`source_noise`).
    The sample rate and the samples per mel frame come from the graphs' info (the model's config), so
    everything downstream (wav files, audio seconds, RTF) reads them here.
    """

    product = "wav"

    def __init__(self, runner: Runner, info: dict[str, Any]) -> None:
        self.runner = runner
        self.sample_rate = int(info["sample_rate"])
        self.upsample = int(info["samples_per_frame"])
        self.harmonics = int(info.get("nb_harmonics", 8)) + 1
        self.n_fft = int(info.get("istft_n_fft", 16))
        self.hop = int(info.get("istft_hop", 4))
        self.audio_limit = float(info.get("audio_limit", 0.99))

    @classmethod
    def from_runners(cls, runners: dict[str, Runner], assets: dict[str, np.ndarray],
                     info: dict[str, Any]) -> "ISTFTVocoderRuntime":
        """The stage runtime from its graphs' runners (the one constructor every loader uses)."""
        return cls(runners[HIFT.name], info)

    def produce(self, upstream: np.ndarray, text_ids: np.ndarray, prompt: Prompt, sampling: Sampling,
                seed: int) -> np.ndarray:
        """The pipeline's call: the waveform of the flow's mel (no samples when it has no frames)."""
        return self.wav(upstream, seed) if upstream.shape[1] else np.zeros(0, np.float32)

    # The source noise's distribution: HiFTGenerator's is standard normal (upstream's randn); a family
    # whose upstream draws it uniform in [0, 1) (CosyVoice3's causal HiFT: torch.rand) says so.
    uniform_noise: bool = False

    def source_noise(self, frames: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """The NSF source's initial phases [1, H] (uniform in [0, 1), the fundamental's 0, as upstream's
        torch.rand) and noise [1, frames * samples_per_frame, H], drawn from ``seed``."""
        rng = np.random.default_rng(seed)
        rand_ini = rng.random((1, self.harmonics), dtype=np.float32)
        rand_ini[:, 0] = 0.0
        shape = (1, frames * self.upsample, self.harmonics)
        noise = rng.random(shape, dtype=np.float32) if self.uniform_noise else rng.standard_normal(shape, dtype=np.float32)
        return rand_ini, noise

    def spectrum(self, mel: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        rand_ini, noise = self.source_noise(mel.shape[1], seed)
        out = self.runner.run({HIFT.input_names[0]: mel[None].astype(np.float32), HIFT.input_names[1]: rand_ini,
                               HIFT.input_names[2]: noise})
        return out[HIFT.output_names[0]], out[HIFT.output_names[1]]

    def wav(self, mel: np.ndarray, seed: int = 0) -> np.ndarray:
        mag, phase = self.spectrum(mel, seed)
        wav = istft(mag, phase, n_fft=self.n_fft, hop=self.hop)[0]
        return np.clip(wav, -self.audio_limit, self.audio_limit).astype(np.float32)
