"""CosyVoice-300M's text tokenizers: Whisper-style byte-pair vocabularies, read from the model dir.

Which one a model uses is its ``cosyvoice.yaml``'s ``get_tokenizer`` (FunAudioLLM/CosyVoice ace7c47):
the 50 Hz models name openai-whisper's ``whisper.tokenizer.get_tokenizer`` (``multilingual.tiktoken``,
50,257 ranks, then Whisper's specials: 51,866 text rows with 100 languages); the 25 Hz model names
upstream's own ``cosyvoice.tokenizer.tokenizer.get_tokenizer`` (``multilingual_zh_ja_yue_char_del.tiktoken``
and CosyVoice's longer list of specials). Both files are package data of those projects, not part of a
model dir as published: a model dir built here holds a copy of the one its yaml names. Each line of
such a file is a base64 token and its rank; the specials follow the ranks in upstream's order.
Encoding is tiktoken's: the pre-tokenizer regex, then byte-pair merges lowest rank first; special
tokens written in the text are encoded as themselves (upstream passes ``allowed_special='all'``).
Pure Python: no tiktoken dependency. No torch.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cosycompile.errors import ModelError
from cosycompile.families.model_dir import need_file

WHISPER_FILE = "multilingual.tiktoken"
COSYVOICE_FILE = "multilingual_zh_ja_yue_char_del.tiktoken"
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LANGUAGES = ("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr "
             "bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn "
             "yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su "
             "yue").split()
AUDIO_EVENTS = ("ASR", "AED", "SER", "Speech", "/Speech", "BGM", "/BGM", "Laughter", "/Laughter", "Applause",
                "/Applause")
EMOTIONS = ("HAPPY", "SAD", "ANGRY", "NEUTRAL")
TTS_TOKENS = ("TTS/B", "TTS/O", "TTS/Q", "TTS/A", "TTS/CO", "TTS/CL", "TTS/H", *(f"TTS/SP{i:02d}" for i in range(1, 14)))


def special_tokens(vocab: str, num_languages: int = 100) -> list[str]:
    """The special tokens of ``vocab`` (``whisper`` or ``cosyvoice``) in id order (after the ranks)."""
    langs = [f"<|{x}|>" for x in LANGUAGES[:num_languages]]
    tasks = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    times = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    if vocab == "whisper":
        return ["<|endoftext|>", "<|startoftranscript|>", *langs, *tasks, *times]
    return ["<|endoftext|>", "<|startoftranscript|>", *langs, *(f"<|{x}|>" for x in AUDIO_EVENTS),
            *(f"<|{x}|>" for x in EMOTIONS), *tasks, *(f"<|SPECIAL_TOKEN_{i}|>" for i in range(1, 31)),
            *(f"<|{x}|>" for x in TTS_TOKENS), *times]


def tokenizer_choice(root: Path) -> tuple[str, str, int]:
    """(vocabulary kind, its file name, languages) as the model dir's yaml names its ``get_tokenizer``
    (upstream's 50 Hz default, Whisper's, when the yaml names none)."""
    from cosycompile.families.hyperyaml import Tagged, args, read_cosyvoice_yaml

    from . import CONFIG_FILE

    node = read_cosyvoice_yaml(Path(root) / CONFIG_FILE).get("get_tokenizer")
    target = node.target if isinstance(node, Tagged) else "whisper.tokenizer.get_tokenizer"
    langs = args(node).get("num_languages", 100)
    if not isinstance(langs, int) or not 1 <= langs <= len(LANGUAGES):
        raise ModelError(f"{Path(root) / CONFIG_FILE}: get_tokenizer: num_languages must be 1..{len(LANGUAGES)}")
    if target.startswith("whisper."):
        return "whisper", WHISPER_FILE, langs
    if target.startswith("cosyvoice.tokenizer."):
        return "cosyvoice", COSYVOICE_FILE, langs
    raise ModelError(f"{Path(root) / CONFIG_FILE}: get_tokenizer: {target} is not a CosyVoice-300M tokenizer")


def check_tokenizer_file(root: Path) -> None:
    """A one-line :class:`ModelError` unless ``root`` holds the vocabulary its yaml names (saying where it
    comes from)."""
    kind, name, _ = tokenizer_choice(root)
    origin = ("openai-whisper's package (whisper/assets/)" if kind == "whisper"
              else "upstream CosyVoice's source tree (cosyvoice/tokenizer/assets/)")
    need_file(Path(root) / name, f"text tokenizer of the front end: copy it from {origin} into the model dir")


@dataclass
class TextTokenizer:
    """``encode(text)`` -> ids as upstream's ``tokenizer.encode(text, allowed_special='all')``."""

    file: Path
    ranks: dict[bytes, int]
    specials: dict[str, int]

    def __post_init__(self) -> None:
        import regex

        self._words = regex.compile(PATTERN)
        self._special = regex.compile("|".join(regex.escape(s) for s in sorted(self.specials, key=len, reverse=True)))
        self._merge = lru_cache(maxsize=65536)(self._bpe)

    @property
    def vocab_size(self) -> int:
        return len(self.ranks) + len(self.specials)

    def _bpe(self, piece: bytes) -> tuple[int, ...]:
        """Ids of one pre-tokenized piece: merge the adjacent pair of lowest rank until none is in the vocabulary."""
        if piece in self.ranks:
            return (self.ranks[piece],)
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            ranked = [(self.ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            best = min(((r, i) for r, i in ranked if r is not None), default=None)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        try:
            return tuple(self.ranks[p] for p in parts)
        except KeyError:
            raise ModelError(f"{self.file}: a byte has no rank (not a byte-level vocabulary)") from None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` is accepted for the front end's call and adds none."""
        out: list[int] = []
        start = 0
        for m in [*self._special.finditer(text), None]:
            chunk = text[start:m.start() if m else len(text)]
            for word in self._words.findall(chunk):
                out.extend(self._merge(word.encode("utf-8")))
            if m is not None:
                out.append(self.specials[m.group()])
                start = m.end()
        return out


def load_text_tokenizer(model_dir: Path) -> TextTokenizer:
    """The tokenizer of a model dir (``FamilyInfo.text_tokenizer``); a missing or malformed file is a
    one-line :class:`ModelError` naming it."""
    kind, name, langs = tokenizer_choice(Path(model_dir))
    path = Path(model_dir) / name
    check_tokenizer_file(Path(model_dir))
    ranks: dict[bytes, int] = {}
    n = 0
    try:
        with open(path, encoding="ascii") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                token, rank = line.split()
                # Decoded leniently as upstream does: one line of its file is a lone '=' (an empty token).
                ranks[base64.b64decode(token)] = int(rank)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"{path}: not a tiktoken vocabulary (line {n}: {exc.__class__.__name__})") from None
    if not ranks:
        raise ModelError(f"{path}: holds no tokens")
    return TextTokenizer(path, ranks, {s: len(ranks) + i for i, s in enumerate(special_tokens(kind, langs))})
