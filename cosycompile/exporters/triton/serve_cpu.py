"""The python-backend model of a CPU repository: text in, waveform out, on the bundle's engines.

Runs inside Triton's python stub (``triton_python_backend_utils`` exists only there, so it is
imported in the methods). Synthesis is :mod:`cosycompile.runtime.bundle`'s own code
(``load_bundle``, ``split_text``, ``synthesize_pieces``): with the same text, seed and threads a
request gives the samples ``cosycompile synthesize`` writes (``--stream`` for the decoupled model). A
decoupled model (gRPC streaming) sends one response per token chunk of each text piece as soon as it
is vocoded (:mod:`cosycompile.runtime.streaming`), then an empty final response; a plain one (HTTP)
answers each request with the whole waveform, synthesized offline.

Inputs (batch dim 1, as CosyVoice's runtime clients send them): ``target_text`` (BYTES) or
``target_text_utf8`` (UINT8, its UTF-8 bytes: see :mod:`.pbcompat` for why), optional
``reference_wav`` (FP32 16 kHz samples) with ``reference_wav_len`` (INT32) and ``reference_text``
(BYTES, or ``reference_text_utf8``) for a zero-shot prompt, or ``speaker`` (BYTES, or
``speaker_utf8``) naming a speaker cached in the bundle; optional ``seed`` (INT64: piece k uses
seed+k). Output: ``waveform`` (FP32 [1, samples]).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

PROMPT_SR = 16000  # CosyVoice's runtime clients send reference audio at 16 kHz


def model_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """The ``parameters`` of a parsed model config as plain strings."""
    return {k: str(v.get("string_value", "")) for k, v in (model_config.get("parameters") or {}).items()}


def _first(values: Any) -> Any:
    """The single value of an optional input (None when absent or empty)."""
    if values is None or len(values) == 0:
        return None
    return values.reshape(-1)[0]


class Cancelled(Exception):
    """The client cancelled the request."""


class TritonPythonModel:
    """``<family>`` (decoupled, streaming) or ``<family>_offline`` over a bundle in the version dir."""

    def initialize(self, args: dict[str, Any]) -> None:
        """Load the bundle named by the ``bundle`` parameter (relative to the version dir)."""
        import triton_python_backend_utils as pb_utils

        from cosycompile.runtime.bundle import load_bundle, recipe_sampling
        from cosycompile.runtime.idle_wait import set_spinning
        from cosycompile.exporters.triton.pbcompat import numpy_bridge_ok, patch_stub

        patch_stub(pb_utils)
        self.bytes_ok = numpy_bridge_ok(pb_utils)
        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = model_parameters(config)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        bundle = Path(args["model_repository"]) / args["model_version"] / params.get("bundle", "bundle")
        threads = int(params.get("threads") or 0) or None
        # Before the engines load: sessions take the setting when they are created.
        spin = params.get("spin_wait") == "true"
        set_spinning(spin)
        self.bundle = load_bundle(bundle, threads)
        self.speakers: dict[str, Any] = {}
        self.max_chars = int(params.get("max_chars") or 80)
        # Absent from repositories written before the limits existed: no limit there, as before.
        self.max_text_chars = int(params.get("max_text_chars") or 0) or None
        self.request_timeout_s = float(params.get("request_timeout_s") or 0) or None
        mode = params.get("sampling") or None
        self.sampling = recipe_sampling(self.bundle.recipe, mode=mode)
        bridge = "" if self.bytes_ok else "; BYTES inputs garbled by this stub: text only as *_utf8"
        pb_utils.Logger.log_info(f"{args['model_name']}: loaded {bundle} ({self.bundle.threads} threads, "
                                 f"idle threads {'spin' if spin else 'sleep'}, "
                                 f"sampling {self.sampling.mode}, numpy {np.__version__}{bridge})")

    def _request_parts(self, request: Any) -> tuple[list[np.ndarray], Any, Any]:
        """(text ids per piece, prompt, sampling) of one request; UserError/ValueError for bad input."""
        import dataclasses

        from cosycompile.runtime.text import split_text
        from cosycompile.exporters.triton.pbcompat import input_array, input_text

        pb = self.pb
        text = input_text(pb, request, "target_text", self.bytes_ok)
        if text is None or not text.strip():
            raise ValueError("target_text (or target_text_utf8): missing or empty")
        if self.max_text_chars is not None and len(text) > self.max_text_chars:
            raise ValueError(f"target_text: {len(text)} characters; this server takes at most {self.max_text_chars} "
                             f"per request (split the text, or serve with a larger --max-text-chars)")
        pieces = split_text(text, self.max_chars)
        frontend = self.bundle.frontend
        wav = input_array(pb, request, "reference_wav")
        speaker = input_text(pb, request, "speaker", self.bytes_ok)
        if speaker is not None:
            if wav is not None:
                raise ValueError("speaker replaces reference_wav and reference_text (a speaker is a cached prompt)")
            cached = self._speaker(speaker)
            prompt = frontend.prompt_from_features(cached.features, cached.prompt_text, text)
        elif wav is not None:
            samples = wav.reshape(-1).astype(np.float32)
            length = _first(input_array(pb, request, "reference_wav_len"))
            if length is not None:
                samples = samples[: int(length)]
            ref_text = input_text(pb, request, "reference_text", self.bytes_ok)
            prompt = frontend.prompt(samples, PROMPT_SR, ref_text or "", text)
        else:
            prompt = frontend.no_prompt(text)
        sampling = self.sampling
        seed = _first(input_array(pb, request, "seed"))
        if seed is not None:
            sampling = dataclasses.replace(sampling, seed=int(seed))
        return [frontend.text_ids(p) for p in pieces], prompt, sampling

    def _speaker(self, name: str) -> Any:
        """A speaker of the bundle, read (and digest-checked) once per model instance."""
        from cosycompile.runtime.speakers import load_speaker

        if name not in self.speakers:
            self.speakers[name] = load_speaker(self.bundle.path, self.bundle.manifest, name)
        return self.speakers[name]

    def _waves(self, request: Any, stream: bool) -> Any:
        """The request's audio in turn: token chunks of each piece when ``stream``, else each piece's
        whole waveform. Between two, a cancelled request or one past the timeout stops (Triton cannot
        interrupt a python model mid-call)."""
        import time

        from cosycompile.runtime.bundle import stream_pieces, synthesize_pieces

        t0 = time.monotonic()
        ids, prompt, sampling = self._request_parts(request)
        if stream:
            parts = ((c.wav, c.final) for c in stream_pieces(self.bundle.pipeline, ids, prompt, sampling))
        else:
            parts = ((w, True) for w in synthesize_pieces(self.bundle.pipeline, ids, prompt, sampling))
        done = 0
        for wav, ends_piece in parts:
            yield wav
            done += ends_piece
            if done == len(ids):
                break
            where = f"{done} of {len(ids)} text pieces"
            if request.is_cancelled():
                raise Cancelled(f"cancelled by the client after {where}")
            if self.request_timeout_s is not None and time.monotonic() - t0 > self.request_timeout_s:
                raise TimeoutError(f"past the {self.request_timeout_s:g} s request timeout after {where}")

    def _response(self, wav: np.ndarray) -> Any:
        from cosycompile.exporters.triton.pbcompat import output_tensor

        return self.pb.InferenceResponse(output_tensors=[output_tensor(self.pb, "waveform", wav.astype(np.float32)[None])])

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """One response per request (plain), or a stream of responses per request (decoupled)."""
        pb = self.pb
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                try:
                    for wav in self._waves(request, stream=True):
                        if len(wav):  # a piece's last chunk may hold no samples; the stream sends none
                            sender.send(self._response(wav))
                    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except Exception as exc:  # any failure goes back to the client, the model stays up
                    sender.send(pb.InferenceResponse(error=pb.TritonError(f"{exc.__class__.__name__}: {exc}")),
                                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        responses = []
        for request in requests:
            try:
                wavs = list(self._waves(request, stream=False))
                responses.append(self._response(np.concatenate(wavs) if wavs else np.zeros(0, np.float32)))
            except Exception as exc:  # any failure goes back to the client, the model stays up
                responses.append(pb.InferenceResponse(output_tensors=[],
                                                      error=pb.TritonError(f"{exc.__class__.__name__}: {exc}")))
        return responses

    def finalize(self) -> None:
        """Drop the engines (ONNX Runtime sessions close with their runners)."""
        self.bundle = None
