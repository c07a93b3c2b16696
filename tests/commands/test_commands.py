"""Conformance of the command plug-ins (``cosycompile/commands/``, discovered by ``cli.py``)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Callable

import pytest

from cosycompile.cli import build_parser, command_modules
from cosycompile.errors import BuildFailed, RecipeError, Terminated, exit_status


def _names() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_every_command_module_has_its_parts_and_a_place() -> None:
    mods = command_modules()
    assert len(mods) >= 12
    for mod in mods:
        assert isinstance(mod.ORDER, int) and callable(mod.add_parser) and callable(mod.run), mod.__name__
        assert not mod.__name__.rsplit(".", 1)[1].startswith("_")
    orders = [m.ORDER for m in mods]
    assert len(set(orders)) == len(orders), "two commands share an ORDER"
    # Each module adds exactly one command, named after it (underscores as dashes).
    assert _names() == [m.__name__.rsplit(".", 1)[1].replace("_", "-") for m in mods]
    # Its examples in `cosycompile --help` are of that command.
    for mod, name in zip(mods, _names()):
        for cmd, what in getattr(mod, "EXAMPLES", ()):
            assert cmd.split()[:2] == ["cosycompile", name] and what, (name, cmd)


@pytest.mark.parametrize("name", _names())
def test_every_command_explains_itself(name: str) -> None:
    res = subprocess.run([sys.executable, "-m", "cosycompile", name, "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.startswith(f"usage: cosycompile {name}"), res.stderr


def test_a_reader_that_goes_away_is_no_traceback() -> None:
    """`cosycompile gate --list-metrics | head -1`: the closed pipe ends the command quietly."""
    res = subprocess.run(f"{sys.executable} -m cosycompile gate --list-metrics | head -1", shell=True,
                         capture_output=True, text=True, timeout=120)
    assert len(res.stdout.splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr


def _raises(exc: BaseException) -> Callable[[], int]:
    def run() -> int:
        raise exc
    return run


@pytest.mark.parametrize(("run", "status", "says"), [
    (lambda: 3, 3, ""),
    (_raises(RecipeError("r.yaml: bad\nkey")), 2,
     "cosycompile: error: r.yaml: bad\\nkey"),
    (_raises(BuildFailed("flow.engine on node b")), 1,
     "cosycompile: build failed: flow.engine on node b"),
    (_raises(FileNotFoundError(2, "No such file or directory", "/x\ty")), 2,
     "cosycompile: error: /x\\ty: No such file or directory"),
    (_raises(KeyboardInterrupt()), 130, "cosycompile: interrupted; finished steps stay cached"),
    (_raises(Terminated()), 143, "cosycompile: terminated;"),
])
def test_how_a_command_ends_is_its_exit_status_and_one_line(run: Callable[[], int], status: int, says: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(run) == status
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == (1 if says else 0) and "Traceback" not in err, err


def test_an_os_error_about_no_path_is_a_bug_shown_as_one() -> None:
    with pytest.raises(OSError):
        exit_status(_raises(OSError("no filename")))
