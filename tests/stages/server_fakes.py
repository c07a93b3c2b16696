"""What the SGLang and TensorRT-LLM plug-in tests share: the tiny model's HF rewrite, its reference
logits, and a check that a fake's signature is the real one's.

Neither server runs here (SGLang's kernels and TensorRT-LLM are CUDA-only), so each test fakes the
classes its plug-in subclasses or calls, with the signatures their sources have at the cited
version, and only the last call real code would make (the head's GEMM) is computed by the fake.
"""

from __future__ import annotations

import copy
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

PROMPT = [5, 77, 300, 12, 9, 40, 101]


def params(fn: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """(positional parameter names, keyword-only parameter names) of ``fn``."""
    ps = inspect.signature(fn).parameters.values()
    return ([p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
            [p.name for p in ps if p.kind == p.KEYWORD_ONLY])


def rewrite(tiny_model_dir: Path, out: Path) -> dict[str, Any]:
    """The tiny model's HF rewrite in ``out``, its config, head weights, and the logits transformers
    gives it with its own modeling file (checked against Qwen2LM by test_hf_rewrite) with the last
    hidden state they come from."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Qwen2Config

    from cosycompile.families.cosyvoice2.loader import load_models
    from cosycompile.stages.llm.hf_rewrite import token_map, write_hf_rewrite

    models = load_models(tiny_model_dir, ("llm",))
    write_hf_rewrite(copy.deepcopy(models.llm), models.config, tiny_model_dir, out, "float32")
    tmap = token_map(models.config, None, "cosyvoice2")
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).eval()
    ids = torch.tensor([tmap.prompt_ids(PROMPT)])
    with torch.no_grad():
        res = hf(input_ids=ids, output_hidden_states=True)
    weights = {k: v for k, v in load_file(str(out / "model.safetensors")).items() if k.startswith("lm_head.")}
    return {"dir": out, "config": Qwen2Config(**json.loads((out / "config.json").read_text())), "tmap": tmap,
            "hidden": res.hidden_states[-1][0], "logits": res.logits[0], "head": weights}


def install(monkeypatch: Any, modules: dict[str, Any]) -> None:
    """Put fake modules (and every missing parent package) into ``sys.modules`` for this test."""
    import types

    for name, module in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in sys.modules and parent not in modules:
                pkg = types.ModuleType(parent)
                pkg.__path__ = []
                monkeypatch.setitem(sys.modules, parent, pkg)
        monkeypatch.setitem(sys.modules, name, module)


def module(name: str, **attrs: Any) -> Any:
    import types

    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def same_logits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal where finite (to FP32 rounding), and -inf in the same places."""
    finite = torch.isfinite(want)
    return bool(torch.equal(finite, torch.isfinite(got)) and torch.allclose(got[finite], want[finite], atol=1e-5))
