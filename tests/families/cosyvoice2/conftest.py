"""Fixtures for the model tests: the tiny built-in model, loaded once, on two CPU threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

# Keep timings comparable with CI's 2-core runners (and stop torch from oversubscribing).
torch.set_num_threads(2)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: builds the full-size networks (takes more than ~20 s)")


@pytest.fixture(scope="session")
def tiny_models(tiny_model_dir: Path) -> Any:
    """LoadedModels of builtin:tiny, all three stages (read-only: do not modify weights)."""
    from cosycompile.families.cosyvoice2.loader import load_models

    return load_models(tiny_model_dir)
