"""The ``<stage>.quantize`` step of ``torch_dynamic``: program -> program with quantized linears."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import torch

from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.runtime.host import int8_matmul_is_vectorized
from cosycompile.runtime.torch_ops import build_library, load_library
from cosycompile.runtime.torch_programs import load_program, save_program
from cosycompile.errors import RecipeError
from cosycompile.quantize.graphs import quantizable_graphs, rewrite_graphs
from cosycompile.quantize.torch_dynamic.attention import node_arg, rewrite_attention
from cosycompile.quantize.torch_dynamic.convolutions import NO_NATIVE_BF16, bf16_products_are_native, rewrite_convolutions
from cosycompile.quantize.torch_dynamic.fx import drop_unread, get_attr

SCALAR_INT8_MATMUL = ("this CPU has no AVX512-VNNI, and torch._int_mm is vectorized only with it (PyTorch runs a "
                      "scalar loop otherwise), so INT8 torch programs run their products several times slower than "
                      "FP32 here; on this CPU use ONNX Runtime's INT8 (recipes cpu-int8, cpu-fast) or the FP32 torch "
                      "packages (cpu-torch), and for an LLM the quantizer's kernel: cosycompile")


def products_crawl_here(kernel: str, flags: set[str] | None = None) -> bool:
    """Whether an INT8 CPU program through ``kernel`` runs its products as a scalar loop on this CPU
    (``flags``: :func:`cosycompile.runtime.host.cpu_flags`). The project's operator never does: its
    kernels are AVX512-VNNI or AVX2 passes over the weights, and an FP32 GEMM of the same integers where
    torch._int_mm is not vectorized."""
    return kernel == "int_mm" and not int8_matmul_is_vectorized(flags)


# CUDA's INT8 GEMM needs more than 16 rows; GPU programs pad every call by this many zero rows.
CUDA_INT8_PAD_ROWS = 16
# Inner and outer sizes must be multiples of these for the CUDA kernels (cuBLASLt IMMA / FP8).
ALIGN = {"int8": 8, "fp8": 16}
FP8_MAX = 448.0  # largest finite float8_e4m3fn


# GELU is never below this: its minimum, near y = -0.75, is -0.16997 exact and -0.17004 with tanh.
GELU_MIN = -0.1701


def int8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                pad_rows: int) -> torch.Tensor:
    """``linear(x, w, bias)`` with w = w_q * w_scale (per output channel) and x quantized per row."""
    x2 = x.reshape(-1, x.shape[-1])
    x_scale = x2.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
    return _int8_product(x2, x_scale, w_q, w_scale, bias, pad_rows).reshape(*x.shape[:-1], w_q.shape[0])


def int8_gelu_linear(y: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                     pad_rows: int, approximate: str) -> torch.Tensor:
    """``linear(gelu(y), w, bias)`` as :func:`int8_linear`, with the row scale bounded from y.

    gelu(y) lies in [GELU_MIN, max(y, 0)], so max(max y, -GELU_MIN) bounds a row's range without
    computing the GELU; the quantizing pass then computes it once. A scale from gelu(y) itself makes
    Inductor compute it twice, once for the range and once to quantize, and the exact GELU's erf was
    most of the feed-forward's time outside its two products.
    """
    y2 = y.reshape(-1, y.shape[-1])
    x_scale = y2.amax(dim=1, keepdim=True).clamp(min=-GELU_MIN) / 127.0
    x2 = torch.nn.functional.gelu(y2, approximate=approximate)
    return _int8_product(x2, x_scale, w_q, w_scale, bias, pad_rows).reshape(*y.shape[:-1], w_q.shape[0])


def _int8_product(x2: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  bias: torch.Tensor | None, pad_rows: int) -> torch.Tensor:
    """x2 [M, K] quantized with its row scales (no row beyond its scale's range), times the INT8 weight."""
    x_q = torch.round(x2 / x_scale).clamp(-127, 127).to(torch.int8)
    if pad_rows:
        x_q = torch.nn.functional.pad(x_q, (0, 0, 0, pad_rows))
    acc = torch._int_mm(x_q, w_q.t())  # w_q.t() is the column-major view cuBLASLt wants
    if pad_rows:
        acc = acc[: x2.shape[0]]
    out = acc.to(torch.float32) * x_scale * w_scale
    return out if bias is None else out + bias


def fp8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
               pad_rows: int) -> torch.Tensor:
    """``linear(x, w, bias)`` with w = w_q * w_scale (FP8 E4M3, one scale) and x quantized per tensor."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    x_scale = (x2.abs().amax().clamp(min=1e-12) / FP8_MAX).to(torch.float32)
    x_q = (x2 / x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    y = torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=torch.float32)
    if bias is not None:
        y = y + bias
    return y.reshape(*shape[:-1], w_q.shape[0])


def quantize_weight(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(quantized weight [N, K], its scale): INT8 per output channel, FP8 E4M3 per tensor."""
    w = weight.detach().float()
    if fmt == "int8":
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale
    scale = w.abs().amax().clamp(min=1e-12) / FP8_MAX
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


LINEARS: dict[str, Callable[..., torch.Tensor]] = {"int8": int8_linear, "fp8": fp8_linear}


def rewrite_linears(gm: torch.fx.GraphModule, fmt: str, pad_rows: int = 0,
                    keep_fp32: list[str] | tuple[str, ...] = (), kernel: str = "int_mm",
                    aligned: bool = True) -> dict[str, Any]:
    """Replace, in place, every ``aten.linear`` of ``gm`` whose weight is a constant with the quantized
    linear of ``fmt`` (INT8 through ``kernel``: ``int_mm`` or ``cosycompile``, whose operator must be
    loaded); the FP32 weights no node reads any more are dropped. With ``aligned`` (CUDA's kernels),
    a linear whose sizes are not multiples of ``ALIGN[fmt]`` stays FP32. Returns what was done."""
    own_op = fmt == "int8" and kernel == "cosycompile"
    graph = gm.graph
    done: dict[str, str] = {}  # FP32 weight -> prefix of its quantized buffers (shared weights once)
    kept: dict[str, str] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
            continue
        x, w = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else None
        if not isinstance(w, torch.fx.Node) or w.op != "get_attr":
            continue
        weight = get_attr(gm, w.target)
        n, k = weight.shape
        if any(re.search(p, w.target) for p in keep_fp32):
            kept[w.target] = "keep_fp32"
            continue
        if aligned and (n % ALIGN[fmt] or k % ALIGN[fmt]):
            kept[w.target] = f"{n}x{k} not a multiple of {ALIGN[fmt]}"
            continue
        if w.target not in done:
            q, scale = quantize_weight(weight, fmt)
            prefix = "q_" + re.sub(r"\W", "_", w.target)
            gm.register_buffer(f"{prefix}_w", q)
            gm.register_buffer(f"{prefix}_scale", scale)
            done[w.target] = prefix
        prefix = done[w.target]
        with graph.inserting_before(node):
            qw, qs = graph.get_attr(f"{prefix}_w"), graph.get_attr(f"{prefix}_scale")
            gelu = _gelu_before(x) if fmt == "int8" and not own_op else None
            if own_op:
                new = graph.call_function(torch.ops.cosycompile.int8_linear.default, (x, qw, qs, bias))
            elif gelu is not None:
                approximate = node_arg(gelu, 1, "approximate", "none")
                new = graph.call_function(int8_gelu_linear, (gelu.args[0], qw, qs, bias, pad_rows, approximate))
            else:
                new = graph.call_function(LINEARS[fmt], (x, qw, qs, bias, pad_rows))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    # Dropout counts as impure to FX; in eval mode it is not, and a GELU folded into the linear after
    # it would otherwise stay in the graph through it.
    graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure() and not _eval_dropout(n))
    drop_unread(gm, set(done))
    gm.recompile()
    return {"quantized_linears": len(done), "kept_fp32": kept}


def _gelu_before(node: Any) -> torch.fx.Node | None:
    """The ``aten.gelu`` node that produces ``node``, looking through dropout in eval mode (an exported
    feed-forward keeps its ``dropout(p, train=False)``), else None."""
    while isinstance(node, torch.fx.Node) and _eval_dropout(node):
        node = node.args[0]
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is torch.ops.aten.gelu.default:
        return node
    return None


def _eval_dropout(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch.ops.aten.dropout.default \
        and not node_arg(node, 2, "train", True)


def quantize(ctx: StepContext) -> dict[str, Any]:
    """Rewrite the linears (and, with ``attention: int8``, the attention; with ``convolutions: bf16``,
    the convolutions) of each chosen program; the other programs are linked through."""
    from cosycompile.stages import get_stage
    from cosycompile.stages.common import export_program

    s, stage = ctx.spec, ctx.params["stage"]
    on_gpu = ctx.params.get("target_kind") == "gpu"
    pad_rows = CUDA_INT8_PAD_ROWS if s.format == "int8" and on_gpu else 0

    if s.kernel == "cosycompile" or s.attention == "int8":
        # The operators, beside the programs that call them: load_program registers them from there,
        # and the torch backend links them into the engine dir.
        load_library(build_library(ctx.out))

    def one(name: str, src: GraphsDir, dst: Path) -> dict[str, Any]:
        gm = load_program(src.graph_path(name)).module()
        # The CPU's INT8 products (torch._int_mm, the operator) take any size; FP8 is CUDA's only.
        result = rewrite_linears(gm, s.format, pad_rows, list(s.keep_fp32), s.kernel,
                                 aligned=on_gpu or s.format != "int8")
        ctx.log(f"{name}: {result['quantized_linears']} linears to {s.format}, {len(result['kept_fp32'])} kept FP32")
        if s.attention == "int8":
            result["attention"] = rewrite_attention(gm)
            ctx.log(f"{name}: {result['attention']['int8_attention']} attention nodes to int8, "
                    f"{len(result['attention']['kept_fp32'])} kept FP32")
        if s.convolutions == "bf16":
            result.update(rewrite_convolutions(gm, list(s.keep_fp32)))
            ctx.log(f"{name}: {result['bf16_convolutions']} convolutions to bf16")
        program, _ = export_program(Program(gm), get_stage(stage).graph(name), src.info)
        save_program(program, dst)
        return result

    # The LLM marks no graph quantizable: then its one program, the decode step.
    chosen = list(s.graphs) if s.graphs is not None else (quantizable_graphs(stage) or None)
    meta = rewrite_graphs(ctx, s.format, chosen, one)
    matched = {w for r in meta["quantized"].values() for w, why in r["kept_fp32"].items() if why == "keep_fp32"}
    matched |= {w for r in meta["quantized"].values() for w in r.get("convolutions_kept_fp32", ())}
    unmatched = [p for p in s.keep_fp32 if not any(re.search(p, w) for w in matched)]
    if unmatched:
        what = "linear or convolution" if s.convolutions == "bf16" else "linear"
        raise RecipeError(f"stages.{stage}.quantize.keep_fp32: {unmatched[0]!r} matches no {what} weight of "
                          f"{', '.join(meta['quantized'])}")
    # A CPU engine is compiled for, validated and mostly served on the machine that builds it, so the
    # build says so before any compile when its INT8 products will crawl here.
    if s.format == "int8" and not on_gpu:
        vectorized = not products_crawl_here(s.kernel)
        if not vectorized:
            ctx.reporter.warn(f"{ctx.name}: {SCALAR_INT8_MATMUL}")
        meta["build_host_int8_matmul"] = "vectorized" if vectorized else "scalar"
    if s.convolutions == "bf16" and not on_gpu and not bf16_products_are_native():
        ctx.reporter.warn(f"{ctx.name}: {NO_NATIVE_BF16}")
    return meta


class Program(torch.nn.Module):
    """A rewritten program module behind a plain ``forward(*args)`` for ``torch.export``."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: torch.Tensor) -> Any:
        return self.inner(*args)
