"""The machine line of speed reports: parsed from a cpuinfo file, AMX and its absence named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cosycompile.runtime.host import cpu_flags, describe_host, host_line, int8_matmul_is_vectorized

# Two processor blocks as Linux writes them; only the first is read.
ZEN5 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx fma avx2 avx512f avx512_vnni avx512_bf16 avx_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: second block must not win
flags\t\t: amx_tile
"""
SPR = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: avx2 fma avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""


def test_first_processor_block_gives_model_family_and_isa(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(ZEN5)
    host = describe_host(info)
    assert (host["cpu"], host["vendor"], host["family"], host["model"]) == ("AMD EPYC", "AuthenticAMD", "26", "2")
    assert host["isa"] == ["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16"]
    assert "amx_tile" not in cpu_flags(info)
    line = host_line(host)
    assert line.startswith("AMD EPYC (family 26, model 2), ")
    assert line.endswith("avx512_bf16, no AMX")


def test_amx_machine_lists_its_tiles(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(SPR)
    line = host_line(describe_host(info))
    assert "amx_tile amx_bf16 amx_int8" in line and "no AMX" not in line
    assert "(family 6, model 143)" in line


def test_unreadable_cpuinfo_still_describes_the_machine(tmp_path: Path) -> None:
    host = describe_host(tmp_path / "missing")
    assert host["isa"] == [] and host["vcpus"] >= 1 and host["cpu"]
    assert "family" not in host_line(host)


def test_int8_matmul_needs_avx512_vnni(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(ZEN5)
    assert int8_matmul_is_vectorized(cpu_flags(info))
    assert not int8_matmul_is_vectorized({"avx2", "fma", "avx_vnni", "avx512f"})


def test_int8_matmul_verdict_matches_what_torch_runs_on_this_cpu() -> None:
    """torch._int_mm reaches oneDNN only where the predicate holds: with strided operands oneDNN runs a
    matmul primitive, which ONEDNN_VERBOSE lists; PyTorch's own scalar loop lists nothing. Whatever
    this CPU is, the two must agree (a torch that vectorizes INT8 on more CPUs fails here)."""
    # Every second column: neither stride of A is 1, which sends oneDNN's path to its primitive.
    code = ("import torch\n"
            "a = torch.randint(-127, 128, (64, 256), dtype=torch.int8)[:, ::2]\n"
            "b = torch.randint(-127, 128, (128, 64), dtype=torch.int8)\n"
            "torch._int_mm(a, b)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"ONEDNN_VERBOSE": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    primitive = any(",exec," in ln and ",matmul," in ln for ln in res.stdout.splitlines())
    assert primitive == int8_matmul_is_vectorized(), res.stdout[-2000:]
