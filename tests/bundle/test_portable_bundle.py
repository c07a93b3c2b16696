"""A bundle runs on another machine: pack -> unpack -> synthesize with nothing but the bundle.

One build of recipes/cpu-int8.yaml (two calibration items, one eval item, one timing run) serves
every test; the bundle is packed and unpacked once, and tests that damage it work on copies.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from helpers import EVAL_SET, one_line_error, run_cli, write_recipe
from seed_store import SMALL_INT8, seeded

# Runs the CLI in-process so the test can see what it imported (a bundle server has no torch).
_PROBE = ("import sys\nfrom cosycompile.cli import main\nrc = main(sys.argv[1:])\n"
          "print('TORCH_IMPORTED', 'torch' in sys.modules)\nsys.exit(rc)\n")


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> dict[str, Path]:
    """The small cpu-int8 build (from the session's seed), its bundle, the packed archive and one
    unpacked copy."""
    root = tmp_path_factory.mktemp("portable")
    recipe = write_recipe(root / "cpu-int8-small.yaml", SMALL_INT8, base=False)
    art = seeded(seed, root / "art")
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    (bundle,) = (art / "builds").glob("cpu-int8-*")
    archive = root / "bundle.tar.gz"
    res = run_cli("pack", str(bundle), "-o", str(archive))
    assert res.returncode == 0, res.stderr
    unpacked = root / "elsewhere" / "bundle"
    res = run_cli("unpack", str(archive), str(unpacked))
    assert res.returncode == 0, res.stderr
    return {"root": root, "art": art, "bundle": bundle, "archive": archive, "unpacked": unpacked}


def _copy(build: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the unpacked bundle (plain files, no links into the build's cache)."""
    return Path(shutil.copytree(build["unpacked"], tmp_path / "bundle"))


def test_manifest_lists_every_file_and_the_front_end(build: dict[str, Path]) -> None:
    bundle = build["bundle"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    on_disk = {str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == on_disk - {"manifest.json"}
    for rel in ("frontend/builtin.json", "frontend/CosyVoice-BlankEN/config.json", "frontend/campplus.onnx",
                "frontend/speech_tokenizer_v2.onnx", "engines/llm/engine.json", "recipe.json"):
        assert rel in manifest["files"], rel
    unpacked = build["unpacked"]
    assert {str(p.relative_to(unpacked)) for p in unpacked.rglob("*") if p.is_file()} == on_disk


def test_unpacked_bundle_alone_reproduces_the_builds_audio(build: dict[str, Path], tmp_path: Path) -> None:
    import soundfile as sf

    item = json.loads((EVAL_SET / "manifest.jsonl").read_text(encoding="utf-8").splitlines()[0])
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    out = cwd / "out.wav"
    # The build's artifacts (cache, model entry, bundle) are out of reach while the unpacked copy runs.
    hidden = build["art"].with_name("art.hidden")
    os.replace(build["art"], hidden)
    try:
        res = _cli("synthesize", str(build["unpacked"]), "--text", item["text"],
                   "--prompt-wav", str(EVAL_SET / item["prompt_wav"]), "--prompt-text", item["prompt_text"],
                   "--out", str(out), cwd=cwd, env={"HOME": str(home)})
    finally:
        os.replace(hidden, build["art"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "TORCH_IMPORTED False" in res.stdout, res.stdout
    got, sr = sf.read(str(out), dtype="int16")
    assert sr == 24000 and sf.info(str(out)).subtype == "PCM_16"
    # The build wrote eval item 0 (sampling seed 0, vocoder seed 0) as PCM16: compare at that quantisation.
    ref, _ = sf.read(str(build["unpacked"] / "audio" / f"{item['id']}.built.wav"), dtype="int16")
    assert len(got) == len(ref) and len(ref) > 0
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    noise = float(np.sum((ref64 - got64) ** 2))
    snr = np.inf if noise == 0 else 10 * np.log10(float(np.sum(ref64 ** 2)) / noise)
    assert snr >= 60.0, snr


def test_pack_is_deterministic_and_refuses_a_damaged_bundle(build: dict[str, Path], tmp_path: Path) -> None:
    again = tmp_path / "again.tar.gz"
    assert run_cli("pack", str(build["bundle"]), "-o", str(again)).returncode == 0
    assert again.read_bytes() == build["archive"].read_bytes()
    damaged = _copy(build, tmp_path)
    target = damaged / "engines" / "hift" / "hift.onnx"
    target.write_bytes(target.read_bytes()[:-10])  # truncated
    out = tmp_path / "damaged.tar.gz"
    line = one_line_error(run_cli("pack", str(damaged), "-o", str(out)))
    assert "hift.onnx" in line and "digest mismatch" in line
    assert not out.exists() and not list(tmp_path.glob(".damaged.tar.gz*"))


def _evil_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    """A small archive that looks like a bundle (a manifest at the top) plus one member it must refuse."""
    manifest = json.dumps({"schema": 2, "files": {}}).encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("b/manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def _symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


@pytest.mark.parametrize("member, why", [
    (tarfile.TarInfo("b/../x"), "'..'"),
    (tarfile.TarInfo("/tmp/cosycompile-evil"), "absolute path"),
    (_symlink("b/engines", "/etc"), "symbolic link"),
], ids=["dotdot", "absolute", "symlink"])
@pytest.mark.parametrize("dest_exists", [False, True], ids=["new-dir", "empty-dir"])
def test_unpack_refuses_unsafe_members(tmp_path: Path, member: tarfile.TarInfo, why: str, dest_exists: bool) -> None:
    archive = _evil_tar(tmp_path / "evil.tar.gz", member, b"payload")
    dest = tmp_path / "out"
    if dest_exists:
        dest.mkdir()
    line = one_line_error(run_cli("unpack", str(archive), str(dest)))
    assert why in line, line
    assert (not dest.exists()) if not dest_exists else not any(dest.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["evil.tar.gz"] + (["out"] if dest_exists else []))
    assert not Path("/tmp/cosycompile-evil").exists() and not (tmp_path / "x").exists()


def _stream_tar(path: Path, manifest: dict, members: Iterator[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """A .tar.gz written header by header: the manifest, then each (header, bytes written after it).
    A header may claim more bytes than follow it, as a crafted archive's would."""
    import gzip

    with gzip.open(path, "wb", compresslevel=1) as gz:
        body = json.dumps(manifest).encode()
        info = tarfile.TarInfo("b/manifest.json")
        info.size = len(body)
        gz.write(info.tobuf(tarfile.PAX_FORMAT) + body + b"\0" * (-len(body) % 512))
        for info, data in members:
            gz.write(info.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512))
    return path


def _nothing_written(tmp_path: Path, archive: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name]


def test_unpack_refuses_a_member_larger_than_listed_before_writing_it(tmp_path: Path) -> None:
    """A 3 GB member (3 MB of it present) under a listed name: refused at its header, nothing written."""
    import time

    big = tarfile.TarInfo("b/engines/flow.onnx")
    big.size = 3 << 30
    manifest = {"schema": 2, "files": {"engines/flow.onnx": "0" * 64}, "sizes": {"engines/flow.onnx": 1234}}
    archive = _stream_tar(tmp_path / "bomb.tar.gz", manifest, iter([(big, bytes(3 << 20))]))
    assert archive.stat().st_size < 1 << 20
    t0 = time.perf_counter()
    line = one_line_error(run_cli("unpack", str(archive), str(tmp_path / "out")))
    assert time.perf_counter() - t0 < 5  # the CLI with its start-up (about 0.2 s here)
    assert "flow.onnx" in line and str(3 << 30) in line and "says 1234" in line, line
    _nothing_written(tmp_path, archive)


def test_unpack_refuses_unlisted_members_at_the_first_one(tmp_path: Path) -> None:
    """100,000 one-byte members the manifest does not list: refused at the first, nothing written."""
    def members() -> Iterator[tuple[tarfile.TarInfo, bytes]]:
        for i in range(100_000):
            info = tarfile.TarInfo(f"b/junk/{i:06d}")
            info.size = 1
            yield info, b"x"

    import time

    archive = _stream_tar(tmp_path / "many.tar.gz", {"schema": 2, "files": {}, "sizes": {}}, members())
    t0 = time.perf_counter()
    line = one_line_error(run_cli("unpack", str(archive), str(tmp_path / "out")))
    assert time.perf_counter() - t0 < 5
    assert "b/junk/000000" in line and "more members than its manifest.json lists" in line, line
    _nothing_written(tmp_path, archive)


def test_unpack_wants_the_manifest_first(tmp_path: Path) -> None:
    archive = tmp_path / "late.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, body in (("b/engines/x.onnx", b"x"), ("b/manifest.json", b'{"files": {}}')):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    line = one_line_error(run_cli("unpack", str(archive), str(tmp_path / "out")))
    assert "no manifest.json at the top of the archive, first" in line, line
    _nothing_written(tmp_path, archive)


def test_unpack_refuses_a_file_not_in_the_manifest(build: dict[str, Path], tmp_path: Path) -> None:
    archive = tmp_path / "extra.tar.gz"
    with tarfile.open(build["archive"]) as src, tarfile.open(archive, "w:gz") as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m))
        extra = tarfile.TarInfo(f"{build['bundle'].name}/engines/llm/extra.onnx")
        extra.size = 4
        dst.addfile(extra, io.BytesIO(b"evil"))
    dest = tmp_path / "out"
    line = one_line_error(run_cli("unpack", str(archive), str(dest)))
    assert "extra.onnx" in line and "not in its manifest.json" in line
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["extra.tar.gz"]


def test_flipped_engine_byte_is_refused_at_load(build: dict[str, Path], tmp_path: Path) -> None:
    bundle = _copy(build, tmp_path)
    engine = bundle / "engines" / "llm" / "llm_step.onnx"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))
    res = _cli("synthesize", str(bundle), "--text", "Hello there.", "--out", str(tmp_path / "o.wav"), cwd=tmp_path)
    line = one_line_error(res)
    assert str(engine) in line and "digest mismatch" in line and "cosycompile build" in line
    assert not (tmp_path / "o.wav").exists()


def test_passport_for_another_gpu_is_refused(build: dict[str, Path], tmp_path: Path) -> None:
    bundle = _copy(build, tmp_path)
    passport = bundle / "engines" / "flow" / "engine.json"
    body = json.loads(passport.read_text())
    body["compute_capability"] = "sm90"
    passport.write_text(json.dumps(body))
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so the test says the same on a machine that has one.
    res = _cli("synthesize", str(bundle), "--text", "Hello there.", "--out", str(tmp_path / "o.wav"), cwd=tmp_path,
               env={"CUDA_VISIBLE_DEVICES": ""})
    line = one_line_error(res)
    assert "built for sm90" in line and "no NVIDIA GPU" in line and "rebuild with: cosycompile build" in line


@pytest.mark.parametrize("text", [" \n\t ", "[" * 5000 + "]" * 5000, "?! ... --"])
def test_text_with_nothing_to_say_is_refused(build: dict[str, Path], tmp_path: Path, text: str) -> None:
    line = one_line_error(run_cli("synthesize", str(build["unpacked"]), "--text", text, "--out",
                                   str(tmp_path / "o.wav")))
    assert "--text: text has no letter or digit" in line
    assert not (tmp_path / "o.wav").exists()


def test_split_text_into_sentences_and_lengths() -> None:
    from cosycompile.runtime.text import split_text, text_weight

    assert split_text("Could you remind me what time the museum closes today?") == [
        "Could you remind me what time the museum closes today?"]
    assert split_text("Pi is 3.14 today. Really!  Yes?", max_chars=12) == ["Pi is 3.14", "today.", "Really! Yes?"]
    assert split_text("请问这趟公交车经过人民广场吗？晚饭以后我们去看电影。", max_chars=50) == [
        "请问这趟公交车经过人民广场吗？", "晚饭以后我们去看电影。"]
    long = "word, " * 60 + "end."
    pieces = split_text(long, max_chars=40)
    assert all(text_weight(p) <= 40 for p in pieces) and " ".join(pieces) == " ".join(long.split())
