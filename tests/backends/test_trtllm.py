"""The TensorRT-LLM backend: refusal without TensorRT-LLM, the plan of a checkpoint-consuming LLM,
and both build flows on the tiny model's real HF rewrite with only the last call faked (a fake
``tensorrt_llm`` package whose ``LLM`` records its arguments; a fake ``trtllm-build`` on PATH
recording its argv). TensorRT-LLM itself cannot be installed here (GPU wheels from NVIDIA's index)."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from cosycompile.backends.trtllm import Options, build_problem, flow, version_tuple
from cosycompile.recipe.schema import load_recipe
from cosycompile.core.targets import TARGETS

from helpers import REPO, run_cli, write_recipe

FAKE_LLM = '''
import json, os
__version__ = "{version}"
class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw
class _Out:
    def __init__(self, ids):
        self.token_ids = ids
class _Res:
    def __init__(self, ids):
        self.outputs = [_Out(ids)]
class LLM:
    def __init__(self, **kw):
        with open(os.environ["FAKE_TRTLLM_LOG"], "w") as f:
            json.dump(kw, f)
        self.tmap = json.load(open(os.path.join(kw["model"], "cosycompile_llm.json")))["token_map"]
    def generate(self, prompts, params):
        lo = self.tmap["speech_ids"][0]
        return [_Res([lo + 1, lo + 2, lo + 3, lo + 4])]
'''
FAKE_BUILD = '''#!{python}
import json, os, sys
json.dump(sys.argv, open(os.environ["FAKE_TRTLLM_LOG"], "w"))
out = sys.argv[sys.argv.index("--output_dir") + 1]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "rank0.engine"), "wb").write(b"fake")
'''


def _fake_trtllm(root: Path, version: str, monkeypatch: pytest.MonkeyPatch, with_build: bool) -> Path:
    """A ``tensorrt_llm`` package + dist-info of ``version`` on sys.path (and PYTHONPATH), optionally a
    ``trtllm-build`` on PATH; returns the file the fake records into."""
    import sys

    site = root / "site"
    (site / "tensorrt_llm").mkdir(parents=True)
    (site / "tensorrt_llm" / "__init__.py").write_text(FAKE_LLM.format(version=version))
    dist = site / f"tensorrt_llm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(site))
    if with_build:
        bindir = root / "bin"
        bindir.mkdir()
        exe = bindir / "trtllm-build"
        exe.write_text(FAKE_BUILD.format(python=sys.executable))
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    log = root / "call.json"
    monkeypatch.setenv("FAKE_TRTLLM_LOG", str(log))
    return log


@pytest.fixture(scope="module")
def rewrite_src(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the llm export step hands a checkpoint backend: a graphs dir with the FP32 rewrite in hf/."""
    from cosycompile.families.cosyvoice2.loader import load_models
    from cosycompile.runtime.graphs_dir import GraphsDir
    from cosycompile.stages.llm.export import stage_parts
    from cosycompile.stages.llm.hf_rewrite import write_hf_rewrite

    src = tmp_path_factory.mktemp("llm-export")
    models = load_models(tiny_model_dir, ("llm",))
    write_hf_rewrite(copy.deepcopy(models.llm), models.config, tiny_model_dir, src / "hf", "float32")
    GraphsDir(src, "llm", {}, {}, dict(stage_parts(models)[2], precision="fp32", checkpoint="hf")).write()
    return src


def test_version_flows() -> None:
    assert flow("1.2.1") == "legacy" and flow("1.3.0") == "llmapi" and flow("1.4.0rc1") == "llmapi"
    assert version_tuple("1.10.0") == (1, 10)


def test_missing_trtllm_is_refused_with_the_fix() -> None:
    problem = build_problem(TARGETS["h100"])
    assert problem is not None and "pip install tensorrt-llm" in problem
    assert "nvidia/tritonserver:25.06-trtllm-python-py3" in problem


def test_plan_of_an_fp32_checkpoint_llm(tmp_path: Path) -> None:
    """An unquantized LLM on trtllm: the export step is the HF rewrite (no ONNX simplify), and the
    engine is left to a machine with TensorRT-LLM."""
    from cosycompile.plan import plan_build

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", {
        "name": "gpu-llm-fp32", "target": "h100",
        "stages": {"llm": {"engine": {"backend": "trtllm", "options": {"dtype": "bfloat16"}}},
                   "flow": {"enabled": False}, "hift": {"enabled": False}}}))
    plan = plan_build(recipe)
    steps = plan.stage_steps["llm"]
    assert "simplify" not in steps and steps["export"].kind == "llm.export.checkpoint"
    assert steps["engine"].deps["graphs"] is steps["export"]
    assert "cosycompile.stages.llm.hf_rewrite" in steps["export"].code
    assert "TensorRT-LLM is not installed" in steps["engine"].blocked()


def test_gpu_recipes_plan() -> None:
    for name in ("h100-fp8", "l20-int8", "l20-int4-awq"):
        res = run_cli("plan", str(REPO / "recipes" / f"{name}.yaml"), "--artifacts", "/tmp/cosycompile-trtllm-plan")
        assert res.returncode == 0, res.stderr
        assert "build the llm" in res.stdout and "with trtllm" in res.stdout


def test_llmapi_build(rewrite_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """>= 1.3: checkpoint cast to bf16, the LLM-API YAML from the options, the serve command, and the
    smoke load handed exactly the YAML's arguments."""
    from safetensors import safe_open

    from cosycompile.backends.trtllm.build import OPTIONS_FILE, build

    log = _fake_trtllm(tmp_path, "1.4.0", monkeypatch, with_build=False)
    opts = Options(max_batch_size=8, max_num_tokens=4096, max_seq_len=1536, free_gpu_memory_fraction=0.4,
                   cuda_graph_batch_sizes=[4, 1, 2, 8], dtype="bfloat16")
    out = tmp_path / "engine"
    out.mkdir()
    fields = build(rewrite_src, opts, TARGETS["h100"], out)
    written = yaml.safe_load((out / OPTIONS_FILE).read_text())
    assert written == {"max_batch_size": 8, "max_num_tokens": 4096, "max_seq_len": 1536, "dtype": "bfloat16",
                       "kv_cache_config": {"free_gpu_memory_fraction": 0.4},
                       "cuda_graph_config": {"batch_sizes": [1, 2, 4, 8], "enable_padding": True},
                       "skip_tokenizer_init": True}
    assert fields["serve_command"] == ["trtllm-serve", "serve", "hf", "--extra_llm_api_options", OPTIONS_FILE,
                                       "--trust_remote_code", "--host", "0.0.0.0", "--port", "8000"]
    assert fields["tensorrt_llm"] == "1.4.0" and fields["flow"] == "llmapi"
    assert fields["smoke"]["all_speech"] and fields["warnings"]
    called = json.loads(log.read_text())
    assert called == {"model": str(out / "hf"), "trust_remote_code": True, **written}
    with safe_open(str(out / "hf" / "model.safetensors"), "pt") as f:
        assert str(f.get_slice("lm_head.weight").get_dtype()) == "BF16"
    # The export's files are untouched (the engine dir's copy was re-written, not written through).
    with safe_open(str(rewrite_src / "hf" / "model.safetensors"), "pt") as f:
        assert str(f.get_slice("lm_head.weight").get_dtype()) == "F32"
    assert json.loads((out / "graphs.json").read_text())["info"]["flow"] == "llmapi"


def test_cuda_graphs_off() -> None:
    from cosycompile.backends.trtllm.build import llm_api_options

    assert llm_api_options(Options(cuda_graphs=False), tokenizer=True)["cuda_graph_config"] is None
    on = llm_api_options(Options(max_batch_size=4), tokenizer=True)
    assert on["cuda_graph_config"] == {"max_batch_size": 4, "enable_padding": True} and "skip_tokenizer_init" not in on


def test_legacy_build(rewrite_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """<= 1.2: the FP32 rewrite converted to a TensorRT-LLM checkpoint here, then trtllm-build with the
    recipe's flags."""
    from cosycompile.backends.trtllm.build import build

    log = _fake_trtllm(tmp_path, "1.2.1", monkeypatch, with_build=True)
    assert build_problem(TARGETS["l20"]) is None
    opts = Options(max_batch_size=16, max_input_len=512, max_seq_len=2048, max_num_tokens=32768, dtype="bfloat16")
    out = tmp_path / "engine"
    out.mkdir()
    fields = build(rewrite_src, opts, TARGETS["l20"], out)
    argv = json.loads(log.read_text())
    ckpt = out / "trtllm_checkpoint"
    assert argv[1:] == ["--checkpoint_dir", str(ckpt), "--output_dir", str(out / "engine"), "--max_batch_size", "16",
                        "--max_input_len", "512", "--max_seq_len", "2048", "--max_num_tokens", "32768",
                        "--gemm_plugin", "bfloat16"]
    assert Path(argv[0]).name == "trtllm-build" and fields["build_command"][1:] == argv[1:]
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architecture"] == "Qwen2ForCausalLM" and cfg["vocab_size"] == 7168 and cfg["dtype"] == "bfloat16"
    assert (ckpt / "rank0.safetensors").is_file() and (out / "engine" / "rank0.engine").is_file()
    assert fields["flow"] == "legacy" and fields["container"] == "nvidia/tritonserver:25.06-trtllm-python-py3"
