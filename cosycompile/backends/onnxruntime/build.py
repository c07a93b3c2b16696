"""ONNX Runtime engines: offline optimization (``build``) and sessions over the result (``load``)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from cosycompile.backends.onnxruntime.kv_cache import KeptCacheDecoder, PerLayerCache, layer_names
from cosycompile.errors import BackendUnavailable
from cosycompile.runtime import ort_ops
from cosycompile.runtime.graphs_dir import copy_assets, read_graphs_dir
from cosycompile.runtime.host import cpu_flags
from cosycompile.runtime.idle_wait import spinning
from cosycompile.runtime.loading import read_passport
from cosycompile.core.targets import Target
_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def _cpu_flags() -> list[str]:
    """The vector-ISA flags an 'all'-level engine may depend on."""
    return sorted(f for f in cpu_flags() if f.startswith(("avx", "fma", "amx", "sse4")))


def _session_options(threads: int, level: str, execution_mode: str = "sequential") -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = _LEVELS[level]
    so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if execution_mode == "parallel"
                         else ort.ExecutionMode.ORT_SEQUENTIAL)
    so.log_severity_level = 3
    if not spinning():
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def _build_session_options(level: str) -> ort.SessionOptions:
    """Options of a session that is built and never run: without weight prepacking, which changes nothing
    in the optimized file but holds a second, repacked copy of every weight."""
    so = _session_options(1, level)
    so.add_session_config_entry("session.disable_prepacking", "1")
    return so


def build(src: Path, options: Any, target: Target, out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Optimize each graph of ``src`` offline into ``out``; returns the passport's backend fields."""
    if target.kind != "cpu":
        raise BackendUnavailable(f"onnxruntime backend builds CPU engines only, not for target '{target.name}'")
    gd = read_graphs_dir(src)
    eng = copy_assets(gd, out)
    level = options.optimization
    rewrites = options.rewrites if level != "disable" else ()
    rewritten: dict[str, dict[str, int]] = {}
    for name, g in gd.graphs.items():
        so = _build_session_options(level)
        so.optimized_model_filepath = str(out / g["file"])
        # Creating the session performs and saves the optimization.
        ort.InferenceSession(str(gd.graph_path(name)), so, providers=["CPUExecutionProvider"])
        counts = _rewrite(out / g["file"], rewrites, cache_dir)
        if counts:
            rewritten[name] = counts
    eng.info = dict(gd.info)
    eng.write()
    return {
        "backend_version": ort.__version__,
        "providers": ["CPUExecutionProvider"],
        "target": target.name,
        "precision": gd.info.get("precision", "fp32"),
        "optimization": level,
        "execution_mode": options.execution_mode,
        "rewrites": rewritten,
        "portable": level != "all",
        "build_host": {"machine": platform.machine(), "cpu_flags": _cpu_flags() if level == "all" else []},
    }


def _rewrite(path: Path, rewrites: tuple[str, ...], cache_dir: Path | None) -> dict[str, int]:
    """Apply ``rewrites`` to the optimized graph at ``path`` in place; returns the count of each that
    matched. A graph that now uses the project's own operators gets their library beside it."""
    if not rewrites:
        return {}
    import onnx

    from cosycompile.backends.onnxruntime.attention import fuse_attention
    from cosycompile.backends.onnxruntime.kv_cache import split_kv_cache
    from cosycompile.backends.onnxruntime.mish import rewrite_mish
    from cosycompile.backends.onnxruntime.snake import rewrite_snake
    from cosycompile.onnx.tools import save_model

    model = onnx.load(str(path))
    passes = {"attention": fuse_attention, "mish": rewrite_mish, "kv_cache": split_kv_cache, "snake": rewrite_snake}
    counts = {r: n for r in rewrites if (n := passes[r](model))}
    if counts:
        library = ort_ops.build_library(path.parent, cache_dir) if "snake" in counts else None
        save_model(model, path)
        # Fail the build, not the first server, if a rewrite left a graph ONNX Runtime rejects.
        ort.InferenceSession(str(path), ort_ops.register(_build_session_options("disable"), library),
                             providers=["CPUExecutionProvider"])
    return counts


class OrtRunner:
    """A Runner over one InferenceSession."""

    def __init__(self, path: Path, threads: int, execution_mode: str = "sequential") -> None:
        # The graph is already optimized offline; re-optimizing at load only costs start-up time.
        so = ort_ops.register(_session_options(threads, "disable", execution_mode), ort_ops.library_in(path.parent))
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.session.run(None, {k: feeds[k] for k in self.input_names})
        return dict(zip(self.output_names, outs))


class KVCacheRunner(OrtRunner):
    """A decode-step graph whose cache the ``kv_cache`` rewrite split per layer: ``run`` still takes
    and returns the stacked cache of its graph spec, and ``decoder()`` keeps the per-layer cache
    between one-token steps (``LLMRuntime.decoding`` uses it)."""

    def __init__(self, path: Path, threads: int, execution_mode: str, spec_inputs: list[str],
                 spec_outputs: list[str], layers: int) -> None:
        super().__init__(path, threads, execution_mode)
        cache_in = next(n for n in spec_inputs if layer_names(n, 1)[0] in self.input_names)
        cache_out = next(n for n in spec_outputs if layer_names(n, 1)[0] in self.output_names)
        (self.embeds_name,) = (n for n in spec_inputs if n != cache_in)
        (self.logits_name,) = (n for n in spec_outputs if n != cache_out)
        graph_outputs = self.output_names
        self.cache = PerLayerCache(lambda f: self.session.run(None, f), graph_outputs, cache_in, cache_out, layers)
        # What callers see is the graph spec's stacked names, as with every other runner.
        self.input_names, self.output_names = list(spec_inputs), list(spec_outputs)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.cache.run(feeds)

    def decoder(self) -> KeptCacheDecoder:
        """A decoder of its own (it holds one utterance's cache): ``start`` with a prefill's present
        cache, then ``step`` one embedding at a time."""
        return KeptCacheDecoder(self.cache, self.embeds_name, self.logits_name)


def load(engine_dir: Path, threads: int) -> dict[str, OrtRunner]:
    """Runners for every graph of an engine dir; refuses engines this machine cannot run."""
    passport = read_passport(engine_dir)
    missing = [f for f in passport.get("build_host", {}).get("cpu_flags", []) if f not in _cpu_flags()]
    if missing:
        raise BackendUnavailable(
            f"{engine_dir}: engine was optimized with level 'all' on a CPU with {', '.join(missing)}, "
            "which this CPU lacks; rebuild it here or use optimization 'extended'"
        )
    gd = read_graphs_dir(engine_dir)
    mode = passport.get("execution_mode", "sequential")
    runners: dict[str, OrtRunner] = {}
    for name, g in gd.graphs.items():
        layers = passport.get("rewrites", {}).get(name, {}).get("kv_cache", 0)
        runners[name] = (KVCacheRunner(gd.graph_path(name), threads, mode, g["inputs"], g["outputs"], layers) if layers
                         else OrtRunner(gd.graph_path(name), threads, mode))
    return runners
