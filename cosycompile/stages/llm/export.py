"""The LLM stage's PyTorch side: the decode-step module, its embedding tables and constants."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


class _BuiltOnFirstUse(Mapping[str, Any]):
    """Graph modules made when first looked up. The static step copies each layer's q/k/v and gate/up
    into merged matrices (0.9 GB and 1.5 s for the 0.5B LM), and only a GPU program export reads it:
    ONNX exports and the PyTorch reference never do."""

    def __init__(self, makers: dict[str, Callable[[], Any]]) -> None:
        self._makers = makers
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def __contains__(self, name: object) -> bool:  # Mapping's default would build the module
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def stage_parts(models: Any) -> tuple[Mapping[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(graph modules, numpy assets, runtime constants) of the loaded LM."""
    from cosycompile.families.cosyvoice2.qwen2lm import LLMDecodeStep, LLMStaticStep

    lm = models.llm
    c = models.config.llm
    assets = {
        "text_embedding": lm.llm.model.model.embed_tokens.weight.detach().float().numpy(),
        "speech_embedding": lm.speech_embedding.weight.detach().float().numpy(),
        "llm_embedding": lm.llm_embedding.weight.detach().float().numpy(),
    }
    info = {"num_layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.hidden_size // c.num_heads,
            "hidden_size": c.hidden_size, "speech_token_size": models.config.speech_token_size,
            "vocab_size": models.config.speech_token_size + 3}
    modules = _BuiltOnFirstUse({"llm_step": lambda: LLMDecodeStep(lm).eval(),
                                "llm_step_static": lambda: LLMStaticStep(lm).eval()})
    return modules, assets, info


def export(ctx: StepContext) -> dict[str, Any]:
    """The ``llm.export`` step."""
    from cosycompile.stages.common import export_stage

    return export_stage(ctx, "llm")
