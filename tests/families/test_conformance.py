"""Every model family plug-in keeps the registry's promises: its references resolve, its tiny
built-in loads through the same loader as a model dir, a build on a damaged checkpoint of it is
refused in one line, and a renamed copy of its folder is a new family with no other edit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosycompile.families import family_infos
from helpers import EVAL_SET, REPO, run_cli, write_recipe

FAMILIES = sorted(family_infos())


def test_there_is_a_family() -> None:
    assert "cosyvoice2" in FAMILIES


@pytest.mark.parametrize("name", FAMILIES)
def test_plugin_references_resolve(name: str) -> None:
    from cosycompile.stages import pipeline_stages

    info = family_infos()[name]
    assert info.name == name and info.package == f"cosycompile.families.{name}"
    assert info.config_file and info.summary
    assert info.tiny_builtin in info.builtins
    for attr in ("loader", "init_model", "check_checkpoint", "check_model_dir", "check_frontend", "meta_network"):
        assert callable(info.hook(attr)), attr
    assert info.speech_tokenizer in info.frontend_files
    for stage in pipeline_stages():
        assert stage in info.stage_files, stage
        assert info.config_file in info.stage_files[stage]  # every stage reads the config
        runtime = info.hook("runtimes", stage)
        assert callable(runtime.from_runners) and isinstance(runtime.product, str), stage
        assert callable(info.hook("parts", stage)), stage
    # The modules a step reaches through the registry, named for its code digest, are the family's own.
    assert all(m.startswith(info.package) for m in info.code_modules("loader", "runtimes", "init_model"))


@pytest.mark.parametrize("name", FAMILIES)
def test_tiny_builtin_loads_through_the_model_dir_loader(name: str, tmp_path: Path) -> None:
    import torch

    from cosycompile.families import detect_family, load_models
    from cosycompile.stages import pipeline_stages

    info = family_infos()[name]
    spec = f"builtin:{info.tiny_builtin}"
    root = info.hook("init_model")(spec, tmp_path / "model", seed=0)
    assert (root / info.config_file).is_file()
    assert detect_family(root).name == name
    info.hook("check_model_dir")(root, list(pipeline_stages()))
    from_dir = load_models(root, pipeline_stages())
    from_spec = load_models(spec, pipeline_stages())
    assert from_dir.family == from_spec.family == name
    for stage in pipeline_stages():
        a, b = getattr(from_dir, stage).state_dict(), getattr(from_spec, stage).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), stage


@pytest.mark.parametrize("name", FAMILIES)
def test_parts_give_every_graph_of_every_stage_its_specs_shapes(name: str) -> None:
    """What a family exports is what the stage's graph specs say: a module for every graph a CPU build
    exports, whose outputs on the spec's dummy inputs (built from the parts' constants) have the
    spec's shapes, and the constants the spec's symbolic dims name."""
    import torch

    from cosycompile.families import load_models, stage_parts
    from cosycompile.stages import get_stage, pipeline_stages

    info = family_infos()[name]
    models = load_models(f"builtin:{info.tiny_builtin}", pipeline_stages())
    for stage in pipeline_stages():
        modules, assets, consts = stage_parts(models, stage)
        assert all(isinstance(a, np.ndarray) for a in assets.values()), stage
        for spec in get_stage(stage).graphs:
            if spec.torch_program_only:
                continue
            sizes = {d.name: d.example for d in spec.dims}
            dummy = spec.dummy_inputs(consts, sizes=sizes)
            with torch.no_grad():
                outs = modules[spec.name](*(torch.from_numpy(dummy[n]) for n in spec.input_names))
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            assert len(outs) == len(spec.outputs), (stage, spec.name)
            # A dynamic dim that no input has is the network's to choose (the flow encoder's frames: two per
            # token in CosyVoice2 and 3, one in CosyVoice-300M, whose regulator stretches them later).
            free = {d.name for d in spec.dims} - {e for t in spec.inputs for e in t.shape if isinstance(e, str)}
            for tensor, out in zip(spec.outputs, outs):
                want = spec.shape(tensor, consts, sizes)
                assert len(out.shape) == len(want), (spec.name, tensor.name, tuple(out.shape), want)
                for got, w, entry in zip(out.shape, want, tensor.shape):
                    assert got >= 1 if entry in free else got == int(w), (spec.name, tensor.name, tuple(out.shape), want)
                assert torch.isfinite(out).all(), (spec.name, tensor.name)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_renamed_copy_of_the_folder_is_a_new_family(name: str, tmp_path: Path) -> None:
    copy = tmp_path / "pkg" / "cosycompile"
    shutil.copytree(REPO / "cosycompile", copy, ignore=shutil.ignore_patterns("__pycache__"))
    new = f"{name}copy"
    shutil.copytree(copy / "families" / name, copy / "families" / new)
    code = textwrap.dedent(f"""
        import sys
        from cosycompile.families import family_infos, stage_runtime_class
        from cosycompile.stages import pipeline_stages
        info = family_infos()[{new!r}]
        models = info.hook("loader")("builtin:" + info.tiny_builtin, tuple(pipeline_stages()))
        assert models.family == {new!r}, models.family
        for stage in pipeline_stages():
            cls = stage_runtime_class(stage, {{"family": {new!r}}})
            assert cls.__module__.startswith("cosycompile.families.{new}."), cls.__module__
        loaded = sorted(m for m in sys.modules if m.startswith("cosycompile.families.{name}."))
        print(sorted(family_infos()), loaded)
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(copy.parent)))
    assert res.returncode == 0, res.stderr[-3000:]
    families, loaded = res.stdout.strip().split("] [")
    assert f"'{name}'" in families and f"'{new}'" in families
    # The copy ran on its own modules only: none of the original family's code was imported.
    assert loaded == "]", loaded


@pytest.mark.parametrize(("recipe", "family"), [("cpu-int8.yaml", "cosyvoice2"), ("cv3-cpu-int8.yaml", "cosyvoice3")])
def test_editing_another_familys_files_changes_no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: str,
                                                      family: str) -> None:
    """A recipe's steps are keyed by its own family's folder only: any file of another family folder
    (the other generation, a copy standing in for the next family, any work in progress) can change
    without rebuilding them; an edit of its own family's files re-keys them."""
    from cosycompile.cache.local import Store
    from cosycompile.core import keys
    from cosycompile.core.graph import topo_order
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    copy = tmp_path / "pkg" / "cosycompile"
    shutil.copytree(REPO / "cosycompile", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(copy / "families" / family, copy / "families" / "nextfamily")
    monkeypatch.setattr(keys, "default_package_root", lambda: copy)
    store = Store(tmp_path / "art")

    def all_keys() -> dict[str, str]:
        plan = plan_build(load_recipe(REPO / "recipes" / recipe))
        assert plan.family.name == family
        return {s.name: s.key(store) for s in topo_order([plan.final, *plan.steps])}

    before = all_keys()
    others = [p for p in sorted((copy / "families").rglob("*.py")) if p.parent.name not in ("families", family)]
    assert len(others) >= 10 and any(p.parent.name not in (family, "nextfamily") for p in others)
    for path in others:
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit in another family\n")
        try:
            assert all_keys() == before, path
        finally:
            path.write_bytes(original)
    # The family's own files do key its steps (the check above is not vacuous): its loader keys the
    # reference, its parts every export.
    for name, step in (("loader.py", "reference"), ("parts.py", "llm.export"), ("parts.py", "flow.export")):
        own = copy / "families" / family / name
        original = own.read_bytes()
        own.write_bytes(original + b"\n# an edit\n")
        try:
            assert all_keys()[step] != before[step], (name, step)
        finally:
            own.write_bytes(original)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """family name -> its tiny built-in written as a model dir, once per module (read-only: copy it)."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            info = family_infos()[name]
            made[name] = info.hook("init_model")(f"builtin:{info.tiny_builtin}", tmp_path_factory.mktemp(name) / "tiny",
                                                 seed=0)
        return made[name]

    return get


@pytest.mark.parametrize("stage", ["llm", "flow", "hift"])
@pytest.mark.parametrize("fault", ["missing", "extra", "shape"])
@pytest.mark.parametrize("name", FAMILIES)
def test_a_bad_key_is_one_line_naming_file_and_key(name: str, fault: str, stage: str, tiny_dir: Any,
                                                   tmp_path: Path) -> None:
    """A stage checkpoint with a key missing, an extra key or a tensor of the wrong shape is refused by
    the family's loader and by its checkpoint check, in one line naming the file, the fault and a key."""
    import torch

    from cosycompile.errors import ModelError
    from cosycompile.families import load_models

    d = shutil.copytree(tiny_dir(name), tmp_path / "model")
    path = d / f"{stage}.pt"
    weights = torch.load(path, map_location="cpu", weights_only=True)
    keys = sorted(k for k, v in weights.items() if v.ndim >= 1)
    key = keys[len(keys) // 2]
    if fault == "missing":
        del weights[key]
        want = f"1 missing (e.g. {key})"
    elif fault == "extra":
        key = key.rsplit(".", 1)[0] + ".not_upstream.weight"
        weights[key] = torch.zeros(2)
        want = f"1 unexpected (e.g. {key})"
    else:
        weights[key] = torch.zeros(*(n + 1 for n in weights[key].shape))
        want = f"shape mismatch for 1 tensors, e.g. {key}"
    torch.save(weights, path)
    check_checkpoint = family_infos()[name].hook("check_checkpoint")
    for check in (lambda: load_models(d, (stage,), name), lambda: check_checkpoint(d, stage)):
        with pytest.raises(ModelError) as err:
            check()
        msg = str(err.value)
        assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
        assert want in msg, msg


@pytest.mark.parametrize("name", FAMILIES)
def test_cli_build_on_a_bad_checkpoint_exits_2_naming_file_and_key(name: str, tiny_dir: Any, tmp_path: Path) -> None:
    """The family's tiny model dir with one LM tensor of the wrong shape: ``cosycompile build`` exits 2
    with one line naming the checkpoint file and the key, before any step runs."""
    import torch

    d = shutil.copytree(tiny_dir(name), tmp_path / "model")
    weights = torch.load(d / "llm.pt", map_location="cpu", weights_only=True)
    key = sorted(k for k, v in weights.items() if v.ndim == 2)[0]
    weights[key] = torch.zeros(3)
    torch.save(weights, d / "llm.pt")
    recipe = write_recipe(tmp_path / "bad.yaml", f"extends: {REPO / 'recipes' / 'base.yaml'}\nname: bad\n"
                                                 f"model: {d}\nvalidation:\n  eval_set: {EVAL_SET}\n  max_items: 1\n")
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"))
    err = res.stderr.strip()
    assert res.returncode == 2, f"exit {res.returncode}\n{res.stderr[-2000:]}"
    assert "Traceback" not in res.stderr and len(err.splitlines()) == 1, err
    assert f"{d / 'llm.pt'}: shape mismatch for 1 tensors, e.g. {key}" in err, err
    assert not (tmp_path / "art" / "builds").exists()
