"""Recipe schema: what to build for each stage, where it will run, and how it is validated.

A recipe is YAML, may ``extends:`` another recipe (paths relative to the extending file), and
is validated strictly: unknown keys, wrong types and impossible combinations are errors that
name the file, the line and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cosycompile.errors import RecipeError
from cosycompile.recipe.targets import TARGETS
from cosycompile.recipe.yaml_lines import KeyPath, Located, load_located, merge

STAGE_NAMES = ("llm", "flow", "hift")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExportSpec(_Strict):
    """How a stage's network becomes an ONNX graph."""

    opset: int = Field(18, ge=18, le=23, description="ONNX opset (torch 2.13's exporter needs >= 18)")
    simplify: Literal["onnxslim", "onnxsim", "none"] = "onnxslim"


QuantFormat = Literal["fp32", "int8", "int8_sq", "int8_wo", "int4", "int4_awq", "w4a8_awq", "fp8"]


class QuantizeSpec(_Strict):
    """Numeric format of the stage's weights/activations and how to calibrate it.

    LLM formats go through ModelOpt's PyTorch PTQ (int8_sq, int8_wo, int4_awq, w4a8_awq, fp8);
    flow and HiFT formats through ModelOpt's ONNX PTQ (int8, fp8, int4).
    """

    format: QuantFormat = "fp32"
    method: Literal["max", "entropy", "awq_clip", "awq_lite", "awq_full", "rtn_dq"] | None = Field(
        None, description="calibration method (default: per format)")
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="SmoothQuant migration strength (int8_sq)")
    block_size: int = Field(128, ge=16, description="INT4 block (group) size")
    exclude: list[str] = Field(default_factory=list,
                               description="layers kept in high precision: module wildcards (llm) or node-name regexes")
    high_precision_dtype: Literal["auto", "fp32", "fp16"] = Field(
        "auto", description="dtype of the non-quantized parts; auto = fp32 on CPUs, fp16 on GPUs")
    calib_items: int = Field(16, ge=1, description="calibration items used from the calibration set")
    exports: list[Literal["onnx", "hf", "trtllm"]] = Field(
        default_factory=lambda: ["onnx"], description="LLM only: checkpoint formats written besides the ONNX step")


class EngineSpec(_Strict):
    """Which backend turns the (quantized) graph into an engine, with backend-specific options."""

    backend: str = "onnxruntime"
    options: dict[str, Any] = Field(default_factory=dict)


class LLMCheck(_Strict):
    """Stage check for the LLM decode step against the PyTorch FP32 reference (None: not checked)."""

    max_abs_logit_error: float | None = Field(1e-3, gt=0)
    identical_greedy_tokens: bool = True
    min_top1_agreement: float | None = Field(None, ge=0, le=1)
    min_logit_cosine: float | None = Field(None, ge=-1, le=1)
    max_kl: float | None = Field(None, ge=0)


class FlowCheck(_Strict):
    """Stage check for the flow estimator (and the full 10-step CFM) against PyTorch FP32."""

    lengths: list[int] = Field(default_factory=lambda: [16, 64, 128, 256, 512], min_length=1)
    max_abs_error: float | None = Field(1e-3, gt=0)
    min_mel_snr_db: float = 30.0


class HiFTCheck(_Strict):
    """Stage check for the vocoder (network up to the iSTFT, iSTFT in numpy)."""

    min_snr_db: float = 40.0
    max_log_mel_l1: float | None = Field(None, ge=0)


class _StageBase(_Strict):
    enabled: bool = True
    export: ExportSpec = ExportSpec()
    quantize: QuantizeSpec = QuantizeSpec()
    engine: EngineSpec = EngineSpec()


class LLMStage(_StageBase):
    check: LLMCheck = LLMCheck()


class FlowStage(_StageBase):
    check: FlowCheck = FlowCheck()


class HiFTStage(_StageBase):
    check: HiFTCheck = HiFTCheck()


class Stages(_Strict):
    llm: LLMStage = LLMStage()
    flow: FlowStage = FlowStage()
    hift: HiFTStage = HiFTStage()


class SamplingSpec(_Strict):
    """How speech tokens are drawn on the eval set (same for reference and build)."""

    mode: Literal["greedy", "ras"] = "greedy"
    seed: int = 0
    max_tokens: int | None = Field(200, ge=1, description="cap on speech tokens per item (None: 20x text)")


class SpeedSpec(_Strict):
    warmup: int = Field(1, ge=0)
    runs: int = Field(3, ge=1)
    threads: int = Field(2, ge=1, description="intra-op threads for both reference and engines")


class CalibrationSpec(_Strict):
    """Where calibration data comes from: the FP32 reference run over a calibration set."""

    set: str = Field("../calib_data/calib", description="folder with manifest.jsonl, relative to the recipe file")
    max_items: int = Field(16, ge=1)
    sampling: SamplingSpec = SamplingSpec()
    max_estimator_calls: int = Field(64, ge=1, description="CFM estimator inputs kept (spread over steps/items)")


class GateSpec(_Strict):
    """What a build must reach to pass: fixed limits on named metrics, and/or no regression vs a baseline.

    Metric names are listed by ``cosycompile gate --list-metrics``; speed metrics are speed-ups
    against the reference measured in the same run.
    """

    min: dict[str, float] = Field(default_factory=dict)
    max: dict[str, float] = Field(default_factory=dict)
    baseline: str | None = Field(None, description="baseline report.json or bundle, relative to the recipe file")
    max_quality_drop: float = Field(0.05, ge=0, description="allowed relative quality drop vs the baseline")
    max_slowdown: float = Field(0.25, ge=0, description="allowed relative loss of speed-up vs the baseline")


class ValidationSpec(_Strict):
    eval_set: str = Field(description="folder with manifest.jsonl, relative to the recipe file")
    max_items: int = Field(4, ge=1)
    sampling: SamplingSpec = SamplingSpec()
    speed: SpeedSpec = SpeedSpec()
    gate: GateSpec = GateSpec()


class Recipe(_Strict):
    """A validated recipe. ``source`` and ``base_dir`` are filled in by :func:`load_recipe`."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    model: str = Field(description="'builtin:tiny', 'builtin:random-0.5b' or a CosyVoice2 model dir")
    target: str = "cpu"
    stages: Stages = Stages()
    calibration: CalibrationSpec = CalibrationSpec()
    validation: ValidationSpec

    source: str = ""
    base_dir: str = ""

    def stage(self, name: str) -> _StageBase:
        """The spec of stage ``name``."""
        return getattr(self.stages, name)

    def enabled_stages(self) -> list[str]:
        """Stage names in pipeline order that the recipe builds."""
        return [s for s in STAGE_NAMES if self.stage(s).enabled]

    def resolve_path(self, value: str) -> Path:
        """A path from the recipe, relative to the recipe file's folder."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p)


# Keys holding paths; each is resolved against the folder of the file that sets it.
PATH_KEYS = (("model",), ("validation", "eval_set"), ("calibration", "set"), ("validation", "gate", "baseline"))


def _absolutize(located: Located, folder: Path) -> None:
    for keys in PATH_KEYS:
        node = located.data
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        value = node.get(keys[-1])
        if isinstance(value, str) and value and not value.startswith("builtin:") and not Path(value).is_absolute():
            node[keys[-1]] = str(folder / Path(value).expanduser())


def _load_with_extends(path: Path, seen: tuple[Path, ...] = ()) -> Located:
    path = path.resolve() if path.exists() else path
    if path in seen:
        chain = " -> ".join(str(p) for p in seen + (path,))
        raise RecipeError(f"{path}: 'extends' forms a cycle: {chain}")
    located = load_located(path)
    _absolutize(located, path.parent)
    parent = located.data.pop("extends", None)
    if parent is None:
        return located
    if not isinstance(parent, str):
        raise RecipeError(f"{located.where(('extends',))}: 'extends' must be a path string")
    parent_path = (path.parent / parent) if not Path(parent).is_absolute() else Path(parent)
    if not parent_path.exists():
        raise RecipeError(f"{located.where(('extends',))}: 'extends' names a missing file: {parent_path}")
    base = _load_with_extends(parent_path, seen + (path,))
    return merge(base, located)


def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


def _format_pydantic(err: ValidationError, located: Located) -> str:
    errors = err.errors()
    first = errors[0]
    loc = tuple(first["loc"])
    key = _dotted(loc)
    if first["type"] == "extra_forbidden":
        msg = f"unknown key '{key}'"
        if loc[:-1] == ("stages",):
            msg += f" (stages are: {', '.join(STAGE_NAMES)})"
    elif first["type"] == "missing":
        msg = f"missing required key '{key}'"
    else:
        got = first.get("input")
        got_s = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        msg = f"key '{key}': {first['msg']} (got {got_s})"
    more = f" (+{len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{located.where(loc)}: {msg}{more}"


def load_recipe(path: str | Path) -> Recipe:
    """Read, merge (``extends:``) and validate a recipe; raise RecipeError naming file:line and key."""
    path = Path(path)
    if path.is_dir():
        raise RecipeError(f"{path}: is a directory, expected a recipe .yaml file")
    located = _load_with_extends(path)
    data = dict(located.data)
    for reserved in ("source", "base_dir"):
        if reserved in data:
            raise RecipeError(f"{located.where((reserved,))}: unknown key '{reserved}'")
    data["source"] = str(path)
    data["base_dir"] = str(path.resolve().parent)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_pydantic(exc, located)) from None
    _check_combinations(recipe, located)
    return recipe


def _check_combinations(recipe: Recipe, located: Located) -> None:
    """Cross-field rules that a per-field schema cannot express."""
    # Imported here: the registries are light, but they import this module's types.
    from cosycompile.backends import get_backend_info
    from cosycompile.quantize import format_problem
    from cosycompile.stages import get_stage

    if recipe.target not in TARGETS:
        raise RecipeError(
            f"{located.where(('target',))}: unknown target '{recipe.target}' (known: {', '.join(sorted(TARGETS))})"
        )
    from cosycompile.validate.gate import METRICS

    for kind in ("min", "max"):
        for metric in getattr(recipe.validation.gate, kind):
            if metric not in METRICS:
                raise RecipeError(f"{located.where(('validation', 'gate', kind, metric))}: unknown gate metric "
                                  f"'{metric}' (see cosycompile gate --list-metrics)")
    if not recipe.enabled_stages():
        raise RecipeError(f"{located.where(('stages',))}: every stage is disabled; nothing to build")
    for name in STAGE_NAMES:
        spec = recipe.stage(name)
        if not spec.enabled:
            continue
        where = located.where(("stages", name, "engine", "backend"))
        info = get_backend_info(spec.engine.backend)
        if info is None:
            from cosycompile.backends import BACKENDS

            raise RecipeError(
                f"{where}: unknown backend '{spec.engine.backend}' for stage '{name}' (known: {', '.join(BACKENDS)})"
            )
        stage = get_stage(name)
        if spec.engine.backend not in stage.backends:
            raise RecipeError(
                f"{where}: stage '{name}' cannot use backend '{spec.engine.backend}' "
                f"(supported: {', '.join(stage.backends)})"
            )
        problem = info.check_target(TARGETS[recipe.target])
        if problem:
            raise RecipeError(f"{where}: backend '{info.name}' cannot build for target '{recipe.target}': {problem}")
        problem = info.check_options(spec.engine.options)
        if problem:
            key, msg = problem
            raise RecipeError(f"{located.where(('stages', name, 'engine', 'options', key))}: {msg}")
        qproblem = format_problem(name, spec.quantize, TARGETS[recipe.target], info.name, spec.engine.options,
                                  spec.export.opset)
        if qproblem:
            key, msg = qproblem
            raise RecipeError(f"{located.where(('stages', name, 'quantize', key))}: stages.{name}.quantize.{key}: {msg}")
        if name != "llm" and spec.quantize.exports != ["onnx"]:
            raise RecipeError(f"{located.where(('stages', name, 'quantize', 'exports'))}: "
                              f"checkpoint exports (hf, trtllm) exist for the llm stage only")
