"""Build a TensorRT-LLM deployment of the HF rewrite (see ``__init__.py`` for the two flows).

Everything is written here (checkpoint, options, commands, passport fields); the one call into
TensorRT-LLM goes through :func:`run_tool`, a subprocess, so that tests can stand in a fake
``tensorrt_llm`` package or ``trtllm-build`` executable and check what it was given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from cosycompile.backends.trtllm import LEGACY_CONTAINER, Options, build_problem, flow, version
from cosycompile.errors import BackendUnavailable, ModelError
from cosycompile.core.targets import Target
from cosycompile.core.files import link_or_copy
from cosycompile.runtime.graphs_dir import GraphsDir, read_graphs_dir

OPTIONS_FILE = "llm_api_options.yaml"
CHECKPOINT = "hf"  # the rewrite inside the engine dir (>= 1.3)
LEGACY_CHECKPOINT = "trtllm_checkpoint"  # trtllm-build's input (<= 1.2)
LEGACY_ENGINE = "engine"  # trtllm-build's output (<= 1.2)
SMOKE = "cosycompile.backends.trtllm.smoke"
BIAS_WARNING = ("TensorRT-LLM's Qwen2ForCausalLM has no lm_head bias (LMHead in tensorrt_llm/_torch/models/"
                "modeling_utils.py @000a01de66f0eab4ab05640711f0253f50f5209c): served logits lack llm_decoder's "
                "bias and text ids score 0 instead of -inf")


def run_tool(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run one TensorRT-LLM command (the only call into TensorRT-LLM); its output, or a BackendUnavailable."""
    res = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        tail = (res.stdout + res.stderr).strip().splitlines()[-15:]
        raise BackendUnavailable(f"{argv[0]} failed with exit status {res.returncode}:\n" + "\n".join(tail))
    return res.stdout


def llm_api_options(options: Options, tokenizer: bool) -> dict[str, Any]:
    """The ``--extra_llm_api_options`` YAML (LlmArgs field names) from the recipe's options."""
    opts: dict[str, Any] = {
        "max_batch_size": options.max_batch_size,
        "max_num_tokens": options.max_num_tokens,
        "max_seq_len": options.max_seq_len,
        "dtype": options.dtype,
        "kv_cache_config": {"free_gpu_memory_fraction": options.free_gpu_memory_fraction},
        # null switches CUDA graphs off (the LlmArgs default is an enabled CudaGraphConfig).
        "cuda_graph_config": None,
    }
    if options.cuda_graphs:
        opts["cuda_graph_config"] = ({"batch_sizes": sorted(options.cuda_graph_batch_sizes), "enable_padding": True}
                                     if options.cuda_graph_batch_sizes else
                                     {"max_batch_size": options.max_batch_size, "enable_padding": True})
    if not tokenizer:
        # A built-in model has no tokenizer files: requests must then carry token ids.
        opts["skip_tokenizer_init"] = True
    return opts


def serve_command(options_file: str = OPTIONS_FILE, checkpoint: str = CHECKPOINT) -> list[str]:
    """``trtllm-serve`` for the engine dir (run from inside it); ``--trust_remote_code`` lets the
    tokenizer / config loaders accept the dir's ``auto_map``."""
    return ["trtllm-serve", "serve", checkpoint, "--extra_llm_api_options", options_file, "--trust_remote_code",
            "--host", "0.0.0.0", "--port", "8000"]


def build_command(options: Options, checkpoint: Path, out: Path, dtype: str) -> list[str]:
    """``trtllm-build`` with the recipe's flags (TensorRT-LLM <= 1.2)."""
    gemm = dtype if options.gemm_plugin == "auto" else options.gemm_plugin
    return ["trtllm-build", "--checkpoint_dir", str(checkpoint), "--output_dir", str(out),
            "--max_batch_size", str(options.max_batch_size), "--max_input_len", str(options.max_input_len),
            "--max_seq_len", str(options.max_seq_len), "--max_num_tokens", str(options.max_num_tokens),
            "--gemm_plugin", gemm]


def build(src: Path, options: Options, target: Target, out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Graphs dir with the rewrite in ``hf/`` (export or quantize step) -> TensorRT-LLM engine dir."""
    problem = build_problem(target)
    v = version()
    if problem or v is None:
        raise BackendUnavailable(f"backend 'trtllm': {problem}")
    gd = read_graphs_dir(src)
    precision = gd.info.get("precision", "fp32")
    hf = src / gd.info.get("checkpoint", CHECKPOINT)
    if not (hf / "config.json").is_file():
        raise ModelError(f"{src}: no HF rewrite checkpoint in {hf.name}/ (quantized LMs need 'hf' in "
                         "stages.llm.quantize.exports)")
    fields = (_build_llmapi if flow(v) == "llmapi" else _build_legacy)(src, hf, options, precision, out)
    GraphsDir(out, "llm", {}, {}, dict(gd.info, tensorrt_llm=v, flow=flow(v))).write()
    return {"tensorrt_llm": v, "flow": flow(v), "warnings": [BIAS_WARNING], **fields}


def _build_llmapi(src: Path, hf: Path, options: Options, precision: str, out: Path) -> dict[str, Any]:
    """>= 1.3: the checkpoint (FP32 cast to ``dtype`` when unquantized), the options YAML, a smoke load."""
    import yaml

    ckpt = out / CHECKPOINT
    _copy_checkpoint(hf, ckpt, options.dtype if precision == "fp32" else None)
    tokenizer = any((ckpt / f).is_file() for f in ("tokenizer.json", "vocab.json"))
    opts = llm_api_options(options, tokenizer)
    (out / OPTIONS_FILE).write_text(yaml.safe_dump(opts, sort_keys=True))
    smoke = json.loads(run_tool([sys.executable, "-m", SMOKE, str(ckpt), str(out / OPTIONS_FILE)], env=_env()))
    return {"checkpoint": CHECKPOINT, "llm_api_options": opts, "serve_command": serve_command(),
            "serve_cwd": "the engine dir", "quantization": _quantization(ckpt), "smoke": smoke}


def _build_legacy(src: Path, hf: Path, options: Options, precision: str, out: Path) -> dict[str, Any]:
    """<= 1.2: a TensorRT-LLM checkpoint of the rewrite, then ``trtllm-build``."""
    ckpt = out / LEGACY_CHECKPOINT
    dtype = "bfloat16" if options.dtype == "auto" else options.dtype
    if precision == "fp32":
        _convert_checkpoint(hf, ckpt, dtype)
    else:
        quantized = src / "trtllm"
        if not (quantized / "config.json").is_file():
            raise ModelError(f"{src}: TensorRT-LLM {version()} builds from a TensorRT-LLM checkpoint; add 'trtllm' to "
                             f"stages.llm.quantize.exports (or use TensorRT-LLM >= 1.3, or {LEGACY_CONTAINER})")
        shutil.copytree(quantized, ckpt, copy_function=link_or_copy)
        dtype = json.loads((ckpt / "config.json").read_text()).get("dtype", dtype)
    from cosycompile.stages.llm.hf_rewrite import PREFIX_FILE, TOKEN_MAP_FILE

    for name in (TOKEN_MAP_FILE, PREFIX_FILE):
        if (hf / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(hf / name, out / name)
    argv = build_command(options, ckpt, out / LEGACY_ENGINE, dtype)
    run_tool(argv, env=_env())
    return {"checkpoint": LEGACY_CHECKPOINT, "engine_dir": LEGACY_ENGINE, "build_command": argv,
            "container": LEGACY_CONTAINER, "quantization": json.loads((ckpt / "config.json").read_text()).get("quantization")}


def _convert_checkpoint(hf: Path, dst: Path, dtype: str) -> None:
    """FP32 rewrite -> TensorRT-LLM checkpoint, as ``convert_checkpoint.py`` would, through ModelOpt's
    ``export_tensorrt_llm_checkpoint`` (runs without TensorRT-LLM, so on this machine too)."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    from cosycompile.stages.llm.hf_modeling import CosyVoiceLMForCausalLM

    model = CosyVoiceLMForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    dst.mkdir(parents=True)
    export_tensorrt_llm_checkpoint(model, decoder_type="qwen", dtype=getattr(torch, dtype), export_dir=str(dst),
                                   inference_tensor_parallel=1)


def _copy_checkpoint(src: Path, dst: Path, dtype: str | None) -> None:
    """Link the checkpoint's files into the engine dir; cast the weights when ``dtype`` asks for it."""
    shutil.copytree(src, dst, copy_function=link_or_copy)
    if dtype in (None, "auto", "float32"):
        return
    import torch
    from safetensors.torch import load_file, save_file

    for f in sorted(dst.glob("model*.safetensors")):
        tensors = {k: t.to(getattr(torch, dtype)) if t.is_floating_point() else t for k, t in load_file(str(f)).items()}
        f.unlink()  # a hard link: never write through it into the cache
        save_file(tensors, str(f), metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    config["dtype"] = dtype
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def _quantization(ckpt: Path) -> dict[str, Any] | None:
    return json.loads((ckpt / "config.json").read_text()).get("quantization_config")


def _env() -> dict[str, str]:
    # The subprocess sees the same modules as this process (a venv's site-packages, test fakes).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def load(engine_dir: Path, threads: int) -> dict[str, Any]:
    """TensorRT-LLM engines are not run in-process by the checks (see ``run_problem``)."""
    raise BackendUnavailable(f"{engine_dir}: TensorRT-LLM engines are served (engine.json's serve_command), "
                             "not loaded by cosycompile's checks")
