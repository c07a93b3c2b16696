"""Every entry point against every kind of hostile path (issue 37, item 8): each place a command
reads or writes a path the user names is given a missing path, a FIFO, a device, a file of garbage,
a folder where a file belongs, a name with a newline, a loop of links, a 300-character name and a
JSON file nested 100,000 deep. Each must be refused as ``hostile_harness.refused`` checks, with the
path named in the one line. The table is checked against the command registry: a new command comes
with its slots, or says why it reads no path."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

import pytest

from cosycompile.cli import build_parser
from cosycompile.errors import one_line
from helpers import EVAL_SET
from hostile_harness import CachedBuild, refused

P = "{path}"  # where the hostile path goes
BUNDLE = "{bundle}"  # the follow-up build's bundle (a good one)
ARCHIVE = "{archive}"  # that bundle packed (a good archive)
OUT = "{out}"  # a fresh output path in the case's folder
PROMPT = str(EVAL_SET / "prompts" / "eval-prompt-00.wav")  # a good prompt

# An output file may be new or replace a plain file (atomically).
REPLACEABLE = {"missing", "garbage", "newline-name", "deep-json"}
# command -> slots: (slot id, command line, kinds that are documented successes there)
SLOTS: dict[str, list[tuple[str, list[str], set[str]]]] = {
    "build": [("recipe", ["build", P], set()), ("artifacts", ["build", BUNDLE + "/recipe.json", "--artifacts", P],
                                                  {"missing", "empty-dir"})],
    "plan": [("recipe", ["plan", P], set())],
    "validate": [("bundle", ["validate", P], set()), ("recipe", ["validate", BUNDLE, "--recipe", P], set())],
    "report": [("bundle", ["report", P], set())],
    "compare": [("a", ["compare", P, BUNDLE], set()), ("b", ["compare", BUNDLE, P], set())],
    "gate": [("report", ["gate", P], set()), ("baseline", ["gate", BUNDLE, "--baseline", P], set())],
    "pack": [("bundle", ["pack", P, "-o", OUT], set()), ("out", ["pack", BUNDLE, "-o", P], REPLACEABLE)],
    "unpack": [("archive", ["unpack", P, OUT], set()), ("dest", ["unpack", ARCHIVE, P], {"missing", "empty-dir"})],
    "synthesize": [("bundle", ["synthesize", P, "--text", "Hello.", "--out", OUT], set()),
                   ("prompt", ["synthesize", BUNDLE, "--text", "Hello.", "--prompt-wav", P, "--out", OUT], set()),
                   ("text-file", ["synthesize", BUNDLE, "--text-file", P, "--out", OUT], {"newline-name"}),
                   ("out", ["synthesize", BUNDLE, "--text", "Hello.", "--out", P], REPLACEABLE)],
    "triton": [("bundle", ["triton", P, "--out", OUT], set()),
               ("out", ["triton", BUNDLE, "--out", P], {"missing", "empty-dir"})],
    "cache": [("push", ["cache", "push", P, "--cache-remote", "file:///nonexistent/remote"], set()),
              ("pull", ["cache", "pull", P, "--cache-remote", "file:///nonexistent/remote"], set()),
              ("artifacts", ["cache", "ls", "--artifacts", P], {"missing", "empty-dir"})],
    "serve": [("bundle", ["serve", P, "--http-port", "1", "--grpc-port", "2"], set()),
              ("log", ["serve", BUNDLE, "--log", P, "--http-port", "1", "--grpc-port", "2"], REPLACEABLE)],
    "speakers": [("add-bundle", ["speakers", "add", P, "--name", "a", "--prompt-wav", PROMPT, "--prompt-text", "Hi."],
                  set()),
                 ("add-prompt", ["speakers", "add", BUNDLE, "--name", "a", "--prompt-wav", P, "--prompt-text", "Hi."],
                  set()),
                 ("ls", ["speakers", "ls", P], set())],
    "init-model": [("out", ["init-model", "builtin:tiny", "--out", P], {"missing", "empty-dir"})],
}
NO_PATH = {"recipe": "prints the option reference; it reads no file the user names"}


def _garbage(d: Path) -> Path:
    p = d / "garbage.bin"
    p.write_bytes(bytes(range(256)) * 16)
    return p


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "pipe")
    return d / "pipe"


def _empty_dir(d: Path) -> Path:
    (d / "empty").mkdir()
    return d / "empty"


def _newline(d: Path) -> Path:
    p = d / "two\nlines"
    p.write_text("Hello.")
    return p


def _loop(d: Path) -> Path:
    os.symlink(d / "loop", d / "loop")
    return d / "loop"


def _deep_json(d: Path) -> Path:
    p = d / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    return p


KINDS: dict[str, Callable[[Path], Path]] = {
    "missing": lambda d: d / "missing", "fifo": _fifo, "device": lambda d: Path("/dev/zero"), "garbage": _garbage,
    "empty-dir": _empty_dir, "newline-name": _newline, "link-loop": _loop, "long-name": lambda d: d / ("x" * 300),
    "deep-json": _deep_json,
}
CASES = [(cmd, slot, kind) for cmd, slots in SLOTS.items() for slot, _, ok in slots for kind in KINDS if kind not in ok]


def test_every_command_has_its_slots_or_reads_no_path() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(SLOTS) | set(NO_PATH), "a command without hostile-path slots"
    assert len(CASES) >= 150


@pytest.fixture(scope="module")
def archive(followup: CachedBuild, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hostile_harness import run_bounded

    (bundle,) = (followup.art / "builds").glob("followup-*")
    out = tmp_path_factory.mktemp("archive") / "bundle.tar.gz"
    res = run_bounded(["pack", str(bundle), "-o", str(out)], out.parent, kill_after=300)
    assert res.rc == 0, res.err
    return out


@pytest.mark.parametrize("command,slot,kind", CASES)
def test_hostile_path(command: str, slot: str, kind: str, tmp_path: Path, followup: CachedBuild,
                      archive: Path) -> None:
    case = tmp_path / "case"
    case.mkdir()
    path = KINDS[kind](case)
    (bundle,) = (followup.art / "builds").glob("followup-*")
    line = next(argv for s, argv, _ in SLOTS[command] if s == slot)
    fill = {P: str(path), BUNDLE: str(bundle), ARCHIVE: str(archive), OUT: str(case / "out")}
    args = [fill.get(a, a.replace(BUNDLE, str(bundle))) for a in line]
    # The one line names the path (escaped where it holds a control character) or, for a folder, a file in it.
    refused(args, one_line(path.name), cwd=case, followup=followup)
