"""The generated ``model.py`` of a python-backend model: the server's PYTHONPATH reaches the stub's
interpreter after its standard library (a stray ``typing.py`` backport in a venv does not shadow it)
and before its own site-packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cosycompile.exporters.triton.shim import model_py


def test_pythonpath_goes_after_the_standard_library(tmp_path: Path) -> None:
    venv_site = tmp_path / "venv-site"
    venv_site.mkdir()
    (venv_site / "typing.py").write_text("raise ImportError('the backport shadowed the standard library')\n")
    (venv_site / "shim_probe_pkg.py").write_text("VALUE = 1\n")
    text = model_py("probe", "shim_probe_pkg", cls="VALUE")
    # -E: like the stub's interpreter, ignore PYTHONPATH for sys.path while the variable stays set.
    probe = text + "\nimport json, sys, os\nprint(json.dumps([sys.path, os.__file__]))\n"
    env = dict(os.environ, PYTHONPATH=str(venv_site))
    res = subprocess.run([sys.executable, "-E", "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    path, os_file = json.loads(res.stdout.strip().splitlines()[-1])
    stdlib = str(Path(os_file).parent)
    assert path.index(stdlib) < path.index(str(venv_site))
    site_dirs = [i for i, p in enumerate(path) if "site-packages" in p and p != str(venv_site)]
    assert all(path.index(str(venv_site)) < i for i in site_dirs)
