"""The FP32 reference as a cached step, shared by every recipe on the same model.

Its key covers the model, the eval items, sampling, the checks' workloads and this code, never a
recipe's name, backends or formats; so building ``cpu-fp32`` then ``cpu-int8`` on one model runs
the PyTorch reference once. Outputs (the step's data dir)::

    <stage>.npz        what that stage's check compares an engine with (stage plug-in's ``reference``)
    pipeline.npz       tokens.<n>, mel.<n>, wav.<n> of text -> wav per eval item
    timing.json        reference latencies on the first item (for ``validation.speed.reference: cached``)
"""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext

def run(ctx: StepContext) -> dict[str, Any]:
    """The ``reference`` step."""
    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.runtime.pipeline import Pipeline, Sampling
    from cosycompile.stages import stage_infos
    from cosycompile.stages.eval_set import eval_inputs
    from cosycompile.stages.common import model_dir

    p = ctx.params
    models = load_reference(model_dir(ctx), tuple(stage_infos()), p["threads"], p.get("family"))
    runtimes = {s: reference_runtime(s, models) for s in stage_infos()}
    inputs = eval_inputs(ctx)
    # The flow's check draws speech tokens from the LM's vocabulary, whatever the family calls it.
    extra = {"speech_token_size": runtimes["llm"].speech_token_size}
    for name, sinfo in ctx.progress(list(stage_infos().items()), desc="stage references"):
        arrays = sinfo.hook("reference")(runtimes[name], inputs, p["checks"][name], {**p, **extra})
        save_finite(ctx.out / f"{name}.npz", arrays)
    pipe = Pipeline(runtimes)
    sampling = Sampling(**p["sampling"])
    arrays, seconds = {}, []
    for n, (text_ids, prompt) in enumerate(ctx.progress(inputs, desc="text -> wav")):
        syn = pipe.synthesize(text_ids, prompt, sampling, seed=n)
        arrays.update({f"tokens.{n}": syn.tokens, f"mel.{n}": syn.mel, f"wav.{n}": syn.wav})
        seconds.append(syn.seconds)
    save_finite(ctx.out / "pipeline.npz", arrays)
    # Timed only for recipes that compare speed with a cached reference timing (the key says so).
    timing = (reference_timing(pipe, inputs[0], sampling, p["speed"], arrays["tokens.0"], arrays["mel.0"])
              if inputs and p.get("speed") else {})
    (ctx.out / "timing.json").write_text(json.dumps(timing, indent=1, sort_keys=True))
    return {"items": len(inputs), "synthesis_seconds": seconds}


def save_finite(path: Path, arrays: dict[str, Any]) -> None:
    """``np.savez`` of reference arrays, refusing (ModelError, nothing written) any that holds NaN or Inf:
    every later build compares with these, and NaN compares as no error."""
    from cosycompile.errors import ModelError

    for name, value in arrays.items():
        a = np.asarray(value)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            raise ModelError(f"reference: '{name}' of {path.name} holds NaN or Inf; the model's FP32 output is not "
                             "a reference (check its weights and the eval prompts)")
    np.savez(path, **arrays)


def workloads(pipe: Any, first: tuple[np.ndarray, Any], sampling: Any, tokens: np.ndarray,
              mel: np.ndarray) -> dict[str, Any]:
    """The timed workloads on the first eval item, the same for reference and build; ``tokens`` and
    ``mel`` are what ``pipe`` already made of that item (not computed a second time)."""
    from cosycompile.runtime.streaming import stream_wav

    text_ids, prompt = first

    # What a streaming server sends first, cut by the family's schedule while the LM decodes; a token
    # cap below the chunk's would time a whole short synthesis instead.
    chunk_tokens = pipe.flow.first_chunk[0]
    chunk_sampling = (sampling if sampling.max_tokens is None or sampling.max_tokens >= chunk_tokens
                      else dataclasses.replace(sampling, max_tokens=chunk_tokens))

    def first_chunk(p: Any) -> None:
        next(iter(stream_wav(p, text_ids, prompt, chunk_sampling)))

    return {
        "tokens": tokens, "mel": mel,
        "cases": {
            "llm": lambda p: p.llm.generate(text_ids, prompt, sampling),
            "flow": lambda p: p.flow.mel(tokens, prompt),
            "hift": lambda p: p.hift.wav(mel, 0),
            "end_to_end": lambda p: p.synthesize(text_ids, prompt, sampling),
            "first_chunk": first_chunk,
        },
    }


def reference_timing(pipe: Any, first: tuple[np.ndarray, Any], sampling: Any, spec: dict[str, Any],
                     tokens: np.ndarray, mel: np.ndarray) -> dict[str, Any]:
    """Median latency of each workload on the reference (used when speed is compared to a cached timing)."""
    from cosycompile.validate.speed import timed

    w = workloads(pipe, first, sampling, tokens, mel)
    if not len(w["tokens"]):
        return {}
    return {name: timed(lambda: fn(pipe), spec["warmup"], spec["runs"])[0] for name, fn in w["cases"].items()}
