"""TensorRT engines: ``build`` turns each ONNX graph of a graphs dir into ``<graph>.plan``; ``load``
deserialises them into Runners that run on CUDA (torch tensors on the device, or numpy copied over).

One optimisation profile per graph, from the graph spec's named dynamic dims (min/opt/max, e.g. the
estimator's frames 4/500/3000 at batch 2 as CosyVoice's own profile) or ``options.profiles``; every
input's shape is resolved from the spec (fixed sizes, dim names, products such as HiFT's
``frames*samples_per_frame``) and checked against the parsed network.
"""

from __future__ import annotations

import math
import queue
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.backends.tensorrt import check_format, resolve_flavour
from cosycompile.backends.tensorrt.api import TrtApi, import_api, sm_tag
from cosycompile.core.atomic import write_atomic
from cosycompile.errors import BackendUnavailable, RecipeError
from cosycompile.core.targets import TARGETS, Target
from cosycompile.runtime.graphs_dir import GraphsDir, copy_assets, read_graphs_dir
from cosycompile.runtime.loading import read_passport

PLAN_SUFFIX = ".plan"
POINTS = ("min", "opt", "max")
MAX_WARNINGS = 20  # distinct builder warnings kept per graph in the passport


# ---------------------------------------------------------------------------------------------- shapes

def input_dims(spec: dict[str, Any]) -> set[str]:
    """Dynamic dims that size an input (an output-only dim, like the LLM's ``total``, has no profile)."""
    used = {part for t in spec["inputs"] for e in t["shape"] if isinstance(e, str) for part in e.split("*")}
    return used & set(spec.get("dims", {}))


def profile_dims(spec: dict[str, Any], overrides: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The graph's input dims as ``{name: {min, opt, max}}``: the spec's hints, then the recipe's."""
    dims = {name: {p: int(d[p]) for p in POINTS} for name, d in spec.get("dims", {}).items() if name in input_dims(spec)}
    for name, (lo, opt, hi) in overrides.items():
        if name in dims:
            dims[name] = {"min": int(lo), "opt": int(opt), "max": int(hi)}
    return dims


def resolve_shape(shape: list[int | str], sizes: dict[str, int], info: dict[str, Any], where: str) -> tuple[int, ...]:
    """A spec shape at one profile point: ints stay, dim names take ``sizes``, ``"a*b"`` multiplies
    dims and model constants (``info`` from graphs.json)."""
    out = []
    for entry in shape:
        if isinstance(entry, int):
            out.append(entry)
            continue
        total = 1
        for part in str(entry).split("*"):
            if part in sizes:
                total *= sizes[part]
            elif part in info and isinstance(info[part], (int, float)):
                total *= int(info[part])
            elif part.isdigit():
                total *= int(part)
            else:
                raise BackendUnavailable(f"{where}: shape entry '{entry}' names '{part}', which is neither a dynamic "
                                         "dim of the graph nor a model constant in graphs.json's info")
        out.append(total)
    return tuple(out)


def profile_shapes(spec: dict[str, Any], dims: dict[str, dict[str, int]], info: dict[str, Any],
                   graph: str) -> dict[str, dict[str, tuple[int, ...]]]:
    """``{input: {min, opt, max: shape}}`` for every input of the graph spec."""
    out = {}
    for t in spec["inputs"]:
        out[t["name"]] = {p: resolve_shape(t["shape"], {n: d[p] for n, d in dims.items()}, info,
                                           f"graph '{graph}' input '{t['name']}'") for p in POINTS}
    return out


def _check_network_inputs(network: Any, shapes: dict[str, dict[str, tuple[int, ...]]], graph: str) -> None:
    """The parsed network must have the spec's inputs, with the spec's fixed sizes where it has fixed sizes."""
    seen = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        seen[t.name] = tuple(t.shape)
    if set(seen) != set(shapes):
        raise BackendUnavailable(f"graph '{graph}': the ONNX inputs {sorted(seen)} differ from the graph spec's "
                                 f"{sorted(shapes)}")
    for name, onnx_shape in seen.items():
        for point, shape in shapes[name].items():
            bad = len(shape) != len(onnx_shape) or any(o != -1 and o != s for o, s in zip(onnx_shape, shape))
            if bad:
                raise BackendUnavailable(f"graph '{graph}' input '{name}': {point} shape {list(shape)} from the graph "
                                         f"spec does not fit the ONNX shape {list(onnx_shape)} (-1 = dynamic)")


# ---------------------------------------------------------------------------------------------- build

_OUT_OF_MEMORY = re.compile(r"OutOfMemory \(Requested size was (\d+) bytes")


def workspace_hint(errors: list[str], workspace_gib: float) -> str | None:
    """What to change when the builder's errors say it asked for more memory than the workspace limit
    (TensorRT-RTX reports it as OutOfMemory, also on a machine with memory to spare); None otherwise."""
    asked = [int(m.group(1)) for e in errors if (m := _OUT_OF_MEMORY.search(e))]
    if not asked or max(asked) <= workspace_gib * 2**30:
        return None
    need = max(asked) / 2**30
    return (f"(it asked for {need:.1f} GiB, more than engine.options.workspace_gib: {workspace_gib:g}; "
            f"set it to at least {math.ceil(need)} for this stage)")


def _parser_error(parser: Any, graph: str, api: TrtApi) -> BackendUnavailable:
    """The parser's first error as one line naming the graph and the node."""
    n = parser.num_errors
    if n == 0:
        return BackendUnavailable(f"graph '{graph}': {api.label}'s ONNX parser failed without saying why")
    e = parser.get_error(0)
    node = f"node {e.node()}"
    if e.node_name():
        node += f" '{e.node_name()}'"
    if e.node_operator():
        node += f" ({e.node_operator()})"
    more = f" (+{n - 1} more)" if n > 1 else ""
    return BackendUnavailable(f"graph '{graph}': {api.label}'s ONNX parser failed at {node}: {e.desc()}{more}")


def _build_gpu() -> tuple[str, tuple[int, int]] | None:
    """Name and compute capability of the CUDA device TensorRT builds on (None: no CUDA device)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    i = torch.cuda.current_device()
    return torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i))  # type: ignore[return-value]


def _check_build_gpu(target: Target, hardware_compatibility: str) -> dict[str, str]:
    """TensorRT tunes kernels for the GPU it runs on, so that GPU must be one the engine is for."""
    gpu = _build_gpu()
    if gpu is None:
        raise BackendUnavailable(f"TensorRT builds on the GPU it builds for and no CUDA GPU is visible here; build for "
                                 f"target '{target.name}' on a {target.sm_tag} GPU (or flavour rtx for RTX-class targets)")
    name, sm = gpu
    ok = sm >= (8, 0) if hardware_compatibility == "ampere_plus" else sm == target.sm
    if not ok:
        need = "an Ampere or newer" if hardware_compatibility == "ampere_plus" else f"a {target.sm_tag}"
        raise BackendUnavailable(f"this machine's GPU is {name} ({sm_tag(sm)}); an engine for target '{target.name}' "
                                 f"({target.sm_tag}, hardware_compatibility {hardware_compatibility}) must be built on "
                                 f"{need} GPU")
    return {"name": name, "compute_capability": sm_tag(sm)}


def _gpu_names(target: Target, hardware_compatibility: str, ccs: list[str]) -> list[str]:
    if hardware_compatibility == "none":
        return [target.gpu_name]
    if ccs == ["sm80+"]:
        return sorted({t.gpu_name for t in TARGETS.values() if t.sm and t.sm >= (8, 0)})
    return sorted({t.gpu_name for t in TARGETS.values() if t.sm and sm_tag(t.sm) in ccs})


def _precision(gd: GraphsDir, name: str) -> str:
    """A graph's precision: its own entry, else the stage's, except graphs the quantizer left alone."""
    g = gd.graphs[name]
    if g.get("precision"):
        return str(g["precision"])
    if name not in gd.info.get("quantized_graphs", [name]):
        return "fp32"
    return str(gd.info.get("precision", "fp32"))


def _check_request(gd: GraphsDir, options: Any, target: Target) -> None:
    """What the recipe loader cannot check for GPU targets: formats, and profile dims by name."""
    stage = gd.stage
    if not gd.graphs:
        raise RecipeError(f"stages.{stage}.quantize.exports: the {stage} graphs dir holds no ONNX graph for TensorRT "
                          "(add onnx to the exports, or build the checkpoint with backend trtllm)")
    for name in gd.graphs:
        fmt = _precision(gd, name)
        problem = check_format(stage, fmt, options, 0)
        reason = problem[1] if problem else target.format_problem(fmt)
        if reason:
            raise RecipeError(f"stages.{stage}.quantize.format: {reason}")
    known = {d for g in gd.graphs.values() if g.get("spec") for d in input_dims(g["spec"])}
    for dim in options.profiles:
        if dim not in known:
            raise RecipeError(f"stages.{stage}.engine.options.profiles.{dim}: the {stage} graphs have no dynamic dim "
                              f"'{dim}' (they have: {', '.join(sorted(known)) or 'none'})")


def _build_graph(api: TrtApi, path: Path, name: str, spec: dict[str, Any], info: dict[str, Any], options: Any,
                 target: Target, cache: bytes | None) -> tuple[bytes, dict[str, Any], bytes | None]:
    """One graph -> (serialized engine, passport facts, the timing cache after the build)."""
    trt = api.trt
    logger = api.logger()
    builder = trt.Builder(logger)
    network = builder.create_network(api.network_flags(options.builder_fp16))
    parser = trt.OnnxParser(network, logger)
    # From the file, so that external weights next to it are found.
    if not parser.parse_from_file(str(path)):
        raise _parser_error(parser, name, api)
    dims = profile_dims(spec, options.profiles)
    shapes = profile_shapes(spec, dims, info, name)
    _check_network_inputs(network, shapes, name)

    config = builder.create_builder_config()
    api.set_workspace(config, options.workspace_gib)
    config.builder_optimization_level = options.builder_optimization_level
    ccs = api.set_target(config, target.sm, options.hardware_compatibility)  # type: ignore[arg-type]
    api.set_version_compatible(config, options.version_compatible)
    api.set_precision_flags(config, options.builder_fp16)
    cache_used = (api.load_timing_cache(config, cache) and bool(cache)) if cache is not None else None
    profile = builder.create_optimization_profile()
    for inp, s in shapes.items():
        profile.set_shape(inp, s["min"], s["opt"], s["max"])
    config.add_optimization_profile(profile)

    t0 = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendUnavailable(f"graph '{name}': {api.label} could not build an engine for {', '.join(ccs)} "
                                 + (workspace_hint(getattr(logger, "errors", []), options.workspace_gib)
                                    or "(its log above says why)"))
    facts = {
        "compute_capabilities": ccs,
        "dims": dims,
        "shapes": {inp: {p: list(v) for p, v in s.items()} for inp, s in shapes.items()},
        "seconds": round(time.perf_counter() - t0, 3),
        "timing_cache_reused": cache_used,
        "warnings": [m if c == 1 else f"{m} (x{c})" for m, c in getattr(logger, "warnings", {}).items()][:MAX_WARNINGS],
    }
    new_cache = api.timing_cache_bytes(config) if cache is not None else None
    return bytes(plan), facts, new_cache


def build(src: Path, options: Any, target: Target, out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Build ``<graph>.plan`` for every graph of ``src`` into ``out``; returns the passport's backend fields.

    ``cache_dir``: where the timing cache lives between builds (result-neutral: it only saves tuning
    time); one file per flavour, builder version and compute capability.
    """
    if target.sm is None:
        raise BackendUnavailable(f"the tensorrt backend builds GPU engines, not for target '{target.name}'")
    gd = read_graphs_dir(src)
    _check_request(gd, options, target)
    flavour = resolve_flavour(options.flavour, target)
    api = import_api(flavour)
    build_gpu = _check_build_gpu(target, options.hardware_compatibility) if flavour == "tensorrt" else None

    cache_path = None
    cache: bytes | None = None
    if api.uses_timing_cache and cache_dir is not None:
        cache_path = Path(cache_dir) / f"{flavour}-{api.version}-{target.sm_tag}.timing-cache"
        cache = cache_path.read_bytes() if cache_path.is_file() else b""

    out.mkdir(parents=True, exist_ok=True)
    eng = copy_assets(gd, out)
    facts: dict[str, dict[str, Any]] = {}
    for name, g in gd.graphs.items():
        spec = g.get("spec")
        if not spec:
            raise BackendUnavailable(f"{src}: graph '{name}' has no spec in graphs.json (needed for its profile)")
        plan, facts[name], cache = _build_graph(api, gd.graph_path(name), name, spec, gd.info, options, target, cache)
        (out / f"{name}{PLAN_SUFFIX}").write_bytes(plan)
        eng.graphs[name] = dict(g, file=f"{name}{PLAN_SUFFIX}")
    eng.info = dict(gd.info)
    eng.write()
    if cache_path is not None and cache:
        # Other builds may share the timing cache file: they read the old one or the new one.
        write_atomic(cache_path, cache)

    ccs = next(iter(facts.values()))["compute_capabilities"]
    return {
        "flavour": flavour,
        "builder": api.label,
        "backend_version": api.version,
        "compute_capabilities": ccs,
        "gpu_names": _gpu_names(target, options.hardware_compatibility, ccs),
        "build_gpu": build_gpu,  # None: compiled ahead of time without a GPU (TensorRT-RTX)
        "strongly_typed": not options.builder_fp16,
        "builder_fp16": options.builder_fp16,
        "precisions": {name: _precision(gd, name) for name in gd.graphs},
        "profiles": {name: f["shapes"] for name, f in facts.items()},
        "profile_dims": {name: f["dims"] for name, f in facts.items()},
        "hardware_compatibility": options.hardware_compatibility,
        "version_compatible": options.version_compatible,
        "builder_optimization_level": options.builder_optimization_level,
        "workspace_gib": options.workspace_gib,
        "timing_cache": cache_path.name if cache_path is not None else None,
        "timing_cache_reused": {name: f["timing_cache_reused"] for name, f in facts.items()},
        "build_seconds": {name: f["seconds"] for name, f in facts.items()},
        "builder_warnings": {name: f["warnings"] for name, f in facts.items() if f["warnings"]},
    }


# ---------------------------------------------------------------------------------------------- load

# TensorRT DataType member names -> torch dtype names.
_TORCH_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
                 "INT8": "int8", "UINT8": "uint8", "BOOL": "bool"}


class TorchCuda:
    """The CUDA side of a Runner, through torch (imported here, only when engines are loaded)."""

    def __init__(self) -> None:
        try:
            import torch
        except ImportError as exc:
            raise BackendUnavailable(f"running TensorRT engines needs torch with CUDA: {exc}") from None
        if not torch.cuda.is_available():
            raise BackendUnavailable("running TensorRT engines needs a CUDA GPU; torch sees none")
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())

    def dtype(self, name: str) -> Any:
        return getattr(self.torch, name)

    def stream(self) -> Any:
        return self.torch.cuda.Stream(device=self.device)

    def stream_handle(self, stream: Any) -> int:
        return int(stream.cuda_stream)

    def is_device_array(self, x: Any) -> bool:
        return isinstance(x, self.torch.Tensor)

    def to_device(self, x: Any, dtype: Any) -> Any:
        """A contiguous device tensor of ``dtype``: device tensors are used in place when they already are one."""
        t = x if isinstance(x, self.torch.Tensor) else self.torch.from_numpy(np.ascontiguousarray(x))
        return t.to(device=self.device, dtype=dtype).contiguous()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.empty(shape, dtype=dtype, device=self.device)

    def before(self, stream: Any) -> None:
        """The engine's stream waits for the copies and for whatever produced device inputs."""
        stream.wait_stream(self.torch.cuda.current_stream(self.device))

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def to_host(self, t: Any) -> np.ndarray:
        return t.cpu().numpy()


class TrtRunner:
    """A Runner over one engine: a small pool of (execution context, stream) pairs so that concurrent
    callers (throughput runs) do not share a context; each call synchronizes its stream before returning."""

    def __init__(self, api: TrtApi, engine: Any, device: Any, inputs: list[str], outputs: list[str],
                 out_dtypes: dict[str, str], pool: int) -> None:
        trt = api.trt
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        ins = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        missing = sorted((set(inputs) - set(ins)) | (set(outputs) - (set(names) - set(ins))))
        if missing:
            raise BackendUnavailable(f"engine lacks the graph spec's tensors {missing} (it has {names})")
        self.engine = engine
        self.device = device
        self.input_names = list(inputs)
        self.output_names = list(outputs)
        self._dtype = {n: device.dtype(_TORCH_DTYPES[engine.get_tensor_dtype(n).name]) for n in names}
        # The graph spec's dtypes: what the numpy pipeline expects back, whatever the engine computes in.
        self._out_dtype = {n: device.dtype(out_dtypes.get(n, "float32")) for n in outputs}
        self._pool: queue.Queue = queue.Queue()
        for _ in range(pool):
            context = engine.create_execution_context()
            if context is None:
                raise BackendUnavailable("TensorRT could not create an execution context (out of GPU memory?)")
            self._pool.put((context, device.stream()))
        self._empty = device.empty((1,), device.dtype("float32"))  # an address for zero-volume tensors

    def _address(self, t: Any) -> int:
        return int(t.data_ptr()) if t.numel() else int(self._empty.data_ptr())

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Run once; device tensors in -> device tensors out, numpy in -> numpy out."""
        on_device = any(self.device.is_device_array(feeds[n]) for n in self.input_names)
        context, stream = self._pool.get()
        try:
            keep = {}
            for n in self.input_names:
                t = keep[n] = self.device.to_device(feeds[n], self._dtype[n])
                if not context.set_input_shape(n, tuple(t.shape)):
                    raise BackendUnavailable(f"input '{n}' shape {tuple(t.shape)} is outside the engine's profile")
                context.set_tensor_address(n, self._address(t))
            outs = {}
            for n in self.output_names:
                shape = tuple(context.get_tensor_shape(n))
                if any(s < 0 for s in shape):
                    raise BackendUnavailable(f"output '{n}' has a data-dependent shape {shape}; not supported")
                outs[n] = self.device.empty(shape, self._dtype[n])
                context.set_tensor_address(n, self._address(outs[n]))
            self.device.before(stream)
            if not context.execute_async_v3(self.device.stream_handle(stream)):
                raise BackendUnavailable("TensorRT execution failed (execute_async_v3 returned False)")
            self.device.synchronize(stream)
        finally:
            self._pool.put((context, stream))
        result = {n: t if t.dtype == self._out_dtype[n] else t.to(self._out_dtype[n]) for n, t in outs.items()}
        return result if on_device else {n: self.device.to_host(t) for n, t in result.items()}


def _check_version(api: TrtApi, passport: dict[str, Any], engine_dir: Path) -> None:
    built = str(passport.get("backend_version"))
    if built == api.version:
        return
    same_major = built.split(".")[0] == api.version.split(".")[0]
    if passport.get("version_compatible") and same_major and api.flavour == "tensorrt":
        return
    raise BackendUnavailable(f"{engine_dir}: built with {passport.get('builder', built)}, this machine has {api.label}; "
                             "rebuild here (or build with version_compatible for later versions of the same major)")


def load(engine_dir: Path, threads: int, device: Any = None) -> dict[str, TrtRunner]:
    """Runners for every graph of an engine dir; refuses engines this machine cannot run.

    ``threads`` sizes each runner's pool of execution contexts (at most 4); ``device`` replaces the
    torch CUDA side (tests).
    """
    passport = read_passport(engine_dir)
    flavour = str(passport.get("flavour", "tensorrt"))
    api = import_api(flavour)
    _check_version(api, passport, engine_dir)
    device = device if device is not None else TorchCuda()
    runtime = api.trt.Runtime(api.logger())
    if passport.get("version_compatible"):
        # Version-compatible plans carry their own lean runtime, which the runtime must be allowed to run.
        runtime.engine_host_code_allowed = True
    gd = read_graphs_dir(engine_dir)
    runners = {}
    for name, g in gd.graphs.items():
        engine = runtime.deserialize_cuda_engine(gd.graph_path(name).read_bytes())
        if engine is None:
            ccs = ", ".join(passport.get("compute_capabilities", [])) or "?"
            raise BackendUnavailable(f"{gd.graph_path(name)}: {api.label} could not deserialise it (built by "
                                     f"{passport.get('builder', '?')} for {ccs}); rebuild for this GPU")
        spec = g.get("spec") or {}
        out_dtypes = {t["name"]: t["dtype"] for t in spec.get("outputs", [])}
        runners[name] = TrtRunner(api, engine, device, g.get("inputs") or [t["name"] for t in spec["inputs"]],
                                  g.get("outputs") or list(out_dtypes), out_dtypes, max(1, min(threads, 4)))
    return runners
