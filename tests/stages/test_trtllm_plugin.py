"""The TensorRT-LLM model class every LLM checkpoint dir ships (stages/llm/trtllm_model.py), against
fakes of the PyTorch-backend pieces it subclasses and calls, whose signatures are those of
NVIDIA/TensorRT-LLM's sources at the commits below. What a fake stands in for: the stock Qwen2 and
its ``LMHead`` built without a bias (modeling_qwen.py at 047098b74c51, embedding.py at 06d0733f493),
the head's GEMM adding ``self.bias`` when there is one and the loader filling a bias parameter only
when the module has one (linear.py at ed53795b33f), and ``register_auto_model``'s table
(modeling_utils.py, ``MODEL_CLASS_MAPPING[name] = cls``)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from server_fakes import install, module, params, rewrite, same_logits

# (positional, keyword-only) parameters of what the plug-in subclasses or calls.
TRTLLM_API = {
    "LMHead.__init__": (["self", "num_embeddings", "embedding_dim", "dtype", "mapping", "tensor_parallel_mode",
                         "gather_output", "use_custom_cublas_mm"], []),  # embedding.py at 06d0733f493
    "Qwen2ForCausalLM.__init__": (["self", "model_config"], []),  # modeling_qwen.py at 047098b74c51
    "register_auto_model": (["name"], []),  # modeling_utils.py
}

MODEL_CLASS_MAPPING: dict[str, type] = {}


def register_auto_model(name: str) -> Any:
    def decorator(cls: type) -> type:
        MODEL_CLASS_MAPPING[name] = cls
        return cls

    return decorator


class LMHead(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: Any = None, mapping: Any = None,
                 tensor_parallel_mode: Any = None, gather_output: bool = False,
                 use_custom_cublas_mm: bool = False) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.out_features, self.in_features, self.padding_size = num_embeddings, embedding_dim, 0  # one rank
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, dtype=dtype), requires_grad=False)
        self.register_parameter("bias", None)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight, self.bias)  # Linear's GEMM, with the bias when there is one

    def load_weights(self, weights: list[dict[str, torch.Tensor]]) -> None:
        self.weight.data.copy_(weights[0]["weight"])
        if self.bias is not None:  # as load_weights_vanilla_helper
            self.bias.data.copy_(weights[0]["bias"])


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, model_config: Any) -> None:
        super().__init__()
        config = model_config.pretrained_config
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, dtype=torch.float32)

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """What ``LogitsProcessor.forward(hidden_states, lm_head, attn_metadata, ...)`` computes."""
        return self.lm_head(hidden_states)


FAKES = {"LMHead.__init__": LMHead.__init__, "Qwen2ForCausalLM.__init__": Qwen2ForCausalLM.__init__,
         "register_auto_model": register_auto_model}


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return rewrite(tiny_model_dir, tmp_path_factory.mktemp("trtllm") / "hf")


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch, hf: dict[str, Any]) -> dict[str, type]:
    """The fakes installed as TensorRT-LLM's modules, then the rewrite's plug-in package imported as
    ``--custom_module_dirs`` imports it (its folder's parent on the path, the folder as a package)."""
    install(monkeypatch, {
        "tensorrt_llm._torch.models.modeling_utils": module("modeling_utils", register_auto_model=register_auto_model,
                                                            MODEL_CLASS_MAPPING=MODEL_CLASS_MAPPING),
        "tensorrt_llm._torch.models.modeling_qwen": module("modeling_qwen", Qwen2ForCausalLM=Qwen2ForCausalLM),
    })
    MODEL_CLASS_MAPPING.clear()
    monkeypatch.syspath_prepend(str(hf["dir"] / "trtllm_plugin"))
    monkeypatch.delitem(sys.modules, "cosyvoice_trtllm", raising=False)
    importlib.import_module("cosyvoice_trtllm")
    return dict(MODEL_CLASS_MAPPING)


def test_the_fakes_have_tensorrt_llms_signatures() -> None:
    assert {name: params(fn) for name, fn in FAKES.items()} == TRTLLM_API


def test_importing_the_package_registers_a_class_whose_head_adds_the_bias(registered: dict[str, type],
                                                                         hf: dict[str, Any]) -> None:
    from cosycompile.stages.llm.trtllm_model import ARCHITECTURE

    assert list(registered) == [ARCHITECTURE]
    config = SimpleNamespace(pretrained_config=hf["config"])
    model = registered[ARCHITECTURE](config)
    head = {"weight": hf["head"]["lm_head.weight"], "bias": hf["head"]["lm_head.bias"]}
    model.lm_head.load_weights([head])
    with torch.no_grad():
        assert same_logits(model.logits(hf["hidden"]), hf["logits"])

    stock = Qwen2ForCausalLM(config)  # what config.json's architecture loads without the plug-in
    stock.lm_head.load_weights([head])
    with torch.no_grad():
        plain = stock.logits(hf["hidden"])
    T = hf["tmap"].text_vocab
    assert (plain[:, :T] == 0).all() and (plain[:, T:] - hf["logits"][:, T:]).abs().max() > 1e-3


def test_a_tied_head_is_refused(registered: dict[str, type], hf: dict[str, Any]) -> None:
    from cosycompile.stages.llm.trtllm_model import ARCHITECTURE

    config = hf["config"].__class__(**{**hf["config"].to_dict(), "tie_word_embeddings": True})
    with pytest.raises(ValueError, match="untied"):
        registered[ARCHITECTURE](SimpleNamespace(pretrained_config=config))


def test_importing_cosycompiles_own_module_registers_nothing() -> None:
    """Imported as cosycompile's module (the build side), it neither imports TensorRT-LLM nor registers;
    in a fresh interpreter, since other tests may have imported a tensorrt_llm of their own."""
    import subprocess

    probe = ("import sys, cosycompile.stages.llm.trtllm_model as m; "
             "print(hasattr(m, 'CosyVoiceLMForCausalLM'), 'tensorrt_llm' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", "False"]
