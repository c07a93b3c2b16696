"""Every kind of bad input to a build: refused as ``hostile_harness.refused`` checks (one line on
stderr naming the file or key, exit status 2, no traceback, nothing added to the cache, a follow-up
build still works)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from helpers import EVAL_SET, REPO, copy_model, write_recipe
from hostile_harness import CachedBuild, refused

BASE = REPO / "recipes" / "base.yaml"


def _recipe(tmp: Path, extra: str = "", model: str | None = None, eval_set: str | None = None) -> Path:
    text = (f"extends: {BASE}\nname: bad\n"
            + (f"model: {model}\n" if model else "")
            + f"validation:\n  eval_set: {eval_set or EVAL_SET}\n  max_items: 1\n" + extra)
    return write_recipe(tmp / "bad.yaml", text)


def _corrupt(model: Path) -> None:
    (model / "flow.pt").write_bytes(b"this is not a checkpoint")


def _truncate(model: Path) -> None:
    data = (model / "hift.pt").read_bytes()
    (model / "hift.pt").write_bytes(data[: len(data) // 2])


def _wrong_shapes(model: Path) -> None:
    import torch

    sd = torch.load(model / "flow.pt", weights_only=True)
    key = next(k for k, v in sd.items() if v.ndim == 2)
    sd[key] = torch.zeros(sd[key].shape[0] + 1, sd[key].shape[1])
    torch.save(sd, model / "flow.pt")


# (case id, recipe builder, expected substrings)
CASES: dict[str, tuple[Callable[[Path, Path], tuple[list[str], list[str]]]]] = {}


def case(name: str):
    def deco(fn):
        CASES[name] = fn
        return fn
    return deco


@case("malformed-yaml")
def _c1(tmp, model):
    p = write_recipe(tmp / "bad.yaml", "name: x\nstages: {llm: [\n")
    return ["build", str(p)], ["bad.yaml:", "malformed YAML"]


@case("unknown-key")
def _c2(tmp, model):
    return ["build", str(_recipe(tmp, "stages:\n  llm:\n    engin: {}\n"))], ["bad.yaml:", "stages.llm.engin"]


@case("wrong-type")
def _c3(tmp, model):
    return ["build", str(_recipe(tmp, "stages:\n  llm:\n    export: {opset: high}\n"))], ["stages.llm.export.opset"]


@case("missing-model-dir")
def _c4(tmp, model):
    return ["build", str(_recipe(tmp, model=str(tmp / "nope")))], ["model dir not found", "nope"]


@case("missing-checkpoint")
def _c5(tmp, model):
    (model / "hift.pt").unlink()
    return ["build", str(_recipe(tmp, model=str(model)))], ["hift.pt", "missing"]


@case("corrupt-checkpoint")
def _c6(tmp, model):
    _corrupt(model)
    return ["build", str(_recipe(tmp, model=str(model)))], ["flow.pt"]


@case("truncated-checkpoint")
def _c7(tmp, model):
    _truncate(model)
    return ["build", str(_recipe(tmp, model=str(model)))], ["hift.pt"]


@case("checkpoint-shape-mismatch")
def _c8(tmp, model):
    _wrong_shapes(model)
    return ["build", str(_recipe(tmp, model=str(model)))], ["flow.pt"]


@case("unknown-stage")
def _c9(tmp, model):
    return ["build", str(_recipe(tmp, "stages:\n  vocoder: {}\n"))], ["stages.vocoder"]


@case("backend-not-supported-by-stage")
def _c10(tmp, model):
    return ["build", str(_recipe(tmp, "stages:\n  flow:\n    engine: {backend: trtllm}\n"))], ["cannot use backend"]


@case("unknown-backend")
def _c11(tmp, model):
    return ["build", str(_recipe(tmp, "stages:\n  llm:\n    engine: {backend: tvm}\n"))], ["unknown backend 'tvm'"]


@case("missing-eval-set")
def _c12(tmp, model):
    return ["build", str(_recipe(tmp, eval_set=str(tmp / "no-eval")))], ["no-eval", "not found"]


@case("empty-eval-set")
def _c13(tmp, model):
    (tmp / "empty").mkdir()
    (tmp / "empty" / "manifest.jsonl").write_text("\n")
    return ["build", str(_recipe(tmp, eval_set=str(tmp / "empty")))], ["manifest.jsonl", "empty"]


@case("unwritable-artifacts-dir")
def _c14(tmp, model):
    (tmp / "a-file").write_text("")
    return ["build", str(_recipe(tmp)), "--artifacts", str(tmp / "a-file" / "art")], ["not writable"]


@case("missing-recipe")
def _c15(tmp, model):
    return ["build", str(tmp / "absent.yaml")], ["absent.yaml", "not found"]


@case("unknown-builtin-model")
def _c16(tmp, model):
    return ["build", str(_recipe(tmp, model="builtin:huge"))], ["builtin:huge"]


@case("not-a-model-dir")
def _c17(tmp, model):
    (tmp / "empty-model").mkdir()
    return ["build", str(_recipe(tmp, model=str(tmp / "empty-model")))], ["cosyvoice2.yaml"]


@case("target-cannot-run-backend")
def _c18(tmp, model):
    return ["build", str(_recipe(tmp, "target: l20\n"))], ["cannot build for target 'l20'"]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name: str, tmp_path: Path, tiny_model_dir: Path, followup: CachedBuild) -> None:
    model = copy_model(tiny_model_dir, tmp_path / "model")
    args, expected = CASES[name](tmp_path, model)
    refused(args, *expected, cwd=tmp_path, followup=followup)


def test_at_least_ten_kinds() -> None:
    assert len(CASES) >= 10
