"""ONNX Runtime dynamic INT8 for the flow estimator: a quantizer chosen by name, no calibration
step, integer MatMuls in the graph, and its quality measured by the flow check against FP32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosycompile.quantize.ort_dynamic.quantize import SATURATING_U8S8
from cosycompile.runtime.host import u8s8_products_are_exact
from helpers import EVAL_SET, REPO, run_cli, until_outputs, write_recipe
from seed_store import seeded


def _recipe(tmp: Path, quantize: dict, backend: str = "onnxruntime") -> Path:
    return write_recipe(tmp / "dyn.yaml", {
        "extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": "flow-dynamic",
        "stages": {"llm": {"enabled": False}, "hift": {"enabled": False},
                   "flow": {"quantize": quantize, "engine": {"backend": backend}}},
        "validation": {"eval_set": str(EVAL_SET), "max_items": 1,
                       "speed": {"warmup": 0, "runs": 2, "throughput": [], "machine_state": True},
                       # As cpu-int8's gate: the mel after the CFM, not base.yaml's FP32 limit on one estimator
                       # call (ONNX Runtime's integer kernels round differently per ISA: VNNI or AVX2).
                       "gate": {"min": {"flow.mel_snr_db": 20.0}, "max": {"flow.estimator_max_abs_error": None}}},
    }, base=False)


@pytest.fixture(scope="module")
def dynamic_build(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> dict:
    tmp = tmp_path_factory.mktemp("dyn")
    recipe = _recipe(tmp, {"format": "int8", "quantizer": "ort_dynamic"})
    res = run_cli("build", str(recipe), "--artifacts", str(seeded(seed, tmp / "art")))
    return {"res": res, "art": tmp / "art"}


def test_dynamic_int8_flow_builds_and_holds_quality(dynamic_build: dict) -> None:
    res = dynamic_build["res"]
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    ran = next(ln for ln in res.stdout.splitlines() if ln.startswith("built ")).split("ran: ", 1)[1].split(", ")
    assert "calibrate" not in ran and "flow.quantize" in ran  # ranges come from the tensors at run time
    # Signed weights on an x86 CPU without VNNI: ONNX Runtime's U8S8 products saturate, and the step says so.
    warned = res.stderr.count(f"warning: flow.quantize: {SATURATING_U8S8}")
    assert warned == (0 if u8s8_products_are_exact() else 1), res.stderr[-2000:]
    bundle = Path(next(ln for ln in res.stdout.splitlines() if ln.startswith("bundle: ")).split(": ", 1)[1])
    import onnx

    graphs = json.loads((bundle / "engines" / "flow" / "graphs.json").read_text())["graphs"]
    est = onnx.load(str(bundle / "engines" / "flow" / graphs["flow_estimator"]["file"]), load_external_data=False)
    ops = [n.op_type for n in est.graph.node]
    # The engine is ONNX Runtime's optimized graph: it fuses the dynamic quantization into its contrib ops.
    integer = sum(ops.count(op) for op in ("MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"))
    assert integer >= 4 and "QuantizeLinear" not in ops, sorted(set(ops))
    flow = json.loads((bundle / "report.json").read_text())["checks"]["flow"]["metrics"]
    assert flow["cfm_mel_snr_db_min"] >= 20.0, flow  # the tiny model's mel after the 10-step CFM vs FP32
    assert flow["speedup_vs_fp32"] > 0
    # validation.speed.machine_state: every ratio split by the probes taken around each of its runs.
    speed = json.loads((bundle / "report.json").read_text())["speed"]
    md = (bundle / "report.md").read_text()
    for part in ("flow", "end_to_end", "first_chunk"):
        split = speed[part]["by_state"]
        assert set(split) <= {"threads_win", "threads_lose", "state_changed"}
        assert sum(s["pairs"] for s in split.values()) == 2
        for state in split:
            assert f"{part}, {state.replace('_', ' ')}" in md.replace("state changed during the pair", "state changed")
    assert "validation.speed.machine_state" in md


@pytest.mark.slow  # a CLI build of the flow's programs
def test_uint8_weights_run_the_u8u8_kernels_and_warn_nowhere(tmp_path: Path, seed: Path) -> None:
    """``weights: uint8``: every integer MatMul of the estimator takes unsigned weights (ONNX Runtime's
    U8U8 kernels, exact on every CPU), so no CPU warrants the saturation warning."""
    import onnx
    from onnx import TensorProto

    recipe = _recipe(tmp_path, {"format": "int8", "quantizer": "ort_dynamic", "weights": "uint8"})
    res = run_cli("build", str(recipe), "--artifacts", str(seeded(seed, tmp_path / "art")), "--until", "quantize", "-q")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    assert "warning" not in res.stderr, res.stderr[-2000:]
    out = until_outputs(res.stdout)["flow.quantize"]
    graphs = json.loads((out / "graphs.json").read_text())["graphs"]
    est = onnx.load(str(out / graphs["flow_estimator"]["file"]), load_external_data=False)
    types = {i.name: i.data_type for i in est.graph.initializer}
    weights = [n.input[1] for n in est.graph.node if n.op_type == "MatMulInteger"]
    assert len(weights) >= 4 and {types[w] for w in weights} == {TensorProto.UINT8}, weights


@pytest.mark.parametrize("quantize,backend,expected", [
    ({"format": "int8", "quantizer": "ort_dynamic", "method": "max"}, "onnxruntime", "stages.flow.quantize.method"),
    ({"format": "fp8", "quantizer": "ort_dynamic"}, "onnxruntime", "cannot produce 'fp8'"),
    ({"format": "int8", "quantizer": "ort_dynamic", "op_types": ["Softmax"]}, "onnxruntime", "op_types"),
])
def test_dynamic_spec_errors(tmp_path: Path, quantize: dict, backend: str, expected: str) -> None:
    res = run_cli("plan", str(_recipe(tmp_path, quantize, backend)), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and expected in res.stderr, res.stderr


def test_dynamic_ops_refused_on_tensorrt(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "rtx.yaml", {
        "extends": str(REPO / "recipes" / "rtx4090-fp16.yaml"), "name": "rtx-dyn",
        "stages": {"flow": {"quantize": {"format": "int8", "quantizer": "ort_dynamic"}}}}, base=False)
    res = run_cli("plan", str(recipe), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and "quantizer 'ort_dynamic' writes ops only onnxruntime runs" in res.stderr, res.stderr


def test_child_recipe_switching_quantizer_gets_its_own_block() -> None:
    """cpu-int8-dynamic extends cpu-int8 (ModelOpt static, method + exclude) and names another
    quantizer for the same format: the parent's ModelOpt keys are not merged into it."""
    from cosycompile.recipe.schema import load_recipe

    r = load_recipe(REPO / "recipes" / "cpu-int8-dynamic.yaml")
    spec = r.typed("flow")["quantize"]
    assert r.typed("flow")["quantizer"].name == "ort_dynamic" and spec.exclude == []
    assert r.typed("llm")["quantize"].format == "int8_sq"  # the other stages still inherit
