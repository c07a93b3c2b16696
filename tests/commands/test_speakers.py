"""``cosycompile speakers`` and ``synthesize --speaker`` (issue 39, item 5), through the real CLI on an
unpacked bundle: a cached speaker gives the same audio as its prompt given as files, travels through
pack and unpack, is guarded by its digest, and a build keeps a bundle that holds one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import EVAL_SET, one_line_error
from hostile_harness import CachedBuild

ITEM = json.loads((EVAL_SET / "manifest.jsonl").read_text().splitlines()[0])
PROMPT_WAV = EVAL_SET / ITEM["prompt_wav"]
TEXT = "Hello there, how are you today?"


def _cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res.stdout


@pytest.fixture
def bundle(followup: CachedBuild, tmp_path: Path) -> Path:
    """The follow-up build's bundle, packed and unpacked into this test's folder."""
    (src,) = (followup.art / "builds").glob("followup-*")
    _ok(_cli("pack", src, "-o", tmp_path / "b.tar.gz"))
    _ok(_cli("unpack", tmp_path / "b.tar.gz", tmp_path / "bundle"))
    return tmp_path / "bundle"


def _add(bundle: Path, name: str = "alice", *extra: str) -> subprocess.CompletedProcess:
    return _cli("speakers", "add", bundle, "--name", name, "--prompt-wav", PROMPT_WAV, "--prompt-text",
                ITEM["prompt_text"], *extra)


def test_a_cached_speaker_sounds_as_its_prompt_files(bundle: Path, tmp_path: Path) -> None:
    assert "added speaker alice" in _ok(_add(bundle))
    assert _ok(_cli("speakers", "ls", bundle)).split() == ["alice"]
    _ok(_cli("synthesize", bundle, "--text", TEXT, "--speaker", "alice", "--out", tmp_path / "cached.wav"))
    _ok(_cli("synthesize", bundle, "--text", TEXT, "--prompt-wav", PROMPT_WAV, "--prompt-text", ITEM["prompt_text"],
             "--out", tmp_path / "files.wav"))
    _ok(_cli("synthesize", bundle, "--text", TEXT, "--out", tmp_path / "none.wav"))
    cached = (tmp_path / "cached.wav").read_bytes()
    assert cached == (tmp_path / "files.wav").read_bytes()
    assert cached != (tmp_path / "none.wav").read_bytes(), "the speaker changed nothing: this test proves nothing"


def test_a_speaker_travels_through_pack_and_unpack(bundle: Path, tmp_path: Path) -> None:
    _ok(_add(bundle))
    _ok(_cli("pack", bundle, "-o", tmp_path / "again.tar.gz"))
    _ok(_cli("unpack", tmp_path / "again.tar.gz", tmp_path / "again"))
    assert _ok(_cli("speakers", "ls", tmp_path / "again")).split() == ["alice"]
    _ok(_cli("synthesize", tmp_path / "again", "--text", TEXT, "--speaker", "alice", "--out", tmp_path / "a.wav"))


def test_a_tampered_speaker_is_refused(bundle: Path, tmp_path: Path) -> None:
    _ok(_add(bundle))
    f = bundle / "speakers" / "alice.npz"
    data = bytearray(f.read_bytes())
    data[-40] ^= 1
    f.write_bytes(bytes(data))
    line = one_line_error(_cli("synthesize", bundle, "--text", TEXT, "--speaker", "alice", "--out", tmp_path / "o.wav"))
    assert "alice.npz: digest mismatch" in line
    assert not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("args,expected", [
    (["--speaker", "bob"], "no speaker 'bob' (speakers: alice)"),
    (["--speaker", "alice", "--prompt-wav", str(PROMPT_WAV)], "--speaker replaces --prompt-wav"),
    (["--speaker", "../alice"], "speaker name '../alice'"),
])
def test_synthesize_refuses_a_speaker_it_cannot_use(bundle: Path, tmp_path: Path, args: list[str],
                                                    expected: str) -> None:
    _ok(_add(bundle))
    line = one_line_error(_cli("synthesize", bundle, "--text", TEXT, *args, "--out", tmp_path / "o.wav"))
    assert expected in line


def test_add_refuses_a_taken_name_unless_replace_and_rm_removes(bundle: Path) -> None:
    _ok(_add(bundle))
    assert "speaker 'alice' exists (--replace" in one_line_error(_add(bundle))
    _ok(_add(bundle, "alice", "--replace"))
    assert "speaker name 'a/b'" in one_line_error(_add(bundle, "a/b"))
    _ok(_cli("speakers", "rm", bundle, "--name", "alice"))
    assert _ok(_cli("speakers", "ls", bundle)).split() == []
    assert not (bundle / "speakers" / "alice.npz").exists()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert not [f for f in manifest["files"] if f.startswith("speakers/")]


def test_a_build_keeps_a_bundle_that_holds_a_speaker(followup: CachedBuild, tmp_path: Path) -> None:
    art = tmp_path / "art"
    shutil.copytree(followup.art, art, symlinks=True)
    (bundle,) = (art / "builds").glob("followup-*")
    _ok(_add(bundle))
    out = _ok(_cli("build", followup.recipe, "--artifacts", art, "-q"))
    assert "ran: nothing (all cached)" in out
    assert _ok(_cli("speakers", "ls", bundle)).split() == ["alice"]
