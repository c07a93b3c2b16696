"""A build killed with SIGKILL in the middle of a step, then re-run, completes and trusts nothing
from the killed run that it has not verified."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import EVAL_SET, REPO, write_recipe


def _build_until_staging(tmp_path: Path, name: str, victim: str) -> tuple[subprocess.Popen, Path, Path]:
    """(process, artifacts, recipe) of a cpu-fp32 build started in the background and let run until
    step ``victim`` is running and has its staging dir, i.e. while it is writing."""
    art = tmp_path / "art"
    recipe = write_recipe(tmp_path / "r.yaml", {
        "extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": name,
        "validation": {"eval_set": str(EVAL_SET), "max_items": 1, "speed": {"runs": 1, "throughput": []}},
    })
    proc = subprocess.Popen([sys.executable, "-u", "-m", "cosycompile", "build", str(recipe), "--artifacts", str(art)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.time() + 300
    assert proc.stderr is not None
    for line in proc.stderr:
        if victim in line and "running" in line:
            break
        assert time.time() < deadline
    while not [p for p in (art / "cache" / "tmp").glob("*") if not p.name.startswith(".")]:
        time.sleep(0.01)
        assert time.time() < deadline
    return proc, art, recipe


def test_sigkill_mid_step_then_resume(tmp_path: Path) -> None:
    victim = "flow.export"
    proc, art, recipe = _build_until_staging(tmp_path, "killme", victim)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    staged = [p for p in (art / "cache" / "tmp").glob("*") if not p.name.startswith(".")]
    assert staged, "the kill should land mid-step, leaving a staging dir"
    done_before = {json.loads(e.read_text())["step"] for e in (art / "cache" / "objects").glob("*/*/entry.json")}
    assert victim not in done_before

    # A finished entry from the killed run that was damaged afterwards must not be reused.
    damaged = next(e.parent for e in (art / "cache" / "objects").glob("*/*/entry.json")
                   if json.loads(e.read_text())["step"] == "llm.export")
    onnx = damaged / "data" / "llm_step.onnx"
    onnx.write_bytes(onnx.read_bytes()[:100])

    res = subprocess.run([sys.executable, "-m", "cosycompile", "build", str(recipe), "--artifacts", str(art), "-q"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    ran = res.stdout.split("; ran: ", 1)[1].splitlines()[0].split(", ")
    assert victim in ran and "llm.export" in ran
    assert not [p for p in (art / "cache" / "tmp").glob("*") if not p.name.startswith(".")]
    count, bad = _verify(art)
    assert count > 0 and bad == []


def _verify(art: Path) -> tuple[int, list[str]]:
    from cosycompile.cache.local import Store

    return Store(art).verify_all(full=True)


def test_sigterm_mid_step_unwinds_like_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM (what a CI runner or a container stop sends) mid-step: exit 143, one line, the running
    step's staging dir removed and nothing of it committed; the steps finished before stay cached."""
    victim = "flow.export"
    proc, art, _ = _build_until_staging(tmp_path, "termme", victim)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.stderr is not None
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 143, rest[-2000:]
    assert "Traceback" not in rest
    assert rest.strip().splitlines()[-1].startswith("cosycompile: terminated; finished steps stay cached"), rest[-2000:]
    assert not [p for p in (art / "cache" / "tmp").glob("*") if not p.name.startswith(".")]
    done = {json.loads(e.read_text())["step"] for e in (art / "cache" / "objects").glob("*/*/entry.json")}
    assert victim not in done and "llm.export" in done
