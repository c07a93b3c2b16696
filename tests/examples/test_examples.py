"""Every numbered example under examples/ runs as its README says, and prints what its README shows.

Each ``bash`` block of ``examples/NN-*/README.md`` runs in order, with ``bash -euo pipefail``, in one
scratch folder shared by all examples (as a reader who follows them in order would: 02-05 reuse what
01 built). The folder links ``recipes/``, ``calib_data/`` and ``examples/`` from the repository, so the
READMEs' relative paths hold and ``artifacts/`` lands in the scratch folder. The ``text`` block right
after a ``bash`` block is its expected output: each of its lines must match a line of the block's
output (stdout and stderr together), in that order, ``*`` standing for any text and a line ``...``
for any lines. The Triton ports a README names (8000, 8001) are swapped for free ones.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, free_ports

# Example 05 gates a bundle's measured speed-ups against a baseline: they are measured with nothing
# else running, as a user's build would be (make test runs these after its parallel part).
pytestmark = pytest.mark.serial

EXAMPLES = sorted(p.parent for p in (REPO / "examples").glob("[0-9][0-9]-*/README.md"))
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BLOCK_SECONDS = 900


def steps(readme: Path) -> list[tuple[str, list[str]]]:
    """(bash script, expected lines) of each ``bash`` block of ``readme``; the expected lines are
    those of the ``text`` block that follows it directly (none if another kind of block follows)."""
    blocks = [(m.group(1), m.group(2)) for m in BLOCK.finditer(readme.read_text())]
    out = []
    for i, (kind, body) in enumerate(blocks):
        if kind == "bash":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
            out.append((body, nxt[1].splitlines() if nxt[0] == "text" else []))
    return out


def line_pattern(expected: str) -> re.Pattern[str]:
    """A whole-line pattern of an expected line: literal text, ``*`` for any text."""
    return re.compile(".*".join(re.escape(part) for part in expected.split("*")) + r"\Z")


def unmatched(expected: list[str], output: str) -> str | None:
    """The first expected line that no output line after the previous match matches, else None."""
    lines, at = output.splitlines(), 0
    for want in expected:
        if want.strip() == "...":
            continue
        pattern = line_pattern(want)
        while at < len(lines) and not pattern.match(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    for name in ("recipes", "calib_data", "examples"):
        (root / name).symlink_to(REPO / name)
    return root


def run_block(script: str, cwd: Path) -> tuple[int, str]:
    """Run one block as a reader would (the venv's ``cosycompile`` and ``python`` first on PATH); the
    whole process group is killed after it, so a server a block left running cannot outlive it."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BLOCK_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -9, out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_runs_as_its_readme_says(example: Path, scratch: Path) -> None:
    todo = steps(example / "README.md")
    assert todo, f"{example.name}/README.md has no bash block to run"
    http, grpc = free_ports(2)
    ports = {"8000": str(http), "8001": str(grpc)}
    swap = lambda text: re.sub(r"\b(8000|8001)\b", lambda m: ports[m.group(1)], text)  # noqa: E731
    for n, (script, expected) in enumerate(todo, 1):
        rc, out = run_block(swap(script), scratch)
        assert rc == 0, f"{example.name} block {n} exited {rc}:\n{script}\n--- output ---\n{out[-4000:]}"
        missing = unmatched([swap(e) for e in expected], out)
        assert missing is None, f"{example.name} block {n}: no output line matches {missing!r}:\n{out[-4000:]}"


def test_the_matcher_fails_on_a_missing_or_misordered_line() -> None:
    out = "built x in 3.2s; ran: nothing (all cached)\nbundle: artifacts/builds/x-abc\ngate: PASS\n"
    assert unmatched(["built x in *; ran: nothing (all cached)", "...", "gate: PASS"], out) is None
    assert unmatched(["gate: FAIL*"], out) == "gate: FAIL*"
    assert unmatched(["gate: PASS", "bundle: *"], out) == "bundle: *"
    # Regex characters in an expected line are literal.
    assert unmatched(["bundle: artifacts/builds/x-[a-f]*"], out) == "bundle: artifacts/builds/x-[a-f]*"


def test_every_example_folder_is_listed_in_the_examples_index() -> None:
    index = (REPO / "examples" / "README.md").read_text()
    assert EXAMPLES, "no numbered example found"
    for example in EXAMPLES:
        assert f"({example.name}/README.md)" in index, example.name
