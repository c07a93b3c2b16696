"""CosyVoice-300M's text tokenizers: byte-pair merges as tiktoken does them, upstream's specials, the
vocabulary the model's yaml names, one-line errors, and (where upstream's source is at hand) the ids
upstream's own tokenizer gives (tests/data/cv1_upstream/tokenizer_cases.json, written by
make_upstream_fixtures_tokenizer.py beside this file)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from cosycompile.errors import ModelError
from cosycompile.families.cosyvoice.config import cv1_tiny
from cosycompile.families.cosyvoice.tokenizer import (COSYVOICE_FILE, WHISPER_FILE, load_text_tokenizer,
                                                      special_tokens, tokenizer_choice)
from cosycompile.families.cosyvoice.yaml_read import yaml_text

DATA = Path(__file__).resolve().parents[2] / "data" / "cv1_upstream"
# The bare mirror the search tool's fetch leaves; another checkout can be named in the environment.
UPSTREAM = Path(os.environ.get("COSYCOMPILE_UPSTREAM_COSYVOICE", "/work/.mirror/FunAudioLLM+CosyVoice/repo"))


def _model_dir(root: Path, tokens: list[bytes], vocab: str = "whisper") -> Path:
    """A dir with a cosyvoice.yaml naming ``vocab``'s tokenizer and a vocabulary of ``tokens`` (rank = index)."""
    root.mkdir(parents=True, exist_ok=True)
    text = yaml_text(cv1_tiny())
    if vocab == "cosyvoice":
        text = text.replace("!name:whisper.tokenizer.get_tokenizer", "!name:cosyvoice.tokenizer.tokenizer.get_tokenizer")
    (root / "cosyvoice.yaml").write_text(text)
    name = WHISPER_FILE if vocab == "whisper" else COSYVOICE_FILE
    (root / name).write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    return root


def _bytes_vocab(*merged: bytes) -> list[bytes]:
    return [bytes([i]) for i in range(256)] + list(merged)


def test_merges_take_the_lowest_rank_first(tmp_path: Path) -> None:
    # "ab" and "bc" both apply to "abc"; whichever ranks lower is merged, the other cannot follow.
    ab_first = load_text_tokenizer(_model_dir(tmp_path / "a", _bytes_vocab(b"ab", b"bc")))
    bc_first = load_text_tokenizer(_model_dir(tmp_path / "b", _bytes_vocab(b"bc", b"ab")))
    assert ab_first.encode("abc") == [256, ord("c")]
    assert bc_first.encode("abc") == [ord("a"), 256]
    # Merges go on over merged pieces: "ab" + "c" -> "abc" when that is in the vocabulary too.
    chained = load_text_tokenizer(_model_dir(tmp_path / "c", _bytes_vocab(b"ab", b"abc")))
    assert chained.encode("abc") == [257]


def test_pretokenizer_splits_words_and_specials_keep_their_ids(tmp_path: Path) -> None:
    tok = load_text_tokenizer(_model_dir(tmp_path, _bytes_vocab(b" a")))
    # " a" is one word of the regex (a space joins the letters after it) and one rank.
    assert tok.encode("a a") == [ord("a"), 256]
    eot = 257  # the first special follows the ranks
    assert tok.encode("a<|endoftext|>a") == [ord("a"), eot, ord("a")]
    assert tok.encode("<|en|>") == [eot + 2]


def test_special_token_counts_make_the_text_vocabularies() -> None:
    # Whisper's 50,257 ranks + its specials are the 50 Hz models' 51,866 text rows (cosyvoice.yaml).
    assert 50257 + len(special_tokens("whisper")) == 51866
    assert len(set(special_tokens("cosyvoice"))) == len(special_tokens("cosyvoice")) == 1674
    assert len(special_tokens("whisper", num_languages=99)) == len(special_tokens("whisper")) - 1


def test_the_yaml_names_the_vocabulary(tmp_path: Path) -> None:
    assert tokenizer_choice(_model_dir(tmp_path / "w", _bytes_vocab()))[:2] == ("whisper", WHISPER_FILE)
    assert tokenizer_choice(_model_dir(tmp_path / "c", _bytes_vocab(), "cosyvoice"))[:2] == ("cosyvoice", COSYVOICE_FILE)
    other = _model_dir(tmp_path / "o", _bytes_vocab())
    (other / "cosyvoice.yaml").write_text(yaml_text(cv1_tiny()).replace("whisper.tokenizer.get_tokenizer",
                                                                         "mytok.get_tokenizer"))
    with pytest.raises(ModelError, match="mytok.get_tokenizer is not a CosyVoice-300M tokenizer"):
        tokenizer_choice(other)


def test_missing_or_broken_vocabulary_is_one_line(tmp_path: Path) -> None:
    root = _model_dir(tmp_path, _bytes_vocab())
    (root / WHISPER_FILE).unlink()
    with pytest.raises(ModelError) as err:
        load_text_tokenizer(root)
    assert str(root / WHISPER_FILE) in str(err.value) and "openai-whisper" in str(err.value)
    assert "\n" not in str(err.value)
    (root / WHISPER_FILE).write_text("not base64 at all\n")
    with pytest.raises(ModelError, match="not a tiktoken vocabulary"):
        load_text_tokenizer(root)


def test_ids_equal_upstreams_tokenizer(tmp_path: Path) -> None:
    cases = json.loads((DATA / "tokenizer_cases.json").read_text())
    try:
        vocab = subprocess.run(["git", f"--git-dir={UPSTREAM}", "show",
                                f"{cases['commit']}:cosyvoice/tokenizer/assets/{COSYVOICE_FILE}"],
                               capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"upstream's source is not at {UPSTREAM} (set COSYCOMPILE_UPSTREAM_COSYVOICE)")
    root = _model_dir(tmp_path, [], "cosyvoice")
    (root / COSYVOICE_FILE).write_bytes(vocab)
    tok = load_text_tokenizer(root)
    assert tok.vocab_size == cases["n_vocab"]
    for case in cases["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
