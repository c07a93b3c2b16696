"""The stages' shared export helpers (stages/common.py)."""

from __future__ import annotations


def test_baked_weight_norm_is_a_constant_of_the_exported_program_and_computes_the_same() -> None:
    """A weight-normed convolution exported as is computes its weight from g and v on every call, so a
    rewrite of the convolutions whose weights are constants passes over it; baked, the program reads
    one weight that gives the same output."""
    import torch
    from torch.nn.utils.parametrizations import weight_norm

    from cosycompile.stages.common import bake_parametrizations

    torch.manual_seed(0)
    net = torch.nn.Sequential(weight_norm(torch.nn.Conv1d(4, 8, 3, padding=1)), torch.nn.Tanh(),
                              weight_norm(torch.nn.Conv1d(8, 2, 3, padding=1)))
    x = torch.randn(1, 4, 20)
    want = net(x).detach()

    def conv_weights(module: torch.nn.Module) -> list[str]:
        program = torch.export.export(module, (x,))
        placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        return [n.args[1].op for n in program.graph.nodes
                if n.op == "call_function" and "conv" in str(n.target) and n.args[1].name in placeholders]

    assert conv_weights(net) == []  # computed in the program, not read
    assert bake_parametrizations(net) == 2
    assert conv_weights(net) == ["placeholder", "placeholder"]
    assert not any(hasattr(m, "parametrizations") for m in net.modules())
    torch.testing.assert_close(net(x), want, rtol=1e-6, atol=1e-6)
    assert bake_parametrizations(net) == 0
