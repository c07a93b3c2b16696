"""Read a CosyVoice ``cosyvoice2.yaml`` without constructing anything it names.

The file is hyperpyyaml: under hyperpyyaml, ``!new:module.Class``, ``!name:``, ``!apply:``,
``!module:`` and ``!include:`` import modules and call arbitrary code while the file loads. Here
every tag becomes inert data (:class:`Tagged`); only ``!ref <key>`` references are resolved, to the
plain values they point at (with ``+ - * / //`` arithmetic on numbers, as in
``!ref <chunk_size> * <token_mel_ratio>``). Nothing is imported and nothing is called.

:func:`read_model_config` maps that data plus ``CosyVoice-BlankEN/config.json`` onto
:class:`~cosycompile.families.cosyvoice2.config.ModelConfig`. This module never imports torch.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from cosycompile.core import yaml_limits
from cosycompile.errors import ModelError
from . import CONFIG_FILE, QWEN_DIR
from .config import FlowConfig, HiFTConfig, LLMConfig, ModelConfig, SamplingConfig



@dataclass
class Tagged:
    """An inert ``!kind:target`` node and its arguments (a mapping, a list or a scalar)."""

    kind: str
    target: str
    value: Any = field(default=None)


@dataclass
class Ref:
    """An unresolved ``!ref`` expression, e.g. ``<chunk_size> * <token_mel_ratio>``."""

    expr: str


class _InertLoader(yaml.SafeLoader):
    """SafeLoader that turns every ``!`` tag into data instead of rejecting it."""


def _construct_tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    kind, _, target = suffix.partition(":")
    if isinstance(node, yaml.MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    if kind == "ref":
        return Ref(str(value))
    return Tagged(kind, target, value)


_InertLoader.add_multi_constructor("!", _construct_tagged)

_REF = re.compile(r"<([^<>]+)>")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_DEPTH = 32


def _arith(expr: str) -> int | float:
    """Value of an expression of number literals and + - * / // (parsed, never evaluated as code)."""

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and type(n.value) in (int, float):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.operand))
        raise ValueError(f"not plain arithmetic: {expr!r}")

    return ev(ast.parse(expr, mode="eval"))


def _lookup(root: dict[str, Any], name: str) -> Any:
    """``a``, ``a.b`` or ``a[b]`` inside the document (through tagged nodes' arguments)."""
    node: Any = root
    for part in (p for p in re.split(r"[.\[\]]", name) if p):
        if isinstance(node, Tagged):
            node = node.value
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(f"<{name}>")
    return node


def _resolve(node: Any, root: dict[str, Any], depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError("!ref chain too deep (a reference cycle?)")
    if isinstance(node, Ref):
        names = _REF.findall(node.expr)
        if len(names) == 1 and node.expr.strip() == f"<{names[0]}>":
            return _resolve(_lookup(root, names[0]), root, depth + 1)
        values = [_resolve(_lookup(root, n), root, depth + 1) for n in names]
        if values and all(type(v) in (int, float) for v in values):
            it = iter(values)
            return _arith(_REF.sub(lambda _: repr(next(it)), node.expr))
        # String interpolation, as in ``!ref <output_dir>/save``.
        it = iter(values)
        return _REF.sub(lambda _: str(next(it)), node.expr)
    if isinstance(node, Tagged):
        return Tagged(node.kind, node.target, _resolve(node.value, root, depth + 1))
    if isinstance(node, dict):
        return {k: _resolve(v, root, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root, depth + 1) for v in node]
    return node


def load_inert_yaml(text: str) -> Any:
    """Parse hyperpyyaml text into plain data with :class:`Tagged` / :class:`Ref` nodes (refs
    unresolved); a document over the size, nesting or alias-expansion bounds is a YAMLLimitError."""
    loader = _InertLoader(text)
    try:
        node = yaml_limits.compose(loader)
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def read_cosyvoice_yaml(path: Path) -> dict[str, Any]:
    """The yaml as plain data with :class:`Tagged` nodes and every ``!ref`` resolved.

    Raises :class:`ModelError` naming ``path`` when it is missing, unreadable, not YAML, not a
    mapping, or holds a reference that cannot be resolved.
    """
    path = Path(path)
    try:
        text = yaml_limits.read_text(path)
    except FileNotFoundError:
        raise ModelError(f"{path}: model config not found") from None
    except (OSError, UnicodeDecodeError, yaml_limits.YAMLLimitError) as exc:
        raise ModelError(f"{path}: cannot read model config ({exc.__class__.__name__}: {exc})") from None
    try:
        data = load_inert_yaml(text)
    except yaml_limits.YAMLLimitError as exc:
        raise ModelError(f"{path}: not a model config: {exc}") from None
    except yaml.YAMLError as exc:
        raise ModelError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a mapping at the top level")
    try:
        return _resolve(data, data)
    except (KeyError, ValueError, TypeError, ZeroDivisionError, SyntaxError) as exc:
        raise ModelError(f"{path}: unresolvable !ref ({exc})") from None


def args(node: Any) -> dict[str, Any]:
    """Constructor arguments of a ``!new:`` node (or the mapping itself); ``{}`` for anything else."""
    if isinstance(node, Tagged):
        return node.value if isinstance(node.value, dict) else {}
    return node if isinstance(node, dict) else {}


class _Section:
    """Typed access to one mapping of the yaml, with errors that name the file and the key path."""

    def __init__(self, path: Path, where: str, node: Any, expect_class: str | None = None) -> None:
        self.path, self.where = path, where
        if expect_class is not None:
            target = node.target if isinstance(node, Tagged) else None
            if target is None or target.rsplit(".", 1)[-1] != expect_class:
                got = f"!{node.kind}:{node.target}" if isinstance(node, Tagged) else type(node).__name__
                self.fail(f"expected !new:...{expect_class} (CosyVoice2), got {got}")
        self.data = args(node)

    def fail(self, msg: str) -> None:
        raise ModelError(f"{self.path}: {self.where + ': ' if self.where else ''}{msg}")

    def sub(self, key: str, expect_class: str | None = None) -> "_Section":
        if key not in self.data:
            self.fail(f"missing key '{key}'")
        return _Section(self.path, f"{self.where}.{key}" if self.where else key, self.data[key], expect_class)

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        if key not in self.data:
            if default is None:
                self.fail(f"missing key '{key}'")
            return default
        value = self.data[key]
        ok = (type(value) is int if kind is int else
              type(value) in (int, float) if kind is float else isinstance(value, kind))
        if kind is float and isinstance(value, str):  # PyYAML reads '1e-06' without a dot as a string
            try:
                value, ok = float(value), True
            except ValueError:
                pass
        if not ok:
            self.fail(f"'{key}' must be {kind.__name__}, got {value!r}")
        return kind(value) if kind in (int, float) else value

    def ints(self, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        value = self.get(key, list, list(default) if default is not None else None)
        if not all(type(v) is int for v in value):
            self.fail(f"'{key}' must be a list of integers, got {value!r}")
        return tuple(value)

    def int_lists(self, key: str) -> tuple[tuple[int, ...], ...]:
        value = self.get(key, list)
        if not all(isinstance(v, list) and all(type(i) is int for i in v) for v in value):
            self.fail(f"'{key}' must be a list of integer lists, got {value!r}")
        return tuple(tuple(v) for v in value)

    def require(self, key: str, allowed: Any) -> None:
        """Reject architecture switches this implementation does not have (upstream defaults allowed)."""
        if key in self.data and self.data[key] != allowed:
            self.fail(f"'{key}: {self.data[key]!r}' is not supported (CosyVoice2 uses {allowed!r})")


def _flow_config(flow: _Section) -> FlowConfig:
    enc = flow.sub("encoder", "UpsampleConformerEncoder")
    for key, allowed in (("input_layer", "linear"), ("pos_enc_layer_type", "rel_pos_espnet"),
                         ("selfattention_layer_type", "rel_selfattn"), ("use_cnn_module", False),
                         ("macaron_style", False), ("normalize_before", True)):
        enc.require(key, allowed)
    cfm = flow.sub("decoder", "CausalConditionalCFM")
    params = cfm.sub("cfm_params") if "cfm_params" in cfm.data else None
    if params is not None and "content" in params.data:  # !new:omegaconf.DictConfig {content: {...}}
        params = params.sub("content")
    est = cfm.sub("estimator", "CausalConditionalDecoder")
    est.require("act_fn", "gelu")
    out_size = flow.get("output_size", int)
    if est.get("out_channels", int) != out_size:
        est.fail(f"out_channels must equal flow.output_size ({out_size})")
    return FlowConfig(
        input_size=flow.get("input_size", int), output_size=out_size,
        spk_embed_dim=flow.get("spk_embed_dim", int), vocab_size=flow.get("vocab_size", int),
        pre_lookahead_len=flow.get("pre_lookahead_len", int, 3),
        encoder_size=enc.get("output_size", int), attention_heads=enc.get("attention_heads", int),
        linear_units=enc.get("linear_units", int), num_blocks=enc.get("num_blocks", int),
        num_up_blocks=enc.get("num_up_blocks", int, 4),
        encoder_chunk_size=enc.get("static_chunk_size", int, 25),
        inference_cfg_rate=params.get("inference_cfg_rate", float, 0.7) if params else 0.7,
        estimator_in_channels=est.get("in_channels", int), channels=est.ints("channels"),
        attention_head_dim=est.get("attention_head_dim", int), n_blocks=est.get("n_blocks", int),
        num_mid_blocks=est.get("num_mid_blocks", int), num_heads=est.get("num_heads", int),
        static_chunk_size=est.get("static_chunk_size", int, 50),
    )


def _hift_config(hift: _Section) -> HiFTConfig:
    istft = hift.sub("istft_params")
    f0 = hift.sub("f0_predictor", "ConvRNNF0Predictor")
    if f0.get("in_channels", int, 80) != hift.get("in_channels", int):
        f0.fail("in_channels must equal hift.in_channels")
    if f0.get("num_class", int, 1) != 1:
        f0.fail("num_class must be 1")
    return HiFTConfig(
        in_channels=hift.get("in_channels", int), base_channels=hift.get("base_channels", int),
        nb_harmonics=hift.get("nb_harmonics", int), sampling_rate=hift.get("sampling_rate", int),
        nsf_alpha=hift.get("nsf_alpha", float), nsf_sigma=hift.get("nsf_sigma", float),
        nsf_voiced_threshold=hift.get("nsf_voiced_threshold", float),
        upsample_rates=hift.ints("upsample_rates"), upsample_kernel_sizes=hift.ints("upsample_kernel_sizes"),
        istft_n_fft=istft.get("n_fft", int), istft_hop_len=istft.get("hop_len", int),
        resblock_kernel_sizes=hift.ints("resblock_kernel_sizes"),
        resblock_dilation_sizes=hift.int_lists("resblock_dilation_sizes"),
        source_resblock_kernel_sizes=hift.ints("source_resblock_kernel_sizes"),
        source_resblock_dilation_sizes=hift.int_lists("source_resblock_dilation_sizes"),
        lrelu_slope=hift.get("lrelu_slope", float, 0.1), audio_limit=hift.get("audio_limit", float, 0.99),
        f0_cond_channels=f0.get("cond_channels", int),
    )


def _llm_config(path: Path) -> LLMConfig:
    try:
        q = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: Qwen2 config of the LLM not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not a readable JSON config ({exc.__class__.__name__})") from None
    sec = _Section(path, "", q if isinstance(q, dict) else None)
    if not isinstance(q, dict):
        sec.fail("expected a JSON object")
    if q.get("model_type", "qwen2") != "qwen2":
        sec.fail(f"model_type {q.get('model_type')!r} is not qwen2")
    rope = q.get("rope_theta", (q.get("rope_parameters") or {}).get("rope_theta", 1e6))
    return LLMConfig(
        hidden_size=sec.get("hidden_size", int), num_layers=sec.get("num_hidden_layers", int),
        num_heads=sec.get("num_attention_heads", int), num_kv_heads=sec.get("num_key_value_heads", int),
        intermediate_size=sec.get("intermediate_size", int), vocab_size=sec.get("vocab_size", int),
        rope_theta=float(rope), rms_norm_eps=sec.get("rms_norm_eps", float, 1e-6),
        max_position_embeddings=sec.get("max_position_embeddings", int, 32768),
        tie_word_embeddings=sec.get("tie_word_embeddings", bool, True),
    )


def read_model_config(model_dir: Path) -> ModelConfig:
    """ModelConfig from ``cosyvoice2.yaml`` and ``CosyVoice-BlankEN/config.json``; nothing is constructed.

    Raises :class:`ModelError` naming the file (and the yaml key) for a missing model dir, a
    missing or unreadable file, a missing entry, a value of the wrong type, or an architecture
    that is not CosyVoice2's (e.g. CosyVoice3's DiT flow).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"{model_dir}: model dir not found")
    path = model_dir / CONFIG_FILE
    top = _Section(path, "", read_cosyvoice_yaml(path))
    llm = top.sub("llm", "Qwen2LM")
    flow = top.sub("flow", "CausalMaskedDiffWithXvec")
    hift = top.sub("hift", "HiFTGenerator")
    llm_cfg = _llm_config(model_dir / QWEN_DIR / "config.json")
    if "sampling" in llm.data:
        smp = llm.sub("sampling", "ras_sampling")
        llm_cfg = replace(llm_cfg, sampling=SamplingConfig(
            top_p=smp.get("top_p", float, 0.8), top_k=smp.get("top_k", int, 25),
            win_size=smp.get("win_size", int, 10), tau_r=smp.get("tau_r", float, 0.1)))
    for key in ("llm_input_size", "llm_output_size"):
        if key in llm.data and llm.get(key, int) != llm_cfg.hidden_size:
            llm.fail(f"{key} ({llm.data[key]}) differs from the Qwen2 hidden_size ({llm_cfg.hidden_size})")
    return ModelConfig(
        llm=llm_cfg, flow=_flow_config(flow), hift=_hift_config(hift),
        sample_rate=top.get("sample_rate", int, 24000), token_frame_rate=top.get("token_frame_rate", int, 25),
        token_mel_ratio=top.get("token_mel_ratio", int, 2), speech_token_size=llm.get("speech_token_size", int),
        chunk_size=top.get("chunk_size", int, 25),
    )
