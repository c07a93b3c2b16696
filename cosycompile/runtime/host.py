"""The machine a speed figure was taken on: CPU model, vCPUs and the instruction sets that decide
which kernels run.

The same recipe's end-to-end RTF on ``builtin:random-0.5b`` differed widely between a Zen 5 EPYC,
a Zen 4 one and a Xeon with AMX (docs/bench-log/2026-11-25-cpu-fast-zen5.md), all labelled "AMD
EPYC" or "Intel Xeon Processor" by a 2-vCPU VM, so a report names the family, model and ISA flags
as well.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

# Flags that change which GEMM / attention kernels ONNX Runtime, oneDNN and Inductor pick.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8")


def _cpuinfo(path: Path) -> dict[str, str]:
    """The first processor block of ``/proc/cpuinfo`` as key -> value ({} where unreadable)."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> set[str]:
    """Every CPU flag the kernel reports (empty off Linux)."""
    return set(_cpuinfo(path).get("flags", "").split())


def int8_matmul_is_vectorized(flags: set[str] | None = None) -> bool:
    """Whether ``torch._int_mm`` has a vectorized kernel on this CPU (``flags``: :func:`cpu_flags`).

    PyTorch's CPU ``_int_mm`` hands the product to oneDNN only where ``at::cpu::is_avx512_vnni_supported()``
    holds, and otherwise runs a scalar triple loop (``_int_mm_out_cpu`` in
    aten/src/ATen/native/LinearAlgebra.cpp, pytorch/pytorch at 00076d21ed6c). On an AVX2-only CPU the
    INT8 programs of the ``torch_dynamic`` quantizer are then many times slower than their FP32 programs
    (docs/bench-log/2026-12-02-zen3-int8-products-and-build-memory.md), while ONNX Runtime's INT8 kernels
    stay vectorized there.
    """
    return "avx512_vnni" in (cpu_flags() if flags is None else flags)


def u8s8_products_are_exact(flags: set[str] | None = None) -> bool:
    """Whether ONNX Runtime's U8S8 integer products (unsigned activations, signed weights) are exact here.

    On x86 without VNNI its kernels multiply with VPMADDUBSW, which sums each pair of byte products into
    a saturating 16-bit integer; VNNI (AVX512-VNNI, AVX-VNNI) or AMX accumulate in 32 bits (ONNX Runtime's
    quantization guide, "When and why do I need to try U8U8?"). Other architectures have no such kernel.
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return True
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & (cpu_flags() if flags is None else flags))


def describe_host(path: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """CPU model, family/model numbers, vCPUs and the ISA flags of :data:`ISA_FLAGS` it has."""
    info = _cpuinfo(path)
    flags = set(info.get("flags", "").split())
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "vendor": info.get("vendor_id", ""),
        "family": info.get("cpu family", ""),
        "model": info.get("model", ""),
        "vcpus": os.cpu_count() or 0,
        "arch": platform.machine(),
        "isa": [f for f in ISA_FLAGS if f in flags],
    }


def host_line(host: dict[str, Any]) -> str:
    """One readable line, e.g. ``AMD EPYC (family 26, model 2), 2 vCPU, x86_64, avx2 ... avx512_bf16, no AMX``."""
    ident = f" (family {host['family']}, model {host['model']})" if host.get("family") else ""
    isa = list(host.get("isa", []))
    amx = "" if any(f.startswith("amx") for f in isa) else ", no AMX"
    return (f"{host.get('cpu', '?')}{ident}, {host.get('vcpus', '?')} vCPU, {host.get('arch', '?')}"
            + (f", {' '.join(isa)}" if isa else "") + amx)
