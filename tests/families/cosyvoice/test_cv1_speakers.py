"""CosyVoice-300M's shipped speakers (spk2info.pt): read as a table of tensors only (never unpickled
code), each x-vector a bundle speaker with no prompt audio; a table no bundle can carry is one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosycompile.errors import ModelError
from cosycompile.families.cosyvoice.speakers import model_speakers, write_builtin_speakers


def test_the_builtins_table_reads_as_x_vector_speakers(tmp_path: Path) -> None:
    write_builtin_speakers(tmp_path, ("中文女", "英文男"), seed=3)
    speakers = model_speakers(tmp_path)
    assert [s.name for s in speakers] == ["中文女", "英文男"]
    table = torch.load(tmp_path / "spk2info.pt", weights_only=True)
    for s in speakers:
        assert s.prompt_text == "" and s.speech_tokens.shape == (0,) and s.mel.shape == (80, 0)
        np.testing.assert_array_equal(s.embedding, table[s.name]["embedding"].reshape(-1).numpy())
    assert not np.array_equal(speakers[0].embedding, speakers[1].embedding)


def test_no_table_is_no_speakers_and_entries_without_an_x_vector_are_skipped(tmp_path: Path) -> None:
    assert model_speakers(tmp_path) == []
    torch.save({"a": {"embedding": torch.ones(1, 192)}, "zero-shot": {"llm_embedding": torch.ones(1, 192)}},
               tmp_path / "spk2info.pt")
    assert [s.name for s in model_speakers(tmp_path)] == ["a"]


class _NotATensor:
    pass


@pytest.mark.parametrize("table,want", [
    ([1, 2], "expected a table of speakers"),
    ({"../x": {"embedding": torch.ones(192)}}, "speaker name '../x'"),
    ({"a": {"embedding": torch.ones(100)}}, "'embedding' must be 192 floats"),
    ({"a": {"embedding": torch.full((192,), float("nan"))}}, "NaN or Inf"),
    ({"a": _NotATensor()}, "not a readable speaker table"),
])
def test_a_table_no_bundle_can_carry_is_one_line(tmp_path: Path, table: object, want: str) -> None:
    torch.save(table, tmp_path / "spk2info.pt")
    with pytest.raises(ModelError) as err:
        model_speakers(tmp_path)
    assert want in str(err.value) and "\n" not in str(err.value)
    assert str(tmp_path / "spk2info.pt") in str(err.value)
