"""Handing a split build on: the exit-3 "finish with" command works on another machine (another
checkout, no copy of this artifacts dir, the remote cache as the only link), and ``plan --todo
--json`` gives an orchestrator the same steps as the text form, with what each needs."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cosycompile.split import finish_command, portable_path
from tests.helpers import REPO, write_recipe


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An H100 recipe reduced to HiFT, built here (no TensorRT: the engine is left) with a file remote,
    the recipe named relative to the working dir and the artifacts dir absolute, outside it."""
    tmp = tmp_path_factory.mktemp("handoff")
    here = tmp / "checkout-a"
    write_recipe(here / "h100.yaml", {
        "extends": str(REPO / "recipes" / "h100-fp8.yaml"), "name": "h100-handoff",
        "stages": {"llm": {"enabled": False}, "flow": {"enabled": False}},
    })
    remote = f"file://{tmp / 'remote'}"
    art = tmp / "only-on-machine-a" / "art"
    res = _cli(["build", "h100.yaml", "--artifacts", str(art), "--cache-remote", remote, "-q"], here)
    assert res.returncode == 3, res.stderr
    return {"tmp": tmp, "here": here, "art": art, "remote": remote, "stdout": res.stdout}


def _finish_line(stdout: str) -> list[str]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("finish with: "))
    return shlex.split(line[len("finish with: "):])


def test_finish_command_keeps_the_remote_and_names_no_path_of_this_machine(split: dict) -> None:
    argv = _finish_line(split["stdout"])
    assert argv == ["cosycompile", "build", "h100.yaml", "--cache-remote", split["remote"]]
    assert str(split["art"]) not in split["stdout"].split("finish with: ", 1)[1]


def test_finish_command_runs_on_another_checkout_and_builds_nothing_twice(split: dict) -> None:
    """Machine B: another checkout of the recipe, its own (empty) artifacts dir. The printed command
    pulls what A built and would run only the engine (left again here, as this machine has no
    TensorRT either)."""
    there = split["tmp"] / "checkout-b"
    there.mkdir()
    shutil.copy(split["here"] / "h100.yaml", there / "h100.yaml")
    argv = _finish_line(split["stdout"])
    res = _cli(argv[1:] + ["-q"], there)
    assert res.returncode == 3, res.stderr
    assert "pulled from the remote cache: model, hift.export, hift.simplify" in res.stdout
    assert "ran: nothing (all cached)" in res.stdout
    assert (there / "artifacts" / "cache").is_dir()


def test_plan_todo_json_matches_the_text_form(split: dict) -> None:
    args = ["plan", "h100.yaml", "--artifacts", str(split["art"]), "--todo"]
    text = _cli(args, split["here"])
    js = _cli(args + ["--json"], split["here"])
    assert text.returncode == 0 and js.returncode == 0, text.stderr + js.stderr
    doc = json.loads(js.stdout)  # one object, nothing else on stdout
    rows = [ln.split(None, 3) for ln in text.stdout.splitlines() if ln.startswith("  ")]
    assert [(r[0].lower(), r[1], r[2]) for r in rows] == [(s["state"], s["name"], s["key"][:12]) for s in doc["steps"]]
    assert [ln.split("because: ", 1)[1] for ln in text.stdout.splitlines() if ln.startswith("  ")] == \
        [s["why"] for s in doc["steps"]]
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == ["hift.engine", "pipeline.check"] and doc["left"] == 2
    engine = steps["hift.engine"]
    assert engine["kind"] == "engine.tensorrt" and len(engine["key"]) == 64
    assert engine["needs"]["target"] == {"name": "h100", "kind": "gpu", "sm": "sm90", "gpu": "NVIDIA H100"}
    assert engine["needs"]["backend"] == "tensorrt"
    assert "backend 'tensorrt'" in engine["needs"]["blocked"] and engine["needs"]["waits_for"] == []
    check = steps["pipeline.check"]
    assert check["needs"]["blocked"] is None and check["needs"]["waits_for"] == ["hift.engine"]


def test_plan_json_without_todo_is_one_line_error(split: dict) -> None:
    res = _cli(["plan", "h100.yaml", "--artifacts", str(split["art"]), "--json"], split["here"])
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--todo" in res.stderr


def test_finish_command_without_a_remote_names_the_cache_it_needs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    # Inside the working dir: relative, so it names the same files in another checkout.
    build, plan, needs = finish_command(repo / "recipes" / "r.yaml", repo / "out", None, until="quantize", cwd=repo)
    assert build == "cosycompile build recipes/r.yaml --artifacts out --until quantize"
    assert plan == "cosycompile plan recipes/r.yaml --artifacts out --todo"
    assert "copy of its cache/" in needs
    # Outside it and no remote: this cache is the only way, so its path stays (a shared mount or a copy).
    build, _, _ = finish_command(Path("r.yaml"), Path("/mnt/shared/art"), None, cwd=repo)
    assert build == "cosycompile build r.yaml --artifacts /mnt/shared/art"
    # The default artifacts dir is not repeated; with a remote an outside dir is dropped.
    assert finish_command(Path("r.yaml"), Path("artifacts"), None, cwd=repo)[0] == "cosycompile build r.yaml"
    assert finish_command(Path("r.yaml"), Path("/tmp/a b"), "s3://b/p", cwd=repo)[0] == \
        "cosycompile build r.yaml --cache-remote s3://b/p"
    assert portable_path(Path("/elsewhere/r.yaml"), repo) == "/elsewhere/r.yaml"


def test_ci_doc_lists_every_exit_status() -> None:
    """docs/ci.md's table names each status the CLI returns, the split build's 3 included."""
    from cosycompile.split import EXIT_SPLIT

    rows = [ln for ln in (REPO / "docs" / "ci.md").read_text().splitlines() if ln.startswith("| ")]
    listed = {ln.split("|")[1].strip() for ln in rows}
    assert {"0", "1", "2", str(EXIT_SPLIT)} <= listed
