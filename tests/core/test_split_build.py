"""Split builds: a machine without an engine's builder runs every other step, exits 3 with the
steps left, and a machine that has the builder finishes from the same cache running only those."""

from __future__ import annotations

from pathlib import Path

from cosycompile.cache.local import Store
from cosycompile.core.graph import Executor, Reporter, StateFile, Step, StepContext
from tests.helpers import REPO, run_cli, write_recipe

CALLS: list[str] = []


def _writer(ctx: StepContext) -> dict:
    CALLS.append(ctx.name)
    text = str(ctx.params.get("value", "")) + "".join("|" + (p / "out.txt").read_text() for p in ctx.inputs.values())
    (ctx.out / "out.txt").write_text(text)
    return {}


def _graph(builder_here: bool) -> Step:
    """export -> engine (needs a builder) -> check; export -> other (needs nothing)."""
    export = Step("export", "t.export", _writer, params={"value": 1})
    engine = Step("engine", "t.engine", _writer, deps={"graphs": export},
                  blocked=lambda: None if builder_here else "the builder is not installed")
    other = Step("other", "t.other", _writer, deps={"graphs": export})
    check = Step("check", "t.check", _writer, deps={"engine": engine, "other": other})
    return check


def _executor(root: Path, builder_here: bool) -> Executor:
    return Executor(Store(root), [_graph(builder_here)], StateFile(root / "state.json"), Reporter(quiet=True))


def test_blocked_step_and_its_dependents_are_left_the_rest_runs(tmp_path: Path) -> None:
    CALLS.clear()
    res = _executor(tmp_path, builder_here=False).run()
    assert sorted(CALLS) == ["export", "other"]
    assert res.left == {"engine": "cannot run on this machine: the builder is not installed",
                        "check": "waits for engine"}
    items = {i.step.name: i for i in _executor(tmp_path, builder_here=False).plan()}
    assert [n for n, i in items.items() if not i.cached] == ["engine", "check"]
    assert items["engine"].left and items["check"].left and not items["other"].left

    CALLS.clear()  # the machine with the builder, same cache: only what was left runs
    res = _executor(tmp_path, builder_here=True).run()
    assert CALLS == ["engine", "check"] and not res.left
    assert (res.entries["check"].data / "out.txt").read_text() == "||1||1"  # check(engine(export), other(export))


def test_blocked_step_already_cached_is_not_left(tmp_path: Path) -> None:
    _executor(tmp_path, builder_here=True).run()
    CALLS.clear()
    res = _executor(tmp_path, builder_here=False).run()
    assert CALLS == [] and res.left == {}


def test_cli_split_build_exits_3_and_lists_what_is_left(tmp_path: Path) -> None:
    """A real GPU recipe (H100: TensorRT, which TensorRT-RTX cannot stand in for) on this CPU machine,
    reduced to HiFT so it is quick: export and simplify run, the engine and the check are left."""
    art = tmp_path / "art"
    recipe = write_recipe(tmp_path / "h100.yaml", {
        "extends": str(REPO / "recipes" / "h100-fp8.yaml"), "name": "h100-split",
        "stages": {"llm": {"enabled": False}, "flow": {"enabled": False}},
    })
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 3, res.stderr
    assert "ran: model, hift.export, hift.simplify" in res.stdout
    assert "hift.engine: cannot run on this machine: backend 'tensorrt'" in res.stdout
    assert "pipeline.check: waits for hift.engine" in res.stdout
    assert f"finish with: cosycompile build {recipe}" in res.stdout
    assert not (art / "builds").exists() or not any((art / "builds").iterdir())  # no bundle from half a build

    plan = run_cli("plan", str(recipe), "--artifacts", str(art), "--todo")
    assert plan.returncode == 0, plan.stderr
    listed = [ln.split()[:2] for ln in plan.stdout.splitlines() if ln.startswith("  ")]
    assert listed == [["LEFT", "hift.engine"], ["LEFT", "pipeline.check"]]
    again = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert again.returncode == 3 and "ran: nothing (all cached)" in again.stdout
