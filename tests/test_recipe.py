"""Recipe loading: extends, defaults, and errors that name file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosycompile.errors import RecipeError
from cosycompile.recipe.schema import load_recipe

from helpers import REPO, write_recipe


def test_repo_recipes_load() -> None:
    r = load_recipe(REPO / "recipes" / "cpu-fp32.yaml")
    assert r.name == "cpu-fp32"
    assert r.model == "builtin:tiny"
    assert r.enabled_stages() == ["llm", "flow", "hift"]
    assert r.stage("flow").export.opset == 18
    assert r.resolve_path(r.validation.eval_set).resolve() == (REPO / "calib_data" / "eval").resolve()


def test_extends_merges_deeply(tmp_path: Path) -> None:
    p = write_recipe(tmp_path / "r.yaml", {"name": "x", "stages": {"flow": {"export": {"simplify": "none"}}}})
    r = load_recipe(p)
    assert r.stage("flow").export.simplify == "none"
    assert r.stage("flow").export.opset == 18  # kept from base
    assert r.stage("llm").export.simplify == "onnxslim"


def _err(tmp_path: Path, text: str) -> str:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


BASE = f"extends: {REPO / 'recipes' / 'base.yaml'}\nname: bad\n"


def test_unknown_key_names_line_and_key(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "stages:\n  llm:\n    engine:\n      backnd: onnxruntime\n")
    assert "bad.yaml:6" in msg and "stages.llm.engine.backnd" in msg


def test_wrong_type(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "stages:\n  flow:\n    export:\n      opset: eighteen\n")
    assert "bad.yaml:6" in msg and "stages.flow.export.opset" in msg and "eighteen" in msg


def test_unknown_stage(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "stages:\n  vocoder: {}\n")
    assert "bad.yaml:4" in msg and "stages.vocoder" in msg and "llm, flow, hift" in msg


def test_malformed_yaml(tmp_path: Path) -> None:
    msg = _err(tmp_path, "name: x\nstages: [unclosed\n")
    assert "malformed YAML" in msg and "bad.yaml:" in msg


def test_duplicate_key(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "name: again\n")
    assert "duplicate key 'name'" in msg and "bad.yaml:3" in msg


def test_backend_stage_does_not_support(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "stages:\n  flow:\n    engine: {backend: trtllm}\n")
    assert "stage 'flow' cannot use backend 'trtllm'" in msg and "bad.yaml:5" in msg


def test_backend_cannot_build_for_target(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "target: h100\n")
    assert "onnxruntime" in msg and "h100" in msg


def test_unknown_target(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "target: tpu\n")
    assert "unknown target 'tpu'" in msg and "bad.yaml:3" in msg


def test_unknown_engine_option(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "stages:\n  hift:\n    engine: {options: {turbo: true}}\n")
    assert "turbo" in msg and "optimization" in msg


def test_missing_extends_file(tmp_path: Path) -> None:
    msg = _err(tmp_path, "extends: nowhere.yaml\nname: x\n")
    assert "nowhere.yaml" in msg and "bad.yaml:1" in msg


def test_extends_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    with pytest.raises(RecipeError, match="cycle"):
        load_recipe(tmp_path / "a.yaml")


def test_all_stages_disabled(tmp_path: Path) -> None:
    body = BASE + "stages:\n" + "".join(f"  {s}: {{enabled: false}}\n" for s in ("llm", "flow", "hift"))
    assert "nothing to build" in _err(tmp_path, body)


def test_yaml_tags_rejected(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "description: !!python/object/apply:os.system ['true']\n")
    assert "tag" in msg


def test_trtllm_backend_without_tensorrt_llm_is_left_for_another_machine(tmp_path: Path) -> None:
    from cosycompile.plan import plan_build

    body = "target: l20\nstages:\n  flow: {enabled: false}\n  hift: {enabled: false}\n"
    p = tmp_path / "gpu.yaml"
    p.write_text(BASE + body + "  llm:\n    engine: {backend: trtllm}\n    quantize: {format: int8_sq, exports: [hf]}\n")
    plan = plan_build(load_recipe(p))
    engine = plan.stage_steps["llm"]["engine"]
    # TensorRT-LLM is not installed here: the engine is blocked (split build), naming what to install.
    assert engine.preflight is None and "pip install tensorrt-llm" in engine.blocked()
    partial = plan_build(load_recipe(p), until="quantize")
    assert [s.name for s in partial.steps] == ["llm.quantize"]


def test_engines_that_cannot_run_here_end_built_not_validated(tmp_path: Path) -> None:
    """A GPU recipe on this CPU machine: no check steps, a final step that says so."""
    from cosycompile.plan import plan_build

    p = tmp_path / "gpu.yaml"
    p.write_text(BASE + "target: rtx4090\nstages:\n  llm: {enabled: false}\n  hift: {enabled: false}\n"
                 "  flow:\n    engine: {backend: tensorrt}\n")
    plan = plan_build(load_recipe(p))
    if not plan.not_validated:
        pytest.skip("this machine can run TensorRT engines")
    assert plan.final.kind == "pipeline.unvalidated" and "flow" in plan.not_validated
    assert "check" not in plan.stage_steps["flow"] and "NVIDIA GPU" in plan.not_validated["flow"]


def test_onnx_int4_on_onnxruntime_cpu_is_refused(tmp_path: Path) -> None:
    msg = _err(tmp_path, BASE + "stages:\n  flow:\n    quantize: {format: int4}\n")
    assert "stages.flow.quantize.format" in msg and "use int8" in msg


def test_child_with_another_format_gets_its_own_quantize_block(tmp_path: Path) -> None:
    """cpu-int8 sets alpha for int8_sq; a child switching the LLM to fp32 must not inherit it, while a
    block without a format (gpu-base's shared exports) still merges into the child's."""
    p = tmp_path / "child.yaml"
    p.write_text(f"extends: {REPO / 'recipes' / 'cpu-int8.yaml'}\nname: child\nstages:\n  llm:\n    quantize: {{format: fp32}}\n")
    r = load_recipe(p)
    assert r.typed("llm")["quantize"].format == "fp32" and r.typed("llm")["quantizer"] is None
    r = load_recipe(REPO / "recipes" / "l20-int8.yaml")
    assert r.typed("llm")["quantize"].exports == ["hf", "trtllm"] and r.typed("llm")["quantize"].alpha == 0.5


def test_stage_runtime_settings_are_validated_by_the_stage(tmp_path: Path) -> None:
    ok = write_recipe(tmp_path / "ok.yaml", {"name": "x", "stages": {"flow": {"runtime": {"n_timesteps": 5}}}})
    assert load_recipe(ok).typed("flow")["runtime"].n_timesteps == 5
    assert load_recipe(REPO / "recipes" / "cpu-fp32.yaml").typed("flow")["runtime"].n_timesteps == 10
    msg = _err(tmp_path, BASE + "stages:\n  flow:\n    runtime:\n      n_timestep: 5\n")
    assert "bad.yaml:6" in msg and "n_timestep" in msg and "n_timesteps" in msg
    msg = _err(tmp_path, BASE + "stages:\n  flow:\n    runtime:\n      n_timesteps: 0\n")
    assert "bad.yaml:6" in msg and "stages.flow.runtime.n_timesteps" in msg
    msg = _err(tmp_path, BASE + "stages:\n  llm:\n    runtime:\n      n_timesteps: 5\n")
    assert "bad.yaml:5" in msg and "stage 'llm' has no runtime settings" in msg
