"""The vLLM backend: its refusal where no Python imports vLLM, the load options and serve command,
the smoke comparison; and, with the real vLLM (its CPU build, marked ``vllm``), the INT8 W8A8
checkpoint of builtin:tiny built through the CLI: vLLM decodes the quantized reference's tokens and
gives its first-step log-probabilities, not the FP32 model's."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from cosycompile.backends.vllm import PYTHON_ENV, Options, build_problem
from cosycompile.backends.vllm.build import SMOKE_SECONDS, compare, load_options, root_cause, serve_command
from cosycompile.core.targets import TARGETS
from helpers import REPO, run_cli, until_outputs

RECIPE = REPO / "recipes" / "vllm-cpu-int8.yaml"


def test_without_vllm_the_build_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    assert "pip install vllm" in build_problem(TARGETS["cpu"]) and PYTHON_ENV in build_problem(TARGETS["cpu"])
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nope" / "python"))
    assert build_problem(TARGETS["cpu"]) == f"{PYTHON_ENV} names {tmp_path / 'nope' / 'python'}, which is not a file"


def test_the_cli_stops_before_the_llm_engine_and_says_where_to_finish(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    res = run_cli("build", str(RECIPE), "--artifacts", str(tmp_path / "a"), "-q")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "backend 'vllm': vLLM is not installed" in res.stdout + res.stderr
    assert "finish with: cosycompile build" in res.stdout + res.stderr


def test_load_options_and_serve_command_use_vllm_names() -> None:
    opts = load_options(Options(dtype="float32", kv_cache_memory_bytes=2**26), "Arch", tokenizer=False)
    assert opts["hf_overrides"] == {"architectures": ["Arch"]} and opts["skip_tokenizer_init"] is True
    assert opts["kv_cache_memory_bytes"] == 2**26 and opts["dtype"] == "float32"
    argv = serve_command(opts)
    assert argv[:3] == ["vllm", "serve", "hf"] and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert json.loads(argv[argv.index("--hf-overrides") + 1]) == {"architectures": ["Arch"]}
    assert "--skip-tokenizer-init" in argv and "--enforce-eager" not in argv  # booleans are bare flags
    assert "skip_tokenizer_init" not in load_options(Options(), "Arch", tokenizer=True)


def test_compare_counts_the_identical_prefix_and_the_logprob_error() -> None:
    ref = {"tokens": [5, 6, 7, 8], "first_logprobs": {"5": -1.0, "9": -2.0}}
    got = compare({"tokens": [5, 6, 9], "first_logprobs": {"5": -1.25, "9": -2.0}}, ref)
    assert got == {"reference_tokens": 4, "identical_prefix": 2, "greedy_identical_ratio": 0.5, "equal": False,
                   "max_abs_logprob_error": 0.25}
    missing = compare({"tokens": [5, 6, 7, 8], "first_logprobs": {"5": -1.0, "9": None}}, ref)
    assert missing["equal"] and missing["max_abs_logprob_error"] is None
    assert compare({"tokens": [1], "first_logprobs": {}}, None) == {}


def test_a_failed_vllm_run_is_reported_by_the_error_it_ended_on() -> None:
    worker = ["(Worker pid=837) ERROR 11-30 08:50:12 [multiproc_executor.py:1063] Traceback (most recent call last):",
              "(Worker pid=837) ERROR 11-30 08:50:12 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU "
              "attention configuration: head_dim=16",
              "(EngineCore pid=1) ERROR 11-30 08:50:13 [core.py:1] RuntimeError: Worker failed with error "
              "'Unsupported CPU attention configuration: head_dim=16'",
              "Traceback (most recent call last):",
              "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
              "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: leaked shared_memory"]
    assert root_cause(worker) == "RuntimeError: Worker failed with error 'Unsupported CPU attention configuration: head_dim=16'"
    assert root_cause(["Traceback (most recent call last):", '  File "x.py"', "ValueError: no such model"]) == \
        "ValueError: no such model"
    assert root_cause(["killed"]) == "killed" and root_cause([]) == "(no output)"


@pytest.mark.vllm
def test_real_vllm_runs_the_int8_checkpoint_as_the_quantized_reference_does(tmp_path: Path) -> None:
    import torch

    from cosycompile.families import builtin_family, load_models
    from cosycompile.quantize.compressed_tensors.quantize import first_logprobs
    from cosycompile.stages.llm.hf_modeling import CosyVoiceLMForCausalLM
    from cosycompile.stages.llm.hf_rewrite import write_hf_rewrite

    assert os.environ.get(PYTHON_ENV), "make test-vllm names the vLLM venv's python"
    # Longer than the build's own bound on the smoke decode, so a hung vLLM is ended by the build (which
    # reports it), not by this timeout, which would leave the smoke process orphaned.
    res = run_cli("build", str(RECIPE), "--until", "engine", "--artifacts", str(tmp_path / "a"),
                  timeout=SMOKE_SECONDS + 600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    engine = until_outputs(res.stdout)["llm.engine"]
    passport = json.loads((engine / "engine.json").read_text())
    smoke = passport["smoke"]
    assert smoke["architecture"] == ["CosyVoiceLMForCausalLM"]
    assert smoke["reference_tokens"] > 30 and smoke["equal"], smoke
    assert smoke["max_abs_logprob_error"] < 1e-5, smoke
    assert passport["quantization"]["quant_method"] == "compressed-tensors"
    # The bundle (the checks do not run vLLM) shows that smoke as its LLM's evidence.
    done = run_cli("build", str(RECIPE), "--allow-unvalidated", "--artifacts", str(tmp_path / "a"), "-q")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (bundle,) = (tmp_path / "a" / "builds").glob("vllm-cpu-int8-*")
    stages = json.loads((bundle / "report.json").read_text())["stages"]
    assert stages["llm"]["smoke"]["equal"] is True and "tokens" not in stages["llm"]["smoke"]
    assert "| llm   | identical_prefix" in (bundle / "report.md").read_text()
    # The same ids under the FP32 model: further from vLLM's than the quantization's own error, so
    # vLLM ran the INT8 layers (the tiny model's greedy tokens alone do not tell the two apart).
    model_dir = tmp_path / "tiny"
    builtin_family("builtin:tiny").hook("init_model")("builtin:tiny", model_dir, seed=0)
    models = load_models(model_dir, ("llm",))
    write_hf_rewrite(copy.deepcopy(models.llm), models.config, model_dir, tmp_path / "fp32", "float32")
    fp32 = CosyVoiceLMForCausalLM.from_pretrained(str(tmp_path / "fp32"), dtype=torch.float32).eval()
    ref = json.loads((engine / "reference_decode.json").read_text())
    fp32_logprobs = first_logprobs(fp32, ref["prompt_ids"], top=fp32.config.vocab_size)
    away = max(abs(fp32_logprobs[i] - v) for i, v in smoke["first_logprobs"].items())
    assert away > 20 * smoke["max_abs_logprob_error"] and away > 1e-4, (away, smoke)
