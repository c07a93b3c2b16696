"""The bounded harness every hostile case runs through (issue 37's acceptance, one place).

A case is a command line that must be refused. :func:`refused` runs the real CLI in a subprocess
and checks everything the acceptance asks of a refusal:

- exit 2 and exactly one ``cosycompile: error:`` line holding the expected texts, no traceback;
- under :data:`MAX_SECONDS` of wall time and :data:`MAX_RSS_MB` of peak resident memory;
- nothing changed under the case's own folder (its recipe, model copy, output targets), nothing
  written into the shared artifacts dir that a later build could trust (no entry, no bundle, no
  staging dir left);
- and a follow-up normal build of an already cached recipe, in that same artifacts dir, still
  succeeds with every step cached. That build runs whenever the case changed anything under the
  cached build's folder (its recipe, its artifacts dir: any path's type, size, change time or
  inode). A case that changed nothing there leaves the follow-up build nothing different to read,
  so it would only repeat the build that made the folder; most cases are of that kind, and the
  follow-up build costs about as much as the case itself.
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import run_cli, write_recipe
from seed_store import FOLLOWUP, seeded

MAX_SECONDS = 20.0  # generous for a loaded 2-core machine; the alias bomb used to run > 20 s at 820 MB
MAX_RSS_MB = 1500  # the CLI with torch imported stays well under this; a 2,000-char text once took 7.6 GB
# Commands that take --artifacts: a case of theirs that names none runs in the shared, cached one.
_ARTIFACT_COMMANDS = {"build", "plan", "validate", "cache"}


@dataclass(frozen=True)
class CachedBuild:
    """A recipe built once into ``art``: every later build of it is all cache hits."""

    recipe: Path
    art: Path


def cached_build(root: Path, seed: Path) -> CachedBuild:
    """The cheapest full build (``seed_store.FOLLOWUP``) in ``root``, from a copy of the session's seed."""
    recipe = write_recipe(root / "followup.yaml", FOLLOWUP, base=False)
    built = CachedBuild(recipe, seeded(seed, root / "art"))
    res = run_cli("build", str(recipe), "--artifacts", str(built.art), "-q", timeout=1800)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return built


@dataclass
class Bounded:
    rc: int
    out: str
    err: str
    seconds: float
    rss_mb: float


# Runs the CLI as its child and reports "<exit code> <peak RSS in KiB>" on the file descriptor it is
# given. Linux carries a process's memory high-water mark across fork and exec, so a CLI started by the
# pytest worker itself would report the worker's RSS (GBs once a test has loaded models) as its own; a
# CLI forked from this small interpreter starts from the interpreter's few MB.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.close(int(sys.argv[1]))  # only this launcher writes the report, and it must not wait on the CLI's children
        os.execv(sys.executable, [sys.executable, "-m", "cosycompile", *sys.argv[2:]])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
os.write(int(sys.argv[1]), f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}".encode())
"""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended on its own


def run_bounded(args: list[str], cwd: Path, env: dict[str, str] | None = None,
                kill_after: float = 3 * MAX_SECONDS) -> Bounded:
    """The real CLI in a subprocess: exit status, output, wall seconds and its own peak RSS (from
    ``wait4`` in a small launcher, so no other process counts). A run past ``kill_after`` is killed
    with its launcher (exit -9)."""
    t0 = time.perf_counter()
    report_r, report_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-S", "-c", _LAUNCHER, str(report_w), *args], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                pass_fds=(report_w,), start_new_session=True)
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)
    timer = threading.Timer(kill_after, _kill_group, (proc.pid,))
    timer.start()
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""))
    reader.start()
    try:
        err = proc.stderr.read() if proc.stderr else ""
        reader.join()
        proc.wait()
        with os.fdopen(report_r, "rb") as report:
            words = report.read().split()
    finally:
        timer.cancel()
        if proc.poll() is None:
            _kill_group(proc.pid)
            proc.wait()
    rc, rss_kib = (int(words[0]), int(words[1])) if len(words) == 2 else (-signal.SIGKILL, 0)
    return Bounded(rc, out[0] if out else "", err, time.perf_counter() - t0, rss_kib / 1024)


def tree_state(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Every path under ``root`` (links not followed, ``skip`` left out) with what a write would
    change: its type, and for files and links their size, change time and inode."""
    state: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if skip is not None and here == skip:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = here / name
            if skip is not None and p == skip:
                continue
            st = os.lstat(p)
            kind = stat.S_IFMT(st.st_mode)
            state[str(p.relative_to(root))] = (kind,) if stat.S_ISDIR(st.st_mode) else \
                (kind, st.st_size, st.st_ctime_ns, st.st_ino)
    return state


def store_state(art: Path) -> dict[str, str]:
    """What a later build could trust in artifacts dir ``art``: each cache entry (its entry.json's
    digest), each bundle folder, and anything left in the cache's staging dir."""
    state: dict[str, str] = {}
    try:
        if not art.is_dir():
            return state
    except OSError:  # a name too long, a loop of links: nothing can be stored there
        return state
    for entry in art.glob("cache/objects/*/*/entry.json"):
        state[str(entry.relative_to(art))] = hashlib.sha256(entry.read_bytes()).hexdigest()
    for p in [*art.glob("builds/*"), *art.glob("cache/tmp/*")]:
        if not p.name.startswith("."):
            state[str(p.relative_to(art))] = "present"
    return state


def refused(args: list[str | Path], *expected: str, cwd: Path, followup: CachedBuild,
            env: dict[str, str] | None = None, max_seconds: float = MAX_SECONDS) -> str:
    """Run a hostile command line and check it is refused as issue 37 asks (see the module's
    docstring); returns the error line. ``cwd`` is the case's own folder (it must not change);
    a command that takes ``--artifacts`` and names none runs in ``followup``'s artifacts dir.
    ``max_seconds`` is for the cases whose acceptance names their own bound (a silent remote)."""
    argv = [str(a) for a in args]
    if argv[0] in _ARTIFACT_COMMANDS and "--artifacts" not in argv:
        argv += ["--artifacts", str(followup.art)]
    art = Path(argv[argv.index("--artifacts") + 1]) if "--artifacts" in argv else None
    watched = art if art is not None else followup.art  # the store a refusal must leave as it was
    tree_before, store_before = tree_state(cwd, skip=watched), store_state(watched)
    shared_before = tree_state(followup.recipe.parent)
    run = run_bounded(argv, cwd, env, kill_after=3 * max_seconds)
    err = run.err.strip()
    assert run.rc == 2, f"exit {run.rc}\nstdout: {run.out[-1500:]}\nstderr: {err[-2000:]}"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1 and err.startswith("cosycompile: error: "), err
    for text in expected:
        assert text in err, (text, err)
    assert run.seconds < max_seconds and run.rss_mb < MAX_RSS_MB, f"{run.seconds:.1f} s, {run.rss_mb:.0f} MB"
    tree_after = tree_state(cwd, skip=watched)
    changed = sorted(k for k in tree_before.keys() | tree_after.keys() if tree_before.get(k) != tree_after.get(k))
    assert not changed, f"the refused command changed {changed[:5]}"
    store_after = store_state(watched)
    added = sorted(k for k in store_after.keys() | store_before.keys() if store_after.get(k) != store_before.get(k))
    assert not added, f"the refused command left {added[:5]} in the artifacts dir"
    if tree_state(followup.recipe.parent) == shared_before:
        return err
    follow = run_bounded(["build", str(followup.recipe), "--artifacts", str(followup.art), "-q"], cwd)
    assert follow.rc == 0 and "ran: nothing (all cached)" in follow.out, \
        f"the follow-up build failed after this case: exit {follow.rc}\n{follow.out[-1500:]}\n{follow.err[-1500:]}"
    return err
