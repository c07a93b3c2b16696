"""From a recipe to a graph of steps, and from finished steps to a bundle.

Per enabled stage: export -> simplify -> engine -> check. Then one pipeline check over the
eval set, then the bundle ``builds/<name>-<key12>/`` assembled from cache entries.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cosycompile import __version__
from cosycompile.backends import get_backend_info
from cosycompile.cache.local import Store
from cosycompile.runtime.dataset import load_dataset
from cosycompile.errors import BackendUnavailable, ModelError
from cosycompile.core.graph import BuildResult, Executor, Reporter, StateFile, Step, StepContext
from cosycompile.core.hashing import tool_versions
from cosycompile.recipe.schema import Recipe
from cosycompile.stages import STAGES
from cosycompile.recipe.targets import TARGETS

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("tiny", "random-0.5b")
FRONTEND_FILES = ("campplus.onnx", "speech_tokenizer_v2.onnx", "builtin.json",
                  "CosyVoice-BlankEN/tokenizer_config.json", "CosyVoice-BlankEN/vocab.json",
                  "CosyVoice-BlankEN/merges.txt", "CosyVoice-BlankEN/tokenizer.json")
TORCH_TOOLS = ("torch", "transformers", "onnx", "onnxscript")


def _lazy(module: str, func: str) -> Callable[[StepContext], Any]:
    """A step body that imports its (heavy) implementation only when the step actually runs."""

    def run(ctx: StepContext) -> Any:
        return getattr(importlib.import_module(module), func)(ctx)

    run.__qualname__ = f"{module}.{func}"
    return run


@dataclass
class ModelInput:
    """Either a step that materialises a built-in model, or a checkpoint dir on disk."""

    step: Step | None
    root: Path | None

    def attach(self, step: Step, files: tuple[str, ...]) -> None:
        """Make ``step`` depend on the model: the whole built-in dir, or only ``files`` of a real dir."""
        if self.step is not None:
            step.deps["model"] = self.step
        else:
            assert self.root is not None
            present = [self.root / f for f in files if (self.root / f).is_file()]
            step.files["model"] = (self.root, present)


def model_input(recipe: Recipe) -> ModelInput:
    """Resolve the recipe's ``model:`` into a ModelInput, failing early on a bad spec or dir."""
    spec = recipe.model
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ModelError(f"{recipe.source}: unknown built-in model '{spec}' "
                             f"(known: {', '.join(BUILTIN_PREFIX + m for m in BUILTIN_MODELS)})")
        step = Step(
            name="model", kind="model.builtin", run=_lazy("cosycompile.models.builtin_step", "materialize"),
            params={"spec": spec, "seed": 0}, sources=("models",), tools=("torch", "transformers", "onnx"),
            describe=f"write {spec} in the CosyVoice2 checkpoint layout",
        )
        return ModelInput(step, None)
    root = recipe.resolve_path(spec)
    if not root.is_dir():
        raise ModelError(f"{recipe.source}: model dir not found: {root}")
    if not (root / "cosyvoice2.yaml").is_file():
        raise ModelError(f"{root}: not a CosyVoice2 model dir (no cosyvoice2.yaml)")
    for stage in recipe.enabled_stages():
        for f in STAGES[stage].model_files:
            if f.endswith(".pt") and not (root / f).is_file():
                raise ModelError(f"{root / f}: checkpoint for stage '{stage}' is missing")
    return ModelInput(None, root.resolve())


@dataclass
class BuildPlan:
    recipe: Recipe
    steps: list[Step]
    final: Step
    stage_steps: dict[str, dict[str, Step]]


STEP_ORDER = ("export", "simplify", "quantize", "engine", "check")


def plan_build(recipe: Recipe, until: str | None = None) -> BuildPlan:
    """Every step the recipe needs, wired together (no work done, nothing heavy imported)."""
    target = TARGETS[recipe.target]
    model = model_input(recipe)
    eval_set = load_dataset(recipe.resolve_path(recipe.validation.eval_set))
    eval_items = eval_set.head(recipe.validation.max_items)
    eval_files = sorted({eval_set.root / "manifest.jsonl", *[i.prompt_wav for i in eval_items if i.prompt_wav]})
    threads = recipe.validation.speed.threads
    sampling = recipe.validation.sampling.model_dump()

    calibrate = _calibrate_step(recipe, model)
    stage_steps: dict[str, dict[str, Step]] = {}
    for name in recipe.enabled_stages():
        sdef = STAGES[name]
        spec = recipe.stage(name)
        mod = sdef.module
        src = f"stages/{name}.py"
        export = Step(
            name=f"{name}.export", kind=f"{name}.export", run=_lazy(mod, "export"),
            params={"opset": spec.export.opset}, sources=("models", src, "onnx_tools.py", "graphs_dir.py"),
            tools=TORCH_TOOLS, describe=f"export {sdef.summary} to ONNX",
        )
        model.attach(export, sdef.model_files)
        if model.root is not None:
            export.preflight = _checkpoint_preflight(model.root, name)
        simplify = Step(
            name=f"{name}.simplify", kind="onnx.simplify", run=_lazy("cosycompile.core.steps", "simplify"),
            params={"method": spec.export.simplify}, deps={"graphs": export},
            sources=("steps_common.py", "onnx_tools.py", "graphs_dir.py"),
            tools=("onnx", "onnxslim", "onnxsim"), describe=f"simplify the {name} graphs",
        )
        steps = {"export": export, "simplify": simplify}
        info = get_backend_info(spec.engine.backend)
        assert info is not None  # recipe validation guarantees it
        fmt = spec.quantize.format
        graphs = simplify
        if fmt != "fp32":
            graphs = steps["quantize"] = _quantize_step(recipe, name, simplify, calibrate, model)
        engine = _engine_step(name, info, spec.engine.options, fmt, graphs, target.name)
        steps["engine"] = engine
        check = Step(
            name=f"{name}.check", kind=f"{name}.check", run=_lazy(mod, "check"),
            params={"check": spec.check.model_dump(), "threads": threads, "sampling": sampling,
                    "max_items": recipe.validation.max_items, "backend": info.name, "precision": fmt},
            deps={"engine": engine}, sources=("models", src, "pipeline.py", "reference.py", "dsp.py",
                                              "validate/metrics.py", "validate/speed.py", "frontend.py", "dataset.py",
                                              "stages/common.py"),
            tools=TORCH_TOOLS + info.tools, target=target.name,
            describe=f"compare the {name} engine with the PyTorch FP32 reference",
        )
        if fmt != "fp32":
            # Speed of a quantized engine is reported against the FP32 engine of the same backend.
            steps["engine_fp32"] = check.deps["fp32_engine"] = _engine_step(
                name, info, spec.engine.options, "fp32", simplify, target.name, suffix=".fp32")
        model.attach(check, sdef.model_files + FRONTEND_FILES)
        check.files["eval"] = (eval_set.root, eval_files)
        check.preflight = _audio_preflight(eval_files)
        steps["check"] = check
        stage_steps[name] = steps

    final = Step(
        name="pipeline.check", kind="pipeline.check", run=_lazy("cosycompile.validate.pipeline_check", "run"),
        params={"validation": recipe.validation.model_dump(exclude={"eval_set", "gate"}),
                "stages": recipe.enabled_stages(),
                "backends": {s: recipe.stage(s).engine.backend for s in recipe.enabled_stages()},
                "precisions": {s: recipe.stage(s).quantize.format for s in recipe.enabled_stages()}},
        deps={**{f"{s}.engine": st["engine"] for s, st in stage_steps.items()},
              **{f"{s}.check": st["check"] for s, st in stage_steps.items()}},
        sources=("models", "pipeline.py", "reference.py", "frontend.py", "dsp.py", "validate", "dataset.py",
                 "backends"),
        tools=TORCH_TOOLS + ("onnxruntime",), target=target.name,
        describe="text -> wav on the engines vs the PyTorch FP32 reference on the eval set",
    )
    model.attach(final, tuple(sorted({f for s in recipe.enabled_stages() for f in STAGES[s].model_files}))
                 + FRONTEND_FILES)
    final.files["eval"] = (eval_set.root, eval_files)
    final.preflight = _audio_preflight(eval_files)
    steps = [final]
    if until is not None:
        # Partial build: per stage, the deepest step at or before ``until`` (no pipeline check, no bundle).
        keep = STEP_ORDER[: STEP_ORDER.index(until) + 1]
        steps = [next(st[k] for k in reversed(keep) if k in st) for st in stage_steps.values()]
    return BuildPlan(recipe, steps, final, stage_steps)


def _audio_preflight(files: list[Path]) -> Callable[[], None]:
    def check() -> None:
        from cosycompile.runtime.dataset import check_audio

        check_audio(files)

    return check


def _checkpoint_preflight(root: Path, stage: str) -> Callable[[], None]:
    def check() -> None:
        from cosycompile.models.loader import check_checkpoint

        check_checkpoint(root, stage)

    return check


def _unavailable_preflight(stage: str, info: Any) -> Callable[[], None]:
    def check() -> None:
        raise BackendUnavailable(f"stage '{stage}': backend '{info.name}': {info.unavailable}; "
                                 f"build everything before the engine with --until quantize")

    return check


def _engine_step(stage: str, info: Any, options: dict[str, Any], fmt: str, graphs: Step, target: str,
                 suffix: str = "") -> Step:
    return Step(
        name=f"{stage}.engine{suffix}", kind=f"engine.{info.name}",
        run=_lazy("cosycompile.core.steps", "build_engine"),
        params={"backend": info.name, "options": info.resolved_options(options), "precision": fmt},
        deps={"graphs": graphs}, sources=(f"backends/{info.name}.py", "steps_common.py", "graphs_dir.py"),
        tools=info.tools, target=target, describe=f"build the {stage} {fmt} engine with {info.name}",
        preflight=_unavailable_preflight(stage, info) if info.unavailable else None,
    )


def _calibrate_step(recipe: Recipe, model: ModelInput) -> Step | None:
    """One reference run over the calibration set recording every stage's real inputs (if any stage needs it)."""
    from cosycompile.quantize import needs_calibration

    stages = [s for s in recipe.enabled_stages() if needs_calibration(recipe.stage(s).quantize.format)]
    if not stages:
        return None
    cal = recipe.calibration
    calib_set = load_dataset(recipe.resolve_path(cal.set), what="calibration set")
    items = calib_set.head(cal.max_items)
    files = sorted({calib_set.root / "manifest.jsonl", *[i.prompt_wav for i in items if i.prompt_wav]})
    step = Step(
        name="calibrate", kind="calibrate", run=_lazy("cosycompile.quantize.calibrate", "run"),
        params={"calibration": cal.model_dump(exclude={"set"}), "stages": stages},
        sources=("quantize/calibrate.py", "pipeline.py", "reference.py", "frontend.py", "dsp.py", "dataset.py",
                 "models", "stages"),
        tools=TORCH_TOOLS, describe="record each stage's real inputs from the FP32 reference on the calibration set",
    )
    model.attach(step, tuple(sorted({f for s in stages for f in STAGES[s].model_files})) + FRONTEND_FILES)
    step.files["calib"] = (calib_set.root, files)
    step.preflight = _audio_preflight(files)
    return step


def _quantize_step(recipe: Recipe, stage: str, simplify: Step, calibrate: Step | None, model: ModelInput) -> Step:
    from cosycompile.quantize import DEFAULT_METHOD, needs_calibration

    spec = recipe.stage(stage)
    q = spec.quantize
    target = TARGETS[recipe.target]
    hp = q.high_precision_dtype if q.high_precision_dtype != "auto" else ("fp32" if target.kind == "cpu" else "fp16")
    params = q.model_dump()
    params.update(method=q.method or DEFAULT_METHOD[q.format], high_precision_dtype=hp, stage=stage,
                  opset=spec.export.opset)
    impl = "cosycompile.quantize.llm_ptq" if stage == "llm" else "cosycompile.quantize.onnx_ptq"
    step = Step(
        name=f"{stage}.quantize", kind=f"{stage}.quantize", run=_lazy(impl, "quantize"), params=params,
        deps={"graphs": simplify}, sources=("quantize", "onnx_tools.py", "graphs_dir.py", "models", f"stages/{stage}.py"),
        tools=("nvidia-modelopt", "onnx", "onnxruntime", "torch", "transformers"), target=target.name,
        describe=f"quantize {stage} to {q.format} ({params['method']})",
    )
    if needs_calibration(q.format):
        assert calibrate is not None
        step.deps["calib"] = calibrate
    if stage == "llm":
        model.attach(step, STAGES[stage].model_files)
        if q.exclude:
            source = model.root if model.root is not None else recipe.model.split(":", 1)[1]
            step.preflight = _llm_exclusion_preflight(source, list(q.exclude))
    return step


def _llm_exclusion_preflight(source: Any, patterns: list[str]) -> Callable[[], None]:
    def check() -> None:
        from cosycompile.quantize.llm_ptq import exclusion_preflight

        exclusion_preflight(source, patterns)

    return check


def executor(plan: BuildPlan, store: Store, reporter: Reporter, force: bool = False) -> Executor:
    """An Executor for the plan, remembering state per recipe name (to explain rebuilds)."""
    state = StateFile(store.root / "state" / f"{plan.recipe.name}.json")
    return Executor(store, plan.steps, state, reporter, force=force)


def bundle_dir(plan: BuildPlan, store: Store) -> Path:
    return store.root / "builds" / f"{plan.recipe.name}-{plan.final.key(store)[:12]}"


def assemble_bundle(plan: BuildPlan, store: Store, result: BuildResult) -> Path:
    """Publish ``builds/<name>-<key12>/`` atomically from the cache entries (no-op if present)."""
    dest = bundle_dir(plan, store)
    if (dest / "manifest.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    try:
        for stage, steps in plan.stage_steps.items():
            src = result.entries[steps["engine"].name].data
            shutil.copytree(src, tmp / "engines" / stage, copy_function=_link)
        final = result.entries[plan.final.name].data
        for f in final.iterdir():
            if f.is_file():
                _link(str(f), str(tmp / f.name))
            else:
                shutil.copytree(f, tmp / f.name, copy_function=_link)
        manifest = {
            "schema": 1,
            "cosycompile": __version__,
            "recipe": plan.recipe.name,
            "recipe_source": plan.recipe.source,
            "model": plan.recipe.model,
            "target": plan.recipe.target,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "key": plan.final.key(store),
            "steps": {name: {"key": e.key, "seconds": e.meta.get("seconds")} for name, e in result.entries.items()},
            "stages": {s: {"backend": plan.recipe.stage(s).engine.backend,
                           "precision": plan.recipe.stage(s).quantize.format,
                           "engine_key": result.entries[st["engine"].name].key}
                       for s, st in plan.stage_steps.items()},
            "tools": tool_versions(("torch", "transformers", "onnx", "onnxruntime", "onnxslim")),
        }
        (tmp / "recipe.json").write_text(plan.recipe.model_dump_json(indent=1, exclude={"source", "base_dir"}))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        from cosycompile.validate.report import render_bundle

        render_bundle(tmp)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _link(src: str, dst: str) -> None:
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
