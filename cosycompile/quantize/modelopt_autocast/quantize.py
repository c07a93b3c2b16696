"""The ``<stage>.quantize`` step for ``format: fp16``: scan, then ModelOpt AutoCast, per quantizable graph.

For each quantizable graph (the flow estimator, HiFT; the flow encoder is linked unchanged):

1. ``keep_fp32`` patterns must each match a node (a dead pattern would silently keep nothing FP32);
2. the FP16-overflow scan (``scan.py``): constants whose reciprocal would exceed 65504, Snake alphas
   first. ``snake_alpha: refuse`` stops the build naming the layer; ``clamp`` clamps |alpha| to
   ``snake_alpha_min`` keeping the sign and records it in ``graphs.json`` ``info["fp16_clamped"]``;
3. the ranges of every float tensor on the stage's recorded real inputs (ONNX Runtime CPU, FP32);
4. ``modelopt.onnx.autocast.convert_to_mixed_precision`` to FP16 with I/O kept FP32 (runtimes feed the
   same float32 arrays as for the FP32 engine); kept FP32: ``keep_fp32`` nodes, nodes reading a constant
   beyond 65504 (AutoCast's ``init_max``) and nodes whose recorded values exceed ``data_max`` (3.);
5. a check that no FP16 constant of the result is inf or NaN.

Why (3.) is ours and not AutoCast's ``calibration_data``: AutoCast's reference pass keeps every
intermediate tensor of every record in memory at once (gigabytes per HiFT record of the real model), and
also counts integer shape arithmetic (sample counts above 65504) against ``data_max``, keeping float
nodes FP32 for nothing. Here one record is in memory at a time, only float tensors count, and the
result reaches AutoCast's classifier through its public ``custom_rule`` hook.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.errors import RecipeError
from cosycompile.quantize.calibrate import load_records
from cosycompile.quantize.graphs import rewrite_graphs
from cosycompile.runtime.graphs_dir import GraphsDir, read_graphs_dir

from .scan import FP16_MAX, Hazard, clamp, find_hazards, keep_fp32_covers

# Records run for the ranges, spread over the recording (every CFM step and item represented), and a
# bound on their length: long enough for length-dependent values to reach what real utterances reach.
MAX_RECORDS = 16
MAX_FRAMES = 1000
AUTOCAST_LOGGER = "modelopt.onnx.autocast"


def check_keep_fp32(onnx_paths: list[Path], patterns: list[str], stage: str) -> None:
    """Every ``keep_fp32`` regex must match (``re.search``) a node of one of the stage's quantizable graphs."""
    from cosycompile.onnx.tools import check_node_patterns

    check_node_patterns(onnx_paths, patterns, f"stages.{stage}.quantize.keep_fp32")


def _g(x: float) -> str:
    return f"{x:.3g}"


def refusal(stage: str, graph: str, hazards: list[Hazard], alpha_min: float) -> RecipeError:
    """The one-line error for ``snake_alpha: refuse``: stage, layer(s), how many, the smallest, the fix."""
    n = sum(len(h.index) for h in hazards)
    smallest = min((abs(a) for h in hazards for a in h.alphas), default=0.0)
    layers = list(dict.fromkeys(f"{h.layer} (module {h.module}, constant {h.constant})" for h in hazards))
    where = layers[0] if len(layers) == 1 else f"{len(layers)} layers: {'; '.join(layers[:3])}" + (
        f"; and {len(layers) - 3} more" if len(layers) > 3 else "")
    what = "Snake alphas" if all(h.kind == "snake" for h in hazards) else "Snake alphas / divisors"
    keep = ", ".join(f"'{p}'" for p in list(dict.fromkeys(re.escape(h.layer) + "/" for h in hazards))[:3])
    return RecipeError(
        f"stages.{stage}.quantize.snake_alpha: graph '{graph}': {n} {what} with |alpha| < {_g(alpha_min)} "
        f"(smallest {_g(smallest)}) in {where}: 1/alpha overflows FP16 (max 65504) and clips the audio; "
        f"set stages.{stage}.quantize.snake_alpha: clamp (|alpha| -> {_g(alpha_min)}, sign kept), "
        f"or keep those nodes FP32 with keep_fp32: [{keep}]")


def _records(ctx: StepContext, spec: Any, info: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    """The graph's recorded real inputs, spread and bounded (see MAX_RECORDS, MAX_FRAMES)."""
    records = load_records(ctx.inputs["calib"], spec.name) if "calib" in ctx.inputs else []
    if not records:
        raise RecipeError(f"stages.{ctx.params['stage']}.quantize: no recorded inputs for {spec.name} "
                          f"(the data_max check runs on them)")
    if len(records) > MAX_RECORDS:
        idx = np.linspace(0, len(records) - 1, MAX_RECORDS).round().astype(int)
        records = [records[i] for i in idx]
    return [_crop(spec, r, info) for r in records]


def _crop(spec: Any, rec: dict[str, np.ndarray], info: dict[str, Any]) -> dict[str, np.ndarray]:
    """One record cut to at most MAX_FRAMES along the spec's calibration axis (all inputs consistently)."""
    dim = spec.calib_crop_dim
    lengths = [rec[t.name].shape[a] for t in spec.inputs for a, e in enumerate(t.shape) if e == dim]
    if dim is None or not lengths or lengths[0] <= MAX_FRAMES:
        return rec
    out = {}
    for t in spec.inputs:
        arr = rec[t.name]
        sized = spec.shape(t, info, {dim: MAX_FRAMES})
        for axis, e in enumerate(t.shape):
            if isinstance(e, str) and e.split("*")[0] == dim:
                arr = arr[(slice(None),) * axis + (slice(0, int(sized[axis])),)]
        out[t.name] = np.ascontiguousarray(arr)
    return out


def float_ranges(path: Path, records: list[dict[str, np.ndarray]], work: Path) -> tuple[dict[str, float], set[str]]:
    """(max |value| of every float tensor of the graph (inputs and node outputs) over ``records``, run in
    FP32 on ONNX Runtime CPU one record at a time, NaN where a tensor held inf or NaN; the names of the
    other tensors: constants and non-float values, which need no range)."""
    import onnx
    import onnxruntime as ort

    from cosycompile.onnx.tools import save_model

    model = onnx.load(str(path))
    other = {i.name for i in model.graph.initializer}
    have = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Constant":
            other.update(node.output)
            continue
        for o in node.output:
            if o and o not in have:  # name-only outputs: ORT infers their types
                model.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    probe = work / "ranges.onnx"
    save_model(model, probe)
    del model
    so = ort.SessionOptions()
    # The values AutoCast will see are the graph's own: no fusions, no rewritten arithmetic.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(probe), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    absmax: dict[str, float] = {}

    def update(name: str, arr: np.ndarray) -> None:
        if arr.dtype.kind != "f":
            other.add(name)
            return
        if arr.size == 0:
            absmax.setdefault(name, 0.0)
            return
        m = float(np.max(np.abs(arr)))
        prev = absmax.get(name, 0.0)
        absmax[name] = float("nan") if (np.isnan(prev) or not np.isfinite(m)) else max(prev, m)

    for rec in records:
        for k, v in rec.items():
            update(k, v)
        for name, arr in zip(names, sess.run(names, rec)):
            update(name, arr)
    return absmax, other - set(absmax)


def _range_rule(absmax: dict[str, float], other: set[str], data_max: float) -> Any:
    """An AutoCast ``custom_rule``: keep a node FP32 when a float tensor it reads or writes exceeded
    ``data_max`` (or was inf/NaN) on the recorded inputs. Tensors in neither ``absmax`` nor ``other``
    (names AutoCast's sanitizer made) are collected on ``unknown`` so the step can report them."""
    from modelopt.onnx.autocast.nodeclassifier import NodeRuleBase

    log = logging.getLogger(AUTOCAST_LOGGER)

    class RecordedRangeRule(NodeRuleBase):
        def __init__(self) -> None:
            self.hit: tuple[str, float] | None = None
            self.unknown: set[str] = set()

        def _check_inner(self, node: Any) -> bool:
            if node.op_type == "Constant":
                return False
            for t in (*node.input, *node.output):
                m = absmax.get(t)
                if m is None:
                    # AutoCast's sanitizer duplicates shared constants as <name>_<k>.
                    if t and t not in other and re.sub(r"_\d+$", "", t) not in other:
                        self.unknown.add(t)
                    continue
                if not m <= data_max:  # NaN (inf seen) counts as out of range
                    self.hit = (t, m)
                    return True
            return False

        def _log_skipped(self, node: Any, **kwargs: Any) -> None:
            t, m = self.hit or ("?", float("nan"))
            log.info(f"Skipping node {node.name}: recorded |{t}| = {m:.3g} > data_max {data_max:.3g}")

    return RecordedRangeRule()


def _check_finite(model: Any, graph: str) -> int:
    """Raise if the converted graph holds an inf/NaN FP16 constant; returns the number of FP16 initializers."""
    from onnx import TensorProto, numpy_helper

    n = 0
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT16:
            n += 1
            if not np.isfinite(numpy_helper.to_array(init)).all():
                raise RuntimeError(f"{graph}: AutoCast produced a non-finite FP16 constant '{init.name}'")
    return n


class _AutoCastLog(logging.Handler):
    """Collects AutoCast's decisions (``Skipping node X: reason`` = X stays FP32) and its warnings."""

    SKIP = re.compile(r"^Skipping node (.+?): (.*)$", re.S)

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.kept: dict[str, str] = {}
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        m = self.SKIP.match(msg)
        if m:
            self.kept.setdefault(m.group(1), m.group(2))
        elif record.levelno >= logging.WARNING:
            self.warnings.append(msg)


@contextmanager
def _autocast_logging() -> Iterator[_AutoCastLog]:
    """Route AutoCast's INFO logging (printed to stdout by default) into a collector for the step log,
    and quiet onnxslim's symbolic shape inference, which AutoCast's type inference runs."""
    ac = logging.getLogger(AUTOCAST_LOGGER)
    slim = logging.getLogger("onnxslim")
    saved = (ac.level, ac.handlers[:], ac.propagate, slim.level)
    handler = _AutoCastLog()
    ac.handlers[:] = [handler]
    ac.setLevel(logging.INFO)
    ac.propagate = False
    slim.setLevel(logging.ERROR)
    try:
        yield handler
    finally:
        ac.setLevel(saved[0])
        ac.handlers[:] = saved[1]
        ac.propagate = saved[2]
        slim.setLevel(saved[3])


def quantize(ctx: StepContext) -> dict[str, Any]:
    """Convert the stage's quantizable graphs to FP16 (scan for FP16 overflow first; see the module doc)."""
    import onnx

    from cosycompile.onnx.tools import save_model
    from cosycompile.stages import get_stage

    s = ctx.spec
    stage = ctx.params["stage"]
    specs = {g.name: g for g in get_stage(stage).graphs}
    src = read_graphs_dir(ctx.inputs["graphs"])
    targets = [name for name in src.graphs if specs[name].quantizable]
    check_keep_fp32([src.graph_path(n) for n in targets], list(s.keep_fp32), stage)
    # The scan of every graph comes before any conversion: a refusal costs seconds, not a conversion.
    scans: dict[str, tuple[Any, list[Hazard], list[tuple[str, float]]]] = {}
    for name in targets:
        model = onnx.load(str(src.graph_path(name)))
        hazards, large = find_hazards(model, s.snake_alpha_min)
        covered = [h for h in hazards if keep_fp32_covers(h, list(s.keep_fp32))]
        hazards = [h for h in hazards if h not in covered]
        for h in covered:
            ctx.log(f"{name}: {len(h.index)} values < {_g(s.snake_alpha_min)} in {h.layer} stay FP32 (keep_fp32)")
        if hazards and s.snake_alpha == "refuse":
            raise refusal(stage, name, hazards, s.snake_alpha_min)
        scans[name] = (model, hazards, large)
    clamped: dict[str, list[dict[str, Any]]] = {}
    kept_fp32: dict[str, list[str]] = {}

    def one(name: str, src: GraphsDir, dst: Path) -> dict[str, Any]:
        model, hazards, large = scans.pop(name)
        if large:
            # AutoCast's init_max (65504) keeps their readers FP32; say so rather than leave it implicit.
            ctx.log(f"{name}: {len(large)} constants beyond FP16 stay FP32: "
                    + ", ".join(f"{n} ({_g(v)})" for n, v in large[:5]))
        work = Path(tempfile.mkdtemp(prefix=f".work-{name}-", dir=ctx.out))
        try:
            path = src.graph_path(name)
            if hazards:  # snake_alpha: clamp
                clamp(model, hazards, s.snake_alpha_min)
                clamped[name] = [h.describe() | {"clamped_to": s.snake_alpha_min} for h in hazards]
                for h in hazards:
                    ctx.log(f"{name}: clamped {len(h.index)} |alpha| < {_g(s.snake_alpha_min)} in {h.layer} "
                            f"(smallest {_g(min(abs(a) for a in h.alphas))}) to {_g(s.snake_alpha_min)}, sign kept")
                path = work / dst.name
                save_model(model, path)
            del model
            records = _records(ctx, specs[name], src.info)
            absmax, other = float_ranges(path, records, work)
            rule = _range_rule(absmax, other, s.data_max)
            ctx.log(f"{name}: ranges of {len(absmax)} float tensors on {len(records)} recorded inputs; "
                    f"AutoCast fp16 with data_max {_g(s.data_max)}, keep_fp32 {list(s.keep_fp32)}")
            converted = _convert(path, list(s.keep_fp32), rule, ctx.params["opset"], name, ctx)
            fp16_inits = _check_finite(converted, name)
            save_model(converted, dst)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        kept = rule.kept
        kept_fp32[name] = sorted(kept)
        stats = {"fp16_initializers": fp16_inits, "fp32_nodes": len(kept), "nodes": len(converted.graph.node),
                 "clamped": sum(len(h.index) for h in hazards), "large_constants": len(large),
                 "tensors_without_range": len(rule.unknown)}
        if rule.unknown:  # names the range pass never saw: their nodes were judged on their other tensors
            ctx.log(f"{name}: warning: {len(rule.unknown)} tensors had no recorded range, e.g. "
                    + ", ".join(sorted(rule.unknown)[:3]))
        ctx.log(f"{name}: {stats}; kept FP32: "
                + "; ".join(f"{n} ({why})" for n, why in list(kept.items())[:5]) + (" ..." if len(kept) > 5 else ""))
        return stats

    # rewrite_graphs writes the info after the loop, by when one() has filled both maps.
    done = rewrite_graphs(ctx, "fp16", targets, one, {"fp16_clamped": clamped, "fp16_kept_fp32": kept_fp32})
    return {**done, "fp16_clamped": clamped}


def _convert(path: Path, keep_fp32: list[str], rule: Any, opset: int, name: str, ctx: StepContext) -> Any:
    """``convert_to_mixed_precision`` with our range rule; AutoCast's decisions are left on ``rule.kept``."""
    from modelopt.onnx.autocast import convert_to_mixed_precision

    with _autocast_logging() as log:
        converted = convert_to_mixed_precision(
            str(path), low_precision_type="fp16",
            # AutoCast anchors node regexes with re.match; keep_fp32 is documented (and checked) as re.search.
            nodes_to_exclude=[f"(?s).*?(?:{p})" for p in keep_fp32] or None,
            # data_max=inf: no AutoCast reference pass; the recorded ranges come in through custom_rule.
            data_max=float("inf"), init_max=FP16_MAX, custom_rule=rule,
            keep_io_types=True, providers=["cpu"], opset=opset,
        )
    for w in dict.fromkeys(log.warnings):
        ctx.log(f"{name}: autocast: {w}")
    rule.kept = log.kept
    return converted
