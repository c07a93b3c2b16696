"""Placing an immutable file somewhere else: a hard link where the file system allows, else a copy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Hard-link ``src`` at ``dst`` (parents made), or copy it where links cannot cross. Only for files
    nobody edits in place (cache entries, bundles): both names share the bytes. Takes strings too, so it
    serves as ``shutil.copytree``'s ``copy_function``."""
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
