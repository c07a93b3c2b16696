"""The plug-in layout's promises: keys follow the code a step imports, a backend is one folder,
and a plug-in's spec rejects every key it does not read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, write_recipe
from seed_store import FOLLOWUP, seeded

PACKAGE = REPO / "cosycompile"


def _copy_package(dst: Path) -> Path:
    shutil.copytree(PACKAGE, dst / "cosycompile", ignore=shutil.ignore_patterns("__pycache__"))
    return dst / "cosycompile"


def _keys(recipe: Path, art: Path) -> dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]]:
    from cosycompile.cache.local import Store
    from cosycompile.core.graph import topo_order
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    plan = plan_build(load_recipe(recipe))
    store = Store(art)
    # Every step of the graph, and the engine steps of --until too.
    return {s.name: (s.key(store), s.code_roots(), tuple(d.name for d in s.deps.values()))
            for s in topo_order([plan.final, *plan.steps])}


def test_each_module_edit_changes_exactly_the_keys_of_steps_that_import_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from cosycompile.core import keys

    copy = _copy_package(tmp_path / "pkg")
    monkeypatch.setattr(keys, "default_package_root", lambda: copy)
    recipe = REPO / "recipes" / "cpu-int8.yaml"
    art = tmp_path / "art"
    before = _keys(recipe, art)
    assert {"reference", "calibrate", "llm.quantize", "flow.quantize", "hift.engine", "pipeline.check"} <= set(before)
    closures = {name: set(keys.module_closure(roots, package_root=copy)) for name, (_, roots, _) in before.items()}
    modules = sorted(p for p in copy.rglob("*.py"))
    assert len(modules) > 50
    touched_some = 0
    for path in modules:
        rel = path.relative_to(copy.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit that changes no behaviour\n")
        try:
            after = _keys(recipe, art)
        finally:
            path.write_bytes(original)
        changed = {n for n in before if after[n][0] != before[n][0]}
        expected = {n for n, mods in closures.items() if module in mods}
        # A step whose input's key changed is re-keyed too: that is what a content key means.
        for name, (_, _, deps) in before.items():  # dependencies come first
            if expected & set(deps):
                expected.add(name)
        assert changed == expected, f"{module}: changed {sorted(changed)} expected {sorted(expected)}"
        touched_some += bool(changed)
    assert touched_some > 30
    # The CLI and the cache commands implement no step: editing them rebuilds nothing.
    assert not any("cosycompile.cli" in mods for mods in closures.values())


def test_missing_module_in_a_step_closure_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosycompile.core import keys

    copy = _copy_package(tmp_path / "pkg")
    monkeypatch.setattr(keys, "default_package_root", lambda: copy)
    target = copy / "stages" / "flow" / "check.py"
    target.write_text(target.read_text() + "\nfrom cosycompile.stages.flow import renamed_module  # noqa\n"
                      "import cosycompile.validate.no_such_module  # noqa\n")
    with pytest.raises(keys.CodeDigestError, match="no_such_module"):
        _keys(REPO / "recipes" / "cpu-fp32.yaml", tmp_path / "art")


@pytest.mark.slow
def test_a_backend_is_one_folder(tmp_path: Path, seed: Path) -> None:
    """A renamed copy of backends/onnxruntime builds cpu-fp32 with no other file touched. The copy's other
    files are the package's, so the session's seed already holds every step before the engines."""
    copy = _copy_package(tmp_path / "pkg")
    shutil.copytree(copy / "backends" / "onnxruntime", copy / "backends" / "ortcopy")
    untouched = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*.py") if "ortcopy" not in p.parts}
    stages = {s: {"engine": {"backend": "ortcopy"}} for s in ("llm", "flow", "hift")}
    recipe = write_recipe(tmp_path / "r.yaml", {**FOLLOWUP, "name": "ortcopy-fp32", "stages": stages}, base=False)
    env = dict(os.environ, PYTHONPATH=str(copy.parent))
    probe = subprocess.run([sys.executable, "-c", "import cosycompile; print(cosycompile.__file__)"], env=env,
                           cwd=tmp_path, capture_output=True, text=True)
    assert probe.stdout.strip().startswith(str(copy)), probe.stdout + probe.stderr
    res = subprocess.run([sys.executable, "-m", "cosycompile", "build", str(recipe), "--artifacts",
                          str(seeded(seed, tmp_path / "art")), "-q"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    ran = res.stdout.split("ran: ", 1)[1].split("\n", 1)[0].split(", ")
    assert {"llm.engine", "flow.engine", "hift.engine"} <= set(ran) and "model" not in ran, ran
    (bundle,) = (tmp_path / "art" / "builds").glob("ortcopy-fp32-*")
    import json

    for stage in ("llm", "flow", "hift"):
        assert json.loads((bundle / "engines" / stage / "engine.json").read_text())["backend"] == "ortcopy"
    assert json.loads((bundle / "report.json").read_text())["gate"]["passed"]
    assert {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*.py") if "ortcopy" not in p.parts} == untouched


# Keys that once loaded, entered the step key and were read by nothing, and the ones a sweep over
# every spec field found the same way: each is now a recipe error naming file:line and the key.
UNREAD = [
    ({"stages": {"flow": {"quantize": {"format": "int8", "alpha": 0.5}}}}, "stages.flow.quantize.alpha"),
    ({"stages": {"flow": {"quantize": {"format": "int8", "calib_items": 4}}}}, "stages.flow.quantize.calib_items"),
    ({"stages": {"llm": {"quantize": {"format": "int8_sq", "high_precision_dtype": "fp16"}}}},
     "stages.llm.quantize.high_precision_dtype"),
    ({"stages": {"llm": {"quantize": {"format": "int4_awq", "alpha": 0.3}}}}, "stages.llm.quantize.alpha"),
    ({"stages": {"llm": {"quantize": {"format": "int8_sq", "block_size": 64}}}}, "stages.llm.quantize.block_size"),
    ({"stages": {"flow": {"quantize": {"format": "int8", "block_size": 64}}}}, "stages.flow.quantize.block_size"),
    ({"stages": {"llm": {"quantize": {"format": "int8_wo", "calib_items": 4}}}}, "stages.llm.quantize.calib_items"),
    ({"stages": {"hift": {"quantize": {"method": "max"}}}}, "stages.hift.quantize.method"),
    ({"stages": {"flow": {"quantize": {"format": "int8", "exports": ["hf"]}}}}, "stages.flow.quantize.exports"),
    ({"stages": {"flow": {"check": {"max_abs_error": 0.1}}}}, "stages.flow.check.max_abs_error"),
    ({"stages": {"llm": {"check": {"identical_greedy_tokens": False}}}}, "stages.llm.check.identical_greedy_tokens"),
    ({"stages": {"hift": {"check": {"min_snr_db": 30}}}}, "stages.hift.check.min_snr_db"),
    ({"extends": str(REPO / "recipes" / "gpu-base.yaml"), "target": "l20",
      "stages": {"llm": {"quantize": {"format": "int8_sq"}}, "flow": {"engine": {"options": {"max_frames": 3000}}}}},
     "stages.flow.engine.options.max_frames"),
]


@pytest.mark.parametrize("body,key", UNREAD, ids=[k for _, k in UNREAD])
def test_keys_no_plugin_reads_are_recipe_errors(tmp_path: Path, body: dict, key: str) -> None:
    from cosycompile.errors import RecipeError
    from cosycompile.recipe.schema import load_recipe

    path = write_recipe(tmp_path / "r.yaml", {"name": "t", "model": "builtin:tiny", **body})
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:") and "\n" not in msg
    assert key.rsplit(".", 1)[1] in msg, msg


def test_autoawq_shows_its_own_message(tmp_path: Path) -> None:
    from cosycompile.errors import RecipeError
    from cosycompile.recipe.schema import load_recipe

    path = write_recipe(tmp_path / "r.yaml", {"name": "t", "model": "builtin:tiny",
                                              "stages": {"llm": {"quantize": {"format": "int4_awq",
                                                                              "method": "autoawq"}}}})
    with pytest.raises(RecipeError, match="AutoAWQ"):
        load_recipe(path)


def test_one_metric_registry_for_checks_report_and_gate() -> None:
    from cosycompile.validate.registry import registry

    reg = registry()
    for name in ("llm.logit_cosine", "flow.mel_snr_db", "hift.waveform_snr_db", "pipeline.pesq", "speed.end_to_end"):
        assert name in reg
    assert reg["llm.kl"].metric.higher is False and reg["flow.mel_snr_db"].metric.unit == "dB"
    # Each stage's metrics come from its plug-in folder, not from a table in validate/.
    assert reg["flow.mel_snr_db"].path == ("checks", "flow", "metrics", "cfm_mel_snr_db_min")
