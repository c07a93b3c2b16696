"""The GPU layout, after CosyVoice's ``runtime/triton_trtllm``: a BLS front model over GPU engines.

| model | kind | what |
|---|---|---|
| ``<family>`` / ``<family>_offline`` | python BLS, KIND_CPU | text pieces -> LLM -> token chunks / ``token2wav`` |
| ``audio_tokenizer`` | python, KIND_CPU | prompt wav -> speech tokens (the bundle's front-end ONNX) |
| ``speaker_embedding`` | python, KIND_CPU | prompt wav -> x-vector (the bundle's front-end ONNX) |
| ``token2wav`` | python BLS, KIND_CPU | tokens -> mel (CFM loop in numpy) -> wav (iSTFT in numpy) |
| ``flow_encoder`` / ``flow_estimator`` / ``vocoder`` | tensorrt_plan, KIND_GPU | the bundle's TensorRT engines |
| ``tensorrt_llm`` | tensorrtllm, decoupled | the TensorRT-LLM engine (TensorRT-LLM <= 1.2); or a trtllm-serve URL |

The front models are named after the bundle's family (``cosyvoice2``, ``cosyvoice3``, as upstream's
repositories for each). Configs come from the engines' passports (graph specs: names, dtypes, shapes),
the flow and HiFT stages' ``graphs.json`` info (mel bins, x-vector size, sample rate), the LLM
passport's options and the recipe; the LM's vocabulary (prompt, speech and stop ids) from the token
map its HF rewrite wrote (``cosycompile_llm.json``), linked into the front models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosycompile.errors import UserError
from cosycompile.exporters.triton.config import ModelConfig, TensorConfig, spec_dims
from cosycompile.exporters.triton.cpu import INPUTS, OUTPUTS, model_names
from cosycompile.exporters.triton.repository import RepoOptions, Writer
from cosycompile.exporters.triton.shim import model_py
from cosycompile.runtime.bundle import MANIFEST
from cosycompile.runtime.speakers import SPEAKERS_DIR

SERVE_MODULE = "cosycompile.exporters.triton.serve_gpu"
PLAN_SUFFIX = ".plan"  # cosycompile.backends.tensorrt.build.PLAN_SUFFIX (not imported: it loads TensorRT helpers)
TRT_MODELS = {"flow_encoder": ("flow", "flow_encoder"), "flow_estimator": ("flow", "flow_estimator"),
              "vocoder": ("hift", "hift")}
LAST_TRITON_TRTLLM = (1, 2)  # newest TensorRT-LLM with a Triton tensorrtllm backend
TOKEN_MAP = "cosycompile_llm.json"  # cosycompile.stages.llm.hf_rewrite.TOKEN_MAP_FILE (not imported: it loads torch)
WAV_INPUTS = [TensorConfig("reference_wav", "float32", (-1,)), TensorConfig("reference_wav_len", "int32", (1,))]


def _graph_tensors(spec: dict[str, Any], key: str) -> list[TensorConfig]:
    return [TensorConfig(t["name"], t["dtype"], spec_dims(t["shape"])) for t in spec[key]]


def trt_config(name: str, spec: dict[str, Any]) -> ModelConfig:
    """A ``tensorrt_plan`` model of one engine graph (its spec from the passport), on the GPU."""
    return ModelConfig(name, _graph_tensors(spec, "inputs"), _graph_tensors(spec, "outputs"), platform="tensorrt_plan",
                       instance_kind="KIND_GPU", default_model_filename="model.plan")


def _trtllm_version(passport: dict[str, Any]) -> tuple[int, ...] | None:
    raw = passport.get("tensorrt_llm") or (passport.get("tools") or {}).get("tensorrt-llm")
    try:
        return tuple(int(p) for p in str(raw).split(".")[:2])
    except ValueError:
        return None


def trtllm_config(passport: dict[str, Any], engine_dir: Path) -> ModelConfig:
    """The ``tensorrt_llm`` model (inflight batching, streaming), as CosyVoice's run.sh fills its template."""
    options = passport.get("options") or {}
    inputs = [TensorConfig("input_ids", "int32", (-1,)), TensorConfig("input_lengths", "int32", (1,)),
              TensorConfig("request_output_len", "int32", (1,))]
    inputs += [TensorConfig(n, d, (1,), optional=True) for n, d in (
        ("end_id", "int32"), ("pad_id", "int32"), ("streaming", "bool"), ("runtime_top_k", "int32"),
        ("runtime_top_p", "float32"), ("temperature", "float32"), ("repetition_penalty", "float32"),
        ("random_seed", "uint64"))]
    # CosyVoice3 stops on any of 200 ids, more than one end_id says: the front model sends them all.
    inputs.append(TensorConfig("stop_words_list", "int32", (2, -1), optional=True))
    outputs = [TensorConfig("output_ids", "int32", (-1, -1)), TensorConfig("sequence_length", "int32", (-1,))]
    params = {"gpt_model_type": "inflight_fused_batching", "gpt_model_path": str(engine_dir),
              "batching_strategy": "inflight_fused_batching", "max_tokens_in_paged_kv_cache": "2560",
              "max_attention_window_size": "2560", "kv_cache_free_gpu_mem_fraction": "0.5",
              "exclude_input_in_output": "true", "enable_kv_cache_reuse": "false"}
    return ModelConfig("tensorrt_llm", inputs, outputs, backend="tensorrtllm",
                       max_batch_size=int(options.get("max_batch_size", 16)), instance_kind="KIND_CPU",
                       decoupled=True, parameters=params)


def token_map_file(w: Writer, passport: dict[str, Any]) -> str:
    """The bundle-relative path of the LM's token map: beside a TensorRT-LLM <= 1.2 engine, or in the
    checkpoint a >= 1.3 engine dir serves from."""
    candidates = [f"engines/llm/{TOKEN_MAP}"]
    if passport.get("checkpoint"):
        candidates.append(f"engines/llm/{passport['checkpoint']}/{TOKEN_MAP}")
    found = next((c for c in candidates if (w.bundle / c).is_file()), None)
    if found is None:
        raise UserError(f"{w.bundle / candidates[0]}: missing; the GPU layout reads the LM's prompt, speech and stop "
                        "ids from the token map of its HF rewrite (rebuild the bundle with this cosycompile)")
    return found


def gpu_configs(w: Writer, options: RepoOptions, out: Path) -> list[tuple[ModelConfig, str]]:
    """Every model's config with its role, from the bundle's passports and recipe."""
    from cosycompile.runtime.bundle import recipe_sampling

    passports = {s: w.bundle_json(f"engines/{s}/engine.json") for s in ("llm", "flow", "hift")}
    info = w.bundle_json("engines/flow/graphs.json").get("info") or {}
    mel_bins, spk = int(info.get("mel_bins", 80)), int(info.get("spk_embed_dim", 192))
    token_map_file(w, passports["llm"])
    llm_version = _trtllm_version(passports["llm"])
    if options.llm_url is None and llm_version is not None and llm_version > LAST_TRITON_TRTLLM:
        raise UserError(f"{w.bundle / 'engines/llm/engine.json'}: TensorRT-LLM {'.'.join(map(str, llm_version))} has "
                        f"no Triton tensorrtllm backend (last: 1.2); serve the LLM with trtllm-serve and pass --llm-url")
    sampling = recipe_sampling(w.recipe)
    bls = {"frontend": "frontend", "max_chars": str(options.max_chars), "token_map": TOKEN_MAP,
           "sample_rate": str(w.sample_rate()),
           "llm": "trtllm-serve" if options.llm_url else "tensorrt_llm", "llm_url": options.llm_url or "",
           "top_k": str(sampling.top_k), "top_p": str(sampling.top_p), "max_tokens": str(sampling.max_tokens or 0),
           "bundle_key": str(w.manifest.get("key", ""))}
    configs = [(ModelConfig(name, list(INPUTS), list(OUTPUTS), backend="python", max_batch_size=1,
                            instance_count=options.instances, decoupled=dec, parameters=dict(bls)),
                "text -> waveform (BLS), " + ("streaming in token chunks" if dec else "offline"))
               for name, dec in zip(model_names(w.manifest), (True, False))]
    configs.append((ModelConfig("audio_tokenizer", list(WAV_INPUTS), [TensorConfig("prompt_speech_tokens", "int64",
                                (-1,))], backend="python", instance_count=options.instances,
                                parameters={"frontend": "frontend"}), "prompt wav -> speech tokens"))
    configs.append((ModelConfig("speaker_embedding", list(WAV_INPUTS), [TensorConfig("prompt_spk_embedding", "float32",
                                (spk,))], backend="python", instance_count=options.instances,
                                parameters={"frontend": "frontend"}), "prompt wav -> x-vector"))
    t2w_in = [TensorConfig("target_speech_tokens", "int64", (-1,)),
              TensorConfig("prompt_speech_tokens", "int64", (-1,), optional=True),
              TensorConfig("prompt_speech_feat", "float32", (mel_bins, -1), optional=True),
              TensorConfig("prompt_spk_embedding", "float32", (spk,), optional=True),
              TensorConfig("seed", "int64", (1,), optional=True)]
    configs.append((ModelConfig("token2wav", t2w_in, [TensorConfig("waveform", "float32", (-1,))], backend="python",
                                instance_count=options.instances, parameters={"flow": "flow", "hift": "hift"}),
                    "speech tokens -> waveform (BLS over flow_encoder, flow_estimator, vocoder)"))
    for model, (stage, graph) in TRT_MODELS.items():
        spec = (passports[stage].get("graphs") or {}).get(graph)
        if not isinstance(spec, dict):
            raise UserError(f"{w.bundle / 'engines' / stage / 'engine.json'}: no spec of graph '{graph}'")
        configs.append((trt_config(model, spec), f"TensorRT engine {stage}/{graph}{PLAN_SUFFIX}"))
    if options.llm_url is None:
        # The bundle's llm engine dir is linked as tensorrt_llm/1/engine; trtllm-build's output is the
        # sub-folder its passport names (``engine_dir``).
        engine = out.resolve() / "tensorrt_llm" / "1" / "engine" / str(passports["llm"].get("engine_dir", ""))
        configs.append((trtllm_config(passports["llm"], engine),
                        "TensorRT-LLM engine of the LM"))
    return configs


def write_gpu(w: Writer, options: RepoOptions, out: Path) -> str:
    """Write every model (config, model.py, engines, front end) and return the README text."""
    front = model_names(w.manifest)
    classes = {front[0]: "TextToWave", front[1]: "TextToWave", "audio_tokenizer": "AudioTokenizer",
               "speaker_embedding": "SpeakerEmbedding", "token2wav": "Token2Wav"}
    token_map = token_map_file(w, w.bundle_json("engines/llm/engine.json"))
    for cfg, role in gpu_configs(w, options, out):
        w.config(cfg, role)
        if cfg.name in classes:
            w.text(f"{cfg.name}/1/model.py", model_py(cfg.name, SERVE_MODULE, classes[cfg.name]))
        if cfg.name in (*front, "audio_tokenizer", "speaker_embedding"):
            w.link_tree("frontend", f"{cfg.name}/1/frontend")
        if cfg.name in front:
            w.link("recipe.json", f"{cfg.name}/1/recipe.json")
            w.link(token_map, f"{cfg.name}/1/{TOKEN_MAP}")
            # Cached speakers, checked against the manifest's digests when a request names one.
            w.link_manifest(f"{cfg.name}/1/{MANIFEST}")
            w.link_tree(SPEAKERS_DIR, f"{cfg.name}/1/{SPEAKERS_DIR}")
        if cfg.name in ("token2wav", front[0]):  # the streaming model cuts its chunks with the same runtimes
            for stage in ("flow", "hift"):  # graphs.json (runtime info) and numpy assets; the engines are models
                w.link_tree(f"engines/{stage}", f"{cfg.name}/1/{stage}", skip=(PLAN_SUFFIX, "engine.json"))
        if cfg.name in TRT_MODELS:
            stage, graph = TRT_MODELS[cfg.name]
            w.link(f"engines/{stage}/{graph}{PLAN_SUFFIX}", f"{cfg.name}/1/model.plan")
        if cfg.name == "tensorrt_llm":
            w.link_tree("engines/llm", "tensorrt_llm/1/engine")
    return readme(w, options, out)


def readme(w: Writer, options: RepoOptions, out: Path) -> str:
    """How to serve the GPU repository."""
    streaming, offline = model_names(w.manifest)
    llm = (f"The LM is served by trtllm-serve at `{options.llm_url}` (parameter `llm_url` of `{streaming}`)."
           if options.llm_url else
           f"`tensorrt_llm/config.pbtxt` names its engine by absolute path (`gpt_model_path`, as Triton's "
           f"tensorrtllm backend requires): `{out.resolve() / 'tensorrt_llm' / '1' / 'engine'}`. After moving "
           f"the repository, write it again with `cosycompile triton` or edit that parameter.")
    return f"""# Triton model repository of bundle `{w.bundle.name}` (GPU: TensorRT + TensorRT-LLM)

Written by `cosycompile triton` from recipe `{w.manifest.get('recipe')}` (bundle key `{w.manifest.get('key')}`),
in the shape of CosyVoice's `runtime/triton_trtllm`. Models: {', '.join(f'`{m}`' for m in w.models)}.

- `{streaming}` (decoupled: one `waveform` response per token chunk) and `{offline}` (one response) are python
  BLS models: text pieces -> token ids (the bundle's front end; the family's instruction before the prompt
  text where it has one) -> LM -> speech. `{offline}` sends each piece's tokens to `token2wav`; `{streaming}`
  reads the LM's tokens as they come (`tensorrt_llm` with `streaming`) and cuts chunks on the family's
  schedule with the same runtimes over the same engines (cosycompile's `runtime/streaming.py`; behind
  trtllm-serve the tokens arrive at once and are cut the same way). A prompt goes through `audio_tokenizer` and
  `speaker_embedding`; a `speaker` input names a voice cached in the bundle (`cosycompile speakers add`),
  read from `speakers/` beside the model (digest-checked against the linked manifest). The LM's prompt,
  speech and stop ids are those of `{TOKEN_MAP}` beside their
  `model.py`. Inputs and outputs are those of the CPU layout (`target_text` or `target_text_utf8`, optional
  prompt inputs and `seed`; `waveform` at the vocoder's sample rate).
- `token2wav` runs the CFM loop and the iSTFT in numpy (cosycompile's runtime) and calls the TensorRT
  engines `flow_encoder`, `flow_estimator` and `vocoder` (HiFT up to the iSTFT) as `tensorrt_plan` models.
- {llm}

Serve with a Triton image that has the python, tensorrt and (for `tensorrt_llm`) tensorrtllm backends, the
TensorRT version the engines were built with, and `PYTHONPATH` naming an environment with cosycompile,
numpy and onnxruntime (the generated `model.py` files add `PYTHONPATH`'s entries to the python stub's
`sys.path`; see cosycompile's `exporters/triton/shim.py`). Not run on a GPU by cosycompile's tests: they
check that every config parses and matches the bundle.
"""
