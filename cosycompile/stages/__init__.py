"""Stages as plug-ins: each module in this folder implements ``export(ctx)`` and ``check(ctx)``.

Adding a stage means adding its module here and one ``StageDef`` line; the build graph,
planner and report pick it up from this registry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageDef:
    """Light description of a stage (no imports of torch or runtimes)."""

    name: str
    module: str
    backends: tuple[str, ...]
    model_files: tuple[str, ...]
    summary: str


STAGES: dict[str, StageDef] = {
    "llm": StageDef("llm", "cosycompile.stages.llm", ("onnxruntime", "trtllm"),
                    ("cosyvoice2.yaml", "llm.pt", "CosyVoice-BlankEN/config.json"),
                    "Qwen2 LM decode step with KV cache -> speech-token logits"),
    "flow": StageDef("flow", "cosycompile.stages.flow", ("onnxruntime", "tensorrt"),
                     ("cosyvoice2.yaml", "flow.pt"),
                     "flow encoder + CFM estimator (1-D UNet, batch 2 for CFG)"),
    "hift": StageDef("hift", "cosycompile.stages.hift", ("onnxruntime", "tensorrt"),
                     ("cosyvoice2.yaml", "hift.pt"),
                     "HiFT vocoder up to the iSTFT"),
}


def get_stage(name: str) -> StageDef:
    """Registry lookup (KeyError for an unknown stage; recipes reject those earlier)."""
    return STAGES[name]
