"""The SGLang model class every LLM checkpoint dir ships (stages/llm/sglang_model.py), against fakes of
the SGLang classes it subclasses and calls, whose signatures are sglang 0.5.23's (read from the
release wheel's sources; file:line below). SGLang's own pieces a fake stands in for: the stock
Qwen2 head built without a bias and the loader that skips a ``.bias`` with no parameter
(qwen2.py:535, :708), the head's plain product (logits_processor.py:1144), and the registry's scan
of ``SGLANG_EXTERNAL_MODEL_PACKAGE`` for ``EntryClass`` (registry.py:117)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable

import pytest
import torch
from torch import nn

from server_fakes import install, module, params, rewrite, same_logits

# sglang 0.5.23: (positional, keyword-only) parameters of what the plug-in subclasses or calls.
SGLANG_API = {
    "ParallelLMHead.__init__": (["self", "num_embeddings", "embedding_dim"],  # vocab_parallel_embedding.py:562
                                ["bias", "params_dtype", "org_num_embeddings", "padding_size", "quant_config",
                                 "prefix", "enable_tp", "use_attn_tp_group", "use_presharded_weights"]),
    "LogitsProcessor.__init__": (["self", "config", "skip_all_gather", "logit_scale", "return_full_logits"], []),
    "LogitsProcessor._compute_lm_head": (["self", "hidden_states", "lm_head", "embedding_bias"], ["out"]),  # :1144
    "Qwen2ForCausalLM.__init__": (["self", "config", "quant_config", "prefix"], []),  # qwen2.py:520
    "Qwen2ForCausalLM.load_weights": (["self", "weights"], []),  # qwen2.py:644
    "add_prefix": (["name", "prefix"], []),  # utils/common.py:3716
    "import_model_classes": (["package_name", "strict"], []),  # models/registry.py:118
}


class ParallelLMHead(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, *, bias: bool = False, params_dtype: Any = None,
                 org_num_embeddings: Any = None, padding_size: int = 64, quant_config: Any = None, prefix: str = "",
                 enable_tp: bool = True, use_attn_tp_group: bool = False, use_presharded_weights: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(num_embeddings), requires_grad=False)
        else:
            self.register_parameter("bias", None)


class LogitsProcessor(nn.Module):
    def __init__(self, config: Any, skip_all_gather: bool = False, logit_scale: Any = None,
                 return_full_logits: bool = False) -> None:
        super().__init__()

    def _compute_lm_head(self, hidden_states: torch.Tensor, lm_head: Any, embedding_bias: Any = None, *,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        # SGLang's unquantized path: the product with the head's weight, nothing else.
        logits = torch.matmul(hidden_states, lm_head.weight.T)
        return logits if out is None else out.copy_(logits)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.pp_group = SimpleNamespace(is_last_rank=True, world_size=1)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=quant_config,
                                      prefix=add_prefix("lm_head", prefix))
        self.logits_processor = LogitsProcessor(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name.endswith(".bias") and name not in params:
                continue  # as SGLang's loader: a checkpoint bias without a parameter is dropped
            params[name].data.copy_(tensor)


def add_prefix(name: str, prefix: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def import_model_classes(package_name: str, strict: bool = False) -> dict[str, type]:
    """The registry's scan: each plain submodule of the package, its ``EntryClass`` keyed by class name."""
    found: dict[str, type] = {}
    package = importlib.import_module(package_name)
    for _, name, ispkg in pkgutil.iter_modules(package.__path__, package_name + "."):
        if not ispkg:
            mod = importlib.import_module(name)
            if hasattr(mod, "EntryClass"):
                entries = mod.EntryClass if isinstance(mod.EntryClass, list) else [mod.EntryClass]
                found.update({e.__name__: e for e in entries})
    return found


FAKES = {"ParallelLMHead.__init__": ParallelLMHead.__init__, "LogitsProcessor.__init__": LogitsProcessor.__init__,
         "LogitsProcessor._compute_lm_head": LogitsProcessor._compute_lm_head,
         "Qwen2ForCausalLM.__init__": Qwen2ForCausalLM.__init__,
         "Qwen2ForCausalLM.load_weights": Qwen2ForCausalLM.load_weights, "add_prefix": add_prefix,
         "import_model_classes": import_model_classes}


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return rewrite(tiny_model_dir, tmp_path_factory.mktemp("sglang") / "hf")


@pytest.fixture
def sglang(monkeypatch: pytest.MonkeyPatch, hf: dict[str, Any]) -> Any:
    """The fakes installed as SGLang's modules and the rewrite's plug-in package importable."""
    install(monkeypatch, {
        "sglang.srt.layers.vocab_parallel_embedding": module("vocab_parallel_embedding", ParallelLMHead=ParallelLMHead),
        "sglang.srt.layers.logits_processor": module("logits_processor", LogitsProcessor=LogitsProcessor),
        "sglang.srt.models.qwen2": module("qwen2", Qwen2ForCausalLM=Qwen2ForCausalLM),
        "sglang.srt.utils": module("utils", add_prefix=add_prefix),
    })
    monkeypatch.syspath_prepend(str(hf["dir"] / "sglang_plugin"))
    for name in [m for m in sys.modules if m.startswith("cosyvoice_sglang")]:
        monkeypatch.delitem(sys.modules, name)
    return import_model_classes("cosyvoice_sglang", strict=True)


def test_the_fakes_have_sglang_0_5_23_signatures() -> None:
    assert {name: params(fn) for name, fn in FAKES.items()} == SGLANG_API


def _logits(model: Any, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    kwargs = {} if out is None else {"out": out}
    with torch.no_grad():
        return model.logits_processor._compute_lm_head(hidden, model.lm_head, None, **kwargs)


def test_the_registry_finds_the_class_and_its_logits_keep_the_head_bias(sglang: dict[str, type],
                                                                        hf: dict[str, Any]) -> None:
    from cosycompile.stages.llm.sglang_model import ARCHITECTURE

    assert list(sglang) == [ARCHITECTURE]
    model = sglang[ARCHITECTURE](hf["config"], quant_config=None, prefix="")
    model.load_weights(hf["head"].items())
    assert same_logits(_logits(model, hf["hidden"]), hf["logits"])
    buffer = torch.empty_like(hf["logits"])
    assert _logits(model, hf["hidden"], out=buffer) is buffer and same_logits(buffer, hf["logits"])

    stock = Qwen2ForCausalLM(hf["config"])  # what config.json's architecture loads without the plug-in
    stock.load_weights(hf["head"].items())
    plain = _logits(stock, hf["hidden"])
    T = hf["tmap"].text_vocab
    assert (plain[:, :T] == 0).all() and torch.isinf(hf["logits"][:, :T]).all()  # text ids: 0 instead of -inf
    assert (plain[:, T:] - hf["logits"][:, T:]).abs().max() > 1e-3


def test_a_tied_head_is_refused(sglang: dict[str, type], hf: dict[str, Any]) -> None:
    from cosycompile.stages.llm.sglang_model import ARCHITECTURE

    config = hf["config"].__class__(**{**hf["config"].to_dict(), "tie_word_embeddings": True})
    with pytest.raises(ValueError, match="untied"):
        sglang[ARCHITECTURE](config)


def test_the_checkpoint_dir_says_how_sglang_loads_it(hf: dict[str, Any], tmp_path: Path) -> None:
    import json

    note = json.loads((hf["dir"] / "cosycompile_llm.json").read_text())["sglang"]
    assert note["environment"] == {"SGLANG_EXTERNAL_MODEL_PACKAGE": "cosyvoice_sglang"}
    assert json.loads(note["load"]["json_model_override_args"]) == {"architectures": ["CosyVoiceLMForCausalLM"]}
    # ``pip install ./sglang_plugin`` (the note's command) installs the package the registry scans.
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(hf["dir"] / "sglang_plugin")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in (target / "cosyvoice_sglang").glob("*.py")) == ["__init__.py", "model.py"]
