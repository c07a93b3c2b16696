"""The CPU layout: two python-backend models over the bundle, streaming (gRPC) and offline (HTTP).

``tritonclient``'s HTTP client cannot talk to a decoupled model, so the same code is served twice,
named after the bundle's model family: ``cosyvoice2`` (decoupled: one response per token chunk, gRPC
streaming) and ``cosyvoice2_offline`` (one response per request, HTTP or gRPC), ``cosyvoice3`` and
``cosyvoice3_offline`` for a CosyVoice3 bundle. Each has the whole bundle in ``1/bundle/``.
"""

from __future__ import annotations

from cosycompile.exporters.triton.config import ModelConfig, TensorConfig
from cosycompile.exporters.triton.repository import RepoOptions, Writer
from cosycompile.exporters.triton.shim import model_py

SERVE_MODULE = "cosycompile.exporters.triton.serve_cpu"

# CosyVoice's runtime contract (runtime/triton_trtllm cosyvoice2 model), plus an optional seed.
# Each text also as UTF-8 UINT8 (``*_utf8``): a python stub built for numpy 1.x garbles BYTES under numpy 2
# (pbcompat.py); one of the two target inputs is required, which the model checks.
INPUTS = [
    TensorConfig("target_text", "string", (1,), optional=True),
    TensorConfig("target_text_utf8", "uint8", (-1,), optional=True),
    TensorConfig("reference_wav", "float32", (-1,), optional=True),
    TensorConfig("reference_wav_len", "int32", (1,), optional=True),
    TensorConfig("reference_text", "string", (1,), optional=True),
    TensorConfig("reference_text_utf8", "uint8", (-1,), optional=True),
    TensorConfig("seed", "int64", (1,), optional=True),
    # A speaker cached in the bundle (cosycompile speakers add) instead of reference_wav/_text.
    TensorConfig("speaker", "string", (1,), optional=True),
    TensorConfig("speaker_utf8", "uint8", (-1,), optional=True),
]
OUTPUTS = [TensorConfig("waveform", "float32", (-1,))]


def model_names(manifest: dict) -> tuple[str, str]:
    """(streaming, offline) model names of a bundle: its family's name (bundles written before the
    manifest named a family are CosyVoice2's)."""
    from cosycompile.families import LEGACY_FAMILY

    family = str(manifest.get("family", LEGACY_FAMILY))
    return family, f"{family}_offline"


def cpu_configs(w: Writer, options: RepoOptions) -> list[ModelConfig]:
    """The two models' configs, from the recipe (threads, sampling) and the options."""
    from cosycompile.runtime.bundle import recipe_sampling, recipe_threads

    threads = options.threads or recipe_threads(w.recipe)
    sampling = recipe_sampling(w.recipe)
    params = {"bundle": "bundle", "threads": str(threads), "max_chars": str(options.max_chars),
              "sampling": sampling.mode, "sample_rate": str(w.sample_rate()), "bundle_key": str(w.manifest.get("key", "")),
              "max_text_chars": str(options.max_text_chars), "request_timeout_s": str(options.request_timeout_s),
              "spin_wait": "true" if options.spin_wait else "false"}
    return [ModelConfig(name, list(INPUTS), list(OUTPUTS), backend="python", max_batch_size=1,
                        instance_kind="KIND_CPU", instance_count=options.instances, decoupled=decoupled,
                        parameters=dict(params))
            for name, decoupled in zip(model_names(w.manifest), (True, False))]


def write_cpu(w: Writer, options: RepoOptions) -> str:
    """Write both models (config, model.py, the bundle) and return the README text."""
    for cfg in cpu_configs(w, options):
        w.config(cfg, "text -> waveform, " + ("streaming in token chunks (gRPC)" if cfg.decoupled else "offline"))
        w.text(f"{cfg.name}/1/model.py", model_py(cfg.name, SERVE_MODULE))
        w.link_tree("", f"{cfg.name}/1/bundle")
    return readme(w, options)


def readme(w: Writer, options: RepoOptions) -> str:
    """How to serve and call the CPU repository (the environment lines are this machine's)."""
    from cosycompile.exporters.triton.server import server_ld_library_path, server_pythonpath

    streaming, offline = model_names(w.manifest)
    rate = w.sample_rate()
    return f"""# Triton model repository of bundle `{w.bundle.name}` (CPU, ONNX Runtime)

Written by `cosycompile triton` from recipe `{w.manifest.get('recipe')}` (bundle key `{w.manifest.get('key')}`).
Every model is a python-backend model running the bundle's engines through cosycompile's torch-free
runtime: the same code as `cosycompile synthesize`, so the same text and seed give the same samples.

| model | transaction | protocol | what |
|---|---|---|---|
| `{streaming}` | decoupled | gRPC streaming | a `waveform` response per token chunk as the LM decodes, then a final empty one |
| `{offline}` | one response | HTTP or gRPC | the whole `waveform` of the text |

Inputs (batch dim 1): `target_text` BYTES [1,1] or `target_text_utf8` UINT8 [1,N] (its UTF-8 bytes);
optional `reference_wav` FP32 [1,N] (16 kHz prompt audio), `reference_wav_len` INT32 [1,1], `reference_text`
BYTES [1,1] or `reference_text_utf8` UINT8 [1,N]; or instead `speaker` BYTES [1,1] / `speaker_utf8` UINT8 [1,N],
the name of a voice cached in the bundle (`cosycompile speakers add`: its prompt features are not computed per
request); optional `seed` INT64 [1,1] (text piece k uses seed+k; default the recipe's sampling seed).
Limits (`parameters` `max_text_chars`, `request_timeout_s`): a longer text is refused at once; a request
running past the timeout, or cancelled by its client, stops at its next token chunk (streaming) or text piece (offline).
Output: `waveform` FP32 [1,samples], {rate} Hz mono.

**BYTES and numpy 2.** The python stub of tritonserver 2.51 (the `nvidia-pytriton` 0.7.0 wheel) converts
tensors with a pybind11 built for numpy 1.x; under numpy 2 a BYTES tensor reaches Python garbled. The
models detect this at load (logged) and then answer a BYTES text with an error naming `*_utf8`: send
`np.frombuffer(text.encode(), np.uint8)[None]` as `target_text_utf8`. Numeric tensors go through DLPack
and are exact with either numpy.
Each model's `1/bundle/` is the whole bundle (hard links where possible); `repository.json` lists every
file with its sha256. Instances: {options.instances} per model (KIND_CPU); threads per instance: see
`parameters` in each `config.pbtxt`. Idle engine threads sleep between ops (`spin_wait` false, ONNX
Runtime's `allow_spinning` off): on a 2-core machine requests ran faster so, with one instance or two;
`true` lets them spin, which may pay where an instance has cores to spare.

## Serving

The models import `cosycompile`, `numpy` and `onnxruntime`. Triton's python stub runs its own
embedded interpreter (the libpython of the stub's Python version, 3.11 here) and does not put
`PYTHONPATH` on `sys.path`, but it inherits the variable: each generated `model.py` adds the entries
of the server's `PYTHONPATH` as site dirs in front of the interpreter's own. So start the server with

- `PYTHONPATH` = the site-packages of the environment that has cosycompile installed, then the folder
  that holds the `cosycompile` package (an editable install's source root);
- `LD_LIBRARY_PATH` = tritonserver's libraries, then the lib folder of that environment's Python, so
  the stub loads the same libpython as the environment's interpreter;
- a backend dir whose `python/` holds `libtriton_python.so`, `triton_python_backend_utils.py` and the
  `triton_python_backend_stub` of that Python version.
  The stub's interpreter imports numpy before `model.py` runs (from its own site-packages):
  keep that numpy the environment's version.

On a CPU machine, the `nvidia-pytriton` wheel (installed with `--no-deps`, see cosycompile's Makefile)
ships tritonserver 2.51 at `pytriton/tritonserver/bin/tritonserver`, its libraries in
`nvidia_pytriton.libs/`, the python backend in `pytriton/tritonserver/backends/python/` and the
stubs in `pytriton/tritonserver/python_backend_stubs/3.X/`; `cosycompile.exporters.triton.server`
has `prepare_backend_dir`, `server_env` and `server_command` for exactly this. On the machine
that wrote this repository:

```
PYTHONPATH={server_pythonpath()}
LD_LIBRARY_PATH={server_ld_library_path()}
tritonserver --model-repository <this folder> --backend-directory <backend dir> --http-port 8000 --grpc-port 8001
```

## Calling

```python
import numpy as np, tritonclient.http as http, tritonclient.grpc as grpc
text = np.frombuffer("Hello there.".encode(), np.uint8)[None]   # or BYTES target_text where the stub allows
c = http.InferenceServerClient("127.0.0.1:8000")
i = http.InferInput("target_text_utf8", list(text.shape), "UINT8"); i.set_data_from_numpy(text)
wav = c.infer("{offline}", [i]).as_numpy("waveform")[0]          # {rate} Hz float32

g = grpc.InferenceServerClient("127.0.0.1:8001")               # streaming: token chunks as they are ready
g.start_stream(callback=lambda result, error: print(error or result.as_numpy("waveform").shape))
gi = grpc.InferInput("target_text_utf8", list(text.shape), "UINT8"); gi.set_data_from_numpy(text)
g.async_stream_infer("{streaming}", [gi]); g.stop_stream()
```
"""
