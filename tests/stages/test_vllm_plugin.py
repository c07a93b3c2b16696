"""The HF rewrite of builtin:tiny loaded by a real vLLM (its CPU build, in its own venv) through the
plug-in the rewrite dir ships (issue 39): greedy tokens equal the reference's; without the plug-in
vLLM cannot load the architecture at all, and loaded as the stock Qwen2 that config.json names the
head bias is dropped and the tokens differ.

Marked ``vllm``: run by ``make test-vllm`` (CI runs it after ``make test``), which builds the venv
and names its Python in ``COSYCOMPILE_VLLM_PYTHON``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from cosycompile.families.cosyvoice2.loader import load_models
from cosycompile.backends.vllm.build import SMOKE, install_plugin
from cosycompile.stages.llm.hf_rewrite import TOKEN_MAP_FILE, token_map, write_hf_rewrite
from cosycompile.stages.llm.vllm_model import ARCHITECTURE
from helpers import REPO

pytestmark = pytest.mark.vllm

TEXT = [5, 77, 300, 12, 9, 40, 101]
PROMPT_TEXT = [33, 44]
PROMPT_SPEECH = [10, 200, 6000, 3]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def vllm_python() -> str:
    python = os.environ.get("COSYCOMPILE_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    if not Path(python).is_file():
        pytest.fail(f"no vLLM venv at {python}: run `make test-vllm` (it builds one)")
    return python


@pytest.fixture(scope="module")
def case(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict[str, Any]:
    """The FP32 rewrite, the plug-in installed from it into a folder of its own, and the reference's
    greedy tokens over the same prompt."""
    models = load_models(tiny_model_dir, ("llm",))
    root = tmp_path_factory.mktemp("vllm")
    out = root / "hf"
    write_hf_rewrite(copy.deepcopy(models.llm), models.config, tiny_model_dir, out, "float32")
    site = root / "site"
    install_plugin(vllm_python, out, site)
    tmap = token_map(models.config, None, "cosyvoice2")
    ref = models.llm.inference(torch.tensor([TEXT]), torch.tensor([PROMPT_TEXT]), torch.tensor([PROMPT_SPEECH]),
                               sampling="greedy", max_tokens=MAX_TOKENS)
    return {"dir": out, "site": site, "tmap": tmap, "ref": [tmap.text_vocab + t for t in ref],
            "ids": tmap.prompt_ids(PROMPT_TEXT + TEXT, PROMPT_SPEECH)}


def _vllm(python: str, case: dict[str, Any], architecture: str | None, plugin: bool) -> tuple[dict | None, str]:
    tmap = case["tmap"]
    # An explicit KV cache size: on the CPU backend gpu_memory_utilization is a share of the NUMA node's
    # RAM minus what the process already holds, which goes negative on a machine with a small node.
    options = {"skip_tokenizer_init": True, "dtype": "float32", "enforce_eager": True, "max_model_len": 512,
               "kv_cache_memory_bytes": 64 * 2**20,
               "hf_overrides": {"architectures": [architecture]} if architecture else None}
    req = {"model": str(case["dir"]), "options": options, "prompt_ids": case["ids"], "stop_ids": tmap.stop_ids,
           "max_tokens": min(int(len(TEXT) * tmap.max_token_text_ratio), MAX_TOKENS),
           "min_tokens": int(len(TEXT) * tmap.min_token_text_ratio), "logprob_ids": case["ref"][:1]}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    if plugin:
        env["PYTHONPATH"] = str(case["site"])
    res = subprocess.run([python, str(SMOKE), json.dumps(req)], capture_output=True, text=True, env=env, timeout=600)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    return (json.loads(line[len("RESULT "):]) if line else None), res.stdout + res.stderr


def test_the_rewrite_dir_says_how_vllm_loads_it(case: dict[str, Any]) -> None:
    body = json.loads((case["dir"] / TOKEN_MAP_FILE).read_text())
    assert body["vllm"]["loads"] and body["vllm"]["load"] == {"hf_overrides": {"architectures": [ARCHITECTURE]}}
    assert not [p.name for p in case["dir"].glob("*.safetensors") if p.name != "model.safetensors"], \
        "servers load every top-level *.safetensors as weights"


def test_vllm_with_the_plugin_decodes_the_reference_tokens(vllm_python: str, case: dict[str, Any]) -> None:
    got, log = _vllm(vllm_python, case, ARCHITECTURE, plugin=True)
    assert got is not None, log[-3000:]
    assert got["architecture"] == [ARCHITECTURE]
    assert len(case["ref"]) > 10 and got["tokens"] == case["ref"], (got["tokens"], case["ref"])


def test_without_the_plugin_the_architecture_does_not_load(vllm_python: str, case: dict[str, Any]) -> None:
    got, log = _vllm(vllm_python, case, ARCHITECTURE, plugin=False)
    assert got is None and f"Model architectures ['{ARCHITECTURE}'] are not supported" in log, log[-3000:]


def test_stock_qwen2_drops_the_bias_and_decodes_other_tokens(vllm_python: str, case: dict[str, Any]) -> None:
    stock, log = _vllm(vllm_python, case, None, plugin=False)
    assert stock is not None, log[-3000:]
    assert stock["architecture"] == ["Qwen2ForCausalLM"]
    assert stock["tokens"] != case["ref"]
    with_plugin, log = _vllm(vllm_python, case, ARCHITECTURE, plugin=True)
    assert with_plugin is not None, log[-3000:]
    first = str(case["ref"][0])
    assert abs(stock["first_logprobs"][first] - with_plugin["first_logprobs"][first]) > 1e-3


def test_vllm_refuses_the_int8_smoothquant_export_as_the_dir_says(vllm_python: str, case: dict[str, Any],
                                                                   tiny_model_dir: Path, tmp_path: Path) -> None:
    """The dir's note says which quantized exports vLLM cannot load; the real vLLM agrees."""
    import modelopt.torch.quantization as mtq

    from cosycompile.quantize.modelopt_torch.quantize import _export_hf, quant_config

    lm = load_models(tiny_model_dir, ("llm",)).llm
    torch.manual_seed(0)
    records = [lm.prompt_embeddings(torch.randint(0, 512, (1, 12))) for _ in range(4)]

    def loop(_: Any) -> None:
        with torch.no_grad():
            for r in records:
                lm.qwen.model(inputs_embeds=r)

    mtq.quantize(lm.qwen, quant_config({"format": "int8_sq", "method": "max", "alpha": 0.5, "block_size": 128}), loop)
    out = tmp_path / "hf"
    _export_hf(copy.deepcopy(lm), load_models(tiny_model_dir, ("llm",)).config, tiny_model_dir, out)
    note = json.loads((out / TOKEN_MAP_FILE).read_text())["vllm"]
    assert note["loads"] is False and "W8A8_SQ_PER_CHANNEL" in note["why"]
    got, log = _vllm(vllm_python, dict(case, dir=out), ARCHITECTURE, plugin=True)
    assert got is None and "ModelOpt currently only supports" in log, log[-3000:]

