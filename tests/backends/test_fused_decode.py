"""The fused Triton decode kernels (``backends/torch/fused_decode.py``), run by Triton's CPU
interpreter against ``LLMStaticStep`` on the tiny LM: FP32 weights must give the static step's
logits and cache, the reduced formats its logits' direction. The interpreter's Triton lives in its
own folder (``make install`` puts it in ``.venv/triton-interpreter``) so that the venv's PyTorch
never imports it. The interpreter's run (over a minute) is the extended tier's (`make test-extended`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TRITON_DIR = Path(sys.prefix) / "triton-interpreter"


@pytest.fixture(scope="module")
def results() -> list[dict]:
    if not (TRITON_DIR / "triton").is_dir():
        pytest.fail(f"no interpreter Triton in {TRITON_DIR}: run `make install`")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(TRITON_DIR), str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("fused_decode_interp.py"))],
                          capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.extended
def test_fp32_weights_give_the_static_steps_logits_and_cache(results: list[dict]) -> None:
    exact = [r for r in results if r["weights"] == "fp32"]
    assert {(r["batch"], r["past"], r.get("split", False), r.get("fused", False)) for r in exact} == {
        (1, 7, False, False), (2, 9, False, False), (1, 3, False, False), (2, 5, True, False), (1, 7, False, True),
        (2, 5, False, True)}
    for r in exact:
        assert r["finite"]
        assert r["max_relative"] < 1e-5, r
        assert r["cache_relative"] < 1e-5, r


@pytest.mark.extended
@pytest.mark.parametrize("weights, cosine", [("bf16", 0.999), ("int8", 0.995), ("fp8", 0.99)])
def test_reduced_weights_keep_the_logits_direction(results: list[dict], weights: str, cosine: float) -> None:
    rows = [r for r in results if r["weights"] == weights]
    # Once through five kernels a layer, once through the fused three (quantized down_proj transposed).
    assert sorted(r.get("fused", False) for r in rows) == [False, True]
    for r in rows:
        assert r["finite"]
        assert r["min_cosine"] > cosine, r
        # A reduced format that came out equal to FP32 would mean its weights were never converted.
        assert r["max_relative"] > 1e-6, r


@pytest.mark.parametrize("tiling, message", [("qkv_pairs=32", "rotary pairs per program (32)"),
                                             ("down_k=96", "powers of two (down_k=96)"),
                                             ("down_split=0", "at least 1 (down_split=0)"),
                                             ("mlp_rows=24, mlp_sub=16", "mlp_rows (24) must be a multiple of mlp_sub (16)")])
def test_a_tiling_the_kernels_cannot_run_is_refused(tiling: str, message: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(TRITON_DIR), str(REPO), os.environ.get("PYTHONPATH", "")])}
    code = ("import torch\n"
            "from cosycompile.backends.torch.fused_decode import FusedDecodeStep, Tiling\n"
            "from cosycompile.families.cosyvoice2.config import PRESETS\n"
            "from cosycompile.families.cosyvoice2.qwen2lm import Qwen2LM\n"
            "from cosycompile.families.qwen2_steps import LLMStaticStep\n"
            "step = LLMStaticStep(Qwen2LM(PRESETS['tiny'].llm).eval())\n"
            f"try:\n    FusedDecodeStep(step, 'bf16', Tiling({tiling}))\nexcept ValueError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert message in done.stdout


def _interp_module() -> Any:
    """The interpreter check's module (``fused_decode_interp.py``), imported here to run on CUDA."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fused_decode_interp", Path(__file__).with_name("fused_decode_interp.py"))
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check


@pytest.mark.gpu
def test_compiled_kernels_in_a_cuda_graph_match_the_static_step() -> None:
    """On a CUDA machine (``make test-gpu``), the kernels compiled by the machine's own Triton and
    replayed as a CUDA graph: the same limits as the interpreter's, at batch 1 and 8 and a longer past."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    check = _interp_module()
    from cosycompile.backends.torch.fused_decode import Tiling

    for batch, past in ((1, 7), (8, 130)):
        r = check.run("fp32", batch, past, 6, Tiling(), "cuda")
        assert r["finite"] and r["max_relative"] < 1e-5 and r["cache_relative"] < 1e-5, r
    for weights, cosine in (("bf16", 0.999), ("int8", 0.995), ("fp8", 0.99)):
        r = check.run(weights, 1, 7, 4, Tiling(), "cuda")
        assert r["finite"] and r["min_cosine"] > cosine and r["max_relative"] > 1e-6, r


@pytest.mark.gpu
def test_split_reductions_and_dependent_launches_in_a_cuda_graph_match_the_static_step() -> None:
    """Split o/down reductions (atomic adds) and programmatic dependent launches (Hopper on): a kernel
    that read its predecessor's output before waiting for it would show as a logit error."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("no CUDA device of compute capability 9.0 or later")
    check = _interp_module()
    from cosycompile.backends.torch.fused_decode import Tiling

    for tiling in (Tiling(o_split=2, down_split=3, down_k=32), Tiling(pdl=True),
                   Tiling(o_split=2, down_split=3, down_k=32, pdl=True)):
        for batch, past in ((1, 7), (8, 130)):
            r = check.run("fp32", batch, past, 6, tiling, "cuda")
            assert r["finite"] and r["max_relative"] < 1e-5 and r["cache_relative"] < 1e-5, (tiling, r)


@pytest.mark.gpu
def test_fused_attention_o_and_mlp_in_a_cuda_graph_match_the_static_step() -> None:
    """Three launches a layer (attention with o_proj, the MLP with down_proj, both adding atomically),
    plain and as programmatic dependent launches: the fused MLP's output buffer, cleared by the q/k/v
    kernel, must hold the whole residual when the next layer reads it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("no CUDA device of compute capability 9.0 or later")
    check = _interp_module()
    from cosycompile.backends.torch.fused_decode import Tiling

    for tiling in (Tiling(fuse_o=True, fuse_mlp=True), Tiling(fuse_o=True, fuse_o_rows=32, fuse_mlp=True, mlp_rows=64,
                                                            mlp_sub=16, pdl=True)):
        for batch, past in ((1, 7), (8, 130)):
            r = check.run("fp32", batch, past, 6, tiling, "cuda")
            assert r["finite"] and r["max_relative"] < 1e-5 and r["cache_relative"] < 1e-5, (tiling, r)
    for weights, cosine in (("bf16", 0.999), ("int8", 0.995), ("fp8", 0.99)):
        r = check.run(weights, 1, 7, 4, Tiling(fuse_o=True, fuse_mlp=True, pdl=True), "cuda")
        assert r["finite"] and r["min_cosine"] > cosine and r["max_relative"] > 1e-6, r
