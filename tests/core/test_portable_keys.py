"""Portable keys: a step built on a CPU runner is reused by a GPU server whose tools are other builds
of the same releases (torch ``+cu128`` instead of ``+cpu``, ``onnxruntime-gpu`` instead of
``onnxruntime``), and is rebuilt where a tool is really another release.

The other machine is simulated for real: a folder of distribution metadata put first on
``PYTHONPATH`` of a ``cosycompile`` subprocess, which ``importlib.metadata`` then reads before the
venv's own (first on ``sys.path`` wins), as it would read a CUDA torch installed on that machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from cosycompile.core import hashing
from tests.helpers import EVAL_SET, REPO, fake_distribution as _fake_dist, write_recipe

TORCH = metadata.version("torch").split("+")[0]
ORT = metadata.version("onnxruntime").split("+")[0]


def _env(fake: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(fake)}


def _run(args: list[str], fake: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=_env(fake), capture_output=True, text=True,
                          timeout=600)


def _todo(recipe: Path, art: Path, fake: Path) -> dict[str, str]:
    """``plan --todo`` as {step: why} of the steps it lists."""
    res = _run(["-m", "cosycompile", "plan", str(recipe), "--artifacts", str(art), "--todo"], fake)
    assert res.returncode == 0, res.stderr
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("  ") and "because: " in line:
            out[line.split()[1]] = line.split("because: ", 1)[1]
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """HiFT of the tiny model built through its ONNX Runtime engine by this venv (CPU torch)."""
    tmp = tmp_path_factory.mktemp("portable")
    recipe = write_recipe(tmp / "r.yaml", {
        "extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": "portable", "model": "builtin:tiny",
        "stages": {"llm": {"enabled": False}, "flow": {"enabled": False}},
        "validation": {"eval_set": str(EVAL_SET)},
    }, base=False)
    art = tmp / "art"
    res = subprocess.run([sys.executable, "-m", "cosycompile", "build", str(recipe), "--until", "engine",
                          "--artifacts", str(art), "-q"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "ran: model, hift.export, hift.simplify, hift.engine" in res.stdout
    return recipe, art


BUILT = ("model", "hift.export", "hift.simplify", "hift.engine")


def test_the_fake_distributions_are_what_the_subprocess_reads(tmp_path: Path) -> None:
    """Guards the tests below: a dist-info first on PYTHONPATH shadows the venv's for importlib.metadata."""
    _fake_dist(tmp_path, "torch", f"{TORCH}+cu128")
    res = _run(["-c", "from importlib import metadata; print(metadata.version('torch'))"], tmp_path)
    assert res.stdout.strip() == f"{TORCH}+cu128", res.stderr


def test_cuda_torch_and_onnxruntime_gpu_of_the_same_release_reuse_every_step(built: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    recipe, art = built
    _fake_dist(tmp_path, "torch", f"{TORCH}+cu128")
    _fake_dist(tmp_path, "onnxruntime-gpu", ORT, top_level="onnxruntime")
    todo = _todo(recipe, art, tmp_path)
    assert not set(BUILT) & set(todo), todo
    assert not any("tool versions" in why for why in todo.values()), todo
    assert "hift.check" in todo  # the plan is the full recipe: what --until left out is still listed


def test_another_torch_release_replans_the_steps_that_list_torch(built: tuple[Path, Path], tmp_path: Path) -> None:
    recipe, art = built
    other = "2.12.0+cpu" if TORCH != "2.12.0" else "2.11.0+cpu"
    _fake_dist(tmp_path, "torch", other)
    todo = _todo(recipe, art, tmp_path)
    for step in ("model", "hift.export"):  # both list torch among their tools
        assert f"torch {TORCH}->{other.split('+')[0]}" in todo[step], todo
    # Simplify lists no torch: it re-runs only because its input (the export) is another step now.
    assert "tool versions" not in todo["hift.simplify"] and "input 'graphs' changed" in todo["hift.simplify"]


def test_another_onnxruntime_gpu_release_replans_the_engine(built: tuple[Path, Path], tmp_path: Path) -> None:
    recipe, art = built
    _fake_dist(tmp_path, "onnxruntime-gpu", "1.0.0", top_level="onnxruntime")
    todo = _todo(recipe, art, tmp_path)
    assert f"onnxruntime {ORT}->1.0.0" in todo["hift.engine"], todo
    assert not {"model", "hift.export", "hift.simplify"} & set(todo), todo


def test_identity_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local label is dropped; a distribution merely named like ONNX Runtime does not count."""
    _fake_dist(tmp_path, "onnxruntime-extensions", "9.9.9", top_level="onnxruntime_extensions")
    _fake_dist(tmp_path, "torch", f"{TORCH}+cu128")
    monkeypatch.syspath_prepend(str(tmp_path))
    hashing.tool_identity.cache_clear()
    hashing.tool_version.cache_clear()
    try:
        assert hashing.tool_version("torch") == f"{TORCH}+cu128"  # what a bundle's manifest records
        assert hashing.tool_identities(["torch", "onnxruntime"]) == {"onnxruntime": ORT, "torch": TORCH}
    finally:
        hashing.tool_identity.cache_clear()
        hashing.tool_version.cache_clear()
