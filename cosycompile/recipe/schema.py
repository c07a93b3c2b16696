"""Recipe schema: what to build for each stage, where it will run, and how it is validated.

A recipe is YAML, may ``extends:`` another recipe (paths relative to the extending file), and
is validated strictly: unknown keys, wrong types and impossible combinations are errors that
name the file, the line and the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from cosycompile.errors import RecipeError
from cosycompile.core.targets import TARGETS
from cosycompile.recipe.yaml_lines import KeyPath, Located, load_located, merge

# Keys the loader fills in (the recipe file and its folder); a recipe that writes one is refused.
RESERVED_KEYS = ("source", "base_dir")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExportSpec(_Strict):
    """How a stage's network becomes an ONNX graph."""

    opset: int = Field(18, ge=18, le=23, description="ONNX opset (torch 2.13's exporter needs >= 18)")
    simplify: Literal["onnxslim", "onnxsim", "none"] = Field("onnxslim", description="graph simplifier run after export")


class EngineSpec(_Strict):
    """Which backend turns the (quantized) graphs into an engine; ``options`` is that backend's spec."""

    backend: str = Field("onnxruntime", description="the backend that builds the engine (a folder of backends/)")
    options: dict[str, Any] = Field(default_factory=dict, description="the backend's options (its own spec)")


class StageSpec(_Strict):
    """One stage of a recipe. ``quantize`` and ``engine.options`` are validated by the chosen
    quantizer's and backend's own specs; ``check`` by the stage's check spec."""

    enabled: bool = Field(True, description="false: the stage is not built (the pipeline check then needs it)")
    export: ExportSpec = Field(ExportSpec(), description="how the network becomes a graph")
    quantize: dict[str, Any] = Field(default_factory=lambda: {"format": "fp32"},
                                     description="the format, and the settings of the quantizer that writes it")
    engine: EngineSpec = Field(EngineSpec(), description="the backend and its options")
    check: dict[str, Any] = Field(default_factory=dict, description="the stage check's workload (its check spec)")
    runtime: dict[str, Any] = Field(default_factory=dict, description="the stage's runtime settings (its runtime spec)")


class SamplingSpec(_Strict):
    """How speech tokens are drawn on the eval set (same for reference and build)."""

    mode: Literal["greedy", "ras"] = Field("greedy", description="greedy, or repetition-aware sampling (upstream's)")
    seed: int = Field(0, ge=0, lt=2**32, description="sampling seed (numpy's range)")
    max_tokens: int | None = Field(200, ge=1, le=100_000, description="cap on speech tokens per item (None: 20x text)")


class SpeedSpec(_Strict):
    """How speed is measured: always on the first eval item, as a ratio against the FP32 reference."""

    warmup: int = Field(1, ge=0, le=100, description="untimed runs per side before the timed ones")
    runs: int = Field(3, ge=1, le=1000, description="timed runs per side (interleaved pairs with reference: same-run)")
    min_seconds: float = Field(0.0, ge=0, le=86_400, description="keep timing pairs past `runs` until this many seconds have "
                                                      "passed, so one slow spell of a shared machine cannot set a ratio")
    machine_state: bool = Field(False, description="probe before each pair whether the threads beat one thread on a "
                                                   "small op, and give each ratio per state too (small VMs switch "
                                                   "between two states that move ratios; docs/benchmarks.md)")
    threads: int = Field(2, ge=1, le=1024, description="intra-op threads for both reference and engines")
    reference: Literal["same-run", "cached"] = Field(
        "same-run", description="same-run: reference and build timed in interleaved pairs in this run; cached: the "
                                "reference step's own timing is reused (fast re-validation, noisier ratios)")
    throughput: list[Annotated[int, Field(ge=1, le=256)]] = Field(default_factory=lambda: [1, 2, 4], max_length=16,
                                  description="concurrency levels of the throughput measurement (empty: none)")


class CalibrationSpec(_Strict):
    """Where calibration data comes from: the FP32 reference run over a calibration set."""

    set: str = Field("../calib_data/calib", description="folder with manifest.jsonl, relative to the recipe file")
    max_items: int = Field(16, ge=1, le=10_000, description="calibration items used (the first ones)")
    sampling: SamplingSpec = Field(SamplingSpec(), description="how the reference draws tokens on them")
    same_as_eval: bool = Field(False, description="allow the eval set as calibration set (quality figures then "
                                                  "overstate the engine's quality on unseen text)")
    max_estimator_calls: int = Field(64, ge=1, le=100_000, description="CFM estimator inputs kept (spread over steps/items)")


class GateSpec(_Strict):
    """What a build must reach to pass: fixed limits on named metrics, and/or no regression vs a baseline.

    Metric names are listed by ``cosycompile gate --list-metrics``; speed metrics are speed-ups
    against the reference measured in the same run.
    """

    min: dict[str, float | None] = Field(default_factory=dict, description="metric -> lowest allowed (null: not gated)")
    max: dict[str, float | None] = Field(default_factory=dict, description="metric -> highest allowed (null: not gated)")

    def thresholds(self) -> dict[str, dict[str, float]]:
        """min/max with the entries a recipe switched off (null) dropped."""
        return {"min": {k: v for k, v in self.min.items() if v is not None},
                "max": {k: v for k, v in self.max.items() if v is not None}}
    baseline: str | None = Field(None, description="baseline report.json or bundle, relative to the recipe file")
    # Finite only: NaN passes every comparison and infinity switches the baseline gate off.
    max_quality_drop: float = Field(0.05, ge=0, allow_inf_nan=False,
                                    description="allowed relative quality drop vs the baseline")
    max_slowdown: float = Field(0.25, ge=0, allow_inf_nan=False,
                                description="allowed relative loss of speed-up vs the baseline")


class ValidationSpec(_Strict):
    """How a build is judged against the FP32 reference."""

    eval_set: str = Field(description="folder with manifest.jsonl, relative to the recipe file")
    max_items: int = Field(4, ge=1, le=10_000, description="eval items synthesized (the first ones)")
    sampling: SamplingSpec = Field(SamplingSpec(), description="how tokens are drawn, the same on both sides")
    speed: SpeedSpec = Field(SpeedSpec(), description="how speed is measured")
    gate: GateSpec = Field(GateSpec(), description="what the build must reach to pass")


class Recipe(_Strict):
    """A validated recipe. ``source`` and ``base_dir`` are filled in by :func:`load_recipe`."""

    # A bundle folder is "<name>-<key12>": 200 characters keep it within the 255 a file system takes.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=200,
                      description="names the bundle folder builds/<name>-<key12>/")
    description: str = Field("", description="one line for people; no effect on the build")
    model: str = Field(description="'builtin:tiny', 'builtin:random-0.5b' or a model dir; or a mapping "
                                   "{path: <that>, family: <name>} naming the model family (model.family), "
                                   "which is otherwise read from the model dir's config file")
    target: str = Field("cpu", description="the hardware the engines are for (cosycompile.core.targets)")
    stages: dict[str, StageSpec] = Field(default_factory=dict, description="per stage (llm, flow, hift): how it is built")
    calibration: CalibrationSpec = Field(CalibrationSpec(), description="the data quantizers calibrate on")
    validation: ValidationSpec = Field(description="the eval set, speed measurement and gate")
    exports: list[str] = Field(default_factory=lambda: ["bundle"], description="deployable outputs (exporters)")

    source: str = Field("", description="filled in by the loader: the recipe file (not a recipe key)")
    base_dir: str = Field("", description="filled in by the loader: the recipe's folder (not a recipe key)")
    _typed: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)
    _family: str | None = PrivateAttr(default=None)

    @property
    def model_family(self) -> str | None:
        """The family the recipe names (``model.family``), checked against the registry at load; None:
        read from the model (the built-in's family, or the config file the model dir holds)."""
        return self._family

    def stage(self, name: str) -> StageSpec:
        """The spec of stage ``name`` (defaults for a stage the recipe does not mention)."""
        return self.stages.get(name, StageSpec())

    def enabled_stages(self) -> list[str]:
        """Stage names in pipeline order that the recipe builds."""
        from cosycompile.stages import stage_infos

        return [s for s in stage_infos() if self.stage(s).enabled]

    def typed(self, stage: str) -> dict[str, Any]:
        """The stage's plug-in specs, validated at load: ``quantize`` (the quantizer's spec or
        NoQuantization), ``quantizer`` (its info, or None), ``backend`` (info), ``options``, ``check``,
        ``runtime`` (the stage's runtime spec, or None)."""
        return self._typed[stage]

    def resolve_path(self, value: str) -> Path:
        """A path from the recipe, relative to the recipe file's folder."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p)


# Keys holding paths; each is resolved against the folder of the file that sets it.
PATH_KEYS = (("model",), ("model", "path"), ("validation", "eval_set"), ("calibration", "set"),
             ("validation", "gate", "baseline"))


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
    _replace_changed_quantize(base, located)
    return merge(base, located)


def _replace_changed_quantize(base: Located, child: Located) -> None:
    """A child recipe that sets another ``quantize.format`` (or ``quantizer``) than its parent gets its own quantize block:
    the parent's settings belong to the parent's quantizer (``alpha`` means nothing to fp32), so a deep
    merge would only carry dead keys. A block without ``format`` (e.g. shared ``exports``) still merges,
    unless the child sets format fp32 with no quantizer (nothing would read those settings)."""
    b_stages, c_stages = base.data.get("stages"), child.data.get("stages")
    if not isinstance(b_stages, dict) or not isinstance(c_stages, dict):
        return
    for name, c_stage in c_stages.items():
        b_stage = b_stages.get(name)
        if not (isinstance(b_stage, dict) and isinstance(c_stage, dict)):
            continue
        bq, cq = b_stage.get("quantize"), c_stage.get("quantize")
        if not (isinstance(bq, dict) and isinstance(cq, dict) and "format" in cq):
            continue
        if "format" not in bq:
            # A parent's block without a format holds settings for whichever quantizer its children pick;
            # a child that picks fp32 and no quantizer has none to read them.
            if cq["format"] == "fp32" and cq.get("quantizer") is None:
                del b_stage["quantize"]
            continue
        # Another quantizer for the same format is just as foreign to the parent's settings.
        if bq["format"] != cq["format"] or cq.get("quantizer", bq.get("quantizer")) != bq.get("quantizer"):
            del b_stage["quantize"]


def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


def _format_pydantic(err: ValidationError, located: Located, prefix: KeyPath = ()) -> str:
    errors = err.errors()
    first = errors[0]
    loc = prefix + tuple(first["loc"])
    key = _dotted(loc)
    if first["type"] == "extra_forbidden":
        msg = f"unknown key '{key}'"
        if loc[:-1] == ("stages",):
            from cosycompile.stages import stage_infos

            msg += f" (stages are: {', '.join(stage_infos())})"
    elif first["type"] == "missing":
        msg = f"missing required key '{key}'"
    else:
        got = first.get("input")
        got_s = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        msg = f"key '{key}': {first['msg']} (got {got_s})"
    more = f" (+{len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{located.where(loc)}: {msg}{more}"


def strict_validate(model: type[BaseModel], data: Any, context: dict[str, Any] | None = None) -> Any:
    """``model`` from recipe data with no lax coercion: "2" is not a number, true is not an integer.

    Validated as JSON in strict mode, which is pydantic's strict mode plus lists for tuple fields (a
    YAML recipe writes tuples as lists); the YAML reader has already refused what JSON cannot carry.
    """
    return model.model_validate_json(json.dumps(data), strict=True, context=context)


def load_recipe(path: str | Path) -> Recipe:
    """Read, merge (``extends:``) and validate a recipe; raise RecipeError naming file:line and key."""
    path = Path(path)
    if path.is_dir():
        raise RecipeError(f"{path}: is a directory, expected a recipe .yaml file")
    located = _load_with_extends(path)
    data = dict(located.data)
    for reserved in RESERVED_KEYS:
        if reserved in data:
            raise RecipeError(f"{located.where((reserved,))}: unknown key '{reserved}'")
    data["source"] = str(path)
    data["base_dir"] = str(path.resolve().parent)
    family = _model_mapping(data, located)
    try:
        recipe = strict_validate(Recipe, data)
    except ValidationError as exc:
        raise RecipeError(_format_pydantic(exc, located)) from None
    recipe._family = family
    _check_combinations(recipe, located)
    return recipe


def _model_mapping(data: dict[str, Any], located: Located) -> str | None:
    """Unfold ``model: {path, family}`` into ``model: <path>`` and return the family it names (None
    for the plain string form); the family is checked against the registry."""
    model = data.get("model")
    if not isinstance(model, dict):
        return None
    for key in model:
        if key not in ("path", "family"):
            raise RecipeError(f"{located.where(('model', key))}: unknown key 'model.{key}' (known: path, family)")
    if "path" not in model:
        raise RecipeError(f"{located.where(('model',))}: missing required key 'model.path'")
    data["model"] = model["path"]
    family = model.get("family")
    if family is None:
        return None
    from cosycompile.families import family_infos

    known = family_infos()
    if not isinstance(family, str) or family not in known:
        raise RecipeError(f"{located.where(('model', 'family'))}: unknown model family {family!r} "
                          f"(known: {', '.join(known)})")
    return family


def _plugin_spec(model: type[BaseModel], data: Any, located: Located, prefix: KeyPath,
                 context: dict[str, Any] | None = None) -> Any:
    try:
        return strict_validate(model, data, context)
    except ValidationError as exc:
        msg = _format_pydantic(exc, located, prefix)
        if exc.errors()[0]["type"] == "extra_forbidden":
            msg += f" (known: {', '.join(model.model_fields)})"
        raise RecipeError(msg) from None


def _check_combinations(recipe: Recipe, located: Located) -> None:
    """Resolve every plug-in spec, and cross-field rules that a per-field schema cannot express."""
    from cosycompile.backends import backend_infos
    from cosycompile.exporters import exporter_infos
    from cosycompile.quantize import (NoQuantization, choose_quantizer, formats_for, quantizer_infos,
                                      target_problem)
    from cosycompile.stages import stage_infos
    from cosycompile.validate.registry import registry

    stages = stage_infos()
    for name in recipe.stages:
        if name not in stages:
            raise RecipeError(f"{located.where(('stages', name))}: unknown stage 'stages.{name}' "
                              f"(stages are: {', '.join(stages)})")
    if recipe.target not in TARGETS:
        raise RecipeError(
            f"{located.where(('target',))}: unknown target '{recipe.target}' (known: {', '.join(sorted(TARGETS))})"
        )
    target = TARGETS[recipe.target]
    calib, evals = (Path(recipe.resolve_path(x)).resolve() for x in (recipe.calibration.set, recipe.validation.eval_set))
    if calib == evals and not recipe.calibration.same_as_eval:
        raise RecipeError(f"{located.where(('calibration', 'set'))}: calibration set {calib} is the eval set; quantizing "
                          "on the data it is judged on overstates its quality (set calibration.same_as_eval: true "
                          "to do it on purpose)")
    metrics = registry()
    for kind in ("min", "max"):
        for metric in getattr(recipe.validation.gate, kind):
            where = located.where(("validation", "gate", kind, metric))
            if metric not in metrics:
                raise RecipeError(f"{where}: unknown gate metric '{metric}' (see cosycompile gate --list-metrics)")
    for i, name in enumerate(recipe.exports):
        if name not in exporter_infos():
            raise RecipeError(f"{located.where(('exports', i))}: unknown exporter '{name}' "
                              f"(known: {', '.join(exporter_infos())})")
    if not recipe.enabled_stages():
        raise RecipeError(f"{located.where(('stages',))}: every stage is disabled; nothing to build")
    backends = backend_infos()
    for name in recipe.enabled_stages():
        spec = recipe.stage(name)
        sinfo = stages[name]
        base = ("stages", name)
        check = _plugin_spec(sinfo.check_spec, spec.check, located, base + ("check",))
        if sinfo.runtime_spec is None and spec.runtime:
            raise RecipeError(f"{located.where(base + ('runtime',))}: stage '{name}' has no runtime settings")
        runtime = _plugin_spec(sinfo.runtime_spec, spec.runtime, located, base + ("runtime",)) \
            if sinfo.runtime_spec is not None else None
        where = located.where(base + ("engine", "backend"))
        info = backends.get(spec.engine.backend)
        if info is None:
            raise RecipeError(f"{where}: unknown backend '{spec.engine.backend}' for stage '{name}' "
                              f"(known: {', '.join(backends)})")
        if info.stages is not None and name not in info.stages:
            raise RecipeError(f"{where}: stage '{name}' cannot use backend '{info.name}' "
                              f"(it builds: {', '.join(info.stages)})")
        problem = info.target_problem(target)
        if problem:
            raise RecipeError(f"{where}: backend '{info.name}' cannot build for target '{recipe.target}': {problem}")
        options = _plugin_spec(info.options, spec.engine.options, located, base + ("engine", "options"),
                               context={"target": target, "stage": name})
        q = spec.quantize
        qwhere = base + ("quantize",)
        if not isinstance(q.get("format", "fp32"), str):
            raise RecipeError(f"{located.where(qwhere + ('format',))}: key 'stages.{name}.quantize.format' must be a string")
        fmt = q.get("format", "fp32")
        named = q.get("quantizer")
        quantizer = None

        def runnable() -> str:
            """The formats this stage's backend takes with the recipe's settings, for messages."""
            fits = [f for f in formats_for(name, info.name, info.consumes)
                    if target_problem(f, target) is None
                    and (info.check_format is None or info.check_format(name, f, options, spec.export.opset) is None)]
            return ", ".join(["fp32", *fits])

        if fmt == "fp32" and named is None:
            extra = sorted(set(q) - {"format"})
            if "format" not in q and extra:
                # Settings without a format (e.g. gpu-base.yaml's shared `exports`) are for the quantizer a
                # recipe picks by format; left unset, the stage is fp32 and nothing reads them.
                raise RecipeError(
                    f"{located.where(qwhere + (extra[0],))}: stages.{name}.quantize sets {', '.join(extra)} but no "
                    f"format, and only a quantizer reads {'them' if len(extra) > 1 else 'it'}: set "
                    f"stages.{name}.quantize.format (backend '{info.name}' takes: {runnable()})")
            qspec = _plugin_spec(NoQuantization, q, located, qwhere)
        else:
            chosen = choose_quantizer(name, fmt, named, info.name, info.consumes)
            if isinstance(chosen, str):
                key = "quantizer" if named is not None else "format"
                raise RecipeError(f"{located.where(qwhere + (key,))}: stages.{name}.quantize.{key}: {chosen}")
            quantizer = chosen
            if named is None and quantizer.backends is not None and info.name not in quantizer.backends:
                # The recipe chose a format, not this quantizer: no quantizer for that format writes what the
                # backend runs, so say which keys to change rather than validate a spec it never asked for.
                raise RecipeError(
                    f"{located.where(qwhere + ('format',))}: stages.{name}.quantize.format: no quantizer writes "
                    f"format '{fmt}' for stage '{name}' in a form backend '{info.name}' runs (quantizer "
                    f"'{quantizer.name}' writes it for {' and '.join(quantizer.backends)}): set "
                    f"stages.{name}.engine.backend to {' or '.join(quantizer.backends)}, or a format backend "
                    f"'{info.name}' takes ({runnable()})")
            qspec = _plugin_spec(quantizer.spec, q, located, qwhere)
            problem2 = quantizer.check(qspec, name, target) if quantizer.check else None
            if problem2 is None and quantizer.backends is not None and info.name not in quantizer.backends:
                problem2 = ("quantizer", f"quantizer '{quantizer.name}' writes ops only {', '.join(quantizer.backends)} "
                                         f"runs; backend '{info.name}' cannot run them")
            if problem2 is None and target_problem(fmt, target):
                problem2 = ("format", target_problem(fmt, target) or "")
            if problem2 is None and info.check_format is not None:
                problem2 = info.check_format(name, fmt, options, spec.export.opset)
            if problem2 is None and not quantizer.serves(info.name, info.consumes):
                fits = [q.name for q in quantizer_infos().values() if q.serves(info.name, info.consumes)]
                problem2 = ("quantizer", f"backend '{info.name}' compiles torch programs, which quantizer "
                                         f"'{quantizer.name}' does not write; use {' or '.join(fits) or 'format fp32'}")
            if problem2:
                key, msg = problem2
                raise RecipeError(f"{located.where(qwhere + (key,))}: stages.{name}.quantize.{key}: {msg}")
            consumes = "checkpoint" if info.consumes == "checkpoint" else "onnx"
            exports = getattr(qspec, "exports", None)
            if consumes == "checkpoint" and exports is not None and not {"hf", "trtllm"} & set(exports):
                raise RecipeError(f"{located.where(qwhere + ('exports',))}: backend '{info.name}' builds from a "
                                  f"checkpoint: add hf or trtllm to stages.{name}.quantize.exports")
        recipe._typed[name] = {"quantize": qspec, "quantizer": quantizer, "backend": info, "options": options,
                               "check": check, "runtime": runtime}
