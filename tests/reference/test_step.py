"""The reference step (cosycompile/reference/step.py): what it commits is what every later build trusts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from helpers import copy_model, one_line_error, run_cli, write_recipe


def test_a_non_finite_reference_is_refused_and_not_cached(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Finite weights whose output overflows (the flow estimator's last projection scaled by 1e36): the
    reference step fails in one line naming the array, and no reference entry is committed for a later
    build to compare with."""
    import torch

    model = copy_model(tiny_model_dir, tmp_path / "model")
    sd = torch.load(model / "flow.pt", weights_only=True)
    scaled = [k for k in sd if "final_proj" in k]
    assert scaled, "the flow checkpoint has no final_proj"
    sd.update({k: sd[k] * 1e36 for k in scaled})
    torch.save(sd, model / "flow.pt")
    recipe = write_recipe(tmp_path / "r.yaml", {"name": "overflow", "model": str(model),
                                                "validation": {"max_items": 1}})
    art = tmp_path / "art"
    line = one_line_error(run_cli("build", str(recipe), "--artifacts", str(art), "-q"))
    assert "reference:" in line and "holds NaN or Inf" in line and ".npz" in line, line
    kinds = [json.loads(p.read_text()).get("kind") for p in art.glob("cache/objects/*/*/entry.json")]
    assert "reference" not in kinds, kinds


def test_save_finite_writes_nothing_for_a_nan_array(tmp_path: Path) -> None:
    import numpy as np

    from cosycompile.errors import ModelError
    from cosycompile.reference.step import save_finite

    save_finite(tmp_path / "ok.npz", {"tokens": np.arange(3), "wav": np.zeros(4, np.float32)})
    assert (tmp_path / "ok.npz").is_file()
    with pytest.raises(ModelError, match=r"'wav' of bad.npz holds NaN or Inf"):
        save_finite(tmp_path / "bad.npz", {"tokens": np.arange(3), "wav": np.array([0.0, np.inf], np.float32)})
    assert not (tmp_path / "bad.npz").exists()


@pytest.mark.parametrize("family", ["cosyvoice", "cosyvoice2", "cosyvoice3"])
def test_first_chunk_workload_follows_the_familys_streaming_schedule(family: str, tmp_path: Path) -> None:
    """The timed first chunk is the first streamed chunk: the LM decodes the tokens the family's first
    chunk waits for and no more, and the vocoder runs over the frames it emits (upstream's schedule:
    25 + 3 tokens for the Qwen2 generations, 100 + 20 for CosyVoice-300M), even under a token cap
    below that."""
    import numpy as np

    from cosycompile.families import get_family
    from cosycompile.reference.runners import load_reference, reference_pipeline
    from cosycompile.reference.step import workloads
    from cosycompile.runtime.pipeline import Prompt, Sampling

    info = get_family(family)
    model = tmp_path / "model"
    info.hook("init_model")("builtin:" + info.tiny_builtin, model, seed=0)
    pipe = reference_pipeline(load_reference(model, family=family))
    tokens_cap, frames = pipe.flow.first_chunk
    seen: dict[str, int] = {"tokens": 0}
    stream, wav = pipe.llm.stream, pipe.hift.wav

    def spy_stream(text_ids: np.ndarray, prompt: Prompt, sampling: Sampling) -> Iterator[int]:
        for tok in stream(text_ids, prompt, sampling):
            seen["tokens"] += 1
            yield tok

    def spy_wav(mel: np.ndarray, seed: int) -> np.ndarray:
        seen["frames"] = mel.shape[1]
        return wav(mel, seed)

    pipe.llm.stream, pipe.hift.wav = spy_stream, spy_wav
    prompt = Prompt.empty()
    w = workloads(pipe, (np.arange(1, 61, dtype=np.int64), prompt), Sampling(mode="greedy", max_tokens=8),
                  np.zeros(0, np.int64), np.zeros((80, 0), np.float32))
    w["cases"]["first_chunk"](pipe)
    assert seen["tokens"] == tokens_cap and seen["frames"] == frames
    assert tokens_cap == (120 if family == "cosyvoice" else 28)
