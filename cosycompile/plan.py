"""From a recipe to a graph of steps. Names no stage, backend, format, exporter or model family: each
comes from its plug-in registry, and each step's code is the import closure of the plug-in modules it runs.

Per enabled stage: export -> simplify -> [quantize] -> engine -> check; one ``reference`` step (the
PyTorch FP32 outputs every check compares with, shared by every recipe on the model), one
``calibrate`` step when a quantizer reads activations, then the ``pipeline.check``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cosycompile.core.graph import Step, lazy
from cosycompile.errors import BackendUnavailable, ModelError
from cosycompile.families import BUILTIN_PREFIX, FamilyInfo
from cosycompile.recipe.schema import Recipe
from cosycompile.core.targets import TARGETS
from cosycompile.runtime.dataset import load_dataset

TORCH_TOOLS = ("torch", "transformers", "onnx", "onnxscript")
# The export for backends that compile torch programs (BackendInfo.consumes == "program").
PROGRAM_EXPORT = "cosycompile.stages.common:export_programs"
STEP_ORDER = ("export", "simplify", "quantize", "engine", "check")

# Hooks a step that loads the model reaches through the family's registry entry besides its loader:
# the stage parts (export, reference, quantizers) and the LM's speech vocabulary (its HF rewrite).
FAMILY_LM_HOOKS = ("parts", "llm_vocab", "llm_vocab_rows", "llm_quant_target")


@dataclass
class ModelInput:
    """Either a step that materialises a built-in model, or a checkpoint dir on disk, and its family."""

    step: Step | None
    root: Path | None
    family: FamilyInfo

    def attach(self, step: Step, files: tuple[str, ...]) -> None:
        """Make ``step`` depend on the model: the whole built-in dir, or only ``files`` of a real dir."""
        if self.step is not None:
            step.deps["model"] = self.step
        else:
            assert self.root is not None
            present = [self.root / f for f in files if (self.root / f).is_file()]
            step.files["model"] = (self.root, present)


def model_input(recipe: Recipe) -> ModelInput:
    """Resolve the recipe's ``model:`` and its family into a ModelInput, failing early on a bad spec or dir."""
    spec = recipe.model
    if spec.startswith(BUILTIN_PREFIX):
        family = _family(recipe, spec)
        if spec[len(BUILTIN_PREFIX):] not in family.builtins:
            raise ModelError(f"{recipe.source}: unknown built-in model '{spec}' of family '{family.name}' "
                             f"(known: {', '.join(BUILTIN_PREFIX + m for m in family.builtins)})")
        step = Step(
            name="model", kind="model.builtin", run=lazy("cosycompile.families.builtin_step:materialize"),
            code=family.code_modules("init_model"),
            params={"spec": spec, "seed": 0, "family": family.name}, tools=("torch", "transformers", "onnx"),
            describe=f"write {spec} in the {family.name} checkpoint layout",
        )
        return ModelInput(step, None, family)
    root = recipe.resolve_path(spec)
    if not root.is_dir():
        raise ModelError(f"{recipe.source}: model dir not found: {root}")
    family = _family(recipe, root)
    # Every file the build will read, checked now rather than when the step reading it runs (minutes in).
    # The family's layout check imports no torch, so planning stays light.
    family.hook("check_model_dir")(root, recipe.enabled_stages())
    return ModelInput(None, root.resolve(), family)


def _family(recipe: Recipe, model: str | Path) -> FamilyInfo:
    """The recipe's ``model.family``, else the family of the built-in or of the model dir's config file."""
    from cosycompile.families import resolve_family

    try:
        return resolve_family(model, recipe.model_family)
    except ModelError as exc:
        raise ModelError(f"{recipe.source}: {exc}") from None


@dataclass
class BuildPlan:
    recipe: Recipe
    steps: list[Step]
    final: Step
    stage_steps: dict[str, dict[str, Step]]
    not_validated: dict[str, str]  # stage -> why its engine cannot run on this machine
    family: FamilyInfo  # the model family of the recipe's model
    # Planned for a machine of the target's kind (its checks included), not for this one.
    on_target: bool = False


def run_problems(recipe: Recipe) -> dict[str, str]:
    """Stages whose engines cannot run on this machine, with the reason (then nothing is validated)."""
    target = TARGETS[recipe.target]
    out = {}
    for name in recipe.enabled_stages():
        hook = recipe.typed(name)["backend"].run_problem
        reason = hook(target) if hook is not None else None
        if reason:
            out[name] = reason
    return out


def checks_run_on_target(recipe: Recipe) -> bool:
    """Whether a machine of the recipe's target kind could run its checks: every enabled stage's
    backend is one the checks run (whatever this machine lacks)."""
    return all(recipe.typed(name)["backend"].checks_run for name in recipe.enabled_stages())


def plan_build(recipe: Recipe, until: str | None = None, engines_from: Path | None = None,
               on_target: bool = False) -> BuildPlan:
    """Every step the recipe needs, wired together (no work done, nothing heavy imported).

    ``engines_from``: a bundle whose engines are validated instead of building new ones
    (``cosycompile validate``). ``on_target``: plan the checks as a machine of the target's kind
    would run them (a cluster sends them to such a node), whatever this machine can run; only for a
    recipe whose checks run there (:func:`checks_run_on_target`).
    """
    from cosycompile.stages import stage_infos

    stages = stage_infos()
    target = TARGETS[recipe.target]
    assert not on_target or checks_run_on_target(recipe)
    unrunnable = {} if engines_from is not None or on_target else run_problems(recipe)
    model = model_input(recipe)
    family = model.family
    # What every step that loads the model reads through the family's registry entry: the loader and
    # the stage runtimes (a static import walk from the step body cannot see them).
    family_code = family.code_modules("loader", "runtimes", *FAMILY_LM_HOOKS)
    v = recipe.validation
    eval_set = load_dataset(recipe.resolve_path(v.eval_set))
    eval_items = eval_set.head(v.max_items)
    eval_files = sorted({eval_set.root / "manifest.jsonl", *[i.prompt_wav for i in eval_items if i.prompt_wav]})
    threads = v.speed.threads
    sampling = v.sampling.model_dump()
    all_model_files = family.model_files(stages) + family.frontend_files

    # The reference depends on the model and the checks' workloads, never on what a recipe builds.
    reference = Step(
        name="reference", kind="reference", run=lazy("cosycompile.reference.step:run"),
        code=tuple(m for s in stages.values() for m in _module_roots(s, "reference", "modules")) + family_code,
        params={"checks": {n: recipe.typed(n)["check"].model_dump(mode="json") if n in recipe.enabled_stages()
                           else s.check_spec().model_dump(mode="json") for n, s in stages.items()},
                "family": family.name, "sampling": sampling, "max_items": v.max_items, "threads": threads,
                "speed": v.speed.model_dump(include={"warmup", "runs"}) if v.speed.reference == "cached" else None},
        tools=TORCH_TOOLS, describe="run the PyTorch FP32 reference on the eval set (once per model)",
    )
    model.attach(reference, all_model_files)
    reference.files["eval"] = (eval_set.root, eval_files)
    reference.preflight = _audio_preflight(eval_files, model.root, family)

    calibrate = _calibrate_step(recipe, model, all_model_files, family_code)
    stage_steps: dict[str, dict[str, Step]] = {}
    for name in recipe.enabled_stages():
        sinfo = stages[name]
        spec = recipe.stage(name)
        typed = recipe.typed(name)
        binfo, qinfo, qspec = typed["backend"], typed["quantizer"], typed["quantize"]
        # A backend that consumes a checkpoint gets the stage's checkpoint export, one that compiles
        # torch programs gets them from torch.export; only ONNX goes through simplify.
        consumes = binfo.consumes
        if consumes == "checkpoint" and sinfo.checkpoint_export is None:
            raise ModelError(f"{recipe.source}: stage '{name}' has no checkpoint export for backend '{binfo.name}'")
        if consumes == "checkpoint" and not family.llm_checkpoint:
            # Refused before any step: the checkpoint export would fail only after the model and reference.
            raise ModelError(f"{recipe.source}: stages.{name}.engine.backend '{binfo.name}' serves the LM from a "
                             f"Qwen2 checkpoint; the {family.name} family's LM is not a Qwen2 body and has none "
                             "(build it with onnxruntime or tensorrt)")
        if consumes == "checkpoint":
            run, code, params, what = (sinfo.ref("checkpoint_export"), _module_roots(sinfo, "modules", "checkpoint_export"),
                                       {}, "as a checkpoint")
        elif consumes == "program":
            run, code, params, what = (PROGRAM_EXPORT, _module_roots(sinfo, "modules") + (PROGRAM_EXPORT.split(":")[0],),
                                       {"stage": name, "target_kind": target.kind}, "as torch.export programs")
            if getattr(typed["options"], "static_cache", False) and target.kind == "cpu":
                params["static_cache"] = True  # set only when on, so other recipes keep their cache keys
        else:
            run, code, params, what = (sinfo.ref("export"), _module_roots(sinfo, "modules", "export"),
                                       {"opset": spec.export.opset}, "to ONNX")
        code += family.code_modules("loader", *FAMILY_LM_HOOKS)
        params = {**params, "family": family.name}
        runtime = typed["runtime"]
        settings = runtime.model_dump(mode="json", exclude_defaults=True) if runtime is not None else {}
        if settings:  # only what a recipe changed, so recipes on the defaults keep their cache keys
            params = {**params, "runtime": settings}
        export = Step(
            name=f"{name}.export", kind=f"{name}.export" + ("" if consumes == "onnx" else f".{consumes}"),
            run=lazy(run), code=code, params=params, tools=TORCH_TOOLS, describe=f"export {sinfo.summary} {what}",
        )
        stage_files = family.model_files((name,))
        model.attach(export, stage_files + (family.frontend_files if consumes == "checkpoint" else ()))
        if model.root is not None:
            export.preflight = _checkpoint_preflight(family, model.root, name)
        steps = {"export": export}
        graphs = export
        if consumes == "onnx":
            graphs = steps["simplify"] = Step(
                name=f"{name}.simplify", kind="onnx.simplify", run=lazy("cosycompile.onnx.simplify:simplify"),
                params={"method": spec.export.simplify}, deps={"graphs": export},
                tools=("onnx", "onnxslim", "onnxsim"), describe=f"simplify the {name} graphs",
            )
        unquantized = graphs
        if qinfo is not None:
            quantize = Step(
                name=f"{name}.quantize", kind=f"quantize.{qinfo.name}", run=lazy(qinfo.ref("quantize")),
                code=_module_roots(sinfo, "modules") + family.code_modules("loader", *FAMILY_LM_HOOKS),
                params={"stage": name, "opset": spec.export.opset, "target_kind": target.kind, "family": family.name},
                spec=qspec, deps={"graphs": unquantized}, tools=qinfo.tools, target=target.name,
                describe=f"quantize {name} to {qspec.format} with {qinfo.name}",
            )
            if qinfo.needs_calibration(qspec.format):
                assert calibrate is not None
                quantize.deps["calib"] = calibrate
            # The checkpoint exports read the front end's tokenizer (it sets the merged vocabulary).
            model.attach(quantize, stage_files + (family.frontend_files if consumes == "checkpoint" else ()))
            if getattr(qspec, "exclude", None) and qinfo.stages is not None:
                source = model.root if model.root is not None else recipe.model.split(":", 1)[1]
                quantize.preflight = _exclusion_preflight(qinfo, source, list(qspec.exclude))
            graphs = steps["quantize"] = quantize
        engine = _engine_step(name, binfo, typed["options"], qspec.format, graphs, target.name)
        if engines_from is not None:
            engine = _imported_engine(name, engines_from / "engines" / name, binfo, target.name)
        steps["engine"] = engine
        if unrunnable:
            stage_steps[name] = steps
            continue
        check = Step(
            name=f"{name}.check", kind=f"{name}.check", run=lazy(sinfo.ref("check")),
            code=(binfo.package, binfo.ref("load").split(":")[0]) + family.code_modules("runtimes"),
            params={"threads": threads, "sampling": sampling, "max_items": v.max_items, "backend": binfo.name,
                    "precision": qspec.format, "pairs": v.speed.runs, "warmup": v.speed.warmup,
                    "min_seconds": v.speed.min_seconds, "machine_state": v.speed.machine_state},
            spec=typed["check"], deps={"engine": engine, "reference": reference},
            tools=TORCH_TOOLS + binfo.tools, target=target.name, hardware=_hardware(target.name),
            describe=f"compare the {name} engine with the PyTorch FP32 reference",
        )
        if qinfo is not None and engines_from is None:
            # Speed of a quantized engine is reported against the FP32 engine of the same backend.
            steps["engine_fp32"] = check.deps["fp32_engine"] = _engine_step(
                name, binfo, typed["options"], "fp32", unquantized, target.name, suffix=".fp32")
        model.attach(check, stage_files + family.frontend_files)
        check.files["eval"] = (eval_set.root, eval_files)
        steps["check"] = check
        stage_steps[name] = steps

    enabled = recipe.enabled_stages()
    if unrunnable:
        final = _unvalidated_step(recipe, stage_steps, unrunnable, target.name)
        targets = [final] if until is None else _until(stage_steps, until)
        return BuildPlan(recipe, targets, final, stage_steps, unrunnable, family)
    final = Step(
        name="pipeline.check", kind="pipeline.check", run=lazy("cosycompile.validate.pipeline_check:run"),
        code=tuple(m for s in enabled for m in stage_steps[s]["check"].code)
        + tuple(m for s in stages.values() for m in _module_roots(s, "modules")) + family_code,
        params={"family": family.name, "validation": v.model_dump(exclude={"eval_set", "gate"}), "stages": enabled,
                "max_items": v.max_items,
                "backends": {s: recipe.stage(s).engine.backend for s in enabled},
                "precisions": {s: recipe.typed(s)["quantize"].format for s in enabled},
                "thresholds": v.gate.thresholds()},
        deps={"reference": reference, **{f"{s}.engine": st["engine"] for s, st in stage_steps.items()},
              **{f"{s}.check": st["check"] for s, st in stage_steps.items()}},
        tools=TORCH_TOOLS + ("onnxruntime",), target=target.name, hardware=_hardware(target.name),
        describe="text -> wav on the engines vs the PyTorch FP32 reference on the eval set",
    )
    model.attach(final, all_model_files)
    final.files["eval"] = (eval_set.root, eval_files)
    final.preflight = _audio_preflight(eval_files, None, family)
    targets = [final] if until is None else _until(stage_steps, until)
    return BuildPlan(recipe, targets, final, stage_steps, {}, family, on_target)


def _until(stage_steps: dict[str, dict[str, Step]], until: str) -> list[Step]:
    """Partial build: per stage, the deepest step at or before ``until`` (no pipeline check, no bundle)."""
    keep = STEP_ORDER[: STEP_ORDER.index(until) + 1]
    return [next(st[k] for k in reversed(keep) if k in st) for st in stage_steps.values()]


def _unvalidated_step(recipe: Recipe, stage_steps: dict[str, dict[str, Step]], reasons: dict[str, str],
                      target: str) -> Step:
    """The last step when the engines cannot run here: a report that says so (the gate fails it
    unless told otherwise), so the bundle is still assembled for a machine that can validate it."""
    enabled = recipe.enabled_stages()
    return Step(
        name="pipeline.check", kind="pipeline.unvalidated", run=lazy("cosycompile.validate.unvalidated:run"),
        params={"stages": enabled, "reasons": reasons, "thresholds": recipe.validation.gate.thresholds(),
                "backends": {s: recipe.stage(s).engine.backend for s in enabled},
                "precisions": {s: recipe.typed(s)["quantize"].format for s in enabled}},
        deps={f"{s}.engine": st["engine"] for s, st in stage_steps.items()}, target=target,
        describe="record that the engines were built but cannot be validated on this machine",
    )


def _imported_engine(stage: str, engine_dir: Path, info: Any, target: str) -> Step:
    """An engine taken from a bundle, keyed by its passport's file digests (what makes it that engine)."""
    from cosycompile.runtime.loading import read_passport

    passport = read_passport(engine_dir)
    files = sorted(f for f in engine_dir.rglob("*") if f.is_file())
    # Keyed by content (relative names + digests), not by where the bundle happens to be.
    return Step(
        name=f"{stage}.engine", kind=f"engine.imported.{info.name}", run=lazy("cosycompile.backends.step:import_engine"),
        params={"digests": passport.get("files", {}), "key": passport.get("key")}, files={"engine": (engine_dir, files)},
        target=target, describe=f"take the {stage} engine from {engine_dir}",
    )


def _module_roots(sinfo: Any, *hooks: str) -> tuple[str, ...]:
    """The stage's package and the modules of its hooks: code reached through the registry, which a
    static import walk from the step body cannot see."""
    return (sinfo.package,) + tuple(sinfo.ref(h).split(":")[0] for h in hooks)


def _engine_step(stage: str, info: Any, options: Any, fmt: str, graphs: Step, target: str, suffix: str = "") -> Step:
    return Step(
        name=f"{stage}.engine{suffix}", kind=f"engine.{info.name}", run=lazy("cosycompile.backends.step:build_engine"),
        code=(info.package, info.ref("build").split(":")[0]), params={"backend": info.name, "precision": fmt}, spec=options,
        deps={"graphs": graphs}, tools=info.tools, target=target,
        describe=f"build the {stage} {fmt} engine with {info.name}",
        preflight=_unavailable_preflight(stage, info) if info.unavailable else None,
        blocked=_build_blocker(info, TARGETS[target], options) if info.build_problem else None,
        hardware=_hardware(target),
    )


def _hardware(target: str) -> str | None:
    """What a step that builds or runs the target's engines must run on: the GPU's ``sm_tag``
    (TensorRT builds on the GPU itself; TensorRT-RTX could build anywhere, but its engines are
    checked there), None for a CPU target."""
    t = TARGETS[target]
    return t.sm_tag if t.kind == "gpu" else None


def _calibrate_step(recipe: Recipe, model: ModelInput, model_files: tuple[str, ...],
                    family_code: tuple[str, ...]) -> Step | None:
    """One reference run over the calibration set recording every stage's real inputs (if any stage needs it)."""
    if not any((q := recipe.typed(s)["quantizer"]) is not None and q.needs_calibration(recipe.typed(s)["quantize"].format)
               for s in recipe.enabled_stages()):
        return None
    cal = recipe.calibration
    calib_set = load_dataset(recipe.resolve_path(cal.set), what="calibration set")
    items = calib_set.head(cal.max_items)
    files = sorted({calib_set.root / "manifest.jsonl", *[i.prompt_wav for i in items if i.prompt_wav]})
    from cosycompile.stages import stage_infos

    step = Step(
        name="calibrate", kind="calibrate", run=lazy("cosycompile.quantize.calibrate:run"),
        code=tuple(m for s in stage_infos().values() for m in _module_roots(s, "modules")) + family_code,
        # Which stages this recipe quantizes is not a parameter: the step runs the whole reference
        # pipeline and keeps every stage's records either way, so recipes that calibrate different
        # stages of the same model on the same items share one entry. ``set`` is in the key as the files
        # read; ``same_as_eval`` is a permission that changes nothing the step computes.
        params={"calibration": cal.model_dump(exclude={"set", "same_as_eval"}), "family": model.family.name},
        tools=TORCH_TOOLS, describe="record each stage's real inputs from the FP32 reference on the calibration set",
    )
    model.attach(step, model_files)
    step.files["calib"] = (calib_set.root, files)
    step.preflight = _audio_preflight(files, model.root, model.family)
    return step


def _audio_preflight(files: list[Path], model_root: Path | None, family: FamilyInfo) -> Callable[[], None]:
    """The prompts' audio headers and, for a model dir on disk, the front end's ONNX models: what
    the steps running the front end read, checked before any step runs."""

    def check() -> None:
        from cosycompile.runtime.dataset import check_audio

        check_audio(files)
        if model_root is not None:
            family.hook("check_frontend")(model_root)

    return check


def _checkpoint_preflight(family: FamilyInfo, root: Path, stage: str) -> Callable[[], None]:
    def check() -> None:
        family.hook("check_checkpoint")(root, stage)

    return check


def _unavailable_preflight(stage: str, info: Any) -> Callable[[], None]:
    """Refuse, before any step runs, an engine no machine can build with this version."""

    def check() -> None:
        raise BackendUnavailable(f"stage '{stage}': backend '{info.name}' cannot build: {info.unavailable}; "
                                 f"build everything before the engine with --until quantize")

    return check


def _build_blocker(info: Any, target: Any, options: Any = None) -> Callable[[], str | None]:
    """Why this machine cannot build the engine (its builder is missing): the build then runs every
    other step and leaves this one to a machine that has it."""

    def why() -> str | None:
        problem = info.build_problem(target, options)
        return f"backend '{info.name}': {problem}" if problem else None

    return why


def _exclusion_preflight(qinfo: Any, source: Any, patterns: list[str]) -> Callable[[], None]:
    def check() -> None:
        from cosycompile.core.plugins import load_object

        load_object(qinfo.ref("quantize").split(":")[0] + ":exclusion_preflight")(source, patterns)

    return check


def executor(plan: BuildPlan, store: Any, reporter: Any, force: bool = False, remote: Any = None) -> Any:
    """An Executor for the plan, remembering state per recipe name (to explain rebuilds); ``remote``
    is an optional :class:`cosycompile.cache.remote.RemoteCache` shared with other machines."""
    from cosycompile.core.graph import Executor, StateFile

    state = StateFile(store.root / "state" / f"{plan.recipe.name}.json")
    return Executor(store, plan.steps, state, reporter, force=force, remote=remote)
