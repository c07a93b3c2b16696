"""Model families: one sub-folder per CosyVoice generation, named by the value a recipe or a model dir
names (``cosyvoice2``, ``cosyvoice3``, ...). A folder whose name starts with ``_`` is work in progress
and not a plug-in.

A family folder holds what is that generation's own: its PyTorch networks (upstream's state-dict
keys), its config reader, the check of its model dir's layout, its built-in models and the stage
runtimes (the control flow around its graphs). Its light ``__init__.py`` defines
``PLUGIN = FamilyInfo(...)``; the stage roles, backends, quantizers, cache and validation stay
generic and reach the family through this registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from cosycompile.core.plugins import discover, load_object, resolve_ref
from cosycompile.errors import ModelError

BUILTIN_PREFIX = "builtin:"
# Graphs dirs and bundles written before families were plug-ins carry no ``family`` in their info;
# every one of them was built from a CosyVoice2 model.
LEGACY_FAMILY = "cosyvoice2"


@dataclass(frozen=True)
class LMQuantTarget:
    """What the LLM's PyTorch quantizer (``quantize/modelopt_torch``) works on, as the family says."""

    module: Any  # quantized in place: its Linear layers (the Qwen2 body; the 300M Transformer stack)
    calibrate: Callable[[Any], Any]  # runs ``module`` on one calibration record's inputs_embeds (a tensor)
    decode_step: Callable[[], Any]  # the ``llm_step`` graph module over the (quantized) LM, for the ONNX export
    widths: tuple[int, int]  # input features of its attention and FFN projections (a weight block divides them)
    checkpoints: bool  # whether the Hugging Face / TensorRT-LLM checkpoint exports apply (a Qwen2 body)
    # Modules of ``module`` (fnmatch patterns over its module names) the quantizer keeps in full precision
    # whatever a recipe excludes besides: layers the family knows INT8 cannot hold.
    keep_fp32: tuple[str, ...] = ()
    # Modules whose weight the family's code reads directly, not through their forward: an INT8 export
    # keeps these weights as FP32 tensors (as ModelOpt's own export reads them), not as INT8 initializers.
    weights_read: tuple[str, ...] = ()


@dataclass(frozen=True)
class FamilyInfo:
    """What the planner, the steps and the runtimes need to know about a model family, without importing torch.

    Hook references are ``".module:attr"`` relative to the family's package, so a renamed copy of
    the folder is a new family.
    """

    summary: str
    config_file: str  # the file of a model dir that says it is this family's (e.g. ``cosyvoice2.yaml``)
    builtins: tuple[str, ...]  # ``builtin:<name>`` models the family writes
    tiny_builtin: str  # the smallest built-in, the one tests build
    stage_files: Mapping[str, tuple[str, ...]]  # stage -> files of a model dir its network is read from
    frontend_files: tuple[str, ...]  # files of a model dir the front end may read (those present are keyed)
    # Files a bundle's front end carries besides those (read only when present, e.g. tokenizer extras).
    bundle_files: tuple[str, ...]
    runtimes: Mapping[str, str]  # stage -> "module:Class" of its torch-free runtime (``from_runners``)
    # stage -> "module:function": (loaded models) -> (graph modules by graph name, numpy assets, runtime
    # constants), what a stage's export, reference and checkpoint export read of the family's networks.
    parts: Mapping[str, str]
    speech_tokenizer: str  # the front end's speech tokenizer model in a model dir (one of ``frontend_files``)
    # Text the front end puts before a prompt's text when neither it nor the text holds ``prompt_marker``
    # (CosyVoice3's LM was trained on an instruction ending in ``<|endofprompt|>``; upstream asserts it).
    prompt_instruction: str = ""
    prompt_marker: str = ""
    # The prompt mel the flow is conditioned on, as upstream's ``feat_extractor``: (sample rate, n_fft =
    # window, hop); and the mel frames kept per prompt speech token (0: the mel is not trimmed to them).
    prompt_mel: tuple[int, int, int] = (24000, 1920, 480)
    prompt_mel_frames_per_token: int = 2
    # (model dir) -> the text tokenizer of a real model dir (``encode(text) -> ids`` and ``file``, the file
    # an error about it names); empty: the Qwen tokenizer in ``CosyVoice-BlankEN``.
    text_tokenizer: str = ""
    # (front-end dir) -> the speakers a model ships, as ``runtime.speakers.Speaker`` (CosyVoice-300M-SFT's
    # x-vectors); written into every bundle of the model. Empty: none.
    model_speakers: str = ""
    loader: str = ".loader:load_models"  # (model_dir, stages) -> LoadedModels
    init_model: str = ".loader:init_model"  # (spec, out_dir, seed) -> the built-in written as a model dir
    check_checkpoint: str = ".loader:check_checkpoint"  # (model_dir, stage): keys and shapes, pre-flight
    check_model_dir: str = ".layout:check_model_dir"  # (root, stages): files present and readable, at plan time
    check_frontend: str = ".layout:check_frontend_models"  # (root): the front end's models parse, pre-flight
    # (model dir or built-in name, stage) -> that network on the meta device (module names, no weights)
    meta_network: str = ".loader:meta_network"
    # The LM's speech vocabulary as the HF rewrite (stages/llm/hf_rewrite.py) lays it out after the text
    # ids: (model config) -> its rows, head rows, stop / sos / task_id offsets, token names, text
    # tokenizer; (loaded LM) -> the embedding rows and the speech head's weight and bias.
    llm_vocab: str = ".parts:llm_vocab"
    llm_vocab_rows: str = ".parts:llm_vocab_rows"
    # Whether the LM has that rewrite (a Qwen2 body), so that backends serving a checkpoint can take it.
    llm_checkpoint: bool = True
    # (loaded LM) -> :class:`LMQuantTarget`; the Qwen2 families share theirs.
    llm_quant_target: str = "cosycompile.families.qwen2_steps:quant_target"
    name: str = ""
    package: str = ""

    def ref(self, attr: str, key: str | None = None) -> str:
        """An absolute ``module:attr`` reference for a hook (``key``: the stage, for per-stage hooks)."""
        value = getattr(self, attr)
        return resolve_ref(self.package, value[key] if key is not None else value)

    def hook(self, attr: str, key: str | None = None) -> Any:
        """Import and return one of the family's hooks (heavy imports happen here)."""
        return load_object(self.ref(attr, key))

    def code_modules(self, *attrs: str) -> tuple[str, ...]:
        """The family's package and the modules of ``attrs`` (every stage's for the per-stage ones,
        ``runtimes`` and ``parts``): code a step reaches through this registry, which a static import
        walk cannot see."""
        out = [self.package]
        for attr in attrs:
            keys = list(getattr(self, attr)) if isinstance(getattr(self, attr), Mapping) else [None]
            out += [self.ref(attr, k).split(":")[0] for k in keys]
        return tuple(dict.fromkeys(out))

    def model_files(self, stages: Iterable[str]) -> tuple[str, ...]:
        """Files of a model dir that ``stages`` read, sorted (for content keys)."""
        return tuple(sorted({f for s in stages for f in self.stage_files[s]}))


def family_infos() -> dict[str, FamilyInfo]:
    """Every model family plug-in, by name."""
    return dict(discover("families"))


def get_family(name: str) -> FamilyInfo:
    """One family's info; an unknown name is a one-line :class:`ModelError` listing the known ones."""
    families = family_infos()
    if name not in families:
        raise ModelError(f"unknown model family '{name}' (known: {', '.join(families)})")
    return families[name]


def builtin_family(spec: str) -> FamilyInfo:
    """The family that writes ``builtin:<name>`` (a one-line :class:`ModelError` for an unknown one)."""
    name = spec[len(BUILTIN_PREFIX):] if spec.startswith(BUILTIN_PREFIX) else spec
    families = family_infos()
    for info in families.values():
        if name in info.builtins:
            return info
    known = ", ".join(BUILTIN_PREFIX + b for f in families.values() for b in f.builtins)
    raise ModelError(f"unknown built-in model '{BUILTIN_PREFIX}{name}' (known: {known})")


def detect_family(model_dir: Path | str) -> FamilyInfo:
    """The family of a model dir, from the config file it holds (``cosyvoice2.yaml``, ...).

    None or several of them is a one-line :class:`ModelError`: the recipe can then name the
    family (``model.family``).
    """
    root = Path(model_dir)
    families = family_infos()
    found = [f for f in families.values() if (root / f.config_file).is_file()]
    if len(found) == 1:
        return found[0]
    files = ", ".join(f.config_file for f in families.values())
    if not found:
        raise ModelError(f"{root}: holds no model config of a known family (one of: {files}), so it is not a "
                         f"model dir")
    raise ModelError(f"{root}: holds the configs of several families ({', '.join(f.config_file for f in found)}); "
                     f"name one in the recipe's model.family")


def resolve_family(model: str | Path, named: str | None = None) -> FamilyInfo:
    """The family of a recipe's model: the one named (checked against the registry), else the one
    that writes the built-in, else the one whose config file the model dir holds."""
    if named is not None:
        return get_family(named)
    if isinstance(model, str) and model.startswith(BUILTIN_PREFIX):
        return builtin_family(model)
    return detect_family(model)


def load_models(model_dir: Path | str, stages: Iterable[str], family: str | None = None) -> Any:
    """The networks of ``stages`` from a model dir (or ``builtin:<name>``) through its family's loader."""
    return resolve_family(model_dir, family).hook("loader")(model_dir, tuple(stages))


def stage_parts(models: Any, stage: str) -> tuple[Mapping[str, Any], dict[str, Any], dict[str, Any]]:
    """(graph modules, numpy assets, runtime constants) of ``stage`` from models its family's loader loaded."""
    return get_family(models.family).hook("parts", stage)(models)


def stage_runtime_class(stage: str, info: Mapping[str, Any]) -> Any:
    """The runtime class of ``stage`` for a graphs dir whose ``info`` names the family that exported it."""
    return get_family(str(info.get("family", LEGACY_FAMILY))).hook("runtimes", stage)
