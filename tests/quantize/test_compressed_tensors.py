"""The compressed_tensors quantizer: INT8 W8A8 with per-token activations. The weight and token
rounding, the reference Linear against integer arithmetic, fused-layer exclusions, and the step run
by the real CLI on builtin:tiny (the checkpoint's tensors and config, the reference decode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cosycompile.errors import RecipeError
from cosycompile.quantize.compressed_tensors.quantize import check_fused
from cosycompile.quantize.compressed_tensors.w8a8 import (QMAX, QMAX_REDUCED, W8A8Linear, fake_quant_tokens,
                                                          quantize_reference, quantize_weight)
from helpers import REPO, one_line_error, run_cli, until_outputs

RECIPE = REPO / "recipes" / "vllm-cpu-int8.yaml"


@pytest.mark.parametrize("qmax", [QMAX, QMAX_REDUCED])
def test_weights_round_per_channel_within_half_a_step(qmax: int) -> None:
    torch.manual_seed(0)
    w = torch.randn(24, 40) * torch.logspace(-2, 1, 24)[:, None]  # rows of very different ranges
    q, scale = quantize_weight(w, qmax)
    assert q.dtype == torch.int8 and scale.shape == (24, 1)
    assert q.abs().amax(dim=1).tolist() == [qmax] * 24  # each row uses its whole range
    assert torch.all((q.float() * scale - w).abs() <= scale / 2 + 1e-7)


def test_tokens_round_each_on_its_own_scale() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32)
    y = fake_quant_tokens(x)
    scale = x.abs().amax(dim=-1, keepdim=True) / QMAX
    assert torch.allclose(y / scale, torch.round(y / scale), atol=1e-4)  # on each token's grid
    assert torch.all((y - x).abs() <= scale / 2 + 1e-6)
    x2 = x.clone()
    x2[0, 0] *= 100  # one token's range does not move another's rounding
    assert torch.equal(fake_quant_tokens(x2)[0, 1:], y[0, 1:])


def test_the_reference_linear_computes_the_integer_product() -> None:
    """What a W8A8 kernel computes: int8 x int8 summed exactly, times both scales, plus the bias."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    x = torch.randn(7, 64)
    qw, sw = quantize_weight(lin.weight)
    sx = x.abs().amax(dim=-1, keepdim=True) / QMAX
    qx = torch.round(x / sx).clamp(-QMAX, QMAX)
    exact = (qx.double() @ qw.double().t()) * sx.double() * sw.double().t() + lin.bias.double()
    assert torch.allclose(W8A8Linear(lin)(x).double(), exact, atol=1e-4)
    assert not torch.allclose(lin(x), W8A8Linear(lin)(x), atol=1e-4)  # and it is not the FP32 layer


def test_reference_replaces_decoder_layer_linears_only() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2)
    model = Qwen2ForCausalLM(cfg)
    names = quantize_reference(model, ("*.down_proj",))
    assert len(names) == 2 * 6 and not any(n.endswith("down_proj") for n in names)
    assert isinstance(model.model.layers[1].self_attn.q_proj, W8A8Linear)
    assert isinstance(model.lm_head, nn.Linear) and isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)


def test_an_exclusion_splitting_a_fused_layer_is_refused() -> None:
    layer = "model.layers.3"
    every = [f"{layer}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
            [f"{layer}.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    check_fused(every, [])
    check_fused([n for n in every if "mlp" not in n], [n for n in every if "mlp" in n])  # a whole group kept
    with pytest.raises(RecipeError, match=r"model\.layers\.3\.mlp\.\{gate_proj,up_proj\} are one fused layer"):
        check_fused([n for n in every if not n.endswith("up_proj")], [f"{layer}.mlp.up_proj"])


def _recipe(tmp_path: Path, exclude: list[str]) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {RECIPE}\nname: r\nstages:\n  llm:\n"
                    f"    quantize: {{format: int8_dyn, reduce_range: true, exclude: {json.dumps(exclude)}}}\n")
    return path


def test_cli_writes_a_compressed_tensors_checkpoint_and_its_reference(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    kept = [f"model.layers.0.mlp.{p}" for p in ("down_proj", "gate_proj", "up_proj")]
    res = run_cli("build", str(_recipe(tmp_path, ["model.layers.0.mlp.*"])), "--until", "quantize",
                  "--artifacts", str(tmp_path / "a"))
    assert res.returncode == 0, res.stdout + res.stderr
    out = until_outputs(res.stdout)["llm.quantize"]
    hf = out / "hf"
    config = json.loads((hf / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "int-quantized"
    assert qc["ignore"] == sorted(["lm_head", *kept])  # vLLM keeps these in full precision
    group = qc["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"] == \
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    state = load_file(str(hf / "model.safetensors"))
    layers = config["num_hidden_layers"]
    int8 = sorted(k for k, t in state.items() if t.dtype == torch.int8)
    assert len(int8) == 7 * layers - len(kept) and all(k.endswith(".weight") for k in int8)
    assert all(state[f"{k}.weight"].dtype == torch.float32 for k in kept)
    for k in int8:
        assert state[k[: -len("weight")] + "weight_scale"].shape == (state[k].shape[0], 1)
        assert int(state[k].abs().max()) == QMAX_REDUCED  # the recipe's reduce_range
    assert state["lm_head.weight"].dtype == torch.float32 and "lm_head.weight_scale" not in state
    ref = json.loads((out / "reference_decode.json").read_text())
    tmap = json.loads((hf / "cosycompile_llm.json").read_text())["token_map"]
    lo, hi = tmap["speech_ids"]
    assert ref["prompt_ids"][0] == tmap["sos_id"] and ref["min_tokens"] <= len(ref["tokens"]) <= ref["max_tokens"]
    assert all(lo <= t < hi for t in ref["tokens"])
    assert len(ref["first_logprobs"]) == 5 and max(ref["first_logprobs"].values()) < 0


def test_cli_refuses_int8_dyn_for_a_backend_that_cannot_serve_it(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'base.yaml'}\nname: r\nstages:\n  llm:\n"
                      "    quantize: {format: int8_dyn}\n")
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "a"))
    assert res.returncode == 2
    assert "set stages.llm.engine.backend to vllm" in one_line_error(res)


def test_cli_refuses_an_exclusion_splitting_a_fused_layer_before_any_step(tmp_path: Path) -> None:
    res = run_cli("build", str(_recipe(tmp_path, ["model.layers.1.mlp.up_proj"])), "--artifacts", str(tmp_path / "a"))
    assert res.returncode == 2
    assert "model.layers.1.mlp.{gate_proj,up_proj} are one fused layer in vLLM" in one_line_error(res)
    assert not list((tmp_path / "a").glob("cache/objects/*/*/entry.json"))
