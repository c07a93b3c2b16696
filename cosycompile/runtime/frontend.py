"""Text and prompt front end: what turns an eval item into LM/flow inputs.

It is not compiled, and it is the same for the reference and for every build. A real model dir
uses its family's text tokenizer (the Qwen tokenizer in ``CosyVoice-BlankEN`` unless the family names
another), the ``campplus.onnx`` model and its family's speech tokenizer (``speech_tokenizer_v2.onnx``,
``_v3``, ...) through ONNX Runtime, and its family's prompt mel; a built-in model (``builtin.json``)
uses a byte-level stand-in tokenizer and the small stand-in ONNX models ``init-model`` writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.runtime.dataset import Item, read_wav
from cosycompile.runtime.dsp import kaldi_fbank, mel_spectrogram, resample, whisper_log_mel
from cosycompile.errors import DataError, ModelError
from cosycompile.runtime.pipeline import Prompt

PROMPT_SR = 16000


def frontend_family(root: Path) -> Any:
    """The model family whose front end a dir holds: the family of its config file (a model dir), else
    the one family whose speech tokenizer it holds (a bundle's front end). Neither is a one-line
    :class:`ModelError` naming the files looked for."""
    from cosycompile.families import detect_family, family_infos

    try:
        return detect_family(root)
    except ModelError:
        pass
    families = family_infos().values()
    present = [f for f in families if (root / f.speech_tokenizer).is_file()]
    if len(present) == 1:
        return present[0]
    if not present:
        known = ", ".join(sorted({f.speech_tokenizer for f in families}))
        raise ModelError(f"{root}: front-end model is missing (a speech tokenizer: one of {known})")
    raise ModelError(f"{root}: holds the speech tokenizers of several families "
                     f"({', '.join(f.speech_tokenizer for f in present)})")


class Frontend:
    """Tokenizer plus prompt feature extraction for one model dir."""

    def __init__(self, model_dir: Path, threads: int = 1) -> None:
        """The front end of ``model_dir`` (a model dir, or a bundle's front end) as its family defines it."""
        import onnxruntime as ort

        self.model_dir = Path(model_dir)
        family = frontend_family(self.model_dir)
        tokenizer_name = family.speech_tokenizer
        self.instruction, self.marker = family.prompt_instruction, family.prompt_marker
        self.mel_rate, self.mel_n_fft, self.mel_hop = family.prompt_mel
        self.mel_per_token = family.prompt_mel_frames_per_token
        marker = self.model_dir / "builtin.json"
        self.builtin = json.loads(marker.read_text()) if marker.is_file() else None
        qwen_dir = self.model_dir / "CosyVoice-BlankEN"
        if self.builtin is not None:
            # A family without a Qwen body writes its text vocabulary's size into the marker.
            if "text_vocab_size" in self.builtin:
                self.vocab_size = int(self.builtin["text_vocab_size"])
            else:
                self.vocab_size = int(json.loads((qwen_dir / "config.json").read_text())["vocab_size"])
            self._tok = None
            self.tokenizer_file = marker
        elif family.text_tokenizer:
            self._tok = family.hook("text_tokenizer")(self.model_dir)
            self.tokenizer_file = self._tok.file
        else:
            # The file transformers builds the tokenizer from (tokenizer.json wins over vocab.json + merges.txt),
            # so that an error about the ids names what to fix.
            self.tokenizer_file = next((qwen_dir / f for f in ("tokenizer.json", "vocab.json")
                                        if (qwen_dir / f).is_file()), qwen_dir)
            try:
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(str(qwen_dir), local_files_only=True)
            except Exception as exc:  # transformers raises many types for a broken tokenizer dir
                raise ModelError(f"{qwen_dir}: cannot load the Qwen tokenizer ({exc.__class__.__name__})") from None
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        sessions = {}
        for name in ("campplus.onnx", tokenizer_name):
            path = self.model_dir / name
            if not path.is_file():
                raise ModelError(f"{path}: front-end model is missing")
            try:
                sessions[name] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            except Exception as exc:  # ONNX Runtime raises its own types (Fail, InvalidGraph, ...)
                # Its message is one long line ending in the reason, e.g. "Unsupported model IR version:
                # 14, max supported IR version: 13" for a file written by a newer onnx than this runtime.
                first = (str(exc).strip().splitlines() or [""])[0]
                reason = first.rsplit(") ", 1)[-1][:200] or exc.__class__.__name__
                raise ModelError(f"{path}: ONNX Runtime {ort.__version__} cannot load this front-end model "
                                 f"({reason})") from None
        self.campplus = sessions["campplus.onnx"]
        self.speech_tokenizer = sessions[tokenizer_name]

    def text_ids(self, text: str) -> np.ndarray:
        """Token ids of ``text`` for the LM's text embedding table; never empty.

        Raises DataError for a text with nothing to say (empty or whitespace) and ModelError when the
        tokenizer turns a real text into no ids: an empty prefix would make the LM generate from
        nothing, and a comparison of two such runs would pass while measuring nothing.
        """
        if not text.strip():
            raise DataError(f"{self.tokenizer_file}: text to tokenize is empty or whitespace: {_clip(text)}")
        if self._tok is None:
            # Stand-in for a BPE: UTF-8 bytes, shifted past a few reserved ids, folded into the vocab.
            ids = np.asarray([(b + 3) % self.vocab_size for b in text.encode("utf-8")], np.int64)
        else:
            ids = np.asarray(self._tok.encode(text, add_special_tokens=False), np.int64)
        if ids.size == 0:
            raise ModelError(f"{self.tokenizer_file}: the tokenizer gives no token ids for text {_clip(text)} "
                             f"(vocabulary files empty or not the Qwen tokenizer's?)")
        return ids

    def speaker_embedding(self, wav16k: np.ndarray) -> np.ndarray:
        feat = kaldi_fbank(wav16k, 80)
        feat = feat - feat.mean(axis=0, keepdims=True)
        inp = self.campplus.get_inputs()[0].name
        return self.campplus.run(None, {inp: feat[None].astype(np.float32)})[0].reshape(-1).astype(np.float32)

    def speech_tokens(self, wav16k: np.ndarray) -> np.ndarray:
        feats = whisper_log_mel(wav16k, 128)[None].astype(np.float32)
        ins = self.speech_tokenizer.get_inputs()
        out = self.speech_tokenizer.run(None, {ins[0].name: feats, ins[1].name: np.array([feats.shape[2]], np.int32)})
        return out[0].reshape(-1).astype(np.int64)

    def instructed(self, prompt_text: str, text: str = "") -> str:
        """``prompt_text`` with the family's instruction in front when neither it nor ``text`` holds the
        family's marker (CosyVoice3: ``<|endofprompt|>``); unchanged for a family without one."""
        if not self.instruction or self.marker in prompt_text or self.marker in text:
            return prompt_text
        return self.instruction + prompt_text

    def no_prompt(self, text: str = "") -> Prompt:
        """The prompt of a request for ``text`` without prompt audio: no speech, and as its text the
        family's instruction where :meth:`instructed` adds one."""
        empty = Prompt.empty()
        instruction = self.instructed("", text)
        if instruction:
            empty.text_ids = self.text_ids(instruction)
        return empty

    def prompt_features(self, wav: np.ndarray, sr: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(speech tokens, mel, speaker embedding) of prompt audio: the costly part of a prompt (two ONNX
        models and a mel), what a bundle's speaker cache keeps. The mel is the family's; where the family
        says so (CosyVoice2 and later: 2) the tokens and the mel are trimmed to that many frames per token."""
        wav16k = resample(wav, sr, PROMPT_SR) if sr != PROMPT_SR else wav
        tokens = self.speech_tokens(wav16k)
        mel = mel_spectrogram(resample(wav16k, PROMPT_SR, self.mel_rate), self.mel_rate, self.mel_n_fft, self.mel_hop)
        if self.mel_per_token:
            n = min(mel.shape[1] // self.mel_per_token, len(tokens))
            tokens, mel = tokens[:n], mel[:, : self.mel_per_token * n]
        return tokens, np.ascontiguousarray(mel.astype(np.float32)), self.speaker_embedding(wav16k)

    def prompt(self, wav: np.ndarray, sr: int, prompt_text: str, text: str = "") -> Prompt:
        """Prompt features of prompt audio and its text (see :meth:`prompt_from_features`)."""
        return self.prompt_from_features(self.prompt_features(wav, sr), prompt_text, text)

    def prompt_from_features(self, features: tuple[np.ndarray, np.ndarray, np.ndarray], prompt_text: str,
                             text: str = "") -> Prompt:
        """A prompt from :meth:`prompt_features` (computed now or read from a speaker cache) and the
        prompt's text, which gets the family's instruction unless it or ``text`` (what is to be said)
        holds the family's marker (:meth:`instructed`)."""
        text = self.instructed(prompt_text, text)
        tokens, mel, embedding = features
        # No prompt text (or only whitespace, which carries none) is a prompt without text ids, not an error.
        return Prompt(self.text_ids(text) if text.strip() else np.zeros(0, np.int64), tokens, mel, embedding)

    def item_inputs(self, item: Item) -> tuple[np.ndarray, Prompt]:
        """(text ids, prompt) of an eval/calibration item."""
        if item.prompt_wav is None:
            return self.text_ids(item.text), self.no_prompt(item.text)
        wav, sr = read_wav(item.prompt_wav)
        return self.text_ids(item.text), self.prompt(wav, sr, item.prompt_text, item.text)


def _clip(text: str, limit: int = 40) -> str:
    """``text`` quoted for a one-line message (newlines escaped), cut at ``limit`` characters."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")
