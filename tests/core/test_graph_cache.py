"""Build graph and store: keys, reuse, verification, failure leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosycompile.cache.local import Store
from cosycompile.core.graph import Executor, Reporter, StateFile, Step, StepContext

CALLS: list[str] = []


def _writer(ctx: StepContext) -> dict:
    CALLS.append(ctx.name)
    text = str(ctx.params.get("value", ""))
    for name, path in ctx.inputs.items():
        text += "|" + (path / "out.txt").read_text()
    (ctx.out / "out.txt").write_text(text)
    return {"len": len(text)}


def _boom(ctx: StepContext) -> dict:
    (ctx.out / "partial.txt").write_text("half")
    raise ValueError("step failed on purpose")


def _chain(value_a: int = 1, value_b: int = 2) -> tuple[Step, Step, Step]:
    a = Step("a", "test.a", _writer, params={"value": value_a})
    b = Step("b", "test.b", _writer, params={"value": value_b})
    c = Step("c", "test.c", _writer, params={"value": 0}, deps={"a": a, "b": b})
    return a, b, c


def _run(root: Path, target: Step, force: bool = False):
    store = Store(root)
    ex = Executor(store, [target], StateFile(root / "state.json"), Reporter(quiet=True), force=force)
    return ex, ex.run()


def test_second_run_reuses_everything(tmp_path: Path) -> None:
    CALLS.clear()
    _, _, c = _chain()
    _, r1 = _run(tmp_path, c)
    assert r1.ran == ["a", "b", "c"]
    _, _, c2 = _chain()
    _, r2 = _run(tmp_path, c2)
    assert r2.ran == [] and r2.cached == ["a", "b", "c"]
    assert (r2.entries["c"].data / "out.txt").read_text() == "0|1|2"
    assert CALLS == ["a", "b", "c"]


def test_changed_param_reruns_only_dependents(tmp_path: Path) -> None:
    _run(tmp_path, _chain()[2])
    _, r = _run(tmp_path, _chain(value_b=5)[2])
    assert r.ran == ["b", "c"]
    assert (r.entries["c"].data / "out.txt").read_text() == "0|1|5"


def test_key_covers_params_inputs_tools_target(tmp_path: Path) -> None:
    store = Store(tmp_path)
    base = Step("s", "k", _writer, params={"x": 1}).key(store)
    assert Step("s", "k", _writer, params={"x": 2}).key(store) != base
    assert Step("s", "k", _writer, params={"x": 1}, target="l20").key(store) != base
    assert Step("s", "k", _writer, params={"x": 1}, tools=("numpy",)).key(store) != base
    assert Step("s", "k", _writer, params={"x": 1}, code=("cosycompile.cache.local",)).key(store) != base
    assert Step("other-name", "k", _writer, params={"x": 1}).key(store) == base  # names are not content


def test_external_file_content_in_key(tmp_path: Path) -> None:
    store = Store(tmp_path / "art")
    f = tmp_path / "data.txt"
    f.write_text("one")
    k1 = Step("s", "k", _writer, files={"d": (tmp_path, [f])}).key(store)
    f.write_text("two")
    k2 = Step("s", "k", _writer, files={"d": (tmp_path, [f])}).key(store)
    assert k1 != k2


def test_tampered_entry_is_rebuilt(tmp_path: Path) -> None:
    _, r1 = _run(tmp_path, _chain()[2])
    (r1.entries["a"].data / "out.txt").write_text("tampered")
    _, r2 = _run(tmp_path, _chain()[2])
    assert "a" in r2.ran
    assert (r2.entries["a"].data / "out.txt").read_text() == "1"


def test_failed_step_leaves_no_entry_and_no_staging(tmp_path: Path) -> None:
    a = Step("a", "test.a", _writer, params={"value": 1})
    bad = Step("bad", "test.bad", _boom, deps={"a": a})
    store = Store(tmp_path)
    ex = Executor(store, [bad], StateFile(tmp_path / "state.json"), Reporter(quiet=True))
    with pytest.raises(ValueError):
        ex.run()
    assert store.lookup(bad.key(store)) is None
    assert store.lookup(a.key(store)) is not None  # finished steps stay cached
    assert list(store.tmp.iterdir()) == []


def test_plan_explains_why(tmp_path: Path) -> None:
    _run(tmp_path, _chain()[2])
    store = Store(tmp_path)
    ex = Executor(store, [_chain(value_a=7)[2]], StateFile(tmp_path / "state.json"), Reporter(quiet=True))
    plan = {i.step.name: i for i in ex.plan()}
    assert not plan["a"].cached and "params changed: value" in plan["a"].reason
    assert plan["b"].cached
    assert not plan["c"].cached and "input 'a' changed" in plan["c"].reason
    assert not list(store.tmp.iterdir())  # planning does no work


def test_force_reruns(tmp_path: Path) -> None:
    _run(tmp_path, _chain()[2])
    _, r = _run(tmp_path, _chain()[2], force=True)
    assert r.ran == ["a", "b", "c"]


def test_verify_all_full_finds_bit_rot(tmp_path: Path) -> None:
    _, r = _run(tmp_path, _chain()[2])
    f = r.entries["b"].data / "out.txt"
    st = f.stat()
    f.write_text("9")  # same size, then restore mtime: only a full re-hash can notice
    import os

    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    store = Store(tmp_path)
    count, bad = store.verify_all(full=True)
    assert count == 3 and bad == [r.entries["b"].key]
