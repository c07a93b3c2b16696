"""Python models of the GPU layout (see :mod:`.gpu`); they run in Triton's python stub.

The control flow is cosycompile's runtime: the model family's flow and HiFT runtimes (chosen by the
engines' ``graphs.json`` info) over :class:`BlsRunner`s, which run a graph as a BLS request to its
``tensorrt_plan`` model. The LM runs in the ``tensorrt_llm`` model or behind a trtllm-serve URL; its
vocabulary is the bundle's HF rewrite's (:class:`ServedVocab`, read from its token map).
Not exercised on a GPU by the tests (no GPU where they run); they check the configs and the LM
requests the front model sends.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from cosycompile.exporters.triton.pbcompat import input_array, input_text, numpy_bridge_ok, output_tensor, patch_stub
from cosycompile.exporters.triton.serve_cpu import PROMPT_SR, model_parameters



@dataclass(frozen=True)
class ServedVocab:
    """The LM's ids as a server sees them, from the ``token_map`` of ``cosycompile_llm.json``
    (:meth:`cosycompile.stages.llm.hf_rewrite.TokenMap.as_json`)."""

    speech_offset: int  # id of speech token 0
    speech_token_size: int
    sos_id: int
    task_id_id: int
    eos_id: int
    stop_ids: tuple[int, ...]

    @classmethod
    def read(cls, path: Path) -> "ServedVocab":
        """The vocabulary in a token map file; ValueError naming the file when it is not one."""
        try:
            t = json.loads(path.read_text())["token_map"]
            return cls(int(t["speech_offset"]), int(t["speech_token_size"]), int(t["sos_id"]), int(t["task_id_id"]),
                       int(t["eos_id"]), tuple(int(i) for i in t["stop_ids"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a cosycompile token map ({exc.__class__.__name__}: {exc})") from None

    def prompt_ids(self, text_ids: list[int], prompt_speech: list[int]) -> list[int]:
        """``[sos | prompt text + text | task_id | prompt speech]``, as the HF rewrite's LM reads it."""
        return [self.sos_id, *text_ids, self.task_id_id, *(self.speech_offset + int(t) for t in prompt_speech)]

    def speech_tokens(self, ids: np.ndarray) -> np.ndarray:
        """Speech tokens of generated ids: up to the first stop id, text ids (if any) dropped."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        stops = np.flatnonzero(np.isin(ids, self.stop_ids))
        got = (ids[: stops[0]] if len(stops) else ids) - self.speech_offset
        return got[(got >= 0) & (got < self.speech_token_size)]

    def speech_stream(self, id_batches: Iterator[np.ndarray]) -> Iterator[int]:
        """Speech tokens of ids arriving in batches (a streaming LM's responses), up to the first stop id."""
        for ids in id_batches:
            for i in np.asarray(ids, np.int64).reshape(-1).tolist():
                if i in self.stop_ids:
                    return
                if 0 <= i - self.speech_offset < self.speech_token_size:
                    yield i - self.speech_offset

    def stop_words(self) -> np.ndarray:
        """TensorRT-LLM's ``stop_words_list`` of the stop ids, one single-id word each: [1, 2, n] (ids; end offsets)."""
        n = len(self.stop_ids)
        return np.array([[list(self.stop_ids), list(range(1, n + 1))]], np.int32)


def trtllm_feeds(vocab: ServedVocab, ids: list[int], limit: int, top_k: int, top_p: float, seed: int) -> dict[str, np.ndarray]:
    """The ``tensorrt_llm`` model's inputs for one prompt (batch 1)."""
    return {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
            "request_output_len": np.array([[limit]], np.int32), "end_id": np.array([[vocab.eos_id]], np.int32),
            "stop_words_list": vocab.stop_words(), "runtime_top_k": np.array([[top_k]], np.int32),
            "runtime_top_p": np.array([[top_p]], np.float32), "random_seed": np.array([[seed]], np.uint64)}


def completion_body(vocab: ServedVocab, ids: list[int], limit: int, top_k: int, top_p: float, seed: int) -> dict[str, Any]:
    """A ``/v1/completions`` request for trtllm-serve (or any OpenAI-style server) with a token-id prompt."""
    return {"prompt": ids, "max_tokens": limit, "top_p": top_p, "top_k": top_k, "seed": seed, "temperature": 1.0,
            "stop_token_ids": list(vocab.stop_ids)}


class BlsRunner:
    """A :class:`~cosycompile.runtime.runner.Runner` whose graph is another Triton model (outputs on the host)."""

    def __init__(self, pb_utils: Any, model: str, input_names: list[str], output_names: list[str]) -> None:
        self.pb, self.model = pb_utils, model
        self.input_names, self.output_names = input_names, output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One BLS request; errors of the called model are raised."""
        pb = self.pb
        request = pb.InferenceRequest(model_name=self.model, requested_output_names=self.output_names,
                                      inputs=[output_tensor(pb, n, np.asarray(v)) for n, v in feeds.items()],
                                      preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0))
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{self.model}: {response.error().message()}")
        return {n: np.array(np.from_dlpack(pb.get_output_tensor_by_name(response, n))) for n in self.output_names}


class _Base:
    """Shared set-up: the stub fix, parameters and the version dir."""

    def initialize(self, args: dict[str, Any]) -> None:
        """Read the config's parameters; subclasses load what they run."""
        import triton_python_backend_utils as pb_utils

        patch_stub(pb_utils)
        self.pb = pb_utils
        self.bytes_ok = numpy_bridge_ok(pb_utils)
        self.config = json.loads(args["model_config"])
        self.params = model_parameters(self.config)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.config)
        self.dir = Path(args["model_repository"]) / args["model_version"]

    def _frontend(self) -> Any:
        from cosycompile.runtime.frontend import Frontend

        return Frontend(self.dir / self.params.get("frontend", "frontend"), threads=1)

    def _wav16k(self, request: Any) -> np.ndarray:
        wav = input_array(self.pb, request, "reference_wav").reshape(-1).astype(np.float32)
        length = input_array(self.pb, request, "reference_wav_len")
        return wav[: int(length.reshape(-1)[0])] if length is not None else wav

    def _answer(self, requests: list[Any], outputs: Any) -> list[Any]:
        pb, responses = self.pb, []
        for request in requests:
            try:
                tensors = [output_tensor(pb, n, v) for n, v in outputs(request).items()]
                responses.append(pb.InferenceResponse(output_tensors=tensors))
            except Exception as exc:  # the error goes back to the caller, the model stays up
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(f"{exc}")))
        return responses


class AudioTokenizer(_Base):
    """Prompt wav (16 kHz) -> speech tokens, with the bundle's speech tokenizer ONNX."""

    def initialize(self, args: dict[str, Any]) -> None:
        super().initialize(args)
        self.frontend = self._frontend()

    def execute(self, requests: list[Any]) -> list[Any]:
        return self._answer(requests, lambda r: {"prompt_speech_tokens": self.frontend.speech_tokens(self._wav16k(r))})


class SpeakerEmbedding(AudioTokenizer):
    """Prompt wav (16 kHz) -> x-vector, with the bundle's CAM++ ONNX."""

    def execute(self, requests: list[Any]) -> list[Any]:
        return self._answer(requests, lambda r: {"prompt_spk_embedding": self.frontend.speaker_embedding(self._wav16k(r))})


def speech_runtimes(pb_utils: Any, version_dir: Path, params: dict[str, str]) -> tuple[Any, Any]:
    """The family's flow and HiFT runtimes (chosen by the graphs' info in the version dir's ``flow`` and
    ``hift``) over BLS runners of the ``flow_encoder``, ``flow_estimator`` and ``vocoder`` models."""
    from cosycompile.runtime.graphs_dir import read_graphs_dir
    from cosycompile.runtime.loading import load_assets
    from cosycompile.families import stage_runtime_class
    from cosycompile.stages.flow import FLOW_ENCODER, FLOW_ESTIMATOR
    from cosycompile.stages.hift import HIFT

    flow_dir, hift_dir = version_dir / params.get("flow", "flow"), version_dir / params.get("hift", "hift")
    runners = {g.name: BlsRunner(pb_utils, model, g.input_names, g.output_names)
               for g, model in ((FLOW_ENCODER, "flow_encoder"), (FLOW_ESTIMATOR, "flow_estimator"), (HIFT, "vocoder"))}
    flow_info, hift_info = read_graphs_dir(flow_dir).info, read_graphs_dir(hift_dir).info
    flow = stage_runtime_class("flow", flow_info).from_runners(runners, load_assets(flow_dir), flow_info)
    return flow, stage_runtime_class("hift", hift_info).from_runners(runners, {}, hift_info)


def token2wav_prompt(ptok: np.ndarray | None, feat: np.ndarray | None, emb: np.ndarray | None) -> Any:
    """The runtime's prompt from ``token2wav``'s prompt inputs (speech tokens, mel, speaker embedding)."""
    from cosycompile.runtime.pipeline import Prompt

    prompt = Prompt.empty()
    if ptok is not None and feat is not None:
        prompt = Prompt(np.zeros(0, np.int64), ptok.reshape(-1).astype(np.int64), feat.astype(np.float32),
                        prompt.embedding)
    if emb is not None:
        prompt.embedding = emb.reshape(-1).astype(np.float32)
    return prompt


class Token2Wav(_Base):
    """Speech tokens (+ prompt features) -> wav: CFM loop and iSTFT here, graphs as BLS calls."""

    def initialize(self, args: dict[str, Any]) -> None:
        super().initialize(args)
        self.flow, self.hift = speech_runtimes(self.pb, self.dir, self.params)

    def _wav(self, request: Any) -> dict[str, np.ndarray]:
        pb = self.pb
        tokens = input_array(pb, request, "target_speech_tokens").reshape(-1).astype(np.int64)
        prompt = token2wav_prompt(input_array(pb, request, "prompt_speech_tokens"),
                                  input_array(pb, request, "prompt_speech_feat"),
                                  input_array(pb, request, "prompt_spk_embedding"))
        seed = input_array(pb, request, "seed")
        mel = self.flow.mel(tokens, prompt)
        return {"waveform": self.hift.wav(mel, int(seed.reshape(-1)[0]) if seed is not None else 0)}

    def execute(self, requests: list[Any]) -> list[Any]:
        return self._answer(requests, self._wav)


class TextToWave(_Base):
    """Text -> waveform: front end, LM (tensorrt_llm or trtllm-serve), then ``token2wav`` per text piece
    (plain) or token chunks cut as the LM's tokens stream in (decoupled)."""

    def initialize(self, args: dict[str, Any]) -> None:
        super().initialize(args)
        from cosycompile.runtime.bundle import recipe_sampling

        self.frontend = self._frontend()
        self.vocab = ServedVocab.read(self.dir / self.params.get("token_map", "cosycompile_llm.json"))
        self.sample_rate = int(self.params["sample_rate"])
        self.sampling = recipe_sampling(json.loads((self.dir / "recipe.json").read_text()))
        self.max_chars = int(self.params.get("max_chars") or 80)
        if self.decoupled:
            self.flow, self.hift = speech_runtimes(self.pb, self.dir, self.params)
        self.speakers: dict[str, Any] = {}

    def _speaker(self, name: str) -> Any:
        """A speaker cached in the bundle (linked beside the model with its manifest), read and
        digest-checked once per model instance."""
        from cosycompile.runtime.bundle import MANIFEST, read_manifest
        from cosycompile.runtime.speakers import load_speaker

        if name not in self.speakers:
            self.speakers[name] = load_speaker(self.dir, read_manifest(self.dir / MANIFEST), name)
        return self.speakers[name]

    def _request_prompt(self, request: Any) -> tuple[dict[str, np.ndarray], str]:
        """(prompt features for token2wav, prompt text) of a request: a cached ``speaker``, a
        ``reference_wav`` (with ``reference_text``) or none."""
        speaker = input_text(self.pb, request, "speaker", self.bytes_ok)
        if speaker is None:
            return self._prompt(request), input_text(self.pb, request, "reference_text", self.bytes_ok) or ""
        if self.pb.get_input_tensor_by_name(request, "reference_wav") is not None:
            raise ValueError("speaker replaces reference_wav and reference_text (a speaker is a cached prompt)")
        cached = self._speaker(speaker)
        return {"prompt_speech_tokens": cached.speech_tokens, "prompt_speech_feat": cached.mel,
                "prompt_spk_embedding": cached.embedding}, cached.prompt_text

    def _prompt(self, request: Any) -> dict[str, np.ndarray]:
        """Prompt features by BLS (audio_tokenizer, speaker_embedding) plus the prompt mel, or {} without a prompt."""
        from cosycompile.runtime.dsp import mel_spectrogram, resample

        if self.pb.get_input_tensor_by_name(request, "reference_wav") is None:
            return {}
        wav = self._wav16k(request)
        feeds = {"reference_wav": wav, "reference_wav_len": np.array([len(wav)], np.int32)}
        tokens = BlsRunner(self.pb, "audio_tokenizer", list(feeds), ["prompt_speech_tokens"]).run(feeds)
        emb = BlsRunner(self.pb, "speaker_embedding", list(feeds), ["prompt_spk_embedding"]).run(feeds)
        mel = mel_spectrogram(resample(wav, PROMPT_SR, self.sample_rate), self.sample_rate)
        n = min(mel.shape[1] // 2, len(tokens["prompt_speech_tokens"]))
        return {"prompt_speech_tokens": tokens["prompt_speech_tokens"][:n],
                "prompt_speech_feat": np.ascontiguousarray(mel[:, : 2 * n], np.float32), **emb}

    def _llm_stream(self, ids: list[int], seed: int) -> Iterator[int]:
        """Speech tokens for prompt ids ``ids`` as the LM makes them: ``tensorrt_llm`` with ``streaming``
        answers each step as its own response (new ids only), as CosyVoice's Triton BLS reads it."""
        if self.params.get("llm") == "trtllm-serve":
            yield from self._llm(ids, seed).tolist()
            return
        pb, s = self.pb, self.sampling
        feeds = trtllm_feeds(self.vocab, ids, self._token_limit(ids), s.top_k, s.top_p, seed)
        feeds["streaming"] = np.array([[True]], np.bool_)
        request = pb.InferenceRequest(model_name="tensorrt_llm", requested_output_names=["output_ids", "sequence_length"],
                                      inputs=[output_tensor(pb, n, v) for n, v in feeds.items()],
                                      preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0))

        def batches() -> Iterator[np.ndarray]:
            for response in request.exec(decoupled=True):
                if response.has_error():
                    raise RuntimeError(f"tensorrt_llm: {response.error().message()}")
                ids_out = pb.get_output_tensor_by_name(response, "output_ids")
                if ids_out is None:  # the empty response that closes a decoupled stream
                    continue
                n = int(np.array(np.from_dlpack(pb.get_output_tensor_by_name(response, "sequence_length"))).reshape(-1)[0])
                yield np.array(np.from_dlpack(ids_out)).reshape(-1)[:n]

        yield from self.vocab.speech_stream(batches())

    def _token_limit(self, ids: list[int]) -> int:
        return int(self.params.get("max_tokens") or 0) or 20 * len(ids)

    def _llm(self, ids: list[int], seed: int) -> np.ndarray:
        """Speech tokens for prompt ids ``ids`` from the LM."""
        s, limit = self.sampling, self._token_limit(ids)
        if self.params.get("llm") == "trtllm-serve":
            body = completion_body(self.vocab, ids, limit, s.top_k, s.top_p, seed)
            req = urllib.request.Request(self.params["llm_url"].rstrip("/") + "/v1/completions",
                                         json.dumps(body).encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as f:
                text = json.loads(f.read())["choices"][0]["text"]
            return np.array([int(m) for m in re.findall(r"<\|s_(\d+)\|>", text)], np.int64)
        feeds = trtllm_feeds(self.vocab, ids, limit, s.top_k, s.top_p, seed)
        out = BlsRunner(self.pb, "tensorrt_llm", list(feeds), ["output_ids", "sequence_length"]).run(feeds)
        return self.vocab.speech_tokens(out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])])

    def prompt_text_ids(self, ref_text: str, text: str) -> list[int]:
        """Ids of the prompt text, behind the family's instruction where the front end adds one
        (CosyVoice3), as the bundle's own runtime composes them."""
        composed = self.frontend.instructed(ref_text, text)
        return [int(i) for i in self.frontend.text_ids(composed)] if composed.strip() else []

    def _waves(self, request: Any) -> Iterator[np.ndarray]:
        """The request's audio: each piece's waveform (plain), or each piece's token chunks (decoupled)."""
        from cosycompile.runtime.streaming import ChunkCutter
        from cosycompile.runtime.text import split_text

        text = input_text(self.pb, request, "target_text", self.bytes_ok)
        if text is None or not text.strip():
            raise ValueError("target_text (or target_text_utf8): missing or empty")
        prompt, ref_text = self._request_prompt(request)
        ref_ids = self.prompt_text_ids(ref_text, text)
        seed_in = input_array(self.pb, request, "seed")
        seed = int(seed_in.reshape(-1)[0]) if seed_in is not None else self.sampling.seed
        ptok = [int(t) for t in prompt.get("prompt_speech_tokens", [])]
        for k, piece in enumerate(split_text(text, self.max_chars)):
            ids = self.vocab.prompt_ids([*ref_ids, *(int(i) for i in self.frontend.text_ids(piece))], ptok)
            if self.decoupled:
                cutter = ChunkCutter(self.flow, self.hift, token2wav_prompt(prompt.get("prompt_speech_tokens"),
                                                                            prompt.get("prompt_speech_feat"),
                                                                            prompt.get("prompt_spk_embedding")), seed + k)
                for token in self._llm_stream(ids, seed + k):
                    chunk = cutter.push(token)
                    if chunk is not None and len(chunk.wav):
                        yield chunk.wav
                yield cutter.finish().wav
                continue
            feeds = {"target_speech_tokens": self._llm(ids, seed + k), "seed": np.array([seed + k], np.int64), **prompt}
            yield BlsRunner(self.pb, "token2wav", list(feeds), ["waveform"]).run(feeds)["waveform"].reshape(-1)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """As the CPU model: a stream of responses per request (decoupled) or one each."""
        pb = self.pb
        if not self.decoupled:
            return self._answer(requests, lambda r: {"waveform": np.concatenate([*self._waves(r), np.zeros(0, np.float32)])
                                                     [None]})
        for request in requests:
            sender = request.get_response_sender()
            try:
                for wav in self._waves(request):
                    if len(wav):  # a piece's last chunk may hold no samples; the stream sends none
                        sender.send(pb.InferenceResponse(output_tensors=[output_tensor(pb, "waveform", wav[None])]))
                sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as exc:  # the error goes back to the client, the model stays up
                sender.send(pb.InferenceResponse(error=pb.TritonError(f"{exc}")), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
