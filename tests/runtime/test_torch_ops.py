"""cosycompile's own torch operators (runtime/torch_ops): the C++ library builds, computes what the
torch_dynamic composite it replaces computes, for every row count and shape edge, and is written
whole or not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cosycompile.errors import UserError


KERNELS = ("vnni", "avx2", "int_mm", "fp32")


@pytest.mark.parametrize("shape", [(1, 896), (1, 1, 896), (2, 1, 896), (3, 896), (4, 896), (5, 896), (2, 17, 896),
                                   (0, 896), (1, 100), (4, 4864), (8, 896), (9, 896), (2, 4, 4864)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("kernel", ["chosen", *KERNELS])
def test_int8_linear_computes_what_the_int_mm_composite_computes(torch_ops_library: Path, shape: tuple[int, ...],
                                                                  with_bias: bool, kernel: str) -> None:
    """Every kernel this CPU can run, and the one the operator picks by row count (up to 8 rows a pass over
    the weights, more a blocked GEMM), against the composite; K not a multiple of 64 or 32 and N not a
    multiple of 4 take the kernels' tails. The products are the same integers, so only the float
    rescale's rounding may differ."""
    import torch

    from cosycompile.quantize.torch_dynamic.quantize import int8_linear, quantize_weight

    if kernel != "chosen" and kernel not in torch.ops.cosycompile.int8_linear_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    gen = torch.Generator().manual_seed(sum(shape) + with_bias)
    K = shape[-1]
    N = 1154 if K == 4864 else 9730  # not a multiple of 4
    w_q, w_scale = quantize_weight(0.02 * torch.randn(N, K, generator=gen), "int8")
    bias = torch.randn(N, generator=gen) if with_bias else None
    x = torch.randn(*shape, generator=gen)
    want = int8_linear(x, w_q, w_scale, bias, 0)
    got = (torch.ops.cosycompile.int8_linear(x, w_q, w_scale, bias) if kernel == "chosen" else
           torch.ops.cosycompile.int8_linear_with(x, w_q, w_scale, bias, kernel))
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if want.numel():
        assert float(want.abs().max()) > 0.1  # a real product, not zeros on both sides


def test_every_x86_cpu_in_use_runs_a_vectorized_pass_over_the_weights(torch_ops_library: Path) -> None:
    """The kernels list follows the CPU's flags: a one-row product never lands on torch._int_mm's scalar
    loop where the CPU has AVX2 (every x86-64 CPU of the last decade)."""
    import torch

    from cosycompile.runtime.host import cpu_flags

    kernels = torch.ops.cosycompile.int8_linear_kernels()
    flags = cpu_flags()
    assert ("vnni" in kernels) == ({"avx512f", "avx512bw", "avx512_vnni"} <= flags)
    assert ("avx2" in kernels) == ("avx2" in flags)
    assert {"int_mm", "fp32"} <= set(kernels)


def test_a_kernel_this_cpu_lacks_or_that_does_not_exist_is_refused(torch_ops_library: Path) -> None:
    import torch

    x, w_q, w_scale = torch.zeros(1, 64), torch.zeros(8, 64, dtype=torch.int8), torch.ones(8)
    with pytest.raises(RuntimeError, match="no kernel avx3"):
        torch.ops.cosycompile.int8_linear_with(x, w_q, w_scale, None, "avx3")
    missing = [k for k in KERNELS if k not in torch.ops.cosycompile.int8_linear_kernels()]
    for kernel in missing:
        with pytest.raises(RuntimeError, match=f"cannot run kernel {kernel}"):
            torch.ops.cosycompile.int8_linear_with(x, w_q, w_scale, None, kernel)


def test_int8_linear_rejects_mismatched_inputs_with_one_line(torch_ops_library: Path) -> None:
    import torch

    w_q = torch.zeros(8, 64, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="x has 32 features and w_q 64"):
        torch.ops.cosycompile.int8_linear(torch.zeros(1, 32), w_q, torch.ones(8), None)
    with pytest.raises(RuntimeError, match="w_q must be a 2-D int8 tensor"):
        torch.ops.cosycompile.int8_linear(torch.zeros(1, 64), w_q.float(), torch.ones(8), None)


def test_the_same_library_loads_once_and_another_is_refused(torch_ops_library: Path, tmp_path: Path) -> None:
    from cosycompile.runtime.torch_ops import library_in, load_library

    load_library(torch_ops_library)  # again: nothing happens
    other = tmp_path / "libcosycompile_ops-0000000000000000.so"
    other.write_bytes(torch_ops_library.read_bytes())
    with pytest.raises(UserError, match="built from other code"):
        load_library(other)
    assert library_in(tmp_path) == other and library_in(tmp_path / "nothing") is None


@pytest.mark.parametrize(("compiler", "says"), [("false", "failed"), ("no-such-compiler-here", r"no C\+\+ compiler")])
def test_a_failed_compile_is_one_line_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         compiler: str, says: str) -> None:
    from cosycompile.runtime.torch_ops import build_library

    monkeypatch.setenv("CXX", compiler)
    dest = tmp_path / "lib"
    with pytest.raises(UserError, match=says) as err:
        build_library(dest)
    assert "\n" not in str(err.value)
    assert not dest.exists() or not any(dest.iterdir())


ATTENTION_KERNELS = ("vnni", "portable", "amx")
# [B, H, T, S, D]: the estimator's heads; a key count that is no multiple of 16 or 4 and a head size
# that is no multiple of 16 or 4 (the packed layouts' padding); 1 to 7 query rows past a block of 8;
# D = 128 (two passes of four channel vectors in P.V); one query and one key. For the AMX kernel: 13
# blocks of keys (two rounds of its six result tiles and one left over) and a last tile of 4 query rows.
ATTENTION_SHAPES = [(2, 8, 61, 61, 64), (1, 2, 37, 53, 40), (2, 3, 13, 17, 7), (1, 1, 9, 130, 128), (1, 1, 1, 1, 64),
                    (1, 2, 20, 200, 64)]


def _mask(kind: str, B: int, H: int, T: int, S: int, gen: Any) -> Any:
    import torch

    if kind == "none":
        return None
    if kind == "additive":  # padding-style: -inf on a fifth of the pairs, every row keeps one key
        m = torch.where(torch.rand(B, 1, T, S, generator=gen) > 0.2, 0.0, float("-inf"))
        m[..., 0] = 0.0
        return m
    if kind == "boolean per head":
        m = torch.rand(1, H, 1, S, generator=gen) > 0.3
        m[..., 0] = True
        return m
    return torch.randn(T, S, generator=gen)  # a 2-D float bias


@pytest.mark.parametrize("shape", ATTENTION_SHAPES)
@pytest.mark.parametrize("mask_kind", ["none", "additive", "boolean per head", "bias"])
@pytest.mark.parametrize("kernel", ["chosen", *ATTENTION_KERNELS])
def test_int8_attention_computes_what_the_composite_computes(torch_ops_library: Path, shape: tuple[int, ...],
                                                             mask_kind: str, kernel: str) -> None:
    """Every kernel this CPU can run, and the one the operator picks, against torch_dynamic's ATen
    composite: the same quantization, products and base-2 softmax, so only the order of the float sum
    that normalises a row may differ; and, as a check that both compute attention, near FP32 SDPA."""
    import torch

    from cosycompile.quantize.torch_dynamic.attention import int8_attention

    if kernel != "chosen" and kernel not in torch.ops.cosycompile.int8_attention_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    B, H, T, S, D = shape
    gen = torch.Generator().manual_seed(sum(shape) + len(mask_kind))
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for n in (T, S, S))
    mask = _mask(mask_kind, B, H, T, S, gen)
    scale = D ** -0.5
    want = int8_attention(q, k, v, mask, scale)
    got = (torch.ops.cosycompile.int8_attention(q, k, v, mask, scale) if kernel == "chosen" else
           torch.ops.cosycompile.int8_attention_with(q, k, v, mask, scale, kernel))
    assert got.shape == want.shape == (B, H, T, D) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    assert float((got - exact).abs().max()) < 0.1 * float(exact.abs().max())


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_int8_attention_reads_heads_where_a_projection_left_them(torch_ops_library: Path, kernel: str) -> None:
    """q, k and v as the estimator hands them over: [B, T, H*D] projections viewed as [B, H, T, D]
    (rows H*D apart, heads D apart), and one sliced out of a fused QKV projection, and a tensor whose
    channels are not contiguous. Each gives what the same values contiguous give."""
    import torch

    if kernel not in torch.ops.cosycompile.int8_attention_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    B, H, T, S, D = 2, 3, 19, 23, 40
    gen = torch.Generator().manual_seed(7)

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(B, x.shape[1], H, D).transpose(1, 2)

    q = heads(torch.randn(B, T, H * D, generator=gen))
    kv = torch.randn(B, S, 2 * H * D, generator=gen)
    k, v = heads(kv[..., : H * D]), heads(kv[..., H * D:])
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    mask = torch.randn(T, S, generator=gen)
    for args in ((q, k, v), (q, k, v.transpose(2, 3).contiguous().transpose(2, 3))):
        got = torch.ops.cosycompile.int8_attention_with(*args, mask, D ** -0.5, kernel)
        want = torch.ops.cosycompile.int8_attention_with(q.contiguous(), k.contiguous(), v.contiguous(), mask,
                                                         D ** -0.5, kernel)
        assert torch.equal(got, want)


def test_int8_attention_of_a_row_with_every_key_masked_is_zero_as_sdpa(torch_ops_library: Path) -> None:
    import torch

    from cosycompile.quantize.torch_dynamic.attention import int8_attention

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=gen) for _ in range(3))
    mask = torch.ones(20, 20, dtype=torch.bool)
    mask[5] = False
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(want[:, :, 5], torch.zeros(1, 2, 16))
    for got in (int8_attention(q, k, v, mask, 0.25),
                *(torch.ops.cosycompile.int8_attention_with(q, k, v, mask, 0.25, kernel)
                  for kernel in torch.ops.cosycompile.int8_attention_kernels())):
        assert torch.equal(got[:, :, 5], want[:, :, 5])
        assert float((got - want).abs().max()) < 0.1 * float(want.abs().max())


def test_int8_attention_kernels_follow_the_cpu_and_a_wrong_one_is_refused(torch_ops_library: Path) -> None:
    import torch

    from cosycompile.runtime.host import cpu_flags

    kernels = torch.ops.cosycompile.int8_attention_kernels()
    assert ("vnni" in kernels) == ({"avx512f", "avx512bw", "avx512dq", "avx512_vnni"} <= cpu_flags()) and "portable" in kernels
    # AMX also needs Linux's permission (arch_prctl), so its flags are necessary, not sufficient.
    assert "amx" not in kernels or {"amx_tile", "amx_int8", "avx512_vnni"} <= cpu_flags()
    q = torch.zeros(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="no kernel avx3"):
        torch.ops.cosycompile.int8_attention_with(q, q, q, None, 0.25, "avx3")
    for kernel in (k for k in ATTENTION_KERNELS if k not in kernels):
        with pytest.raises(RuntimeError, match=f"cannot run kernel {kernel}"):
            torch.ops.cosycompile.int8_attention_with(q, q, q, None, 0.25, kernel)
    with pytest.raises(RuntimeError, match="must be 4-D"):
        torch.ops.cosycompile.int8_attention(q[0], q[0], q[0], None, 0.25)
    with pytest.raises(RuntimeError, match="with q's B, H and D"):
        torch.ops.cosycompile.int8_attention(q, torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8), None, 0.25)
