"""Speaker names are file names: letters of any script, digits, '.', '_', '-'; never a path, one spelling."""

from __future__ import annotations

import unicodedata

import pytest

from cosycompile.errors import UserError
from cosycompile.runtime.speakers import check_name, speaker_file, speaker_names


@pytest.mark.parametrize("name", ["alice", "speaker_01", "a.b-c"])
def test_ascii_names_are_their_file_names(name: str) -> None:
    assert speaker_file(check_name(name)) == f"speakers/{name}.npz"


@pytest.mark.parametrize("name", ["中文女", "英文男", "Ünal"])
def test_names_of_any_script_get_ascii_file_names_that_list_back(name: str) -> None:
    rel = speaker_file(check_name(name))
    assert rel.isascii() and rel.startswith("speakers/%")
    assert speaker_names({"files": {rel: "", "engines/x.onnx": ""}}) == [name]


@pytest.mark.parametrize("name", ["", "../alice", "a/b", ".hidden", "_x", "-x", "a b", "a\\b", "x" * 65,
                                  unicodedata.normalize("NFD", "Ünal")])
def test_paths_and_other_spellings_are_refused(name: str) -> None:
    with pytest.raises(UserError, match="speaker name"):
        check_name(name)
