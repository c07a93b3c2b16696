"""Token-chunk streaming (cosycompile/runtime/streaming.py) on each family's tiny model, reference runtimes.

The stream is held to what the pipeline check holds a build to (the base recipe's gate): its mel
against the offline mel by ``flow.mel_snr_db``, its audio against the vocoder over that mel by
``hift.waveform_snr_db``. On a random tiny model the audio against the offline audio is no measure:
its vocoder's sine source accumulates the phase of an F0 that any change of the mel moves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import yaml

from helpers import REPO

FAMILIES = ["cosyvoice", "cosyvoice2", "cosyvoice3"]
GATE_MIN = yaml.safe_load((REPO / "recipes" / "base.yaml").read_text())["validation"]["gate"]["min"]


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - test) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)


@pytest.fixture(scope="module", params=FAMILIES)
def pipe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The family's tiny model as the reference pipeline (PyTorch graphs, the shared numpy control flow)."""
    from cosycompile.families import get_family
    from cosycompile.reference.runners import load_reference, reference_pipeline

    info = get_family(request.param)
    model = tmp_path_factory.mktemp(request.param) / "model"
    info.hook("init_model")("builtin:" + info.tiny_builtin, model, seed=0)
    return reference_pipeline(load_reference(model, family=request.param))


def _six_seconds(pipe: Any) -> int:
    """Speech tokens of 6 s of audio at this model's token rate."""
    frames_per_second = pipe.sample_rate / pipe.samples_per_frame
    return int(round(6 * frames_per_second * pipe.flow.stream_schedule.hop / pipe.flow.frames_of(pipe.flow.stream_schedule.hop)))


def _synth(pipe: Any, max_tokens: int) -> tuple[Any, list[Any]]:
    from cosycompile.runtime.pipeline import Prompt, Sampling
    from cosycompile.runtime.streaming import stream_wav

    text_ids = np.arange(1, 31, dtype=np.int64)  # the tiny LM decodes up to its cap (20 tokens per text id)
    sampling = Sampling(mode="greedy", max_tokens=max_tokens)
    prompt = Prompt.empty()
    return pipe.synthesize(text_ids, prompt, sampling, seed=3), list(stream_wav(pipe, text_ids, prompt, sampling, seed=3))


def test_a_six_second_sentence_streams_in_chunks_on_the_familys_schedule(pipe: Any) -> None:
    offline, chunks = _synth(pipe, _six_seconds(pipe))
    s = pipe.flow.stream_schedule
    assert len(offline.wav) / pipe.sample_rate == pytest.approx(6, abs=0.25)
    assert len(chunks) >= 3 and chunks[-1].final and not any(c.final for c in chunks[:-1])
    # Each chunk is cut once the LM has a hop of new tokens past the last cut plus the look-ahead.
    cut, hop = 0, s.hop
    for c in chunks[:-1]:
        assert c.tokens == cut + hop + s.lookahead and c.frames == pipe.flow.frames_of(cut + hop)
        cut, hop = cut + hop, min(s.max_hop, hop * s.scale)
    assert chunks[-1].tokens == len(offline.tokens) and chunks[-1].frames == offline.mel.shape[1]
    # The first chunk holds the schedule's first hop of audio, less the vocoder's hold-back.
    assert len(chunks[0].wav) == (pipe.flow.frames_of(s.hop) - s.hold) * pipe.samples_per_frame
    assert chunks[0].seconds < chunks[-1].seconds

    wav = np.concatenate([c.wav for c in chunks])
    assert wav.shape == offline.wav.shape
    mel = chunks[-1].mel
    mel_snr, wav_snr = _snr_db(offline.mel, mel), _snr_db(pipe.hift.wav(mel, 3), wav)
    print(f"\nstreamed mel vs offline {mel_snr:.1f} dB; streamed audio vs the vocoder over that mel {wav_snr:.1f} dB; "
          f"vs offline audio {_snr_db(offline.wav, wav):.1f} dB")
    assert mel_snr >= GATE_MIN["flow.mel_snr_db"]
    assert wav_snr >= GATE_MIN["hift.waveform_snr_db"]


def test_a_sentence_shorter_than_a_hop_is_one_chunk_equal_to_the_offline_audio(pipe: Any) -> None:
    offline, chunks = _synth(pipe, pipe.flow.stream_schedule.hop - 1)
    assert len(chunks) == 1 and chunks[0].final
    assert np.array_equal(chunks[0].wav, offline.wav) and np.array_equal(chunks[0].mel, offline.mel)


def test_a_schedule_that_cannot_cut_is_refused() -> None:
    from cosycompile.runtime.streaming import StreamSchedule

    for bad in ({"hop": 0}, {"max_hop": 10}, {"scale": 0}, {"lookahead": -1}, {"hold": -1}):
        with pytest.raises(ValueError, match="stream schedule"):
            StreamSchedule(**{"hop": 25, "max_hop": 100, "scale": 2, "lookahead": 3, **bad})


def test_the_tokens_stream_as_generate_decodes_them(pipe: Any) -> None:
    from cosycompile.runtime.pipeline import Prompt, Sampling

    text_ids, prompt = np.arange(1, 11, dtype=np.int64), Prompt.empty()
    for sampling in (Sampling(mode="greedy", max_tokens=40), Sampling(mode="ras", seed=5, max_tokens=40)):
        assert list(pipe.llm.stream(text_ids, prompt, sampling)) == pipe.llm.generate(text_ids, prompt, sampling).tolist()
