"""FP16 with ModelOpt AutoCast (``quantize/modelopt_autocast``): FP16 graphs with FP32 I/O that ONNX Runtime
CPU runs close to FP32, Snake alphas whose 1/alpha overflows FP16 refused or clamped, and recipe errors.

The builds stop at ``--until quantize`` on the CPU target: FP16 engines are for strongly typed GPU
runtimes, but the FP16 ONNX is the whole of what this quantizer makes, and ONNX Runtime CPU runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import EVAL_SET, REPO, run_cli, until_outputs, write_recipe
from seed_store import seeded

CALIB = {"set": str(REPO / "calib_data" / "calib"), "max_items": 2}
# Tiny Snake alphas of builtin:tiny-snake (models/loader.py TINY_SNAKE_ALPHAS): channel -> alpha.
SNAKE = {2: 1.2e-5, 5: -8.0e-6, 9: 4.0e-6, 13: 1.5e-5}
SNAKE_LAYER = "/resblocks.1/activations1.0"


def _recipe(tmp: Path, name: str, stages: dict, model: str = "builtin:tiny") -> Path:
    return write_recipe(tmp / f"{name}.yaml", {"name": name, "model": model, "calibration": CALIB, "stages": stages})



def _calib_dir(art: Path, graph: str) -> Path:
    for index in (art / "cache" / "objects").glob("*/*/data/index.json"):
        if graph in json.loads(index.read_text())["graphs"]:
            return index.parent
    raise AssertionError(f"no calibration records of {graph} under {art}")


def _snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref.astype(np.float64) - out) ** 2)))


# -- (a) builtin:tiny, flow + HiFT to FP16 ------------------------------------------------------------

# The F0 predictor and the NSF source stay FP32: the source integrates F0 into a phase, so FP16 F0 errors
# accumulate over the utterance (HiFT phase SNR vs FP32 ~23 dB in FP16, ~40 dB with these two in FP32).
HIFT_KEEP = ["/f0_predictor/", "/m_source/"]


@pytest.fixture(scope="module")
def fp16_build(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> dict:
    tmp = tmp_path_factory.mktemp("fp16")
    art = seeded(seed, tmp / "art")
    recipe = _recipe(tmp, "tiny-fp16", {"llm": {"enabled": False}, "flow": {"quantize": {"format": "fp16"}},
                                        "hift": {"quantize": {"format": "fp16", "keep_fp32": HIFT_KEEP}}})
    res = run_cli("build", str(recipe), "--artifacts", str(art), "--until", "quantize")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    fp32 = run_cli("build", str(recipe), "--artifacts", str(art), "--until", "simplify", "-q")  # all cached
    assert fp32.returncode == 0, fp32.stderr[-2000:]
    out = {**until_outputs(res.stdout), **until_outputs(fp32.stdout)}
    return {"tmp": tmp, "art": art, "recipe": recipe, "res": res, "out": out}


@pytest.mark.slow
@pytest.mark.parametrize("stage,graph", [("flow", "flow_estimator"), ("hift", "hift")])
def test_fp16_graphs_have_fp16_weights_and_fp32_io(fp16_build: dict, stage: str, graph: str) -> None:
    qdir = fp16_build["out"][f"{stage}.quantize"]
    model = onnx.load(str(qdir / f"{graph}.onnx"))
    # Most weights are FP16; what stays FP32 is what keep_fp32 / the overflow checks kept (HiFT's F0 predictor).
    size = {TensorProto.FLOAT16: 0, TensorProto.FLOAT: 0}
    for i in model.graph.initializer:
        if i.data_type in size:
            size[i.data_type] += int(np.prod(i.dims))
    assert size[TensorProto.FLOAT16] > 2 * size[TensorProto.FLOAT], size
    io = [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)]
    assert io and all(t == TensorProto.FLOAT for t in io)
    assert all(np.isfinite(numpy_helper.to_array(i)).all() for i in model.graph.initializer
               if i.data_type == TensorProto.FLOAT16)
    manifest = json.loads((qdir / "graphs.json").read_text())
    assert manifest["graphs"][graph]["precision"] == "fp16" == manifest["info"]["precision"]
    assert manifest["info"]["fp16_clamped"] == {}


@pytest.mark.slow
def test_fp16_leaves_the_flow_encoder_and_keeps_recipe_and_overflow_nodes_fp32(fp16_build: dict) -> None:
    out = fp16_build["out"]
    flow = json.loads((out["flow.quantize"] / "graphs.json").read_text())
    assert "precision" not in flow["graphs"]["flow_encoder"]
    assert (out["flow.quantize"] / "flow_encoder.onnx").read_bytes() == (out["flow.simplify"] / "flow_encoder.onnx").read_bytes()
    # The attention mask's -1e10 cannot be FP16: AutoCast keeps the node reading it FP32.
    assert flow["info"]["fp16_kept_fp32"]["flow_estimator"]
    hift = json.loads((out["hift.quantize"] / "graphs.json").read_text())
    kept = hift["info"]["fp16_kept_fp32"]["hift"]
    assert any(n.startswith("/f0_predictor/") for n in kept) and any(n.startswith("/m_source/") for n in kept)
    assert not any(n.startswith("/resblocks.") for n in kept)


@pytest.mark.slow
@pytest.mark.parametrize("stage,graph,min_snr", [
    # Loose bounds, measured on builtin:tiny's random weights (flow ~59 dB; HiFT magnitude ~46-50 dB,
    # phase ~37-41 dB): FP16 rounding is ~3e-4 relative, so these hold with a wide margin and fail only
    # on a broken conversion (inf/NaN, a clipped Snake, a wrong cast).
    ("flow", "flow_estimator", {"estimator_out": 40.0}),
    ("hift", "hift", {"magnitude": 30.0, "phase": 25.0}),
])
def test_onnxruntime_cpu_runs_fp16_close_to_fp32(fp16_build: dict, stage: str, graph: str, min_snr: dict) -> None:
    import onnxruntime as ort

    from cosycompile.quantize.calibrate import load_records

    out = fp16_build["out"]
    fp32 = ort.InferenceSession(str(out[f"{stage}.simplify"] / f"{graph}.onnx"), providers=["CPUExecutionProvider"])
    fp16 = ort.InferenceSession(str(out[f"{stage}.quantize"] / f"{graph}.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in fp32.get_outputs()]
    for feeds in load_records(_calib_dir(fp16_build["art"], graph), graph)[:2]:
        for name, ref, got in zip(names, fp32.run(names, feeds), fp16.run(names, feeds)):
            assert got.dtype == np.float32 and np.isfinite(got).all()
            assert _snr_db(ref, got) >= min_snr[name], (name, _snr_db(ref, got))


@pytest.mark.slow
def test_keep_fp32_that_matches_nothing_is_a_recipe_error(fp16_build: dict) -> None:
    # The fixture's stages but a dead pattern: export, calibration and flow.quantize come from its cache.
    recipe = _recipe(fp16_build["tmp"], "dead-keep", {"llm": {"enabled": False}, "flow": {"quantize": {"format": "fp16"}},
                                                      "hift": {"quantize": {"format": "fp16", "keep_fp32": ["/no_such_layer/"]}}})
    res = run_cli("build", str(recipe), "--artifacts", str(fp16_build["art"]), "--until", "quantize", "-q")
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cosycompile: error: "), err
    assert "stages.hift.quantize.keep_fp32" in err and "/no_such_layer/" in err


# -- (b), (c) builtin:tiny-snake: refused, or clamped -------------------------------------------------

@pytest.fixture(scope="module")
def snake_builds(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("snake")
    art = tmp / "art"
    off = {"llm": {"enabled": False}, "flow": {"enabled": False}}
    refuse = _recipe(tmp, "snake-refuse", {**off, "hift": {"quantize": {"format": "fp16"}}}, "builtin:tiny-snake")
    res_refuse = run_cli("build", str(refuse), "--artifacts", str(art), "--until", "quantize", "-q")
    plan = run_cli("plan", str(refuse), "--artifacts", str(art))
    clamp = _recipe(tmp, "snake-clamp", {**off, "hift": {"quantize": {"format": "fp16", "snake_alpha": "clamp"}}},
                    "builtin:tiny-snake")
    res_clamp = run_cli("build", str(clamp), "--artifacts", str(art), "--until", "quantize")
    fp32 = run_cli("build", str(clamp), "--artifacts", str(art), "--until", "simplify", "-q")
    return {"art": art, "refuse": res_refuse, "plan": plan, "clamp": res_clamp,
            "out": {**until_outputs(res_clamp.stdout), **until_outputs(fp32.stdout)}}


@pytest.mark.slow
def test_tiny_snake_alphas_are_refused_naming_the_layer(snake_builds: dict) -> None:
    res = snake_builds["refuse"]
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cosycompile: error: "), err
    assert "stages.hift.quantize.snake_alpha" in err and SNAKE_LAYER in err and "resblocks.1.activations1.0" in err
    assert "4 Snake alphas" in err and "smallest 4e-06" in err and "snake_alpha: clamp" in err
    # Nothing was stored for the refused step; the steps before it were.
    plan = snake_builds["plan"].stdout
    assert any(line.split()[:2] == ["RUN", "hift.quantize"] for line in plan.splitlines()), plan
    assert any(line.split()[:2] == ["cached", "hift.simplify"] for line in plan.splitlines()), plan


@pytest.mark.slow
def test_tiny_snake_alphas_clamped_keep_their_sign_and_are_recorded(snake_builds: dict) -> None:
    res = snake_builds["clamp"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    qdir = snake_builds["out"]["hift.quantize"]
    info = json.loads((qdir / "graphs.json").read_text())["info"]
    (rec,) = info["fp16_clamped"]["hift"]
    assert rec["layer"] == SNAKE_LAYER and rec["module"] == "resblocks.1.activations1.0" and rec["kind"] == "snake"
    assert rec["channels"] == sorted(SNAKE)
    assert np.allclose(rec["alphas"], [SNAKE[c] for c in sorted(SNAKE)], rtol=1e-3)
    amin = rec["clamped_to"]
    assert 1 / 65504 < amin < 1.7e-5
    # In the FP16 graph the Snake's 1/alpha is finite, at most 1/amin, with each channel's sign.
    model = onnx.load(str(qdir / "hift.onnx"))
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64).ravel() for i in model.graph.initializer}
    recips = [v for n, v in inits.items() if n.startswith(rec["constant"]) and v.size == 16]
    assert recips, sorted(inits)[:10]
    for r in recips:
        assert np.isfinite(r).all() and np.abs(r).max() <= 1 / amin * 1.001
        for c, a in SNAKE.items():
            assert np.sign(r[c]) == np.sign(a) and abs(r[c]) == pytest.approx(1 / amin, rel=1e-3)


@pytest.mark.slow
def test_clamped_fp16_hift_runs_close_to_fp32(snake_builds: dict) -> None:
    import onnxruntime as ort

    from cosycompile.quantize.calibrate import load_records

    out = snake_builds["out"]
    fp32 = ort.InferenceSession(str(out["hift.simplify"] / "hift.onnx"), providers=["CPUExecutionProvider"])
    fp16 = ort.InferenceSession(str(out["hift.quantize"] / "hift.onnx"), providers=["CPUExecutionProvider"])
    feeds = load_records(_calib_dir(snake_builds["art"], "hift"), "hift")[0]
    for ref, got in zip(fp32.run(None, feeds), fp16.run(None, feeds)):
        # The whole of HiFT in FP16 (no keep_fp32): ~32 dB magnitude, ~23 dB phase on tiny's weights.
        assert np.isfinite(got).all() and _snr_db(ref, got) >= 15.0


@pytest.mark.slow
def test_tiny_snake_layer_kept_fp32_is_not_refused(snake_builds: dict, tmp_path: Path) -> None:
    """keep_fp32 on the Snake (the error message's other way out) keeps 1/alpha FP32: nothing is clamped."""
    quantize = {"format": "fp16", "keep_fp32": [r"/resblocks\.1/activations1\.0/"]}
    keep = _recipe(tmp_path, "snake-keep", {"llm": {"enabled": False}, "flow": {"enabled": False},
                                            "hift": {"quantize": quantize}}, "builtin:tiny-snake")
    res = run_cli("build", str(keep), "--artifacts", str(snake_builds["art"]), "--until", "quantize")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    info = json.loads((until_outputs(res.stdout)["hift.quantize"] / "graphs.json").read_text())["info"]
    assert info["fp16_clamped"] == {}
    assert f"{SNAKE_LAYER}/Mul_2" in info["fp16_kept_fp32"]["hift"]


# -- (d), (e) recipe errors before any work -------------------------------------------------------------

def _load_error(tmp_path: Path, quantize: dict, stage: str = "hift") -> str:
    from cosycompile.errors import RecipeError
    from cosycompile.recipe.schema import load_recipe

    path = write_recipe(tmp_path / "r.yaml", {"name": "t", "stages": {stage: {"quantize": quantize}}})
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:") and "\n" not in msg
    return msg


@pytest.mark.parametrize("quantize,key", [
    ({"format": "fp16", "method": "max"}, "method"),  # an int8/fp8 key that fp16 does not read
    ({"format": "fp16", "exclude": ["/x/"]}, "exclude"),  # modelopt_onnx's name; here it is keep_fp32
    ({"format": "fp16", "snake_alpha": "ignore"}, "snake_alpha"),
    ({"format": "fp16", "snake_alpha_min": 1.0e-6}, "snake_alpha_min"),  # 1/1e-6 overflows FP16
    ({"format": "fp16", "data_max": 1.0e6}, "data_max"),  # above FP16's range
    ({"format": "fp16", "keep_fp32": ["(unclosed"]}, "keep_fp32"),
])
def test_unread_or_bad_fp16_keys_are_recipe_errors(tmp_path: Path, quantize: dict, key: str) -> None:
    assert f"stages.hift.quantize.{key}" in _load_error(tmp_path, quantize)


def test_fp16_is_chosen_for_flow_and_hift_and_reads_recorded_inputs(tmp_path: Path) -> None:
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    path = write_recipe(tmp_path / "r.yaml", {"name": "t", "validation": {"eval_set": str(EVAL_SET)},
                                              "stages": {"flow": {"quantize": {"format": "fp16"}},
                                                         "hift": {"quantize": {"format": "fp16"}}}})
    recipe = load_recipe(path)
    for stage in ("flow", "hift"):
        typed = recipe.typed(stage)
        assert typed["quantizer"].name == "modelopt_autocast"
        assert typed["quantize"].snake_alpha == "refuse" and 1 / 65504 < typed["quantize"].snake_alpha_min < 1.7e-5
    steps = plan_build(recipe, until="quantize").stage_steps
    assert "calib" in steps["hift"]["quantize"].deps and "calib" in steps["flow"]["quantize"].deps
    # The LLM has no quantizable ONNX graph: fp16 there is not this quantizer's.
    assert "llm" in _load_error(tmp_path, {"format": "fp16"}, stage="llm")


# -- the scan on hand-made graphs (no build) -------------------------------------------------------------

def _snake_graph(alpha: np.ndarray, folded: bool, shared_with_other: bool = False) -> onnx.ModelProto:
    """x + 1/(alpha + 1e-9) * sin(alpha x)^2 on [1, C, T], folded (R initializer) or live (Div at run time)."""
    c = alpha.size
    a3 = alpha.reshape(1, c, 1).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = []
    if folded:
        inits += [numpy_helper.from_array(a3, "alpha"),
                  numpy_helper.from_array((1.0 / (a3 + 1e-9)).astype(np.float32), "recip")]
        nodes.append(helper.make_node("Mul", ["x", "alpha"], ["ax"], name="/act/Mul_1"))
        recip = "recip"
    else:
        inits += [numpy_helper.from_array(alpha.astype(np.float32), "act.alpha"),
                  numpy_helper.from_array(np.array([0, 2], np.int64), "axes"),
                  numpy_helper.from_array(np.array(1e-9, np.float32), "eps"),
                  numpy_helper.from_array(np.array(1.0, np.float32), "one")]
        nodes += [helper.make_node("Unsqueeze", ["act.alpha", "axes"], ["a3"], name="/act/Unsqueeze"),
                  helper.make_node("Mul", ["x", "a3"], ["ax"], name="/act/Mul_1"),
                  helper.make_node("Add", ["a3", "eps"], ["ae"], name="/act/Add_eps"),
                  helper.make_node("Div", ["one", "ae"], ["r"], name="/act/Div")]
        recip = "r"
    nodes += [helper.make_node("Sin", ["ax"], ["s"], name="/act/Sin"),
              helper.make_node("Pow", ["s", "two"], ["s2"], name="/act/Pow"),
              helper.make_node("Mul", [recip, "s2"], ["m"], name="/act/Mul_2"),
              helper.make_node("Add", ["x", "m"], ["y"], name="/act/Add")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, "T"])]
    if shared_with_other:  # simplifiers share equal constants: another node reads the same R
        nodes.append(helper.make_node("Mul", ["x", recip], ["z"], name="/other/Mul"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, c, "T"]))
    g = helper.make_graph(nodes, "snake", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, "T"])],
                          outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


ALPHA = np.array([1.0, 1.2e-5, 0.5, -8e-6, 2.0, 4e-6], np.float64)


@pytest.mark.parametrize("folded", [True, False])
def test_scan_finds_tiny_snake_alphas_in_folded_and_live_graphs(folded: bool) -> None:
    from cosycompile.quantize.modelopt_autocast import SNAKE_ALPHA_MIN
    from cosycompile.quantize.modelopt_autocast.scan import clamp, find_hazards

    model = _snake_graph(ALPHA, folded)
    (h,), large = find_hazards(model, SNAKE_ALPHA_MIN)
    assert h.kind == "snake" and h.layer == "/act" and h.index == [1, 3, 5]
    assert np.allclose(h.alphas, ALPHA[[1, 3, 5]], rtol=1e-3)
    assert (h.constant, h.module) == (("recip", "act") if folded else ("act.alpha", "act"))
    assert [n for n, _ in large] == []  # the hazard's own constant is not listed again
    clamp(model, [h], SNAKE_ALPHA_MIN)
    assert find_hazards(model, SNAKE_ALPHA_MIN) == ([], [])
    x = np.linspace(-3, 3, 6 * 7, dtype=np.float32).reshape(1, 6, 7)
    import onnxruntime as ort

    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.isfinite(y).all()
    # A tiny alpha's Snake is ~x + alpha x^2: clamping moves it by ~amin * x^2, not more.
    assert np.abs(y - x)[0, [1, 3, 5]].max() < 2 * SNAKE_ALPHA_MIN * 9 + 1e-6
    inits = {i.name: numpy_helper.to_array(i).ravel() for i in model.graph.initializer}
    vals = inits["recip"] if folded else inits["act.alpha"]
    assert np.array_equal(np.sign(vals[[1, 3, 5]]), np.sign(ALPHA[[1, 3, 5]]))
    if folded:  # the sin-side alpha is clamped with R, so the Snake stays one function
        assert np.abs(inits["alpha"][[1, 3, 5]]).min() >= SNAKE_ALPHA_MIN * (1 - 1e-6)


def test_clamping_a_shared_reciprocal_does_not_touch_its_other_reader() -> None:
    from cosycompile.quantize.modelopt_autocast import SNAKE_ALPHA_MIN
    from cosycompile.quantize.modelopt_autocast.scan import clamp, find_hazards

    model = _snake_graph(ALPHA, folded=True, shared_with_other=True)
    hazards, _ = find_hazards(model, SNAKE_ALPHA_MIN)
    clamp(model, hazards, SNAKE_ALPHA_MIN)
    other = next(n for n in model.graph.node if n.name == "/other/Mul")
    snake = next(n for n in model.graph.node if n.name == "/act/Mul_2")
    assert "recip" in other.input and "recip" not in snake.input
    inits = {i.name: numpy_helper.to_array(i).ravel() for i in model.graph.initializer}
    assert inits["recip"][1] > 8e4  # untouched


def test_tiny_snake_is_tiny_with_four_tiny_alphas(tmp_path: Path) -> None:
    import torch

    from cosycompile.families.cosyvoice2.loader import TINY_SNAKE_PARAM, init_model, load_models
    from cosycompile.families import get_family

    assert "tiny-snake" in get_family("cosyvoice2").builtins
    init_model("builtin:tiny", tmp_path / "tiny")
    init_model("builtin:tiny-snake", tmp_path / "snake")
    a = torch.load(tmp_path / "tiny" / "hift.pt", weights_only=True)
    b = torch.load(tmp_path / "snake" / "hift.pt", weights_only=True)
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert diff == [TINY_SNAKE_PARAM]
    alpha = b[TINY_SNAKE_PARAM]
    assert {int(i) for i in torch.nonzero(alpha.abs() < 1.6e-5)} == set(SNAKE)
    assert all(alpha[c].item() == pytest.approx(v) for c, v in SNAKE.items())
    assert load_models(tmp_path / "snake", ("hift",)).hift is not None
