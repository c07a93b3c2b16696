"""Quantization: GPU recipes up to the engine step (metadata of checkpoints and ONNX), the CPU INT8
recipe end to end, calibration-driven rebuilds, and bad quantization inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from helpers import REPO, run_cli, until_outputs, write_recipe
from seed_store import seeded

GPU_RECIPES = {
    # recipe: (LLM quant_algo in the HF and TRT-LLM checkpoints, flow Q/DQ element type)
    "l20-int8": ("W8A8_SQ_PER_CHANNEL", onnx.TensorProto.INT8),
    "l20-int4-awq": ("W4A16_AWQ", onnx.TensorProto.INT8),
    "h100-fp8": ("FP8", onnx.TensorProto.FLOAT8E4M3FN),
}


def _small(tmp: Path, name: str, extra: dict | None = None) -> Path:
    """The repo recipe with a 2-item calibration run (the seed's) and one timed pair (the tests' time budget)."""
    body = {"extends": str(REPO / "recipes" / f"{name}.yaml"), "name": name,
            "calibration": {"set": str(REPO / "calib_data" / "calib"), "max_items": 2},
            "validation": {"speed": {"runs": 1, "throughput": []}}}
    body.update(extra or {})
    return write_recipe(tmp / f"{name}.yaml", body, base=False)



@pytest.fixture(scope="module")
def gpu_builds(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> dict[str, dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("gpu")
    seeded(seed, tmp / "art")
    out = {}
    for name in GPU_RECIPES:
        res = run_cli("build", str(_small(tmp, name)), "--artifacts", str(tmp / "art"), "--until", "quantize", "-q")
        assert res.returncode == 0, res.stderr[-3000:]
        out[name] = until_outputs(res.stdout)
    return out


@pytest.mark.parametrize("name", list(GPU_RECIPES))
def test_gpu_recipe_checkpoints_carry_quantization(name: str, gpu_builds: dict) -> None:
    algo, _ = GPU_RECIPES[name]
    llm = gpu_builds[name]["llm.quantize"]
    hf = json.loads((llm / "hf" / "config.json").read_text())
    assert hf["quantization_config"]["quant_method"] == "modelopt"
    assert hf["quantization_config"]["quant_algo"] == algo
    trt = json.loads((llm / "trtllm" / "config.json").read_text())
    assert trt["architecture"] == "Qwen2ForCausalLM"
    assert trt["quantization"]["quant_algo"] == algo
    if algo == "W4A16_AWQ":
        assert trt["quantization"]["group_size"] == 128 and trt["quantization"]["pre_quant_scale"] is True
    assert (llm / "trtllm" / "rank0.safetensors").is_file()
    # The HF checkpoint is the vocabulary-merge rewrite (stages/llm/hf_rewrite.py), lm_head unquantized.
    assert hf["vocab_size"] % 128 == 0 and "lm_head" in hf["quantization_config"]["ignore"]
    assert (llm / "hf" / "cosycompile_llm.json").is_file() and (llm / "hf" / "prefix" / "prefix_embeddings.safetensors").is_file()


@pytest.mark.parametrize("name", list(GPU_RECIPES))
def test_gpu_recipe_flow_onnx_is_quantized(name: str, gpu_builds: dict) -> None:
    _, elem = GPU_RECIPES[name]
    flow = gpu_builds[name]["flow.quantize"]
    model = onnx.load(str(flow / "flow_estimator.onnx"))
    q_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(q_nodes) > 10
    inits = {i.name: i for i in model.graph.initializer}
    zero_points = [inits[n.input[2]] for n in q_nodes if len(n.input) > 2 and n.input[2] in inits]
    assert zero_points and all(z.data_type == elem for z in zero_points)
    # Exclusions from the recipe stay in high precision.
    consumers = {i for n in model.graph.node if n.op_type == "DequantizeLinear" for i in n.output}
    time_mlp = [n for n in model.graph.node if "/time_mlp/" in n.name and n.op_type in ("Gemm", "MatMul")]
    assert time_mlp and not any(i in consumers for n in time_mlp for i in n.input)
    graphs = json.loads((flow / "graphs.json").read_text())
    expected = {"l20-int8": "int8", "l20-int4-awq": "int8", "h100-fp8": "fp8"}[name]
    assert graphs["graphs"]["flow_estimator"]["precision"] == expected == graphs["info"]["precision"]


@pytest.fixture(scope="module")
def cpu_int8(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> dict:
    tmp = tmp_path_factory.mktemp("int8")
    recipe = _small(tmp, "cpu-int8")
    res = run_cli("build", str(recipe), "--artifacts", str(seeded(seed, tmp / "art")), "-q")
    return {"tmp": tmp, "art": tmp / "art", "res": res, "recipe": recipe}


def test_cpu_int8_passes_its_gate_and_reports_each_stage(cpu_int8: dict) -> None:
    res = cpu_int8["res"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "gate: PASS" in res.stdout
    (bundle,) = (cpu_int8["art"] / "builds").glob("cpu-int8-*")
    report = json.loads((bundle / "report.json").read_text())
    assert report["stages"]["llm"]["precision"] == "int8_sq"
    assert report["stages"]["flow"]["precision"] == "int8"
    assert report["stages"]["hift"]["precision"] == "fp32"
    llm, flow = report["checks"]["llm"]["metrics"], report["checks"]["flow"]["metrics"]
    assert llm["logit_cosine"] >= 0.99 and 0 <= llm["kl"] and 0 < llm["top1_agreement"] <= 1
    assert flow["cfm_mel_snr_db_min"] >= 20
    for m in (llm, flow):
        assert m["speedup_vs_fp32"] > 0 and m["fp32_engine_ms"] > 0
    md = (bundle / "report.md").read_text()
    assert "int8_sq" in md and "speedup_vs_fp32" in md


def test_changing_only_the_calibration_set_reruns_calibration_and_downstream(cpu_int8: dict) -> None:
    assert cpu_int8["res"].returncode == 0
    tmp = cpu_int8["tmp"]
    calib = tmp / "calib-copy"
    shutil.copytree(REPO / "calib_data" / "calib", calib)
    lines = (calib / "manifest.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["text"] = row["text"] + " Again."
    lines[0] = json.dumps(row, ensure_ascii=False)
    (calib / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    recipe = _small(tmp, "cpu-int8", {"calibration": {"set": str(calib), "max_items": 2}})
    res = run_cli("plan", str(recipe), "--artifacts", str(cpu_int8["art"]))
    assert res.returncode == 0, res.stderr
    status = {ln.split()[1]: ln.split()[0] for ln in res.stdout.splitlines() if ln.startswith("  ")}
    rerun = {n for n, s in status.items() if s == "RUN"}
    assert rerun == {"calibrate", "llm.quantize", "flow.quantize", "llm.engine", "flow.engine", "llm.check",
                     "flow.check", "pipeline.check"}, status


def test_a_recipe_that_calibrates_fewer_stages_reuses_the_calibration(cpu_int8: dict) -> None:
    """cpu-fast quantizes only the LLM with calibration (its flow is ONNX Runtime's dynamic INT8),
    cpu-int8 the LLM and the flow: on the same model and items they share one calibrate entry."""
    assert cpu_int8["res"].returncode == 0
    res = run_cli("plan", str(_small(cpu_int8["tmp"], "cpu-fast")), "--artifacts", str(cpu_int8["art"]))
    assert res.returncode == 0, res.stderr
    status = {ln.split()[1]: ln.split()[0] for ln in res.stdout.splitlines() if ln.startswith("  ")}
    assert "calibrate" in status and status["calibrate"] != "RUN", status
    # The LLM's quantization reads the same records and options in both recipes.
    assert status["llm.quantize"] != "RUN", status


def _bad(tmp: Path, extra: str, seed: Path | None = None) -> tuple[int, str, Path]:
    """A build of cpu-int8 changed by ``extra``, in a new artifacts dir (a copy of ``seed``'s entries
    if given: a refusal in a late step then costs only that step)."""
    recipe = write_recipe(tmp / "bad.yaml", f"extends: {REPO / 'recipes' / 'cpu-int8.yaml'}\nname: bad\n" + extra)
    art = seeded(seed, tmp / "art") if seed is not None else tmp / "art"
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    return res.returncode, res.stderr.strip(), art


def _entries_of(art: Path, steps: set[str]) -> set[str]:
    """The cache entries of ``art`` (their folder names, which are their keys) made by one of ``steps``."""
    return {e.parent.name for e in (art / "cache" / "objects").glob("*/*/entry.json")
            if json.loads(e.read_text())["step"] in steps}


def _one_line(err: str) -> None:
    assert len(err.splitlines()) == 1 and err.startswith("cosycompile: error: ") and "Traceback" not in err, err


def test_empty_calibration_set(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "manifest.jsonl").write_text("")
    rc, err, art = _bad(tmp_path, f"calibration: {{set: {tmp_path / 'c'}}}\n")
    assert rc == 2 and "calibration set is empty" in err
    _one_line(err)
    assert not (art / "cache" / "objects").exists() or not list((art / "cache" / "objects").glob("*/*/entry.json"))


def test_missing_calibration_set(tmp_path: Path) -> None:
    rc, err, _ = _bad(tmp_path, f"calibration: {{set: {tmp_path / 'nowhere'}}}\n")
    assert rc == 2 and "nowhere" in err and "calibration set folder not found" in err
    _one_line(err)


def test_unreadable_calibration_audio(tmp_path: Path) -> None:
    calib = tmp_path / "c"
    shutil.copytree(REPO / "calib_data" / "calib", calib)
    bad = sorted((calib / "prompts").glob("*.wav"))[0]
    bad.write_bytes(b"RIFF....not audio at all")
    rc, err, art = _bad(tmp_path, f"calibration: {{set: {calib}, max_items: 64}}\n")
    assert rc == 2 and bad.name in err and "unreadable audio" in err
    _one_line(err)
    assert not (art / "cache" / "objects").exists() or not list((art / "cache" / "objects").glob("*/*/entry.json"))


def test_unknown_format(tmp_path: Path) -> None:
    rc, err, _ = _bad(tmp_path, "stages:\n  flow:\n    quantize: {format: int3}\n")
    assert rc == 2 and "stages.flow.quantize.format" in err and "int3" in err
    _one_line(err)


def test_format_the_target_cannot_run(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "bad.yaml",
                          f"extends: {REPO / 'recipes' / 'h100-fp8.yaml'}\nname: bad\ntarget: a10\n")
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "quantize")
    err = res.stderr.strip()
    assert res.returncode == 2 and "compute capability >= 8.9" in err and "sm86" in err
    _one_line(err)


def test_fp8_on_cpu_without_its_settings(tmp_path: Path) -> None:
    rc, err, _ = _bad(tmp_path, "stages:\n  flow:\n    quantize: {format: fp8}\n")
    assert rc == 2 and "optimization: disable" in err
    _one_line(err)


def test_llm_exclusion_matching_nothing(tmp_path: Path) -> None:
    rc, err, art = _bad(tmp_path, "stages:\n  llm:\n    quantize: {exclude: ['*no_such_layer*']}\n")
    assert rc == 2 and "no_such_layer" in err and "matches no module" in err
    _one_line(err)
    assert not (art / "cache" / "objects").exists() or not list((art / "cache" / "objects").glob("*/*/entry.json"))


def test_flow_exclusion_matching_nothing(tmp_path: Path, seed: Path) -> None:
    # Over the seed (its cpu-int8 calibrated on the same two items, its reference of one eval item):
    # only flow.quantize runs, and fails.
    downstream = {"flow.quantize", "flow.engine", "flow.check", "pipeline.check"}
    seeded_entries = _entries_of(seed, downstream)
    rc, err, art = _bad(tmp_path, "calibration: {max_items: 2}\nvalidation: {max_items: 1}\nstages:\n"
                                  "  llm: {enabled: false}\n"
                                  "  flow:\n    quantize: {exclude: ['/no_such_node/']}\n", seed=seed)
    assert rc == 2 and "/no_such_node/" in err and "matches no node" in err
    _one_line(err)
    assert _entries_of(art, downstream) == seeded_entries


def test_autoawq_method_is_a_clear_error_when_it_cannot_run(tmp_path: Path) -> None:
    rc, err, _ = _bad(tmp_path, "stages:\n  llm:\n    quantize: {format: int4_awq, method: autoawq}\n")
    assert rc == 2 and "autoawq" in err and "stages.llm.quantize.method" in err
    _one_line(err)
