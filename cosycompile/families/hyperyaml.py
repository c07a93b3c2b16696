"""Read CosyVoice's hyperpyyaml configs (``cosyvoice2.yaml``, ``cosyvoice3.yaml``) without constructing
anything they name: the machinery every family's config reader shares.

Under hyperpyyaml, ``!new:module.Class``, ``!name:``, ``!apply:``, ``!module:`` and ``!include:``
import modules and call arbitrary code while the file loads. Here every tag becomes inert data
(:class:`Tagged`); only ``!ref <key>`` references are resolved, to the plain values they point at
(with ``+ - * / //`` arithmetic on numbers, as in ``!ref <chunk_size> * <token_mel_ratio>``).
Nothing is imported and nothing is called. :class:`Section` gives typed access to one mapping with
one-line errors naming the file and the key path. This module never imports torch.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosycompile.core import yaml_limits
from cosycompile.errors import ModelError


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


# Upper bounds on the structural sizes of any CosyVoice generation's networks, generous (CosyVoice2's
# Qwen2 body has 24 layers, 14 heads, 151,936 rows; the CosyVoice3 DiT 22 blocks of 16 heads).
_COUNT, _WIDTH = 512, 1 << 18
SIZE_LIMITS = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "num_blocks", "n_blocks", "num_mid_blocks", "num_up_blocks",
                     "depth"), _COUNT),
    **dict.fromkeys(("num_attention_heads", "num_key_value_heads", "attention_heads", "num_heads", "heads"), _COUNT),
    **dict.fromkeys(("hidden_size", "intermediate_size", "vocab_size", "linear_units", "output_size", "input_size",
                     "dim", "dim_head", "attention_head_dim", "mel_dim", "spk_dim", "spk_embed_dim", "in_channels",
                     "out_channels", "speech_token_size"), _WIDTH),
}


def args(node: Any) -> dict[str, Any]:
    """Constructor arguments of a ``!new:`` node (or the mapping itself); ``{}`` for anything else."""
    if isinstance(node, Tagged):
        return node.value if isinstance(node.value, dict) else {}
    return node if isinstance(node, dict) else {}


class Section:
    """Typed access to one mapping of the yaml, with errors that name the file and the key path.

    ``family`` is the generation whose classes the reader expects (``CosyVoice2``), named in the
    errors for a class or a switch of another generation.
    """

    def __init__(self, path: Path, where: str, node: Any, expect_class: str | None = None,
                 family: str = "CosyVoice2") -> None:
        self.path, self.where, self.family = path, where, family
        if expect_class is not None:
            target = node.target if isinstance(node, Tagged) else None
            if target is None or target.rsplit(".", 1)[-1] != expect_class:
                got = f"!{node.kind}:{node.target}" if isinstance(node, Tagged) else type(node).__name__
                self.fail(f"expected !new:...{expect_class} ({family}), got {got}")
        self.data = args(node)

    def fail(self, msg: str) -> None:
        """Raise the one-line :class:`ModelError` naming the file and this section's key path."""
        raise ModelError(f"{self.path}: {self.where + ': ' if self.where else ''}{msg}")

    def sub(self, key: str, expect_class: str | None = None) -> "Section":
        """The section under ``key`` (a missing key, or a node of another class, is an error)."""
        if key not in self.data:
            self.fail(f"missing key '{key}'")
        return Section(self.path, f"{self.where}.{key}" if self.where else key, self.data[key], expect_class,
                       self.family)

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        """The value under ``key`` as ``kind`` (``default`` when absent; no default: it must be there)."""
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
        if kind is int and key in SIZE_LIMITS and not 1 <= value <= SIZE_LIMITS[key]:
            # Checked before any network is built, even on the meta device: a count of 200,000 layers
            # would take minutes and gigabytes to refuse later, and 0 heads divides by zero.
            self.fail(f"'{key}: {value}' is outside 1..{SIZE_LIMITS[key]:,}")
        return kind(value) if kind in (int, float) else value

    def ints(self, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """A list of integers."""
        value = self.get(key, list, list(default) if default is not None else None)
        if not all(type(v) is int for v in value):
            self.fail(f"'{key}' must be a list of integers, got {value!r}")
        return tuple(value)

    def int_lists(self, key: str) -> tuple[tuple[int, ...], ...]:
        """A list of integer lists."""
        value = self.get(key, list)
        if not all(isinstance(v, list) and all(type(i) is int for i in v) for v in value):
            self.fail(f"'{key}' must be a list of integer lists, got {value!r}")
        return tuple(tuple(v) for v in value)

    def require(self, key: str, allowed: Any) -> None:
        """Reject architecture switches this implementation does not have (upstream defaults allowed)."""
        if key in self.data and self.data[key] != allowed:
            self.fail(f"'{key}: {self.data[key]!r}' is not supported ({self.family} uses {allowed!r})")


# -- sections every CosyVoice generation shares ---------------------------------------------------

def cfm_sections(flow: Section, cfm_class: str) -> tuple[Section, Section | None]:
    """``flow.decoder`` (a ``cfm_class``) and its ``cfm_params`` (unwrapped from omegaconf's
    ``DictConfig {content: ...}``; None when absent), whose solver must be Euler on the cosine schedule:
    the runtimes' solver is that, as upstream's inference runs it."""
    cfm = flow.sub("decoder", cfm_class)
    params = cfm.sub("cfm_params") if "cfm_params" in cfm.data else None
    if params is not None and "content" in params.data:
        params = params.sub("content")
    if params is not None:
        params.require("solver", "euler")
        params.require("t_scheduler", "cosine")
    return cfm, params


def sampling_fields(llm: Section) -> dict[str, Any] | None:
    """The ``llm.sampling`` (``!name:...ras_sampling``) settings, or None when the yaml has none."""
    if "sampling" not in llm.data:
        return None
    smp = llm.sub("sampling", "ras_sampling")
    return dict(top_p=smp.get("top_p", float, 0.8), top_k=smp.get("top_k", int, 25),
                win_size=smp.get("win_size", int, 10), tau_r=smp.get("tau_r", float, 0.1))


def check_llm_sizes(llm: Section, hidden_size: int) -> None:
    """``llm_input_size`` / ``llm_output_size``, where given, must be the Qwen2 body's width."""
    for key in ("llm_input_size", "llm_output_size"):
        if key in llm.data and llm.get(key, int) != hidden_size:
            llm.fail(f"{key} ({llm.data[key]}) differs from the Qwen2 hidden_size ({hidden_size})")


def hift_fields(hift: Section, f0_class: str) -> tuple[dict[str, Any], Section]:
    """The HiFT generator's settings both generations' vocoders share, and its F0 predictor's
    section (of class ``f0_class``), whose input width and class count are checked here."""
    istft = hift.sub("istft_params")
    f0 = hift.sub("f0_predictor", f0_class)
    if f0.get("in_channels", int, 80) != hift.get("in_channels", int):
        f0.fail("in_channels must equal hift.in_channels")
    if f0.get("num_class", int, 1) != 1:
        f0.fail("num_class must be 1")
    fields = dict(
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
    return fields, f0


def qwen2_fields(path: Path, family: str = "CosyVoice2") -> dict[str, Any]:
    """The Qwen2 body's settings from ``CosyVoice-BlankEN/config.json`` (names as the LM configs use).

    A missing or unreadable file, or a missing or mistyped entry, is a one-line :class:`ModelError`
    naming the file (and the entry).
    """
    try:
        q = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: Qwen2 config of the LLM not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not a readable JSON config ({exc.__class__.__name__})") from None
    sec = Section(path, "", q if isinstance(q, dict) else None, family=family)
    if not isinstance(q, dict):
        sec.fail("expected a JSON object")
    if q.get("model_type", "qwen2") != "qwen2":
        sec.fail(f"model_type {q.get('model_type')!r} is not qwen2")
    rope = q.get("rope_theta", (q.get("rope_parameters") or {}).get("rope_theta", 1e6))
    return dict(
        hidden_size=sec.get("hidden_size", int), num_layers=sec.get("num_hidden_layers", int),
        num_heads=sec.get("num_attention_heads", int), num_kv_heads=sec.get("num_key_value_heads", int),
        intermediate_size=sec.get("intermediate_size", int), vocab_size=sec.get("vocab_size", int),
        rope_theta=float(rope), rms_norm_eps=sec.get("rms_norm_eps", float, 1e-6),
        max_position_embeddings=sec.get("max_position_embeddings", int, 32768),
        tie_word_embeddings=sec.get("tie_word_embeddings", bool, True),
    )


# -- writing: the sections every generation's yaml spells alike ------------------------------------
# Built-in models are written in upstream's own style, so they go through the same reader as a real
# model dir. Each function returns whole lines (ending in a newline); a family composes them with its
# own sections (CosyVoice2's conformer and UNet, CosyVoice3's pre-look-ahead layer and DiT).

def header_yaml(family: str, sample_rate: int, hidden_size: int, spk_embed_dim: int, token_frame_rate: int,
                token_mel_ratio: int, chunk_size: int, num_decoding_left_chunks: int = -1) -> str:
    """The top-level constants the model sections refer to with ``!ref``."""
    return f"""# {family} model config written by cosycompile (hyperpyyaml style, as upstream).
sample_rate: {sample_rate}
llm_input_size: {hidden_size}
llm_output_size: {hidden_size}
spk_embed_dim: {spk_embed_dim}
qwen_pretrain_path: ''
token_frame_rate: {token_frame_rate}
token_mel_ratio: {token_mel_ratio}
chunk_size: {chunk_size}
num_decoding_left_chunks: {num_decoding_left_chunks}
"""


def llm_yaml(lm_class: str, speech_token_size: int, top_p: float = 0.8, top_k: int = 25, win_size: int = 10,
             tau_r: float = 0.1) -> str:
    """The ``llm`` section: ``lm_class`` over a Qwen2Encoder, with its ras_sampling settings."""
    return f"""llm: !new:cosyvoice.llm.llm.{lm_class}
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {speech_token_size}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: {top_p}
        top_k: {top_k}
        win_size: {win_size}
        tau_r: {tau_r}
"""


def flow_head_yaml(flow_class: str, input_size: int, output_size: int, vocab_size: int, pre_lookahead_len: int) -> str:
    """The first lines of the ``flow`` section (the family's encoder or look-ahead layer follows)."""
    return f"""flow: !new:cosyvoice.flow.flow.{flow_class}
    input_size: {input_size}
    output_size: {output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {vocab_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: {pre_lookahead_len}
"""


def cfm_head_yaml(spk_emb_dim: int, inference_cfg_rate: float, cfm_class: str = "CausalConditionalCFM") -> str:
    """``flow.decoder``: the CFM and its Euler / cosine settings (its estimator follows)."""
    return f"""    decoder: !new:cosyvoice.flow.flow_matching.{cfm_class}
        in_channels: 240
        n_spks: 1
        spk_emb_dim: {spk_emb_dim}
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: {inference_cfg_rate}
                reg_loss_type: 'l1'
"""


def hift_yaml(h: Any, generator: str, f0_class: str, extra: str = "") -> str:
    """The ``hift`` section of a HiFT config ``h`` (the fields :func:`hift_fields` reads); ``extra`` lines
    (indented by four) go before the F0 predictor."""
    return f"""hift: !new:cosyvoice.hifigan.generator.{generator}
    in_channels: {h.in_channels}
    base_channels: {h.base_channels}
    nb_harmonics: {h.nb_harmonics}
    sampling_rate: !ref <sample_rate>
    nsf_alpha: {h.nsf_alpha}
    nsf_sigma: {h.nsf_sigma}
    nsf_voiced_threshold: {h.nsf_voiced_threshold:g}
    upsample_rates: {list(h.upsample_rates)}
    upsample_kernel_sizes: {list(h.upsample_kernel_sizes)}
    istft_params:
        n_fft: {h.istft_n_fft}
        hop_len: {h.istft_hop_len}
    resblock_kernel_sizes: {list(h.resblock_kernel_sizes)}
    resblock_dilation_sizes: {[list(d) for d in h.resblock_dilation_sizes]}
    source_resblock_kernel_sizes: {list(h.source_resblock_kernel_sizes)}
    source_resblock_dilation_sizes: {[list(d) for d in h.source_resblock_dilation_sizes]}
    lrelu_slope: {h.lrelu_slope}
    audio_limit: {h.audio_limit}
{extra}    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.{f0_class}
        num_class: 1
        in_channels: {h.in_channels}
        cond_channels: {h.f0_cond_channels}
"""
