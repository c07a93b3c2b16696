"""ONNX Runtime backend: the engine is the offline-optimized graph plus its session settings.

Offline optimization moves graph rewriting out of every server's start-up. Levels up to
'extended' stay portable across x86 CPUs; 'all' adds layout transforms tied to the build CPU,
which is recorded in the passport.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from cosycompile.errors import BackendUnavailable
from cosycompile.runtime.graphs_dir import copy_assets, read_graphs_dir
from cosycompile.recipe.targets import Target

PASSPORT = "engine.json"
_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def _cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f.startswith(("avx", "fma", "amx", "sse4")))
    except OSError:
        pass
    return []


def _session_options(threads: int, level: str, execution_mode: str = "sequential") -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = _LEVELS[level]
    so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if execution_mode == "parallel"
                         else ort.ExecutionMode.ORT_SEQUENTIAL)
    so.log_severity_level = 3
    return so


def build(src: Path, options: dict[str, Any], target: Target, out: Path) -> dict[str, Any]:
    """Optimize each graph of ``src`` offline into ``out`` and write the engine passport."""
    if target.kind != "cpu":
        raise BackendUnavailable(f"onnxruntime backend builds CPU engines only, not for target '{target.name}'")
    gd = read_graphs_dir(src)
    eng = copy_assets(gd, out)
    level = options.get("optimization", "extended")
    for name, g in gd.graphs.items():
        so = _session_options(1, level)
        so.optimized_model_filepath = str(out / g["file"])
        # Creating the session performs and saves the optimization.
        ort.InferenceSession(str(gd.graph_path(name)), so, providers=["CPUExecutionProvider"])
    eng.info = dict(gd.info)
    eng.write()
    passport = {
        "backend": "onnxruntime",
        "backend_version": ort.__version__,
        "providers": ["CPUExecutionProvider"],
        "target": target.name,
        "precision": gd.info.get("precision", "fp32"),
        "optimization": level,
        "execution_mode": options.get("execution_mode", "sequential"),
        "portable": level != "all",
        "build_host": {"machine": platform.machine(), "cpu_flags": _cpu_flags() if level == "all" else []},
    }
    (out / PASSPORT).write_text(json.dumps(passport, indent=1, sort_keys=True))
    return {"passport": passport}


class OrtRunner:
    """A Runner over one InferenceSession."""

    def __init__(self, path: Path, threads: int, execution_mode: str = "sequential") -> None:
        # The graph is already optimized offline; re-optimizing at load only costs start-up time.
        so = _session_options(threads, "disable", execution_mode)
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.session.run(None, {k: feeds[k] for k in self.input_names})
        return dict(zip(self.output_names, outs))


def load(engine_dir: Path, threads: int) -> dict[str, OrtRunner]:
    """Runners for every graph of an engine dir; refuses engines this machine cannot run."""
    passport = json.loads((engine_dir / PASSPORT).read_text())
    if passport.get("backend") != "onnxruntime":
        raise BackendUnavailable(f"{engine_dir}: engine was built by backend '{passport.get('backend')}'")
    missing = [f for f in passport.get("build_host", {}).get("cpu_flags", []) if f not in _cpu_flags()]
    if missing:
        raise BackendUnavailable(
            f"{engine_dir}: engine was optimized with level 'all' on a CPU with {', '.join(missing)}, "
            "which this CPU lacks; rebuild it here or use optimization 'extended'"
        )
    gd = read_graphs_dir(engine_dir)
    mode = passport.get("execution_mode", "sequential")
    return {name: OrtRunner(gd.graph_path(name), threads, mode) for name in gd.graphs}
