"""Upstream's source for the scripts that run upstream's own code (bench/upstream_cv1.py and the
fixture recorders tests/families/*/make_upstream_fixtures*.py): the folders they import, taken from
a source tree or exported from a git directory at a commit."""

from __future__ import annotations

import subprocess
from pathlib import Path


def source_tree(path: Path, commit: str, folders: list[str], tmp: Path) -> tuple[Path, str]:
    """A folder holding ``folders`` of ``path`` (a source tree, or a git dir at ``commit``), and the commit."""
    if all((path / f).exists() for f in folders):
        try:
            rev = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        except (subprocess.CalledProcessError, FileNotFoundError):
            rev = "unknown (not a git checkout)"
        return path, rev
    git = ["git", f"--git-dir={path}"]
    rev = subprocess.run(git + ["rev-parse", commit], capture_output=True, text=True, check=True).stdout.strip()
    tmp.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(git + ["archive", rev, *folders], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp, rev
