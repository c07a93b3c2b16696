"""Test helpers importable from every test folder (tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EVAL_SET = REPO / "calib_data" / "eval"
def write_recipe(path: Path, body: dict | str, base: bool = True) -> Path:
    """Write a recipe YAML; with ``base`` it extends the repo's recipes/base.yaml."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(body, str):
        path.write_text(body)
        return path
    data = dict(body)
    if base:
        data.setdefault("extends", str(REPO / "recipes" / "base.yaml"))
        data.setdefault("validation", {}).setdefault("eval_set", str(EVAL_SET))
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real console entry point in a subprocess."""
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def until_outputs(stdout: str) -> dict[str, Path]:
    """The ``  <step>: <dir>`` lines that ``cosycompile build --until`` prints, as a dict."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("  ") and ": /" in line:
            name, path = line.strip().split(": ", 1)
            out[name] = Path(path)
    return out
