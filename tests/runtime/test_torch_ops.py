"""cosycompile's own torch operators (runtime/torch_ops): the C++ library builds, computes what the
torch_dynamic composite it replaces computes, for every row count and shape edge, and is written
whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosycompile.errors import UserError


@pytest.mark.parametrize("shape", [(1, 896), (1, 1, 896), (2, 1, 896), (3, 896), (4, 896), (5, 896), (2, 17, 896),
                                   (0, 896), (1, 100), (4, 4864), (8, 896), (9, 896), (2, 4, 4864)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_int8_linear_computes_what_the_int_mm_composite_computes(torch_ops_library: Path, shape: tuple[int, ...],
                                                                  with_bias: bool) -> None:
    """Up to 8 rows take the VNNI pass over the weights (where the CPU has AVX512-VNNI), more rows
    torch._int_mm; K not a multiple of 64 and N not a multiple of 4 take the kernels' tails. The
    products are the same integers, so only the float rescale's rounding may differ."""
    import torch

    from cosycompile.quantize.torch_dynamic.quantize import int8_linear, quantize_weight

    gen = torch.Generator().manual_seed(sum(shape) + with_bias)
    K = shape[-1]
    N = 1154 if K == 4864 else 9730  # not a multiple of 4
    w_q, w_scale = quantize_weight(0.02 * torch.randn(N, K, generator=gen), "int8")
    bias = torch.randn(N, generator=gen) if with_bias else None
    x = torch.randn(*shape, generator=gen)
    want = int8_linear(x, w_q, w_scale, bias, 0)
    got = torch.ops.cosycompile.int8_linear(x, w_q, w_scale, bias)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if want.numel():
        assert float(want.abs().max()) > 0.1  # a real product, not zeros on both sides


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
