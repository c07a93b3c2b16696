"""Checkpoint loading and built-in model writing that every family's ``loader.py`` shares.

Strict state-dict loading (``weights_only=True``; a missing, extra or mis-shaped key is a one-line
error naming the file and the key), the atomic write of a built-in model dir, the small random
initialisation that keeps every stage's output finite and non-degenerate, and the tiny ONNX
stand-ins of the front end's models. Imports torch: only loaders import this module.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from cosycompile.errors import ModelError


def normalize_hift_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip a ``generator.`` prefix and map old-style weight_g/weight_v to parametrization names."""
    out = {}
    for k, v in sd.items():
        if k.startswith("generator."):
            k = k[len("generator."):]
        if k.endswith(".weight_g"):
            k = k[: -len(".weight_g")] + ".parametrizations.weight.original0"
        elif k.endswith(".weight_v"):
            k = k[: -len(".weight_v")] + ".parametrizations.weight.original1"
        out[k] = v
    return out


def load_state(path: Path, mmap: bool = False) -> Any:
    """A checkpoint's state dict (memory-mapped for cheap checks); unreadable files are ModelErrors."""
    if not path.is_file():
        raise ModelError(f"{path}: checkpoint is missing")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # pickle/zip errors come in many types
        raise ModelError(f"{path}: not a readable PyTorch checkpoint ({exc.__class__.__name__})") from None
    return sd


def match_state(path: Path, stage: str, own: dict[str, torch.Tensor], sd: Any, finite: bool = True) -> None:
    """A one-line :class:`ModelError` naming ``path`` and a key unless ``sd`` has exactly ``own``'s keys and
    shapes, floating tensors where ``own`` has them, and (with ``finite``) no NaN or Inf."""
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelError(f"{path}: expected a state dict of tensors")
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise ModelError(f"{path}: keys do not match the {stage} network: {'; '.join(parts)}")
    bad = [k for k in own if own[k].shape != sd[k].shape]
    if bad:
        k = bad[0]
        raise ModelError(f"{path}: shape mismatch for {len(bad)} tensors, e.g. {k}: checkpoint "
                         f"{tuple(sd[k].shape)} vs network {tuple(own[k].shape)}")
    # Integer-truncated weights load without complaint and a NaN weight gives NaN everywhere, which
    # later comparisons read as "no error": both are refused here, at the pre-flight.
    kind = [k for k in own if own[k].is_floating_point() != sd[k].is_floating_point()]
    if kind:
        k = kind[0]
        raise ModelError(f"{path}: {k} is {str(sd[k].dtype).removeprefix('torch.')}; the {stage} network's is "
                         f"{str(own[k].dtype).removeprefix('torch.')}")
    if finite:
        check_finite(path, sd)


def check_finite(path: Path, sd: dict[str, torch.Tensor]) -> None:
    """A one-line :class:`ModelError` naming the first tensor of ``sd`` that holds NaN or Inf."""
    for k, v in sd.items():
        if v.is_floating_point() and not v.is_meta and not bool(torch.isfinite(v).all()):
            raise ModelError(f"{path}: {k} holds NaN or Inf weights")


Normalize = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def check_strict(path: Path, stage: str, build: Callable[[], nn.Module], normalize: Normalize | None = None) -> None:
    """Pre-flight check of one checkpoint: readable, and keys and shapes those of ``build()``'s network.

    The network is built on the meta device and the checkpoint memory-mapped, so this costs seconds
    even for a 0.5B LLM; a bad file is reported before any build step runs.
    """
    with torch.device("meta"):
        net = build()
    sd = load_state(path, mmap=True)
    match_state(path, stage, net.state_dict(), normalize(sd) if normalize is not None and isinstance(sd, dict) else sd)


def load_strict(path: Path, stage: str, net: nn.Module, normalize: Normalize | None = None) -> nn.Module:
    """``net`` with the state dict of ``path`` loaded strictly (``weights_only``), float32, eval mode.

    The file is memory-mapped (private: writes stay in memory) and its tensors become the network's
    (``assign``), so the weights ``net`` was built with are dropped, not overwritten: one copy of the
    weights is resident, not two (a 0.5B LLM is 2 GB). NaN and Inf are looked for after the swap,
    when reading the file's pages no longer adds to a second copy.
    """
    sd = load_state(path, mmap=True)
    if normalize is not None and isinstance(sd, dict):
        sd = normalize(sd)
    match_state(path, stage, net.state_dict(), sd, finite=False)
    net.load_state_dict(sd, strict=True, assign=True)
    check_finite(path, sd)
    return net.float().eval()


@contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """A staging dir beside ``out_dir`` that becomes ``out_dir`` (renamed, atomically) when the block
    ends without error; an existing ``out_dir`` must be empty. Readers never see a half-written model."""
    out_dir = Path(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if out_dir.exists():
            if any(out_dir.iterdir()):
                raise ModelError(f"{out_dir}: exists and is not empty")
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class LoadedModels:
    """The networks of the requested stages (None for the others), eval mode, float32."""

    config: Any
    family: str  # the registry name of the family that loaded them (its runtimes run them)
    llm: Any = None
    flow: Any = None
    hift: Any = None
    model_dir: Path | None = None


@dataclass(frozen=True)
class FamilyLoader:
    """How one family's networks are built and loaded; its ``loader`` module exposes the three methods
    as the family's ``load_models``, ``check_checkpoint`` and ``meta_network`` hooks."""

    family: str  # registry name
    read_config: Callable[[Path], Any]  # model dir -> config, read safely
    builders: Mapping[str, Callable[[Any], nn.Module]]  # stage -> network of a config (random weights)
    builtin_config: Callable[[str], Any]  # built-in name -> its config
    init_model: Callable[[str, Path], Path]  # writes ``builtin:<name>`` as a model dir
    # stage -> key spellings of older checkpoints mapped to the network's. Every family's hift.pt is
    # upstream's HiFT checkpoint: upstream strips ``generator.`` from its keys before loading it (a GAN
    # checkpoint's prefix), and older ones spell weight norm ``weight_g``/``weight_v``.
    normalize: Mapping[str, Normalize] = field(default_factory=lambda: {"hift": normalize_hift_keys})

    def check_checkpoint(self, model_dir: Path, stage: str) -> None:
        """Cheap pre-flight check of ``<stage>.pt``: readable, keys and shapes those of the network (built
        on the meta device, the file memory-mapped), so a bad file is reported before any build step."""
        model_dir = Path(model_dir)
        cfg = self.read_config(model_dir)
        check_strict(model_dir / f"{stage}.pt", stage, lambda: self.builders[stage](cfg), self.normalize.get(stage))

    def load_models(self, model_dir: Path | str, stages: Iterable[str] = ("llm", "flow", "hift")) -> LoadedModels:
        """The networks of ``stages`` from a model dir, float32, eval mode, strictly loaded (a missing,
        extra or mis-shaped key is a one-line :class:`ModelError` naming the file and the key).

        ``builtin:<name>`` is first written to a temporary dir by ``init_model`` and loaded from there,
        exactly like a real checkpoint (its ``model_dir`` is then None: the dir is gone).
        """
        if isinstance(model_dir, str) and model_dir.startswith("builtin:"):
            with tempfile.TemporaryDirectory(prefix="cosycompile-builtin-") as tmp:
                out = self.load_models(self.init_model(model_dir, Path(tmp) / "model"), stages)
            out.model_dir = None
            return out
        model_dir = Path(model_dir)
        stages = tuple(stages)
        unknown = [s for s in stages if s not in self.builders]
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; expected some of {sorted(self.builders)}")
        cfg = self.read_config(model_dir)
        out = LoadedModels(cfg, self.family, model_dir=model_dir)
        for stage in stages:
            net = self.builders[stage](cfg)
            setattr(out, stage, load_strict(model_dir / f"{stage}.pt", stage, net, self.normalize.get(stage)))
        return out

    def meta_network(self, source: str | Path, stage: str) -> nn.Module:
        """The ``stage`` network of a model dir (its config read safely) or of a built-in name, on the meta
        device: its module names and shapes, no weights and no work (recipe checks at plan time)."""
        cfg = self.builtin_config(source) if isinstance(source, str) else self.read_config(source)
        with torch.device("meta"):
            return self.builders[stage](cfg)


def builtin_name(spec: str, known: Iterable[str]) -> str:
    """The name in ``builtin:<name>`` (or a bare name) when a family writes it; else a one-line
    :class:`ModelError` listing the ``known`` ones."""
    name = spec.split(":", 1)[1] if spec.startswith("builtin:") else spec
    known = tuple(known)
    if name not in known:
        raise ModelError(f"unknown built-in model '{spec}' (known: {', '.join('builtin:' + k for k in known)})")
    return name


def init_weights(net: nn.Module, std: float = 0.02) -> None:
    """Small, well-scaled random weights: finite, non-degenerate outputs from every stage."""
    for name, p in net.named_parameters():
        if "original0" in name:  # weight-norm gains keep the norm of the layer's default init
            continue
        if name.endswith("alpha"):
            nn.init.ones_(p)
        elif p.ndim == 1:
            nn.init.zeros_(p)
        else:
            nn.init.normal_(p, 0.0, std)
    for m in net.modules():  # normalisation layers: identity scale, whatever their attribute name
        if isinstance(m, nn.LayerNorm) and m.weight is not None:  # (DiT's norms have no affine)
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


STAGE_ORDER = ("llm", "flow", "hift")


def write_seeded_checkpoints(out: Path, build: Callable[[str], nn.Module], seed: int,
                             prepare: Callable[[str, nn.Module], None]) -> None:
    """Write ``<stage>.pt`` for each stage: its network built and ``prepare``d under its own seed
    (``seed * 1000 + i``, the caller's RNG untouched), saved, then freed before the next one."""
    for i, stage in enumerate(STAGE_ORDER):
        with torch.random.fork_rng():  # seeded weights without touching the caller's RNG
            torch.manual_seed(seed * 1000 + i)
            net = build(stage)
            prepare(stage, net)
        torch.save(net.state_dict(), out / f"{stage}.pt")
        del net


@contextmanager
def builtin_dir(out_dir: Path, config_file: str, yaml_text: str, build: Callable[[str], nn.Module], seed: int,
                prepare: Callable[[str, nn.Module], None]) -> Iterator[Path]:
    """A built-in model dir staged by :func:`staged_dir`, holding its yaml and its seeded checkpoints
    (:func:`write_seeded_checkpoints`); the block adds the family's other files before it ends."""
    with staged_dir(Path(out_dir)) as tmp:
        (tmp / config_file).write_text(yaml_text)
        write_seeded_checkpoints(tmp, build, seed, prepare)
        yield tmp


def prepare_builtin(stage: str, net: nn.Module) -> None:
    """What every family's built-in does to its fresh flow and HiFT (a family's own ``prepare`` adds its
    LM's and anything more): the flow gets :func:`init_weights`; the HiFT keeps PyTorch's default init,
    as a fresh upstream HiFT has (its normal(0, 0.01) init never reaches the weight-normed convs), with
    its F0 predictor centred on a speaking pitch so that the NSF source is not silent."""
    if stage == "flow":
        init_weights(net)
    if stage == "hift":
        voice_f0_predictor(net)


def write_qwen_config(qdir: Path, config: dict[str, Any]) -> None:
    """The Qwen2 body's ``config.json`` (and a greedy ``generation_config.json``) in a new ``qdir``."""
    qdir.mkdir()
    (qdir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    (qdir / "generation_config.json").write_text(json.dumps({"do_sample": False}, indent=2))


def write_builtin_marker(out: Path, name: str, seed: int) -> None:
    """``builtin.json``: tells the front end to use the stand-in tokenizer of a built-in model."""
    (out / "builtin.json").write_text(json.dumps({"builtin": name, "seed": seed}, indent=2))


@torch.no_grad()
def voice_f0_predictor(hift: nn.Module, mean_hz: float = 150.0, spread_hz: float = 25.0) -> None:
    """Centre the random F0 predictor on a speaking pitch.

    With small random weights it predicts ~0 Hz, below the 10 Hz voicing threshold, so the NSF
    sine source (the part of HiFT most sensitive to numerics) would be silent in every test.
    The classifier is rescaled on a probe mel so F0 ~ mean_hz +- spread_hz and follows the input.
    """
    probe = torch.randn(1, hift.cfg.in_channels, 200) * 1.5 - 5.0
    h = hift.f0_predictor.condnet(probe).transpose(1, 2)
    cls = hift.f0_predictor.classifier
    proj = h @ cls.weight[0]
    scale = spread_hz / max(float(proj.std()), 1e-6)
    cls.weight.mul_(scale)
    cls.bias.fill_(mean_hz - float(proj.mean()) * scale)


def write_frontend_standins(out: Path, seed: int, speech_tokenizer: str = "speech_tokenizer_v2.onnx",
                            speech_tokens: int = 6561) -> None:
    """Tiny ONNX models with the real campplus / speech tokenizer I/O signatures."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    # campplus: input [1, T, 80] -> RMS over time -> affine to 192. (The front end subtracts the
    # time mean from the fbank first, so a mean pooling would give the same vector for everyone.)
    w = numpy_helper.from_array(rng.standard_normal((80, 192)).astype(np.float32) * 0.1, "w")
    b = numpy_helper.from_array(rng.standard_normal(192).astype(np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("Mul", ["input", "input"], ["sq"]),
         helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[1], keepdims=0),
         helper.make_node("Sqrt", ["ms"], ["rms"]),
         helper.make_node("MatMul", ["rms", "w"], ["proj"]),
         helper.make_node("Add", ["proj", "b"], ["embedding"])],
        "campplus_standin",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 192])], [w, b])
    _save_standin(g, out / "campplus.onnx")
    # speech tokenizer: feats [1,128,T] -> 4-frame average pooling -> projection -> argmax ids (25 Hz).
    proj = numpy_helper.from_array(rng.standard_normal((128, speech_tokens)).astype(np.float32), "proj")
    g = helper.make_graph(
        [helper.make_node("Unsqueeze", ["feats", "ax"], ["f4"]),
         helper.make_node("AveragePool", ["f4"], ["p4"], kernel_shape=[1, 4], strides=[1, 4], ceil_mode=1),
         helper.make_node("Squeeze", ["p4", "ax"], ["p"]),
         helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["pt", "proj"], ["logits"]),
         helper.make_node("ArgMax", ["logits"], ["ids64"], axis=2, keepdims=0),
         helper.make_node("Cast", ["ids64"], ["tokens"], to=TensorProto.INT32),
         helper.make_node("Identity", ["feats_length"], ["unused_len"])],
        "speech_tokenizer_standin",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("tokens", TensorProto.INT32, [1, "N"]),
         helper.make_tensor_value_info("unused_len", TensorProto.INT32, [1])],
        [proj, numpy_helper.from_array(np.array([2], np.int64), "ax")])
    _save_standin(g, out / speech_tokenizer)


def _save_standin(graph: Any, path: Path) -> None:
    """Save a stand-in graph at opset 17 with the oldest IR version that holds it. ``make_model`` stamps
    the IR version of the onnx package that writes it, and a model dir written with a newer onnx than a
    server's ONNX Runtime then fails to load there (seen on a GPU image: IR 14 written, 13 readable)."""
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", 17)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    onnx.save(model, path)
