"""torch_dynamic: INT8 and FP8 linears rewritten into torch programs (torch._int_mm /
torch._scaled_mm), on the tiny model's real programs: the weights are stored quantized, the result
stays close to FP32 without being equal to it, the GPU row padding changes nothing, and the recipe
keys fail as one line. The compiled INT8 packages are built and checked in tests/backends/test_torch.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, run_cli, until_outputs, write_recipe
from seed_store import seeded


@pytest.fixture(scope="module")
def programs(tiny_model_dir: Path) -> dict[str, Any]:
    """The flow estimator and LLM decode step of the tiny model as exported programs, with inputs."""
    from cosycompile.families.cosyvoice2.loader import load_models
    from cosycompile.stages import get_stage
    from cosycompile.stages.common import export_program, program_example_inputs

    models = load_models(tiny_model_dir, ("llm", "flow"))
    out = {}
    for stage, graph in (("flow", "flow_estimator"), ("llm", "llm_step"), ("llm", "llm_step_static")):
        modules, _, info = get_stage(stage).hook("modules")(models)
        spec = get_stage(stage).graph(graph)
        program, _ = export_program(modules[graph], spec, info)
        out[graph] = {"program": program, "spec": spec, "info": info,
                      "inputs": program_example_inputs(spec, info)}
    return out


def _rewrite(entry: dict[str, Any], fmt: str, pad_rows: int = 0, keep: tuple[str, ...] = (),
             kernel: str = "int_mm") -> tuple[Any, dict]:
    from cosycompile.quantize.torch_dynamic.quantize import Program, rewrite_linears
    from cosycompile.stages.common import export_program

    gm = entry["program"].module()
    done = rewrite_linears(gm, fmt, pad_rows, list(keep), kernel)
    program, _ = export_program(Program(gm), entry["spec"], entry["info"])
    return program, done


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _call_counts(program: Any) -> dict[str, int]:
    calls = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    return {op: calls.count(op) for op in ("aten._int_mm.default", "aten._scaled_mm.default", "aten.linear.default",
                                            "aten.constant_pad_nd.default", "aten.pad.default",
                                            "cosycompile.int8_attention.default")}


@pytest.mark.parametrize(("graph", "fmt", "max_rel_error"), [
    ("flow_estimator", "int8", 0.01), ("flow_estimator", "fp8", 0.03),
    ("llm_step", "int8", 0.01), ("llm_step", "fp8", 0.03), ("llm_step_static", "int8", 0.01),
])
def test_linears_become_quantized_gemms_close_to_fp32(programs: dict, graph: str, fmt: str,
                                                      max_rel_error: float) -> None:
    import torch

    entry = programs[graph]
    fp32_linears = _call_counts(entry["program"])["aten.linear.default"]
    program, done = _rewrite(entry, fmt)
    counts = _call_counts(program)
    gemm = counts["aten._int_mm.default" if fmt == "int8" else "aten._scaled_mm.default"]
    # Every constant-weight linear became a quantized GEMM, except those the kernels' alignment excludes.
    assert gemm == fp32_linears - counts["aten.linear.default"] and gemm >= done["quantized_linears"] > 0
    assert all("not a multiple" in why for why in done["kept_fp32"].values())
    dtype = torch.int8 if fmt == "int8" else torch.float8_e4m3fn
    quantized = [v for v in program.state_dict.values() if v.dtype == dtype]
    assert len(quantized) == done["quantized_linears"]
    # The FP32 copies of the quantized weights are gone from the program.
    fp32_bytes = sum(v.numel() * 4 for v in entry["program"].state_dict.values())
    new_bytes = sum(v.numel() * v.element_size() for v in program.state_dict.values())
    scale_bytes = sum(v.numel() * 4 for k, v in program.state_dict.items() if k.endswith("_scale"))
    assert new_bytes == fp32_bytes - 3 * sum(v.numel() for v in quantized) + scale_bytes
    with torch.no_grad():
        want = _first(entry["program"].module()(*entry["inputs"]))
        got = _first(program.module()(*entry["inputs"]))
    rel = float((want - got).norm() / want.norm())
    assert 0 < rel < max_rel_error, rel  # quantized (not equal), yet close


@pytest.mark.parametrize("graph", ["llm_step", "llm_step_static"])
def test_gpu_row_padding_changes_nothing(programs: dict, graph: str) -> None:
    """CUDA's INT8 GEMM needs more than 16 rows: GPU programs pad every call's rows and slice them
    off again, and compute exactly what the CPU program computes (here, on the CPU), the static-cache
    step's one-row calls included."""
    import torch

    entry = programs[graph]
    plain, _ = _rewrite(entry, "int8")
    padded, _ = _rewrite(entry, "int8", pad_rows=16)
    counts = _call_counts(padded)
    assert counts["aten.constant_pad_nd.default"] + counts["aten.pad.default"] >= counts["aten._int_mm.default"] > 0
    assert _call_counts(plain)["aten.constant_pad_nd.default"] + _call_counts(plain)["aten.pad.default"] == 0
    with torch.no_grad():
        a = plain.module()(*entry["inputs"])
        b = padded.module()(*entry["inputs"])
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("kernel", ["int_mm", "cosycompile"])
def test_a_cpu_program_quantizes_the_linears_cuda_alignment_keeps(programs: dict, kernel: str,
                                                                  torch_ops_library: Path) -> None:
    """The decode step's output head (the speech vocabulary, not a multiple of 8) stays FP32 for CUDA's
    kernels; a CPU program's INT8 products take any size, so there it is quantized too, and the step
    stays close to FP32."""
    import torch

    from cosycompile.quantize.torch_dynamic.quantize import Program, rewrite_linears
    from cosycompile.stages.common import export_program

    entry = programs["llm_step"]
    _, for_cuda = _rewrite(entry, "int8", kernel=kernel)
    assert for_cuda["kept_fp32"] and all("not a multiple" in why for why in for_cuda["kept_fp32"].values())
    gm = entry["program"].module()
    done = rewrite_linears(gm, "int8", kernel=kernel, aligned=False)
    assert done["kept_fp32"] == {}
    assert done["quantized_linears"] == for_cuda["quantized_linears"] + len(for_cuda["kept_fp32"])
    program, _ = export_program(Program(gm), entry["spec"], entry["info"])
    assert _call_counts(program)["aten.linear.default"] == 0
    with torch.no_grad():
        want = _first(entry["program"].module()(*entry["inputs"]))
        got = _first(program.module()(*entry["inputs"]))
    assert 0 < float((want - got).norm() / want.norm()) < 0.01


@pytest.mark.parametrize("graph", ["llm_step", "llm_step_static", "flow_estimator"])
def test_the_cosycompile_kernel_is_one_call_a_linear_computing_what_int_mm_does(programs: dict, graph: str,
                                                                               torch_ops_library: Path) -> None:
    """``kernel: cosycompile`` puts one ``cosycompile::int8_linear`` where ``int_mm`` puts a quantize,
    a ``torch._int_mm`` and a rescale (a GELU before it stays a GELU), with the same weights and
    outputs; the decode steps' one-row calls take the operator's VNNI pass where the CPU has one."""
    import torch

    entry = programs[graph]
    composite, done = _rewrite(entry, "int8")
    own, own_done = _rewrite(entry, "int8", kernel="cosycompile")
    calls = [str(n.target) for n in own.graph.nodes if n.op == "call_function"]
    assert calls.count("cosycompile.int8_linear.default") == _call_counts(composite)["aten._int_mm.default"] > 0
    assert _call_counts(own)["aten._int_mm.default"] == 0 and own_done["quantized_linears"] == done["quantized_linears"]
    with torch.no_grad():
        fp32 = _first(entry["program"].module()(*entry["inputs"]))
        want = _first(composite.module()(*entry["inputs"]))
        got = _first(own.module()(*entry["inputs"]))
    if graph == "flow_estimator":
        # After a GELU the composite takes the row scale from the GELU's input, the operator from its
        # output: other integers, equally close to FP32.
        assert 0 < float((got - fp32).norm() / fp32.norm()) < 0.01
    else:
        # The same integers: only the float rounding of the rescale may differ.
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert not torch.equal(got, fp32)


@pytest.mark.parametrize(("quantize", "target", "says"), [
    ({"format": "int8", "kernel": "cosycompile"}, "h100", "this block is int8 for target 'h100'"),
    ({"format": "fp8", "kernel": "cosycompile"}, "h100", "this block is fp8 for target 'h100'"),
])
def test_the_cosycompile_kernel_off_a_cpu_int8_block_is_one_line(tmp_path: Path, quantize: dict, target: str,
                                                                  says: str) -> None:
    recipe = _flow_only(tmp_path, quantize, target=target)
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "quantize", "-q")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
    assert "stages.flow.quantize.kernel: 'cosycompile' is an INT8 operator for CPU targets" in res.stderr, res.stderr
    assert says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not list((tmp_path / "art").rglob("entry.json"))  # refused when read: nothing cached


def test_keep_fp32_keeps_the_matching_linears(programs: dict) -> None:
    entry = programs["flow_estimator"]
    _, everything = _rewrite(entry, "int8")
    program, done = _rewrite(entry, "int8", keep=("attn",))
    kept = [w for w, why in done["kept_fp32"].items() if why == "keep_fp32"]
    assert kept and all("attn" in w for w in kept)
    assert done["quantized_linears"] == everything["quantized_linears"] - len(kept)
    assert _call_counts(program)["aten.linear.default"] == len(kept)


def test_convolutions_bf16_computes_every_constant_convolution_in_bf16(programs: dict) -> None:
    """``convolutions: bf16`` gives every convolution of the estimator a BF16 weight and input, drops the
    FP32 weights, and keeps the output close to the INT8 program's with FP32 convolutions, not equal."""
    import torch

    from cosycompile.quantize.torch_dynamic.convolutions import rewrite_convolutions
    from cosycompile.quantize.torch_dynamic.quantize import Program, rewrite_linears
    from cosycompile.stages.common import export_program

    entry = programs["flow_estimator"]
    convs = entry["program"].graph.find_nodes(op="call_function", target=torch.ops.aten.conv1d.default)
    gm = entry["program"].module()
    rewrite_linears(gm, "int8")
    fp32_convs = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.conv1d.default)
    fp32_weights = {n.args[1].target for n in fp32_convs}
    done = rewrite_convolutions(gm)
    assert done["bf16_convolutions"] == len(fp32_weights) > 0 and len(fp32_convs) == len(convs)
    program, _ = export_program(Program(gm), entry["spec"], entry["info"])
    after = program.graph.find_nodes(op="call_function", target=torch.ops.aten.conv1d.default)
    assert len(after) == len(fp32_convs)
    assert all(n.args[0].meta["val"].dtype == n.args[1].meta["val"].dtype == torch.bfloat16 for n in after)
    assert not fp32_weights & set(program.state_dict)
    assert sum(v.dtype == torch.bfloat16 for v in program.state_dict.values()) >= len(fp32_weights)
    int8_only, _ = _rewrite(entry, "int8")
    with torch.no_grad():
        want = _first(int8_only.module()(*entry["inputs"]))
        got = _first(program.module()(*entry["inputs"]))
    assert got.dtype == want.dtype == torch.float32
    rel = float((want - got).norm() / want.norm())
    assert 0 < rel < 0.02, rel


def test_keep_fp32_keeps_the_matching_convolutions_fp32(programs: dict) -> None:
    """With ``convolutions: bf16``, ``keep_fp32`` also names convolutions: those whose weight matches stay
    FP32 (weight and input), the others become BF16, and the kept ones are reported."""
    import torch

    from cosycompile.quantize.torch_dynamic.convolutions import rewrite_convolutions
    from cosycompile.quantize.torch_dynamic.quantize import Program
    from cosycompile.stages.common import export_program

    entry = programs["flow_estimator"]
    gm = entry["program"].module()
    weights = sorted({n.args[1].target for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.conv1d.default)})
    keep = weights[0].rsplit(".", 2)[0]  # the first convolution's module
    kept = [w for w in weights if re.search(keep, w)]
    assert 0 < len(kept) < len(weights)
    done = rewrite_convolutions(gm, [keep])
    assert done == {"bf16_convolutions": len(weights) - len(kept), "convolutions_kept_fp32": kept}
    program, _ = export_program(Program(gm), entry["spec"], entry["info"])
    dtypes = {n.args[1].meta["val"].dtype: n for n in program.graph.find_nodes(op="call_function",
                                                                                target=torch.ops.aten.conv1d.default)}
    assert set(dtypes) == {torch.float32, torch.bfloat16}
    assert dtypes[torch.float32].args[0].meta["val"].dtype == torch.float32
    assert {f"inner.{w}" for w in kept} <= set(program.state_dict)  # the Program wrapper's prefix


def test_bf16_products_are_native_only_with_avx512_bf16_or_amx() -> None:
    from cosycompile.quantize.torch_dynamic.convolutions import bf16_products_are_native

    assert bf16_products_are_native({"avx512f", "avx512_bf16"}) and bf16_products_are_native({"amx_bf16"})
    assert not bf16_products_are_native({"avx2", "avx512f", "avx512_vnni"}) and not bf16_products_are_native(set())


def _flow_only(tmp: Path, quantize: dict, target: str = "cpu") -> Path:
    return write_recipe(tmp / "r.yaml", {
        "name": "torch-dyn", "target": target,
        "stages": {"llm": {"enabled": False}, "hift": {"enabled": False},
                   "flow": {"engine": {"backend": "torch"}, "quantize": quantize}}})


@pytest.mark.parametrize(("keep", "says"), [
    (["no_such_layer"], "stages.flow.quantize.keep_fp32: 'no_such_layer' matches no linear weight of flow_estimator"),
    (["("], "not a regular expression: '('"),
])
def test_keep_fp32_errors_are_one_line(tmp_path: Path, seed: Path, keep: list[str], says: str) -> None:
    recipe = _flow_only(tmp_path, {"format": "int8", "keep_fp32": keep})
    art = seeded(seed, tmp_path / "art")  # the model from the seed: only the flow's program export runs
    res = run_cli("build", str(recipe), "--artifacts", str(art), "--until", "quantize", "-q")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
    assert says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.slow  # a CLI build of the flow's programs
def test_a_cpu_without_vectorized_int8_products_is_told_so(tmp_path: Path, seed: Path) -> None:
    """An INT8 program for a CPU target, quantized on a CPU whose torch._int_mm is PyTorch's scalar loop,
    gets one warning line from its quantize step (none where oneDNN runs the products), and the step
    records which it was."""
    from cosycompile.quantize.torch_dynamic.quantize import SCALAR_INT8_MATMUL
    from cosycompile.runtime.host import int8_matmul_is_vectorized

    vectorized = int8_matmul_is_vectorized()
    recipe = _flow_only(tmp_path, {"format": "int8"})
    res = run_cli("build", str(recipe), "--artifacts", str(seeded(seed, tmp_path / "art")), "--until", "quantize", "-q")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.count(f"warning: flow.quantize: {SCALAR_INT8_MATMUL}") == (0 if vectorized else 1), res.stderr
    entry = until_outputs(res.stdout)["flow.quantize"].parent / "entry.json"
    assert json.loads(entry.read_text())["meta"]["build_host_int8_matmul"] == ("vectorized" if vectorized else "scalar")


@pytest.mark.slow  # a CLI build of the flow's programs
def test_convolutions_bf16_in_a_recipe_reaches_the_program_and_warns_where_not_native(tmp_path: Path,
                                                                                     seed: Path) -> None:
    from cosycompile.quantize.torch_dynamic.convolutions import NO_NATIVE_BF16, bf16_products_are_native

    recipe = _flow_only(tmp_path, {"format": "int8", "convolutions": "bf16"})
    res = run_cli("build", str(recipe), "--artifacts", str(seeded(seed, tmp_path / "art")), "--until", "quantize", "-q")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.count(NO_NATIVE_BF16) == (0 if bf16_products_are_native() else 1), res.stderr
    entry = until_outputs(res.stdout)["flow.quantize"].parent / "entry.json"
    assert json.loads(entry.read_text())["meta"]["quantized"]["flow_estimator"]["bf16_convolutions"] > 0


def test_only_the_int_mm_kernel_crawls_without_avx512_vnni() -> None:
    from cosycompile.quantize.torch_dynamic.quantize import products_crawl_here

    assert products_crawl_here("int_mm", {"avx2", "fma"})
    assert not products_crawl_here("int_mm", {"avx2", "avx512f", "avx512bw", "avx512_vnni"})
    assert not products_crawl_here("cosycompile", {"avx2", "fma"}) and not products_crawl_here("cosycompile", set())


@pytest.mark.extended
def test_fp8_program_for_h100_is_written_on_a_cpu_machine(tmp_path: Path) -> None:
    """An H100 recipe's FP8 flow program is quantized here (the engine step is left for the GPU); the
    program runs on this CPU through torch's FP8 emulation and stays close to the FP32 program."""
    import torch

    from cosycompile.runtime.graphs_dir import read_graphs_dir
    from cosycompile.runtime.torch_programs import load_program
    from cosycompile.stages import get_stage
    from cosycompile.stages.common import program_example_inputs

    recipe = _flow_only(tmp_path, {"format": "fp8"}, target="h100")
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "quantize", "-q")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    exported = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "export", "-q")
    assert exported.returncode == 0 and "ran: nothing" in exported.stdout, exported.stdout + exported.stderr
    q = read_graphs_dir(until_outputs(res.stdout)["flow.quantize"])
    fp32 = read_graphs_dir(until_outputs(exported.stdout)["flow.export"])
    assert q.info["precision"] == "fp8" and q.graphs["flow_estimator"]["precision"] == "fp8"
    assert q.graphs["flow_encoder"] == fp32.graphs["flow_encoder"]  # only the quantizable graph
    program = load_program(q.graph_path("flow_estimator"))
    assert _call_counts(program)["aten._scaled_mm.default"] > 0
    inputs = program_example_inputs(get_stage("flow").graph("flow_estimator"), q.info)
    with torch.no_grad():
        want = load_program(fp32.graph_path("flow_estimator")).module()(*inputs)
        got = program.module()(*inputs)
    assert 0 < float((want - got).norm() / want.norm()) < 0.03


def test_int8_is_chosen_for_torch_and_not_for_onnxruntime(tmp_path: Path) -> None:
    from cosycompile.recipe.schema import load_recipe

    r = load_recipe(REPO / "recipes" / "cpu-torch-int8.yaml")
    assert r.typed("llm")["quantizer"].name == "torch_dynamic" and r.typed("flow")["quantizer"].name == "torch_dynamic"
    assert load_recipe(REPO / "recipes" / "cpu-int8.yaml").typed("flow")["quantizer"].name == "modelopt_onnx"
    bad = write_recipe(tmp_path / "bad.yaml", {"name": "b", "stages": {"flow": {"quantize": {
        "format": "int8", "quantizer": "torch_dynamic"}}}})
    res = run_cli("plan", str(bad), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and "quantizer 'torch_dynamic' writes ops only torch runs" in res.stderr, res.stderr


def test_every_feed_forward_gelu_of_the_estimator_is_quantized_from_its_input(programs: dict) -> None:
    """The estimator's feed-forwards (linear, GELU, dropout, linear) take the second linear's row
    scale from the GELU's input: every GELU of the program goes into an int8_gelu_linear."""
    import torch

    from cosycompile.quantize.torch_dynamic.quantize import int8_gelu_linear, rewrite_linears

    entry = programs["flow_estimator"]
    gelus = [n for n in entry["program"].graph.nodes if n.target is torch.ops.aten.gelu.default]
    assert gelus
    gm = entry["program"].module()
    rewrite_linears(gm, "int8")
    fused = [n for n in gm.graph.nodes if n.target is int8_gelu_linear]
    assert len(fused) == len(gelus)
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.gelu.default]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_a_linear_after_gelu_is_close_to_fp32_on_every_row(approximate: str) -> None:
    """The row scale bounded from the GELU's input holds on rows whose pre-activations are all
    negative (there the GELU's own minimum is the bound) as on ordinary rows."""
    import torch

    from cosycompile.quantize.torch_dynamic.quantize import (int8_gelu_linear, int8_linear, quantize_weight,
                                                             rewrite_linears)

    torch.manual_seed(0)
    ff = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(approximate=approximate), torch.nn.Dropout(0.1),
                             torch.nn.Linear(64, 32)).eval()
    with torch.no_grad():
        # A zero input row: every pre-activation negative, the largest near 0, some at GELU's minimum.
        ff[0].bias.copy_(torch.linspace(-0.8, -0.05, 64))
    x = torch.randn(2, 24, 32) * 2
    x[:, ::3] = 0.0
    gm = torch.export.export(ff, (x,)).module()
    rewrite_linears(gm, "int8")
    assert [n.args[-1] for n in gm.graph.nodes if n.target is int8_gelu_linear] == [approximate]
    with torch.no_grad():
        want, got = ff(x), gm(x)
        # The same two INT8 linears with the scale taken from the GELU's output, for comparison.
        w1, s1 = quantize_weight(ff[0].weight, "int8")
        w2, s2 = quantize_weight(ff[3].weight, "int8")
        plain = int8_linear(ff[1](int8_linear(x, w1, s1, ff[0].bias, 0)), w2, s2, ff[3].bias, 0)
    rel = (want - got).norm(dim=-1) / want.norm(dim=-1)
    rel_plain = (want - plain).norm(dim=-1) / want.norm(dim=-1)
    assert 0 < float(rel[:, ::3].max()) < 0.01, rel[:, ::3]  # all-negative rows
    assert 0 < float(rel.max()) < 0.05 and float(rel.mean()) < 1.25 * float(rel_plain.mean()), (rel, rel_plain)


def test_exp2_of_int8_attention_is_accurate_and_never_above_one() -> None:
    import torch

    from cosycompile.quantize.torch_dynamic.attention import exp2_nonpositive

    y = torch.cat([torch.linspace(-30, 0, 200001), torch.tensor([-1e-7, -0.5, -1.0, -29.999])])
    got = exp2_nonpositive(y).double()
    want = torch.exp2(y.double())
    # A probability step is 1/254: the error stays a small part of one at every value.
    assert float(((got - want) / want).abs().max()) < 1.1e-4
    assert float(exp2_nonpositive(torch.zeros(1))) == 1.0 and float(got.max()) <= 1.0
    # Far below (masked scores) and non-finite: 0, nothing wraps around through the exponent bits.
    far = exp2_nonpositive(torch.tensor([-30.5, -40.0, -200.0, -1e10, float("-inf"), float("nan")]))
    assert torch.equal(far, torch.zeros(6))


def _sdpa(q: Any, k: Any, v: Any, mask: Any) -> Any:
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            attn_mask=mask if mask is None or mask.dtype == torch.bool
                                                            else mask.double()).float()


@pytest.mark.parametrize("mask_kind", ["none", "additive", "boolean", "per-head", "2-D"])
def test_int8_attention_is_close_to_sdpa_and_applies_its_mask(mask_kind: str) -> None:
    import torch

    from cosycompile.quantize.torch_dynamic.attention import int8_attention

    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 37, 16  # a frame count that is not a multiple of 8
    q, k, v = (torch.randn(B, H, T, D, generator=g) * 2 for _ in range(3))
    keep = torch.rand(B, 1, T, T, generator=g) > 0.3
    keep[..., 0] = True  # no row without a key
    mask = {"none": None, "additive": torch.where(keep, 0.0, -1e4), "boolean": keep,
            "per-head": torch.where(keep.expand(B, H, T, T), 0.0, -1e4),
            "2-D": torch.where(keep[0, 0], 0.0, -1e4)}[mask_kind]
    want = _sdpa(q, k, v, mask)
    got = int8_attention(q, k, v, mask, D ** -0.5)
    rel = float((want - got).norm() / want.norm())
    assert got.shape == want.shape and 0 < rel < 0.03, rel
    if mask is not None:
        # The mask is applied: the result is far nearer attention with it than attention without it.
        unmasked = float((_sdpa(q, k, v, None) - got).norm() / want.norm())
        assert unmasked > 10 * rel, (unmasked, rel)


def test_attention_int8_rewrites_every_attention_of_the_estimator(programs: dict, torch_ops_library: Path) -> None:
    """Every attention node of the tiny estimator becomes one ``cosycompile::int8_attention`` call; the
    program re-exports, computes what the composite computes and stays close to FP32."""
    import torch

    from cosycompile.quantize.torch_dynamic.attention import int8_attention, rewrite_attention
    from cosycompile.quantize.torch_dynamic.quantize import Program
    from cosycompile.stages.common import export_program

    entry = programs["flow_estimator"]
    sdpa = [n for n in entry["program"].graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert sdpa
    gm = entry["program"].module()
    done = rewrite_attention(gm)
    assert done == {"int8_attention": len(sdpa), "kept_fp32": {}}
    program, _ = export_program(Program(gm), entry["spec"], entry["info"])
    counts = _call_counts(program)
    assert counts["cosycompile.int8_attention.default"] == len(sdpa) and counts["aten._int_mm.default"] == 0
    assert not [n for n in program.graph.nodes if "scaled_dot_product" in str(n.target)]
    # The estimator's padding mask, repeated over the query rows, reaches the operator unrepeated.
    masks = [n.args[3].meta["val"].shape for n in program.graph.nodes if "int8_attention" in str(n.target)]
    assert all(len(m) == 4 and m[2] == 1 for m in masks), masks
    rsub = [n for n in entry["program"].graph.nodes if n.target is torch.ops.aten.rsub.Scalar]
    assert rsub and len(program.graph.find_nodes(op="call_function", target=torch.ops.aten.rsub.Scalar)) == len(rsub)
    composite = entry["program"].module()
    for node in composite.graph.nodes:  # the same rewrite onto the ATen composite, for reference
        if node.target is torch.ops.aten.scaled_dot_product_attention.default:
            node.target = _sdpa_as(int8_attention)
    composite.recompile()
    with torch.no_grad():
        want = _first(entry["program"].module()(*entry["inputs"]))
        got = _first(program.module()(*entry["inputs"]))
        same_arithmetic = _first(composite(*entry["inputs"]))
    assert 0 < float((want - got).norm() / want.norm()) < 0.01
    torch.testing.assert_close(got, same_arithmetic, rtol=1e-4, atol=1e-5)


def _sdpa_as(fn):
    """``scaled_dot_product_attention``'s calling convention onto ``fn(q, k, v, mask, scale)``."""
    def call(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return fn(q, k, v, attn_mask, q.shape[-1] ** -0.5 if scale is None else scale)
    return call


def test_attention_int8_keeps_causal_attention() -> None:
    import torch

    from cosycompile.quantize.torch_dynamic.attention import rewrite_attention

    class Causal(torch.nn.Module):
        def forward(self, q: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    gm = torch.export.export(Causal(), (torch.randn(1, 2, 8, 4),)).module()
    done = rewrite_attention(gm)
    assert done["int8_attention"] == 0 and list(done["kept_fp32"].values()) == ["dropout, is_causal or enable_gqa set"]


def test_attention_int8_rewrites_attention_whose_batch_and_heads_vary(torch_ops_library: Path) -> None:
    """The operator loops over batch and heads itself, so a program exported with both dynamic is
    rewritten too, and computes the composite's arithmetic at every size it is called with."""
    import torch

    from cosycompile.quantize.torch_dynamic.attention import int8_attention, rewrite_attention

    class Attend(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    dims = {"q": {0: torch.export.Dim("b"), 1: torch.export.Dim("h")}}
    dims["k"] = dims["v"] = dims["q"]
    gm = torch.export.export(Attend(), tuple(torch.randn(2, 3, 8, 16) for _ in range(3)), dynamic_shapes=dims).module()
    assert rewrite_attention(gm) == {"int8_attention": 1, "kept_fp32": {}}
    gen = torch.Generator().manual_seed(5)
    for B, H in ((1, 2), (3, 5)):
        q, k, v = (torch.randn(B, H, 8, 16, generator=gen) for _ in range(3))
        torch.testing.assert_close(gm(q, k, v), int8_attention(q, k, v, None, 0.25), rtol=1e-4, atol=1e-5)


def _padding_masked(mix: bool) -> Any:
    """Attention under a padding mask [B, 1, S] repeated over the query rows and made additive, as the
    flow estimator builds it; ``mix`` puts an op that is not elementwise after the repeat."""
    import torch

    class PaddingMasked(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any, keep: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_repeated_mask(keep, q.shape[2], mix))

    return PaddingMasked()


def _repeated_mask(keep: Any, T: int, mix: bool) -> Any:
    import torch

    rows = keep.bool().expand(-1, T, -1)
    if mix:  # and each query row also attends to no key before it
        rows = rows & torch.ones(T, T, dtype=torch.bool).triu()
    return ((1.0 - rows.to(torch.float32)) * -1.0e10).unsqueeze(1)


@pytest.mark.parametrize("mix", [False, True])
def test_attention_int8_takes_a_repeated_mask_before_its_repeat(torch_ops_library: Path, mix: bool) -> None:
    """A mask that is an expand followed by elementwise ops reaches the operator as the tensor before
    the expand ([B, 1, 1, S]), and the output is bit-identical to the repeated mask's; a mask with any
    other op after the expand is passed as it is."""
    import torch

    from cosycompile.quantize.torch_dynamic.attention import rewrite_attention

    gen = torch.Generator().manual_seed(6)
    B, H, T, D = 2, 3, 11, 16
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    keep = torch.ones(B, 1, T)
    keep[1, :, 7:] = 0  # the second item is padded
    gm = torch.export.export(_padding_masked(mix), (q, k, v, keep)).module()
    assert rewrite_attention(gm) == {"int8_attention": 1, "kept_fp32": {}}
    program = torch.export.export(gm, (q, k, v, keep))
    (op,) = [n for n in program.graph.nodes if "int8_attention" in str(n.target)]
    assert tuple(op.args[3].meta["val"].shape) == ((B, 1, T, T) if mix else (B, 1, 1, T))
    with torch.no_grad():
        repeated = _repeated_mask(keep, T, mix).contiguous()
        want = torch.ops.cosycompile.int8_attention(q, k, v, repeated, D ** -0.5)
        got = program.module()(q, k, v, keep)
    assert torch.equal(got, want)
    assert float(got[1].abs().max()) > 0.1


def test_attention_int8_for_a_gpu_target_is_one_line(tmp_path: Path) -> None:
    recipe = _flow_only(tmp_path, {"format": "int8", "attention": "int8"}, target="h100")
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "quantize", "-q")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
    assert "stages.flow.quantize.attention: int8 runs on CPU targets only" in res.stderr, res.stderr
    # Refused when the recipe is read: no step ran, so nothing sits in the cache.
    assert not list((tmp_path / "art").rglob("entry.json"))
