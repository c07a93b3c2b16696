"""Calibration by recording the reference: run the FP32 pipeline over the calibration set and keep
every stage's real inputs. Quantizers read these records; nothing calibrates on random tensors.
Every stage's records are kept whichever stages a recipe quantizes (the pipeline runs whole anyway),
so one entry serves every recipe of the same model, items and sampling.

Output (the step's data dir)::

    index.json                 {"graphs": {graph: n_records}, "items": [...ids...]}
    llm_step.npz               inputs_embeds.0000 ...  (prefix + teacher-forced speech tokens, [1, S, H])
    flow_encoder.npz           token.0000, embedding.0000 ...
    flow_estimator.npz         x.0000, mask.0000, mu.0000, t.0000, spks.0000, cond.0000 ...
    hift.npz                   mel.0000, rand_ini.0000, noise.0000 ...
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.runtime.runner import Runner
from cosycompile.core.graph import StepContext

INDEX = "index.json"


class RecordingRunner:
    """Wraps a Runner and keeps a copy of every feed it is given."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.input_names = inner.input_names
        self.output_names = inner.output_names
        self.records: list[dict[str, np.ndarray]] = []

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.records.append({k: np.array(v, copy=True) for k, v in feeds.items()})
        return self.inner.run(feeds)


def _spread(records: list[Any], keep: int) -> list[Any]:
    """``keep`` records spread evenly (so every CFM step and item is represented)."""
    if len(records) <= keep:
        return records
    idx = np.linspace(0, len(records) - 1, keep).round().astype(int)
    return [records[i] for i in idx]


def save_records(path: Path, records: list[dict[str, np.ndarray]]) -> None:
    np.savez(path, **{f"{k}.{i:04d}": v for i, r in enumerate(records) for k, v in r.items()})


def load_records(calib_dir: Path, graph: str) -> list[dict[str, np.ndarray]]:
    """Records of one graph as a list of feed dicts, in recording order."""
    with np.load(calib_dir / f"{graph}.npz") as z:
        out: dict[int, dict[str, np.ndarray]] = {}
        for key in z.files:
            name, idx = key.rsplit(".", 1)
            out.setdefault(int(idx), {})[name] = z[key]
    return [out[i] for i in sorted(out)]


def run(ctx: StepContext) -> dict[str, Any]:
    """The calibrate step: reference synthesis over the calibration set with recording runners."""
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.pipeline import Pipeline, Sampling
    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.stages import pipeline_stages
    from cosycompile.stages.common import model_dir

    p = ctx.params["calibration"]
    mdir = model_dir(ctx)
    models = load_reference(mdir, threads=2, family=ctx.params.get("family"))
    pipe = Pipeline({s: reference_runtime(s, models) for s in pipeline_stages()})
    llm, flow, hift = pipe.llm, pipe.flow, pipe.hift
    enc, est, voc = RecordingRunner(flow.encoder), RecordingRunner(flow.estimator), RecordingRunner(hift.runner)
    flow.encoder, flow.estimator, hift.runner = enc, est, voc
    frontend = Frontend(mdir)
    sampling = Sampling(**p["sampling"])
    items = load_dataset(ctx.file_roots["calib"], what="calibration set").head(p["max_items"])
    llm_records = []
    for n, item in enumerate(ctx.progress(items, desc="calibration items")):
        text_ids, prompt = frontend.item_inputs(item)
        syn = pipe.synthesize(text_ids, prompt, sampling, seed=n)
        embeds = np.concatenate([llm.prefix(text_ids, prompt)[0], llm.speech_embedding[syn.tokens]], axis=0)
        llm_records.append({"inputs_embeds": embeds[None].astype(np.float32)})
    records = {
        "llm_step": llm_records,
        "flow_encoder": enc.records,
        "flow_estimator": _spread(est.records, p["max_estimator_calls"]),
        "hift": voc.records,
    }
    index = {}
    for graph, recs in records.items():
        if recs:
            save_records(ctx.out / f"{graph}.npz", recs)
            index[graph] = len(recs)
    (ctx.out / INDEX).write_text(json.dumps({"graphs": index, "items": [i.id for i in items]}, indent=1))
    ctx.log(", ".join(f"{g}: {n} records" for g, n in index.items()))
    return {"graphs": index}
