"""The GPU layout's streaming model (exporters/triton/serve_gpu.py) cutting token chunks, with only
the engines faked: what ``tensorrt_llm`` and the ``tensorrt_plan`` models would compute comes from
the CPU bundle's own ONNX Runtime engines of the same graphs.

The fake of Triton's python-backend utilities answers the BLS requests the model sends, with the
call shapes CosyVoice's own Triton BLS uses (FunAudioLLM/CosyVoice ace7c47,
runtime/triton_trtllm/model_repo/cosyvoice2/1/model.py: ``InferenceRequest(model_name=...,
requested_output_names=[...], inputs=[...])``, ``exec(decoupled=True)`` iterated for the
``tensorrt_llm`` model's streamed responses, each holding only the new ``output_ids`` up to
``sequence_length``). The streamed audio must equal ``cosycompile synthesize --stream``'s on the
CPU bundle: the same tokens through the same runtimes over the same graphs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from helpers import EVAL_SET
from hostile_harness import CachedBuild

TEXT = ("Hello there, this is the first sentence of a small streaming test for the GPU layout. "
        "And here is a second sentence, which comes after it.")


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, np.asarray(array)

    @classmethod
    def from_dlpack(cls, name: str, array: Any) -> "_Tensor":
        return cls(name, np.array(np.from_dlpack(array)))

    def as_numpy(self) -> np.ndarray:
        return self.array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.array.__dlpack_device__()


@dataclasses.dataclass
class _Response:
    outputs: dict[str, np.ndarray]

    def has_error(self) -> bool:
        return False


class FakePb:
    """The slice of ``triton_python_backend_utils`` the GPU models call, answering BLS requests in process."""

    TRITONSERVER_MEMORY_CPU = 0
    Tensor = _Tensor

    def __init__(self, handlers: dict[str, Any]) -> None:
        self.handlers = handlers
        self.calls: list[tuple[str, bool]] = []
        pb = self

        class InferenceRequest:
            def __init__(self, model_name: str, requested_output_names: list[str], inputs: list[_Tensor],
                         preferred_memory: Any = None) -> None:
                self.model, self.names = model_name, requested_output_names
                self.feeds = {t.name: t.array for t in inputs}

            def exec(self, decoupled: bool = False) -> Any:
                pb.calls.append((self.model, decoupled))
                return pb.handlers[self.model](self.feeds, decoupled)

        self.InferenceRequest = InferenceRequest

    @staticmethod
    def PreferredMemory(kind: int, device: int) -> tuple[int, int]:
        return kind, device

    @staticmethod
    def get_output_tensor_by_name(response: _Response, name: str) -> np.ndarray | None:
        return response.outputs.get(name)

    @staticmethod
    def get_input_tensor_by_name(request: dict[str, np.ndarray], name: str) -> np.ndarray | None:
        return request.get(name)


@pytest.fixture(scope="module")
def served(followup: CachedBuild, tiny_model_dir: Path) -> dict[str, Any]:
    """The CPU bundle loaded, the HF rewrite's token map of its model, and the fake answering as its engines."""
    from cosycompile.exporters.triton.serve_gpu import Token2Wav, speech_runtimes
    from cosycompile.families import load_models
    from cosycompile.runtime.bundle import load_bundle, recipe_sampling
    from cosycompile.runtime.pipeline import Prompt, Sampling
    from cosycompile.stages.flow import FLOW_ENCODER, FLOW_ESTIMATOR
    from cosycompile.stages.hift import HIFT
    from cosycompile.stages.llm.hf_rewrite import token_map

    (bundle,) = (followup.art / "builds").glob("followup-*")
    loaded = load_bundle(bundle, None)
    models = load_models(tiny_model_dir, ("llm",))
    tmap = token_map(models.config, None, models.family)
    pipe = loaded.pipeline
    engines = {"flow_encoder": pipe.flow.encoder, "flow_estimator": pipe.flow.estimator, "vocoder": pipe.hift.runner}
    seen: dict[str, Any] = {}

    def plan(model: str) -> Any:
        names = {"flow_encoder": FLOW_ENCODER, "flow_estimator": FLOW_ESTIMATOR, "vocoder": HIFT}[model]

        def run(feeds: dict[str, np.ndarray], decoupled: bool) -> _Response:
            assert not decoupled and set(feeds) == set(names.input_names), (model, sorted(feeds))
            return _Response(engines[model].run(feeds))

        return run

    def tensorrt_llm(feeds: dict[str, np.ndarray], decoupled: bool) -> Any:
        """TensorRT-LLM's decoding (streamed, or one response of the generated ids), as the bundle's LM
        decodes the same prompt ids."""
        seen["streaming"] = bool(feeds["streaming"].reshape(-1)[0]) if "streaming" in feeds else False
        seen["decoupled"] = decoupled
        if decoupled:
            return _stream(feeds)
        out = [r.outputs["output_ids"] for r in _stream(feeds) if r.outputs]
        return _Response({"output_ids": np.concatenate(out, axis=2), "sequence_length": np.array([[len(out)]], np.int32)})

    def _stream(feeds: dict[str, np.ndarray]) -> Iterator[_Response]:
        ids = feeds["input_ids"].reshape(-1).tolist()
        task = ids.index(tmap.task_id_id)
        assert ids[0] == tmap.sos_id
        prompt = dataclasses.replace(Prompt.empty(), speech_tokens=np.array(ids[task + 1:], np.int64) - tmap.text_vocab)
        sampling = Sampling(mode=recipe_sampling(loaded.recipe).mode, seed=int(feeds["random_seed"].reshape(-1)[0]),
                            max_tokens=int(feeds["request_output_len"].reshape(-1)[0]))
        for tok in pipe.llm.stream(np.array(ids[1:task], np.int64), prompt, sampling):
            yield _Response({"output_ids": np.array([[[tmap.speech_id(tok)]]], np.int32),
                             "sequence_length": np.array([[1]], np.int32)})
        yield _Response({"output_ids": np.array([[[tmap.stop_ids[0]]]], np.int32),
                         "sequence_length": np.array([[1]], np.int32)})
        yield _Response({})  # the empty response that closes a decoupled stream

    handlers = {m: plan(m) for m in engines} | {"tensorrt_llm": tensorrt_llm}
    pb = FakePb(handlers)
    token2wav = Token2Wav()
    token2wav.pb = pb
    token2wav.flow, token2wav.hift = speech_runtimes(pb, bundle / "engines", {})
    handlers["token2wav"] = lambda feeds, decoupled: _Response(token2wav._wav(feeds))
    return {"bundle": bundle, "loaded": loaded, "tmap": tmap, "pb": pb, "seen": seen}


def _front_model(served: dict[str, Any], decoupled: bool, version_dir: Path | None = None) -> Any:
    """The streaming front model set up as ``initialize`` would, on the fake utilities."""
    from cosycompile.exporters.triton.serve_gpu import ServedVocab, TextToWave, speech_runtimes
    from cosycompile.runtime.bundle import recipe_sampling

    loaded, tmap = served["loaded"], served["tmap"]
    t = tmap.as_json()
    bls = TextToWave()
    bls.pb, bls.bytes_ok, bls.decoupled = served["pb"], True, decoupled
    bls.params = {"llm": "tensorrt_llm", "max_tokens": str(loaded.recipe["validation"]["sampling"]["max_tokens"])}
    bls.frontend, bls.max_chars = loaded.frontend, 80
    bls.vocab = ServedVocab(t["speech_offset"], t["speech_token_size"], t["sos_id"], t["task_id_id"], t["eos_id"],
                            tuple(t["stop_ids"]))
    bls.sampling = recipe_sampling(loaded.recipe)
    bls.flow, bls.hift = speech_runtimes(served["pb"], served["bundle"] / "engines", {})
    bls.dir, bls.speakers = version_dir or served["bundle"], {}
    return bls


def test_the_streaming_model_cuts_the_llm_stream_into_the_cpu_runtimes_chunks(served: dict[str, Any]) -> None:
    from cosycompile.runtime.bundle import recipe_sampling, stream_pieces
    from cosycompile.runtime.text import split_text

    bls = _front_model(served, decoupled=True)
    request = {"target_text_utf8": np.frombuffer(TEXT.encode(), np.uint8)[None]}
    chunks = [w for w in bls._waves(request) if len(w)]
    assert served["seen"] == {"streaming": True, "decoupled": True}
    assert ("tensorrt_llm", True) in served["pb"].calls and not any(m == "token2wav" for m, _ in served["pb"].calls)

    loaded = served["loaded"]
    frontend = loaded.frontend
    ids = [frontend.text_ids(p) for p in split_text(TEXT, 80)]
    expected = [c.wav for c in stream_pieces(loaded.pipeline, ids, frontend.no_prompt(TEXT),
                                             recipe_sampling(loaded.recipe)) if len(c.wav)]
    assert len(ids) == 2 and len(chunks) == len(expected) >= 6  # 3 token chunks per 6 s piece
    for got, want in zip(chunks, expected):
        assert np.array_equal(got, want)


def test_the_speech_stream_stops_at_any_stop_id_and_drops_text_ids(served: dict[str, Any]) -> None:
    from cosycompile.exporters.triton.serve_gpu import ServedVocab

    t = served["tmap"].as_json()
    vocab = ServedVocab(t["speech_offset"], t["speech_token_size"], t["sos_id"], t["task_id_id"], t["eos_id"],
                        tuple(t["stop_ids"]))
    s = served["tmap"].speech_id
    batches = [np.array([s(4)]), np.array([7, s(9)]), np.array([t["stop_ids"][-1], s(3)]), np.array([s(5)])]
    assert list(vocab.speech_stream(iter(batches))) == [4, 9]


def test_a_cached_speaker_streams_and_answers_as_synthesize_with_it(served: dict[str, Any], tmp_path: Path) -> None:
    """A ``speaker`` request on both front models: the chunks of ``synthesize --stream --speaker`` (decoupled)
    and the audio of ``synthesize --speaker`` (plain, through token2wav) on the same bundle."""
    from cosycompile.runtime.bundle import read_manifest, recipe_sampling, stream_pieces, synthesize_pieces
    from cosycompile.runtime.speakers import load_speaker
    from cosycompile.runtime.text import split_text

    item = json.loads((EVAL_SET / "manifest.jsonl").read_text().splitlines()[0])
    bundle = tmp_path / "bundle"
    shutil.copytree(served["bundle"], bundle)
    res = subprocess.run([sys.executable, "-m", "cosycompile", "speakers", "add", str(bundle), "--name", "alice",
                          "--prompt-wav", str(EVAL_SET / item["prompt_wav"]), "--prompt-text", item["prompt_text"]],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    speaker = load_speaker(bundle, read_manifest(bundle / "manifest.json"), "alice")
    loaded = served["loaded"]
    prompt = loaded.frontend.prompt_from_features(speaker.features, speaker.prompt_text, TEXT)
    ids = [loaded.frontend.text_ids(p) for p in split_text(TEXT, 80)]
    sampling = recipe_sampling(loaded.recipe)
    request = {"target_text_utf8": np.frombuffer(TEXT.encode(), np.uint8)[None],
               "speaker_utf8": np.frombuffer(b"alice", np.uint8)[None]}

    streamed = [w for w in _front_model(served, True, bundle)._waves(request) if len(w)]
    expected = [c.wav for c in stream_pieces(loaded.pipeline, ids, prompt, sampling) if len(c.wav)]
    assert len(streamed) == len(expected) and all(np.array_equal(a, b) for a, b in zip(streamed, expected))

    offline = list(_front_model(served, False, bundle)._waves(request))
    whole = list(synthesize_pieces(loaded.pipeline, ids, prompt, sampling))
    assert len(offline) == len(whole) == 2 and all(np.array_equal(a, b) for a, b in zip(offline, whole))

    no_speaker = list(_front_model(served, False, bundle)._waves({"target_text_utf8": request["target_text_utf8"]}))
    assert not np.array_equal(no_speaker[0], offline[0]), "the speaker changed nothing: this test proves nothing"
    with pytest.raises(Exception, match="no speaker 'bob'"):
        list(_front_model(served, False, bundle)._waves({**request, "speaker_utf8": np.frombuffer(b"bob", np.uint8)[None]}))
