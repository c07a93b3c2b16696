"""Build a vLLM deployment of the HF rewrite: the checkpoint, its plug-in installed for vLLM's
Python, the load options, and a smoke decode compared with the quantizer's reference tokens."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cosycompile.backends.vllm import Options, build_problem, vllm_python
from cosycompile.core.files import link_or_copy
from cosycompile.core.targets import Target
from cosycompile.errors import BackendUnavailable, ModelError
from cosycompile.runtime.graphs_dir import GraphsDir, read_graphs_dir

CHECKPOINT = "hf"
SITE = "site"  # the checkpoint's vllm_plugin/, installed (its entry point registers the model class)
OPTIONS_FILE = "vllm_options.json"
SMOKE = Path(__file__).with_name("smoke.py")
INSTALL_SECONDS = 300
SMOKE_SECONDS = 1800  # a 0.5B load and decode on a 2-vCPU machine takes minutes
OWN_ERROR = re.compile(r"^[\w.]+(Error|Exception): ")  # a traceback's last line
WORKER_ERROR = re.compile(r"\] [\w.]+(Error|Exception): ")  # the same, in vLLM's log format


def load_options(options: Options, architecture: str, tokenizer: bool) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments (the same names as ``vllm serve`` flags) for the checkpoint."""
    opts: dict[str, Any] = {"hf_overrides": {"architectures": [architecture]}, "dtype": options.dtype,
                            "max_model_len": options.max_model_len, "max_num_seqs": options.max_num_seqs,
                            "gpu_memory_utilization": options.gpu_memory_utilization,
                            "enforce_eager": options.enforce_eager}
    if options.kv_cache_memory_bytes is not None:
        opts["kv_cache_memory_bytes"] = options.kv_cache_memory_bytes
    if not tokenizer:
        opts["skip_tokenizer_init"] = True  # a built-in model has no tokenizer: requests carry token ids
    return opts


def serve_command(opts: dict[str, Any]) -> list[str]:
    """``vllm serve`` for the engine dir (run from inside it, with ``site/`` on PYTHONPATH), loopback."""
    argv = ["vllm", "serve", CHECKPOINT, "--host", "127.0.0.1", "--port", "8000"]
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def _run(argv: list[str], env: dict[str, str], timeout: int) -> str:
    try:
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BackendUnavailable(f"{Path(argv[1]).name}: no answer within {timeout} s") from e
    if res.returncode != 0:
        lines = (res.stdout + res.stderr).strip().splitlines()
        raise BackendUnavailable(f"vLLM ({argv[0]}) failed with exit status {res.returncode}: {root_cause(lines)}")
    return res.stdout


def root_cause(lines: list[str]) -> str:
    """The error a failed vLLM run ended on. Its engine runs in worker processes whose traceback is
    logged (``ERROR ... ] RuntimeError: ...``) before the parent's own, which only says the engine
    died; the last line of the output otherwise."""
    worker = [ln.split("] ", 1)[-1] for ln in lines if " ERROR " in ln and WORKER_ERROR.search(ln)]
    own = [ln for ln in lines if OWN_ERROR.match(ln) and "EngineDeadError" not in ln]
    return (worker or own or lines or ["(no output)"])[-1].strip()


def _env(site: Path, target: Target) -> dict[str, str]:
    # vLLM's Python sees only its own environment plus the installed plug-in.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    if target.kind == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def smoke_request(src: Path, tmap: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The prompt the smoke decodes (the quantizer's reference one, else four tokens after a
    three-id text) and the reference decode to compare with, if any."""
    from cosycompile.stages.llm.hf_rewrite import REFERENCE_DECODE_FILE

    ref_file = src / REFERENCE_DECODE_FILE
    if ref_file.is_file():
        ref = json.loads(ref_file.read_text())
        keys = ("prompt_ids", "stop_ids", "min_tokens", "max_tokens")
        return {**{k: ref[k] for k in keys}, "logprob_ids": [int(i) for i in ref["first_logprobs"]]}, ref
    return {"prompt_ids": [tmap["sos_id"], 1, 2, 3, tmap["task_id_id"]], "stop_ids": tmap["stop_ids"],
            "min_tokens": 0, "max_tokens": 4, "logprob_ids": []}, None


def install_plugin(python: str, checkpoint: Path, site: Path) -> None:
    """Install ``checkpoint``'s vLLM plug-in into ``site`` with vLLM's Python; ``site`` then goes on
    that Python's PYTHONPATH (its entry point registers the model class in every vLLM process)."""
    from cosycompile.stages.llm.hf_rewrite import VLLM_PLUGIN_DIR

    # --no-build-isolation: vLLM's environment builds the plug-in with its own setuptools, fetching nothing.
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site),
          str(checkpoint / VLLM_PLUGIN_DIR)], dict(os.environ), INSTALL_SECONDS)


def identical_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(smoke: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    """How far vLLM's greedy tokens and first-step log-probabilities follow the reference's; an id
    missing from vLLM's top 20 counts as an infinite error (written None)."""
    if reference is None:
        return {}
    tokens, ref = smoke["tokens"], reference["tokens"]
    same = identical_prefix(tokens, ref)
    errors = [abs(smoke["first_logprobs"][i] - v) if smoke["first_logprobs"].get(i) is not None else None
              for i, v in reference["first_logprobs"].items()]
    return {"reference_tokens": len(ref), "identical_prefix": same,
            "greedy_identical_ratio": round(same / max(len(ref), 1), 4), "equal": tokens == ref,
            "max_abs_logprob_error": None if None in errors else max(errors, default=0.0)}


def build(src: Path, options: Options, target: Target, out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Graphs dir with the rewrite in ``hf/`` (export or quantize step) -> vLLM engine dir."""
    from cosycompile.stages.llm.hf_rewrite import REFERENCE_DECODE_FILE, TOKEN_MAP_FILE
    from cosycompile.stages.llm.vllm_model import ARCHITECTURE

    problem = build_problem(target, options)
    python = vllm_python()
    if problem or python is None:
        raise BackendUnavailable(f"backend 'vllm': {problem}")
    gd = read_graphs_dir(src)
    hf = src / gd.info.get("checkpoint", CHECKPOINT)
    if not (hf / "config.json").is_file():
        raise ModelError(f"{src}: no HF rewrite checkpoint in {hf.name}/ (quantized LMs need 'hf' in "
                         "stages.llm.quantize.exports)")
    note = json.loads((hf / TOKEN_MAP_FILE).read_text())
    if not note["vllm"]["loads"]:
        raise ModelError(f"stages.llm.engine.backend: vllm cannot load this checkpoint: {note['vllm']['why']}")
    ckpt, site = out / CHECKPOINT, out / SITE
    shutil.copytree(hf, ckpt, copy_function=link_or_copy)
    install_plugin(python, ckpt, site)
    tokenizer = any((ckpt / f).is_file() for f in ("tokenizer.json", "vocab.json"))
    opts = load_options(options, ARCHITECTURE, tokenizer)
    (out / OPTIONS_FILE).write_text(json.dumps(opts, indent=1, sort_keys=True))
    prompt, reference = smoke_request(src, note["token_map"])
    if reference is not None:  # beside the engine, to rerun the comparison where it is served
        link_or_copy(src / REFERENCE_DECODE_FILE, out / REFERENCE_DECODE_FILE)
    # The smoke's KV cache is sized for its one short request: the utilization share is of RAM on a
    # CPU, minus what the process holds, and goes negative on a small machine.
    smoke_opts = dict(opts, kv_cache_memory_bytes=opts.get("kv_cache_memory_bytes", 64 * 2**20),
                      max_model_len=min(options.max_model_len, 512))
    req = dict(prompt, model=str(ckpt), options=smoke_opts)
    stdout = _run([python, str(SMOKE), json.dumps(req)], _env(site, target), SMOKE_SECONDS)
    line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise BackendUnavailable("vLLM's smoke decode printed no result:\n" + stdout[-2000:])
    smoke = json.loads(line[len("RESULT "):])
    smoke.update(compare(smoke, reference))
    GraphsDir(out, "llm", {}, {}, dict(gd.info, vllm=smoke["vllm"])).write()
    return {"vllm": smoke["vllm"], "checkpoint": CHECKPOINT, "load_options": opts, "plugin_site": SITE,
            "serve_command": serve_command(opts), "serve_cwd": "the engine dir", "serve_env": {"PYTHONPATH": SITE},
            "quantization": json.loads((ckpt / "config.json").read_text()).get("quantization_config"),
            "smoke": smoke}


def load(engine_dir: Path, threads: int) -> dict[str, Any]:
    """vLLM engines are not run in-process (checks, synthesize, the CPU Triton repository)."""
    raise BackendUnavailable(f"{engine_dir}: vLLM engines are served (engine.json's serve_command); "
                             "cosycompile does not run them in-process")
