"""ModelOpt ONNX PTQ for the flow estimator and HiFT (int8 max/entropy, fp8, int4), calibrated on
the inputs recorded from the FP32 reference.

Only the graphs that carry the compute are quantized: the flow estimator (called 10x per
utterance, batch 2) and the HiFT network. The flow encoder runs once per utterance and stays FP32.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.errors import RecipeError
from cosycompile.core.graph import StepContext
from cosycompile.quantize.graphs import quantize_graphs
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.quantize.calibrate import load_records



class _RecordsReader:
    """An ONNX Runtime CalibrationDataReader over recorded feeds (shapes may differ per record)."""

    def __init__(self, records: list[dict[str, np.ndarray]]) -> None:
        self.records = records
        self._it = iter(records)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def get_first(self) -> dict[str, np.ndarray]:
        return self.records[0]

    def rewind(self) -> None:
        self._it = iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._it = iter(self.records[start_index:end_index])


def _reader_class() -> type:
    # Subclass ORT's reader lazily so importing this module stays cheap.
    from onnxruntime.quantization import CalibrationDataReader

    return type("RecordsReader", (_RecordsReader, CalibrationDataReader), {})


def check_exclusions(onnx_path: Path, patterns: list[str], stage: str) -> list[str]:
    """Every exclusion regex must match at least one node name; a dead pattern is a recipe error."""
    from cosycompile.onnx.tools import check_node_patterns

    return check_node_patterns([onnx_path], patterns, f"stages.{stage}.quantize.exclude")


def quantize(ctx: StepContext) -> dict[str, Any]:
    """The ``<stage>.quantize`` step for ONNX stages."""
    from modelopt.onnx.quantization import quantize as mo_quantize

    from cosycompile.runtime.graphspec import crop_records
    from cosycompile.stages import get_stage

    s = ctx.spec
    stage, fmt = ctx.params["stage"], s.format
    hp = s.high_precision_dtype
    if hp == "auto":  # FP16 islands make ORT CPU slower than FP32; TensorRT wants them
        hp = "fp32" if ctx.params["target_kind"] == "cpu" else "fp16"
    p = {"method": s.resolved_method, "exclude": list(s.exclude), "high_precision_dtype": hp,
         "block_size": s.block_size or 128, "opset": ctx.params["opset"]}
    specs = {g.name: g for g in get_stage(stage).graphs}
    logging.getLogger("modelopt").setLevel(logging.WARNING)

    def one(name: str, src: GraphsDir, dst: Path) -> None:
        excludes = check_exclusions(src.graph_path(name), p["exclude"], stage)
        records = load_records(ctx.inputs["calib"], name) if "calib" in ctx.inputs else []
        if not records:
            raise RecipeError(f"stages.{stage}.quantize: no calibration records for {name}")
        if fmt == "int4":
            records = crop_records(specs[name], records, src.info)
        ctx.log(f"{name}: {fmt}/{p['method']} on {len(records)} recorded inputs")
        opset = max(p["opset"], 21) if fmt in ("fp8", "int4") else p["opset"]
        work = ctx.out / f".work-{name}"
        work.mkdir()
        try:
            tmp_out = work / dst.name
            mo_quantize(
                str(_private_copy(src.graph_path(name), work / "input")), quantize_mode=fmt, calibration_method=p["method"],
                calibration_data_reader=_reader_class()(records), calibration_eps=["cpu"],
                nodes_to_exclude=excludes or None, high_precision_dtype=p["high_precision_dtype"],
                block_size=p["block_size"] if fmt == "int4" else None, output_path=str(tmp_out),
                opset=opset, log_level="WARNING",
            )
            shutil.move(str(tmp_out), dst)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    info = {"requires": "ORT CPU: optimization disable (reference kernels); TensorRT: sm89+"} if fmt == "fp8" else {}
    return quantize_graphs(ctx, fmt, one, info)


def _private_copy(graph: Path, into: Path) -> Path:
    """A copy of ``graph`` (and its external data file, if any) in ``into``, for ModelOpt to read.

    ModelOpt's loader runs onnx's ``infer_shapes_path`` without an output path, which writes the
    shape-inferred model over its input file: given the input step's cached file (or a link to it), it
    would change that cache entry in place. A copy, not a link, because the write goes to the same inode.
    """
    into.mkdir()
    for f in (graph, graph.with_name(graph.name + ".data")):
        if f.is_file():
            shutil.copyfile(f, into / f.name)
    return into / graph.name
