"""The llm stage's graphs (see the package docstring)."""

from __future__ import annotations

from cosycompile.runtime.graphspec import Dim, GraphSpec, Tensor

LLM_STEP = GraphSpec(
    name="llm_step",
    inputs=(Tensor("inputs_embeds", "float32", ("batch", "seq", "hidden_size")),
            Tensor("past_key_values", "float32", ("num_layers", 2, "batch", "kv_heads", "past", "head_dim"))),
    outputs=(Tensor("logits", "float32", ("batch", "seq", "vocab_size")),
             Tensor("present_key_values", "float32", ("num_layers", 2, "batch", "kv_heads", "total", "head_dim"))),
    dims=(Dim("batch", 1, 1, 16, 1), Dim("seq", 1, 1, 1024, 3), Dim("past", 0, 512, 2560, 2),
          Dim("total", 1, 513, 3584, 5)),
    tolerance=1e-3,
    calib_crop_dim="seq",
)

# The decode step over a cache of fixed size (a family's LLMStaticStep, e.g. cosyvoice2.qwen2lm) that the torch backend's
# runtime writes in place, replayed as a CUDA graph on a GPU; torch programs for a GPU target always carry it,
# a CPU target's when its recipe sets the torch backend's static_cache.
LLM_STEP_STATIC = GraphSpec(
    name="llm_step_static",
    inputs=(Tensor("inputs_embeds", "float32", ("batch", 1, "hidden_size")),
            Tensor("key_values", "float32", ("num_layers", 2, "batch", "kv_heads", "slots", "head_dim")),
            Tensor("position", "int64", (1,), value_range=(0, 2))),
    outputs=(Tensor("logits", "float32", ("batch", 1, "vocab_size")),
             Tensor("new_key_values", "float32", ("num_layers", 2, "batch", "kv_heads", 1, "head_dim"))),
    dims=(Dim("batch", 1, 1, 16, 1), Dim("slots", 2, 1024, 4096, 4)),
    tolerance=1e-3,
    torch_program_only=True,
)
