"""The project's ONNX Runtime operator library (``runtime/ort_ops``), compiled here and run by the
real ONNX Runtime: ``cosycompile.Snake`` against the Snake expression in float64."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cosycompile.errors import UserError
from cosycompile.runtime import ort_ops


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ort_ops.build_library(tmp_path_factory.mktemp("ort_ops"))


def _want(x: np.ndarray, alpha: np.ndarray, scale: np.ndarray) -> np.ndarray:
    a = alpha.astype(np.float64).reshape(-1, 1) if alpha.size > 1 else float(alpha[0])
    s = scale.astype(np.float64).reshape(-1, 1) if scale.size > 1 else float(scale[0])
    return x + s * np.sin(a * x.astype(np.float64)) ** 2


def test_library_name_is_a_digest_and_a_second_build_reuses_it(library: Path, tmp_path: Path) -> None:
    assert library.name == ort_ops.library_name() and library.is_file()
    again = ort_ops.build_library(library.parent)
    assert again == library
    # Through a cache dir: compiled there once, placed into each engine dir.
    placed = ort_ops.build_library(tmp_path / "engine", cache_dir=tmp_path / "cache")
    cached = tmp_path / "cache" / "ort_ops" / library.name
    assert placed.read_bytes() == cached.read_bytes() and ort_ops.library_in(tmp_path / "engine") == placed
    before = cached.stat().st_mtime_ns
    second = ort_ops.build_library(tmp_path / "engine2", cache_dir=tmp_path / "cache")
    assert second.read_bytes() == cached.read_bytes() and cached.stat().st_mtime_ns == before
    assert not list((tmp_path / "engine").glob(".*.tmp")) and not list(cached.parent.glob(".*.tmp"))


@pytest.mark.parametrize("per_channel", [True, False])
def test_snake_matches_float64_over_a_wide_range(library: Path, per_channel: bool) -> None:
    rng = np.random.default_rng(0)
    C, T = 7, 3001  # a step count no vector width divides
    if per_channel:
        # Tiny alphas, as upstream CosyVoice3's HiFT has, one of them negative; scale = 1/(alpha + 1e-9).
        alpha = np.array([1.0, 0.3, 1.2e-5, -8.0e-6, 2.5, -1.7, 40.0], np.float32)
    else:
        alpha = np.array([1.3], np.float32)
    scale = (1.0 / (alpha.astype(np.float64) + 1e-9)).astype(np.float32)
    x = (rng.standard_normal((2, C, T)) * np.array([1, 3, 30, 300, 1, 3, 10])[:, None]).astype(np.float32)
    got = ort_ops.snake_session(library, [2, C, T], alpha, scale).run(None, {"x": x})[0]
    want = _want(x, alpha, scale)
    # Per channel, relative to the channel's largest output: float32 rounding of x + scale * sin^2.
    err = np.abs(got - want).max(axis=(0, 2)) / np.abs(want).max(axis=(0, 2))
    assert err.max() < 2e-6, err
    # The sine's own accuracy where it dominates the output (x small against scale * sin^2).
    small = np.abs(x) < 0.1
    rel = np.abs(got - want)[small] / np.maximum(np.abs(want[small]), 1e-30)
    assert rel.max() < 1e-5


@pytest.mark.parametrize("shape", [[1, 37, 1000], [3, 5, 40000], [1, 1, 7]])
def test_snake_split_over_the_pool_matches_one_thread(library: Path, shape: list[int]) -> None:
    # Rows go out in blocks through ONNX Runtime's pool: many blocks with a ragged last one, rows longer
    # than a block, a single row. Every element is computed the same way, so the threads change nothing.
    rng = np.random.default_rng(1)
    alpha = rng.uniform(0.2, 2.0, shape[1]).astype(np.float32)
    scale = (1.0 / alpha).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32) * 4
    one = ort_ops.snake_session(library, shape, alpha, scale, threads=1).run(None, {"x": x})[0]
    pool = ort_ops.snake_session(library, shape, alpha, scale, threads=4).run(None, {"x": x})[0]
    assert np.array_equal(one, pool)
    want = _want(x, alpha, scale)
    assert (np.abs(pool - want).max(axis=(0, 2)) / np.abs(want).max(axis=(0, 2))).max() < 2e-6


def test_mismatched_alpha_is_refused_with_a_message(library: Path) -> None:
    sess = ort_ops.snake_session(library, [1, 4, 16], np.ones(3, np.float32), np.ones(1, np.float32))
    with pytest.raises(Exception, match="one value or one per channel"):
        sess.run(None, {"x": np.zeros((1, 4, 16), np.float32)})


def test_no_compiler_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(UserError, match="no C\\+\\+ compiler .*drop 'snake'"):
        ort_ops.build_library(tmp_path / "out")
    assert not any((tmp_path / "out").iterdir())  # nothing half-written
