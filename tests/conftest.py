"""Shared fixtures (a built-in tiny model dir, a cached build written once per session) and the
opt-in markers' rule."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hostile_harness import CachedBuild

# The suite runs several torch and ONNX Runtime processes at once (a build beside a server, concurrent
# builds, pytest itself) on a 2-core machine. OpenMP's default is to spin while it waits for work, and
# spinning threads of one process starve the other: the tiny model's eager reference pipeline ran many
# times slower under such contention. Sleeping waiters cost the tests nothing (none of them measures
# speed). Set before anything imports torch, and inherited by every subprocess a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:tiny written in the real checkpoint layout (read-only for tests: copy before editing)."""
    from cosycompile.families import builtin_family

    out = tmp_path_factory.mktemp("models") / "tiny"
    builtin_family("builtin:tiny").hook("init_model")("builtin:tiny", out, seed=0)
    return out


@pytest.fixture(scope="session")
def torch_ops_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cosycompile's torch operators compiled once per session and registered in this process."""
    from cosycompile.runtime.torch_ops import build_library, load_library

    library = build_library(tmp_path_factory.mktemp("torch_ops"))
    load_library(library)
    return library


@pytest.fixture(scope="session")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The artifacts dir of the session's seed store (see ``seed_store``): copy it with
    ``seed_store.seeded``, never build into it."""
    from seed_store import seed_store, session_dir

    return seed_store(session_dir(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def followup(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> CachedBuild:
    """A recipe built once per session: hostile cases run in its artifacts dir and build it again after
    each refusal, which must be all cache hits (see ``hostile_harness.refused``)."""
    from hostile_harness import cached_build

    return cached_build(tmp_path_factory.mktemp("followup"), seed)


# Opt-in markers: their tests run only when the ``-m`` expression names them. ``model05b``: a
# 0.5B-shaped model (GBs of weights, minutes; ``make bench``). ``vllm``: a real vLLM in its own venv
# (``make test-vllm``, which CI runs after ``make test``). ``extended``: what keeps CI's test time
# bounded (``make test-extended``; docs/ci.md says what each tier holds).
OPT_IN = ("model05b", "vllm", "extended")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the tests of each opt-in marker the ``-m`` expression does not name."""
    named = config.getoption("markexpr") or ""
    skipped = [m for m in OPT_IN if m not in named]
    left_out = [item for item in items if any(item.get_closest_marker(m) is not None for m in skipped)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
    if getattr(config.option, "numprocesses", None):
        _slow_files_first(items)


def _slow_files_first(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs two workers, a file each at a time): the files with the
    most ``slow`` tests go first, so the run does not end with one worker alone on a long file."""
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    slow = Counter(file_of(item) for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[file_of(item)])  # stable: each file's own order is kept
