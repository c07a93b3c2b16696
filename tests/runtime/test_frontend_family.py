"""The front end is its family's: the speech tokenizer it opens (v2 for CosyVoice2, v3 for CosyVoice3),
found from a model dir's config or from a bundle's front-end files, and CosyVoice3's instruction in
front of a prompt text that lacks ``<|endofprompt|>`` (upstream asserts the marker is there)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cosycompile.errors import ModelError
from cosycompile.families import get_family
from cosycompile.runtime.frontend import Frontend, frontend_family

INSTRUCTION = "You are a helpful assistant.<|endofprompt|>"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for family in ("cosyvoice2", "cosyvoice3"):
        info = get_family(family)
        out[family] = info.hook("init_model")(f"builtin:{info.tiny_builtin}", tmp_path_factory.mktemp(family) / "m", 0)
    return out


def test_each_family_opens_its_own_speech_tokenizer(dirs: dict[str, Path], tmp_path: Path) -> None:
    for family, root in dirs.items():
        assert frontend_family(root).name == family
        # A bundle's front end holds no config: the speech tokenizer it holds says whose it is.
        bare = tmp_path / family
        shutil.copytree(root, bare)
        (bare / get_family(family).config_file).unlink()
        assert frontend_family(bare).name == family
    assert Frontend(dirs["cosyvoice3"]).speech_tokenizer is not None
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="speech_tokenizer_v2.onnx, speech_tokenizer_v3.onnx"):
        frontend_family(empty)


def test_cosyvoice3_prompts_carry_the_instruction_once(dirs: dict[str, Path]) -> None:
    fe = Frontend(dirs["cosyvoice3"])
    wav = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    with_instruction = fe.text_ids(INSTRUCTION + "Hello.")
    assert np.array_equal(fe.prompt(wav, 16000, "Hello.").text_ids, with_instruction)
    # Already there (in the prompt text or in the text to say): nothing is added.
    assert np.array_equal(fe.prompt(wav, 16000, INSTRUCTION + "Hello.").text_ids, with_instruction)
    assert np.array_equal(fe.prompt(wav, 16000, "Hello.", "Say<|endofprompt|> this").text_ids, fe.text_ids("Hello."))
    assert np.array_equal(fe.no_prompt("Say this.").text_ids, fe.text_ids(INSTRUCTION))
    assert fe.no_prompt("Say<|endofprompt|> this.").text_ids.size == 0


def test_cosyvoice2_prompts_are_left_as_written(dirs: dict[str, Path]) -> None:
    fe = Frontend(dirs["cosyvoice2"])
    wav = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    assert np.array_equal(fe.prompt(wav, 16000, "Hello.").text_ids, fe.text_ids("Hello."))
    assert fe.no_prompt("Say this.").text_ids.size == 0
