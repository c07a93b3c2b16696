"""One store of the tiny model's common steps, built once per test session and copied into the
artifacts dir of every test that needs those steps cached, not run.

Most of the suite's build time went into the same steps built again in each test's own fresh
artifacts dir: the built-in model, the reference, the FP32 exports and engines, a small INT8
calibration. A test that checks what a build *runs* (caching, kill and resume, split builds, the
remote tier) starts from an empty store as before; a test that needs a built bundle, or a recipe
that differs from these in one stage, starts from :func:`seeded` and runs only what differs.

The seed is built by the first pytest-xdist worker that asks for it, under a file lock in the
session's own temporary folder (the other workers wait for it), from the code under test.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from helpers import EVAL_SET, REPO, run_cli, write_recipe

# The cheapest full build: the tiny model's cpu-fp32, one eval item, one timing run.
FOLLOWUP: dict[str, Any] = {
    "extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": "followup", "model": "builtin:tiny",
    "validation": {"eval_set": str(EVAL_SET), "max_items": 1, "speed": {"warmup": 0, "runs": 1, "throughput": []}},
}
# The shipped cpu-int8 with two calibration items, one eval item and one timing run.
SMALL_INT8: dict[str, Any] = {
    "extends": str(REPO / "recipes" / "cpu-int8.yaml"), "name": "cpu-int8",
    "calibration": {"max_items": 2},
    "validation": {"max_items": 1, "speed": {"runs": 1, "throughput": []}},
}
SEED_RECIPES = {"followup": FOLLOWUP, "cpu-int8": SMALL_INT8}


def session_dir(basetemp: Path) -> Path:
    """A folder every worker of this pytest session shares (pytest-xdist gives each worker its own
    ``basetemp`` inside the session's), and no other session sees."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def seed_store(shared: Path) -> Path:
    """The artifacts dir holding every :data:`SEED_RECIPES` build, built here unless another worker
    already did."""
    root = shared / "seed"
    art = root / "art"
    with open(shared / "seed.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "READY").is_file():
            return art
        shutil.rmtree(root, ignore_errors=True)  # a worker that died building it
        for name, body in SEED_RECIPES.items():
            recipe = write_recipe(root / f"{name}.yaml", body, base=False)
            res = run_cli("build", str(recipe), "--artifacts", str(art), "-q", timeout=1800)
            assert res.returncode == 0, f"seed build {name}: " + res.stdout[-2000:] + res.stderr[-3000:]
        (root / "READY").write_text("")
    return art


def seeded(seed: Path, art: Path) -> Path:
    """``art``, new, with a private copy of the seed's cache entries (copies, not links: a test may
    damage what it holds)."""
    art.mkdir(parents=True)
    shutil.copytree(seed / "cache" / "objects", art / "cache" / "objects")
    return art
