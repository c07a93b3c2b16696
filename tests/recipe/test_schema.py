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


def _child_of_gpu_base(tmp_path: Path, llm_quantize: dict | None) -> Path:
    """A recipe extending gpu-base.yaml (TensorRT-LLM for the LLM) for an H100, its LLM block as given."""
    body: dict = {"extends": str(REPO / "recipes" / "gpu-base.yaml"), "name": "child", "target": "h100"}
    if llm_quantize is not None:
        body["stages"] = {"llm": {"quantize": llm_quantize}}
    return write_recipe(tmp_path / "child.yaml", body, base=False)


def test_checkpoint_backend_error_names_the_stage_key(tmp_path: Path) -> None:
    """The message once printed a literal '{name}' instead of the stage."""
    p = _child_of_gpu_base(tmp_path, {"format": "int8_sq", "exports": ["onnx"]})
    with pytest.raises(RecipeError) as exc:
        load_recipe(p)
    msg = str(exc.value)
    assert "add hf or trtllm to stages.llm.quantize.exports" in msg and "{" not in msg, msg


def test_gpu_base_child_without_llm_format_names_the_key_to_set(tmp_path: Path) -> None:
    """gpu-base's shared `exports` is for the quantizer a child picks by format; a child that picks none
    is told to set the format, not that `exports` is an unknown key."""
    from helpers import run_cli

    res = run_cli("plan", str(_child_of_gpu_base(tmp_path, None)), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "unknown key" not in res.stderr and "set stages.llm.quantize.format" in res.stderr, res.stderr
    assert "gpu-base.yaml:" in res.stderr and "int8_sq" in res.stderr and "fp32" in res.stderr, res.stderr


def test_gpu_base_child_with_fp32_llm_plans_a_trtllm_engine(tmp_path: Path) -> None:
    """format fp32 drops the parent's format-less quantizer settings: the LLM goes to TensorRT-LLM unquantized."""
    from helpers import run_cli

    p = _child_of_gpu_base(tmp_path, {"format": "fp32"})
    r = load_recipe(p)
    assert r.typed("llm")["quantizer"] is None and r.typed("llm")["backend"].name == "trtllm"
    res = run_cli("plan", str(p), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "build the llm fp32 engine with trtllm" in res.stdout, res.stdout


def test_format_no_quantizer_writes_for_the_backend_names_the_keys(tmp_path: Path) -> None:
    """int8 for the LLM comes only from torch_dynamic, which writes torch programs; on ONNX Runtime the
    recipe is refused at load naming the format and backend keys, not a `quantizer` key it never wrote."""
    msg = _err(tmp_path, BASE + "stages:\n  llm:\n    quantize: {format: int8}\n")
    assert "bad.yaml:5" in msg and "stages.llm.quantize.format" in msg and "quantize.quantizer" not in msg, msg
    assert "stages.llm.engine.backend to torch" in msg and "int8_sq" in msg, msg
    # A key of the quantizer the recipe meant (SmoothQuant's alpha) does not turn it into an unknown-key error.
    msg = _err(tmp_path, BASE + "stages:\n  llm:\n    quantize: {format: int8, alpha: 0.5}\n")
    assert "stages.llm.quantize.format" in msg and "unknown key" not in msg, msg
    # The backend it names takes the same format.
    ok = write_recipe(tmp_path / "ok.yaml", {"name": "x", "stages": {"llm": {
        "quantize": {"format": "int8"}, "engine": {"backend": "torch"}}}})
    assert load_recipe(ok).typed("llm")["quantizer"].name == "torch_dynamic"


@pytest.mark.parametrize(("line", "says"), [
    ("max_quality_drop: .nan", "validation.gate.max_quality_drop: '.nan' is not a finite decimal number"),
    ("max_slowdown: .inf", "validation.gate.max_slowdown: '.inf' is not a finite decimal number"),
    ("min: {flow.mel_snr_db: .NaN}", "validation.gate.min.flow.mel_snr_db: '.NaN' is not a finite decimal number"),
    ("max: {llm.max_abs_logit_error: -.inf}", "llm.max_abs_logit_error: '-.inf' is not a finite decimal number"),
])
def test_non_finite_gate_values_are_refused(tmp_path: Path, line: str, says: str) -> None:
    """NaN passes every comparison and infinity switches a limit off (null is how a recipe says that):
    the recipe reader refuses them wherever they are written."""
    msg = _err(tmp_path, BASE + f"validation:\n  gate:\n    {line}\n")
    assert "bad.yaml:5" in msg and says in msg, msg


@pytest.mark.parametrize(("line", "says"), [
    ("validation: {max_items: '2'}", "key 'validation.max_items': Input should be a valid integer (got '2')"),
    ("validation: {max_items: true}", "key 'validation.max_items': Input should be a valid integer (got True)"),
    ("validation: {max_items: 0x10}", "validation.max_items: '0x10' is a YAML 1.1 hex, octal"),
    ("validation: {max_items: 010}", "validation.max_items: '010' is a YAML 1.1 hex, octal"),
    ("validation: {speed: {min_seconds: '1:30'}}", "key 'validation.speed.min_seconds': Input should be a valid number"),
    ("validation: {speed: {min_seconds: 1:30}}", "validation.speed.min_seconds: '1:30' is a YAML 1.1"),
    ("validation: {speed: {threads: 100000}}", "key 'validation.speed.threads': Input should be less than or equal"),
    ("validation: {speed: {runs: 1000000}}", "key 'validation.speed.runs': Input should be less than or equal"),
    ("validation: {speed: {throughput: [1, 0]}}", "key 'validation.speed.throughput.1': Input should be greater"),
    ("validation: {sampling: {seed: -1}}", "key 'validation.sampling.seed': Input should be greater than or equal to 0"),
    ("calibration: {max_items: 2.0}", "key 'calibration.max_items': Input should be a valid integer (got 2.0)"),
    ("stages: {hift: {quantize: {format: fp16, snake_alpha_min: '0.001'}}}",
     "key 'stages.hift.quantize.snake_alpha_min': Input should be a valid number (got '0.001')"),
])
def test_no_lax_coercion_and_every_number_bounded(tmp_path: Path, line: str, says: str) -> None:
    """A string is not a number, a boolean not an integer, YAML 1.1's octal / hex / base-60 readings are
    refused, and counts, threads and seeds have ranges; plug-in specs are read as strictly."""
    msg = _err(tmp_path, BASE + line + "\n")
    assert "bad.yaml:" in msg and says in msg, msg


def test_tuples_and_floats_still_read_from_plain_yaml(tmp_path: Path) -> None:
    """Strict reading keeps what plain YAML writes: lists for tuple fields, integers for float fields."""
    ok = write_recipe(tmp_path / "ok.yaml", {"name": "x", "validation": {"speed": {"min_seconds": 2}},
                                              "stages": {"flow": {"engine": {"options": {"rewrites": ["mish"]}}}}})
    recipe = load_recipe(ok)
    assert recipe.validation.speed.min_seconds == 2.0
    assert recipe.typed("flow")["options"].rewrites == ("mish",)


def test_names_fit_a_file_system_and_calibration_is_not_the_eval_set(tmp_path: Path) -> None:
    msg = _err(tmp_path, f"extends: {REPO / 'recipes' / 'base.yaml'}\nname: {'a' * 300}\n")
    assert "bad.yaml:2" in msg and "key 'name': String should have at most 200 characters" in msg, msg
    same = f"calibration: {{set: {REPO / 'calib_data' / 'eval'}}}\n"
    msg = _err(tmp_path, BASE + same)
    assert "bad.yaml:3" in msg and "is the eval set" in msg and "calibration.same_as_eval: true" in msg, msg
    on_purpose = write_recipe(tmp_path / "ok.yaml", {"name": "x", "calibration": {
        "set": str(REPO / "calib_data" / "eval"), "same_as_eval": True}})
    assert load_recipe(on_purpose).calibration.same_as_eval


# Three errors a user met (issue 38, item 6): each is one line that names the key to change.
@pytest.mark.parametrize(("base", "stages", "target", "says", "not_says"), [
    # gpu-base.yaml's shared exports with no format: not "unknown key ...quantize.exports".
    ("gpu-base.yaml", {}, "h100", ["stages.llm.quantize.format", "backend 'trtllm' takes:"], ["unknown key"]),
    # int8 for an ONNX Runtime LLM: the torch-only quantizer is named, not a `quantizer` key never written.
    ("cpu-fp32.yaml", {"llm": {"quantize": {"format": "int8"}}}, "cpu",
     ["stages.llm.engine.backend to torch", "quantizer 'torch_dynamic'"], ["quantize.quantizer"]),
    # A checkpoint backend with no checkpoint export: the key is spelled out, no literal {name}.
    ("gpu-base.yaml", {"llm": {"quantize": {"format": "int8_sq", "exports": ["onnx"]}}}, "h100",
     ["add hf or trtllm to stages.llm.quantize.exports"], ["{name}"]),
])
def test_recipe_errors_users_met_name_the_key_to_change(tmp_path: Path, base: str, stages: dict, target: str,
                                                        says: list[str], not_says: list[str]) -> None:
    from helpers import one_line_error, run_cli

    recipe = write_recipe(tmp_path / "r.yaml", {"extends": str(REPO / "recipes" / base), "name": "r",
                                                "target": target, "stages": stages}, base=False)
    line = one_line_error(run_cli("plan", str(recipe), "--artifacts", str(tmp_path / "art")))
    assert all(s in line for s in says) and not any(s in line for s in not_says), line
