"""Shared fixtures: a built-in tiny model dir written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:tiny written in the real checkpoint layout (read-only for tests: copy before editing)."""
    from cosycompile.families import builtin_family

    out = tmp_path_factory.mktemp("models") / "tiny"
    builtin_family("builtin:tiny").hook("init_model")("builtin:tiny", out, seed=0)
    return out
