"""The torch backend's CPU packages are frozen for real, with every 1-D convolution on oneDNN's
prepacked path (backends/torch/conv_layout.py): a small HiFT-like network of 1-D convolutions (FP32
and BF16, dilated, grouped, strided, transposed), compiled by the backend's own ``build``, computes
what eager PyTorch does, here and in a fresh process whose oneDNN is held to older instruction sets
(the prepacked weights carry the build CPU's blocking; an engine moved to a CPU of the same torch
capability class but without AMX, or without AVX512-BF16, must still compute the same)."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SAMPLES = 333  # not the traced length: the package runs a dynamic length


def _net() -> object:
    import torch
    import torch.nn.functional as F

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = torch.nn.Conv1d(6, 16, 7, padding=3)
            self.dilated = torch.nn.Conv1d(16, 16, 3, padding=5, dilation=5)
            self.grouped = torch.nn.Conv1d(16, 16, 5, padding=2, groups=4, bias=False)
            self.strided = torch.nn.Conv1d(16, 16, 4, stride=2, padding=1)
            self.up = torch.nn.ConvTranspose1d(16, 8, 4, stride=2, padding=1)
            # A BF16 convolution between FP32 activations, as torch_dynamic writes HiFT's.
            self.register_buffer("w_bf16", torch.randn(8, 8, 3).bfloat16() * 0.2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = F.leaky_relu(self.pre(x), 0.1)
            h = h + F.leaky_relu(self.dilated(h), 0.1)
            h = self.grouped(h)
            h = self.up(self.strided(h))
            return F.conv1d(h.bfloat16(), self.w_bf16, padding=1).float()

    torch.manual_seed(0)
    return Net().eval()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """(engine dir, input, eager output) of the network compiled by the backend's ``build``."""
    import torch

    from cosycompile.backends.torch import Options
    from cosycompile.backends.torch.build import build
    from cosycompile.core.targets import TARGETS
    from cosycompile.runtime.graphs_dir import GraphsDir
    from cosycompile.runtime.torch_programs import save_program

    tmp = tmp_path_factory.mktemp("conv-layout")
    src, out = tmp / "graphs", tmp / "engine"
    src.mkdir()
    out.mkdir()
    net = _net()
    t = torch.export.Dim("t", min=16, max=4096)
    program = torch.export.export(net, (torch.randn(1, 6, 64),), dynamic_shapes=({2: 2 * t},))
    save_program(program, src / "net.pt2")
    GraphsDir(src, "hift", {"net": {"file": "net.pt2", "format": "torch.export", "inputs": ["x"],
                                    "outputs": ["y"]}}).write()
    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp / "inductor"))  # the build dir stays in this test's tmp
    try:
        fields = build(src, Options(freezing=True), TARGETS["cpu"], out)
    finally:
        mp.undo()
    x = torch.randn(1, 6, 2 * SAMPLES, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = net(x).numpy()
    (out / "fields.json").write_text(json.dumps(fields))
    return out, x.numpy(), want


def _convolution_calls(package: Path) -> collections.Counter:
    with zipfile.ZipFile(package) as z:
        code = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    return collections.Counter(re.findall(r"aoti_torch_cpu_(\w*convolution\w*)\(", code))


def test_every_1d_convolution_is_prepacked(engine: tuple[Path, np.ndarray, np.ndarray]) -> None:
    """Freezing took effect and the pass ran: the five 1-D convolutions call oneDNN's prepacked
    operator; only the transposed one stays a plain ATen convolution. Before the fix, every one did."""
    out, _, _ = engine
    calls = _convolution_calls(out / "net.pt2")
    assert calls == {"mkldnn__convolution_pointwise": 5, "convolution": 1}, calls
    fields = json.loads((out / "fields.json").read_text())
    assert fields["inductor"]["freezing"] is True and fields["inductor"]["passes"] == ["cosycompile-conv1d-as-2d-1"]


def _run_engine(out: Path, x: np.ndarray, env: dict[str, str] | None = None) -> np.ndarray:
    """The engine's output on ``x``, computed in a fresh process with ``env`` added."""
    import os

    np.save(out / "x.npy", x)
    code = ("import sys, numpy as np, torch; from pathlib import Path; "
            "from cosycompile.backends.torch.build import AotiRunner; torch.set_num_threads(2); "
            "d = Path(sys.argv[1]); r = AotiRunner(d / 'net.pt2', ['x'], ['y'], 'cpu'); "
            "np.save(d / 'y.npy', r.run({'x': np.load(d / 'x.npy')})['y'])")
    res = subprocess.run([sys.executable, "-c", code, str(out)], env={**os.environ, **(env or {})},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return np.load(out / "y.npy")


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    # The BF16 convolution rounds its inputs: the bound is BF16's, relative to the output's scale.
    assert got.shape == want.shape
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 2e-2, err


# No AVX2 cap: a package compiled on an AVX-512 CPU is refused by `load` on an AVX2 one (its
# cpu_capability), so oneDNN never runs these weights there.
@pytest.mark.parametrize("isa", [None, "AVX512_CORE_BF16", "AVX512_CORE"])
def test_the_package_computes_the_networks_output_on_every_isa(engine: tuple[Path, np.ndarray, np.ndarray],
                                                              isa: str | None) -> None:
    """None: this CPU as it is. The others cap oneDNN at a CPU without AMX (Zen 4's class) and one
    without AVX512-BF16: prepacked weights in this CPU's blocking are reordered, not misread."""
    out, x, want = engine
    got = _run_engine(out, x, {"ONEDNN_MAX_CPU_ISA": isa} if isa else None)
    _assert_close(got, want)
    if isa is not None:  # and the same values as uncapped, to BF16 rounding
        _assert_close(got, _run_engine(out, x))


def test_the_pass_is_for_frozen_cpu_packages_only() -> None:
    """Without freezing nothing prepacks weights, and CUDA convolutions have no such path: no pass."""
    from cosycompile.backends.torch import Options
    from cosycompile.backends.torch.build import inductor_passes

    assert set(inductor_passes(Options(freezing=True), "cpu")) == {"joint_custom_pre_pass"}
    assert inductor_passes(Options(freezing=False), "cpu") == {}
    assert inductor_passes(Options(freezing=True), "cuda") == {}
