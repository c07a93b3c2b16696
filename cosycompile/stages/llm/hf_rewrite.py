"""The speech-token LM as one plain Qwen2 checkpoint with the speech tokens in its vocabulary.

TensorRT-LLM cannot feed input embeddings to a custom LLM (its issue #15885), so servers (its
PyTorch backend, vLLM, SGLang) get a CosyVoice LM as an ordinary causal LM over token ids, laid
out as CosyVoice's ``examples/grpo/cosyvoice2/pretrained_to_huggingface.py`` (CosyVoice2) and
``runtime/triton_trtllm/scripts/convert_cosyvoice3_to_hf.py`` (CosyVoice3) do:

- ids ``0..T-1`` are the text tokens (``T`` = the text tokenizer's length with the family's special
  tokens, 151,663 for CosyVoice2-0.5B; a built-in model's stand-in tokenizer spans the config's
  ``vocab_size``); the family's speech vocabulary follows, row ``r`` at id ``T + r``: the speech
  tokens, the rows its head scores (stop tokens included) and the rows the prefix needs. The family
  says what they are (``FamilyInfo.llm_vocab``): CosyVoice2 has S+3 head rows (three stop ids), then
  sos and task_id from its ``llm_embedding``; CosyVoice3 has S+200 rows, sos = S, task_id = S+2,
  and every id from S on stops. The vocabulary is padded to a multiple of 128;
- ``embed_tokens``: text rows kept, the speech vocabulary's rows from the family's tables, so the
  prompt ``[sos | text | task_id | prompt speech]`` is a list of ids;
- an untied ``lm_head`` with a bias: the head rows are the speech head's (``llm_decoder``; bias 0
  where it has none), every other row has weight 0 and bias ``-inf`` (finite-free: safetensors and
  bf16 both store ``-inf``).

No stock Qwen2 implementation applies an lm_head bias (see :mod:`.hf_modeling`): the dir ships
``modeling_cosyvoice_lm.py`` (the same file for every family) for transformers
(``trust_remote_code=True``) and records in ``cosycompile_llm.json`` that a stock loader drops the bias.
This module imports no family: what is a family's own comes through its registry entry.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.stages.llm import sglang_model, trtllm_model, vllm_model
from cosycompile.errors import ModelError

CHECKPOINT_DIR = "hf"  # where export and quantize steps put the rewrite inside their output
MODELING_FILE = "modeling_cosyvoice_lm.py"
VLLM_PLUGIN_DIR = "vllm_plugin"
SGLANG_PLUGIN_DIR = "sglang_plugin"
TRTLLM_PLUGIN_DIR = "trtllm_plugin"
MODEL_CLASS = "CosyVoiceLMForCausalLM"
TOKEN_MAP_FILE = "cosycompile_llm.json"
# Beside a quantized checkpoint (not in it): a prompt and the quantized reference's greedy tokens from it.
REFERENCE_DECODE_FILE = "reference_decode.json"
# In a folder of its own: servers load every *.safetensors at the top of a checkpoint dir as weights
# (vLLM refused the dir: "no module or parameter named 'sos'").
PREFIX_FILE = "prefix/prefix_embeddings.safetensors"
PAD_MULTIPLE = 128
DTYPES = ("float32", "bfloat16")
CHAT_TEMPLATE = ("{%- for message in messages %}{%- if message['role'] == 'user' %}"
                 "{{- '<|sos|>' + message['content'] + '<|task_id|>' }}{%- elif message['role'] == 'assistant' %}"
                 "{{- message['content'] }}{%- endif %}{%- endfor %}")


@dataclass(frozen=True)
class TokenMap:
    """Where a family's tokens sit in the merged vocabulary (offsets count from the first speech id)."""

    text_vocab: int  # T: ids below it are text tokens; speech-vocabulary row r is T + r
    speech_token_size: int  # S: speech tokens 0..S-1, then the family's stop and prefix rows
    vocab_size: int  # padded to a multiple of 128
    min_token_text_ratio: float
    max_token_text_ratio: float
    family: str  # the model family whose speech vocabulary this is
    rows: int  # speech-vocabulary rows in the merged vocabulary (CosyVoice2: S+5, CosyVoice3: S+200)
    head_rows: int  # the first rows, the speech head's (CosyVoice2: S+3, CosyVoice3: S+200)
    stop: tuple[int, ...]  # offsets that end decoding
    eos: int  # the offset masked before the minimum length
    sos: int
    task_id: int
    names: tuple[tuple[int, str], ...]  # tokenizer names of the rows from S on that are not <|s_N|>

    @property
    def stop_ids(self) -> list[int]:
        """The ids that end decoding (CosyVoice2: eos1..eos3; CosyVoice3: all 200 past the speech tokens)."""
        return [self.text_vocab + o for o in self.stop]

    @property
    def eos_id(self) -> int:
        """The stop id masked until the minimum length (upstream's ``ignore_eos`` row)."""
        return self.text_vocab + self.eos

    @property
    def sos_id(self) -> int:
        return self.text_vocab + self.sos

    @property
    def task_id_id(self) -> int:
        return self.text_vocab + self.task_id

    def speech_id(self, token: int) -> int:
        """The merged-vocabulary id of speech-vocabulary row ``token`` (0..rows-1)."""
        return self.text_vocab + token

    def token_names(self) -> list[str]:
        """The tokenizer's name of every speech-vocabulary row, in order."""
        named = dict(self.names)
        return [named.get(i, f"<|s_{i}|>") for i in range(self.rows)]

    def prompt_ids(self, text: list[int], prompt_speech: list[int] | None = None) -> list[int]:
        """``[sos | text | task_id | prompt speech]`` as ids (text = prompt text followed by the text)."""
        return [self.sos_id, *text, self.task_id_id, *(self.speech_id(t) for t in prompt_speech or [])]

    def as_json(self) -> dict[str, Any]:
        """The token mapping a server needs, as written to ``cosycompile_llm.json``."""
        return {"text_vocab": self.text_vocab, "speech_token_size": self.speech_token_size,
                "vocab_size": self.vocab_size, "min_token_text_ratio": self.min_token_text_ratio,
                "max_token_text_ratio": self.max_token_text_ratio, "family": self.family,
                "speech_offset": self.text_vocab, "stop_ids": self.stop_ids, "eos_id": self.eos_id,
                "sos_id": self.sos_id, "task_id_id": self.task_id_id,
                "speech_ids": [self.text_vocab, self.text_vocab + self.head_rows]}


def padded_vocab(n: int, multiple: int = PAD_MULTIPLE) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (as ``resize_token_embeddings(pad_to_multiple_of=128)``)."""
    return -(-n // multiple) * multiple


def _family(family: str | None, model_dir: Path | None = None) -> Any:
    """The registry entry of ``family``; None: the family of ``model_dir`` (by its config file)."""
    from cosycompile.families import detect_family, get_family

    return get_family(family) if family is not None else detect_family(model_dir)


def speech_vocab(cfg: Any, family: str) -> dict[str, Any]:
    """The family's speech vocabulary of model config ``cfg`` (``FamilyInfo.llm_vocab``)."""
    return _family(family).hook("llm_vocab")(cfg)


def text_tokenizer(model_dir: Path, cfg: Any, family: str | None = None) -> Any | None:
    """The family's text tokenizer with its special tokens, or None for a built-in model (stand-in tokenizer)."""
    if (Path(model_dir) / "builtin.json").is_file():
        return None
    from transformers import AutoTokenizer

    fam = _family(family, model_dir)
    vocab = fam.hook("llm_vocab")(cfg)
    tok = AutoTokenizer.from_pretrained(str(Path(model_dir) / vocab["tokenizer_dir"]), local_files_only=True)
    tok.add_special_tokens(vocab["special_tokens"])
    return tok


def token_map(cfg: Any, tokenizer: Any | None, family: str) -> TokenMap:
    """The merged vocabulary of model config ``cfg`` with ``tokenizer`` (None: built-in) for ``family``."""
    fam = _family(family)
    v = fam.hook("llm_vocab")(cfg)
    vocab = v["text_rows"]
    # Upstream offsets speech by the tokenizer's length (151,663), not the embedding's 151,936 rows;
    # the built-in stand-in tokenizer folds bytes into all of the config's rows.
    text_vocab = vocab if tokenizer is None else len(tokenizer)
    if text_vocab > vocab:
        raise ModelError(f"the text tokenizer has {text_vocab} tokens but the LM embeds only {vocab} "
                         f"({v['tokenizer_dir']}/config.json vocab_size)")
    return TokenMap(text_vocab, v["speech_token_size"], padded_vocab(text_vocab + v["rows"]),
                    v["min_token_text_ratio"], v["max_token_text_ratio"], family=fam.name, rows=v["rows"],
                    head_rows=v["head_rows"], stop=tuple(v["stop"]), eos=v["eos"], sos=v["sos"],
                    task_id=v["task_id"], names=tuple(sorted(v["names"].items())))


def _rows(lm: Any, tmap: TokenMap) -> dict[str, Any]:
    """The family's embedding rows and speech head, checked against the token map's row counts."""
    from cosycompile.families import get_family

    rows = get_family(tmap.family).hook("llm_vocab_rows")(lm)
    emb, w = rows["embedding"], rows["head_weight"]
    if emb.shape[0] != tmap.rows or w.shape[0] != tmap.head_rows:
        raise ModelError(f"{tmap.family} LM: {emb.shape[0]} embedding rows and {w.shape[0]} speech head rows, "
                         f"its speech vocabulary says {tmap.rows} and {tmap.head_rows}")
    return rows


def rewrite_model(lm: Any, tmap: TokenMap) -> Any:
    """``lm.qwen`` (a Qwen2ForCausalLM, possibly ModelOpt-quantized) rewritten IN PLACE to the merged
    vocabulary: new ``embed_tokens`` and a biased ``lm_head``; returns it. Pass a copy to keep ``lm``."""
    import torch
    from torch import nn

    rows = _rows(lm, tmap)
    model = lm.qwen
    hidden = model.config.hidden_size
    T, R, H, V = tmap.text_vocab, tmap.rows, tmap.head_rows, tmap.vocab_size
    old = model.model.embed_tokens.weight.detach()
    with torch.no_grad():
        emb = nn.Embedding(V, hidden, dtype=old.dtype)
        emb.weight.zero_()  # padding rows: never fed
        emb.weight[:T] = old[:T]
        emb.weight[T:T + R] = rows["embedding"].to(old.dtype)
        head = nn.Linear(hidden, V, bias=True, dtype=old.dtype)
        head.weight.zero_()
        head.bias.fill_(float("-inf"))
        head.weight[T:T + H] = rows["head_weight"].to(old.dtype)
        head.bias[T:T + H] = 0.0 if rows["head_bias"] is None else rows["head_bias"].to(old.dtype)
    model.model.embed_tokens = emb
    model.lm_head = head
    c = model.config
    c.vocab_size = V
    c.tie_word_embeddings = False
    c.use_bias = True  # upstream's key (read by no stock loader; kept for tools that look for it)
    c.bos_token_id = tmap.sos_id
    c.eos_token_id = tmap.stop_ids
    c.pad_token_id = tmap.stop_ids[0]
    c.architectures = ["Qwen2ForCausalLM"]
    # transformers 5 resolves the embedding tie once, at construction; the new lm_head is untied, and
    # a stale tie map makes save/export drop lm_head (or, in ModelOpt's export, refuse the mismatch).
    if hasattr(model, "all_tied_weights_keys"):
        model.all_tied_weights_keys = {}
    return model


def generation_config(tmap: TokenMap, cfg: Any) -> Any:
    """Stop at any stop token; CosyVoice's nucleus settings (RAS's repetition re-draw has no HF form)."""
    from transformers import GenerationConfig

    v = speech_vocab(cfg, tmap.family)
    return GenerationConfig(bos_token_id=tmap.sos_id, eos_token_id=tmap.stop_ids, pad_token_id=tmap.stop_ids[0],
                            do_sample=True, temperature=1.0, top_p=v["top_p"], top_k=v["top_k"])


def finish_dir(out: Path, lm: Any, cfg: Any, tmap: TokenMap, tokenizer: Any | None, dtype: str,
               quantization: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything beside the weights: config patch (auto_map), generation config, modeling file,
    token map, prefix embeddings and, for a real model, the tokenizer with the speech tokens."""
    from safetensors.torch import save_file

    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoModelForCausalLM": f"{MODELING_FILE.removesuffix('.py')}.{MODEL_CLASS}"}
    config["architectures"] = ["Qwen2ForCausalLM"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    generation_config(tmap, cfg).save_pretrained(str(out))
    shutil.copyfile(Path(__file__).with_name("hf_modeling.py"), out / MODELING_FILE)
    write_vllm_plugin(out / VLLM_PLUGIN_DIR)
    write_sglang_plugin(out / SGLANG_PLUGIN_DIR)
    write_trtllm_plugin(out / TRTLLM_PLUGIN_DIR)
    emb = _rows(lm, tmap)["embedding"].detach().float()
    (out / PREFIX_FILE).parent.mkdir(parents=True, exist_ok=True)
    save_file({"sos": emb[tmap.sos].clone().contiguous(), "task_id": emb[tmap.task_id].clone().contiguous()},
              str(out / PREFIX_FILE))
    if tokenizer is not None:
        _save_tokenizer(tokenizer, tmap, out)
    names = tmap.token_names()
    body = {
        "format": f"{tmap.family}-hf-rewrite",
        "token_map": tmap.as_json(),
        "prompt": "[sos | prompt text + text | task_id | prompt speech] as ids (prompt_ids); "
                  f"or inputs_embeds with {PREFIX_FILE} (sos, task_id rows)",
        "decoding": {"min_tokens": "floor(min_token_text_ratio x text tokens, prompt text excluded): mask eos_id "
                                   "until then", "max_tokens": "floor(max_token_text_ratio x text tokens)",
                     "stop": "any of stop_ids"},
        "dtype": dtype,
        "quantization": quantization,
        "lm_head_bias": ("in model.safetensors (lm_head.bias: speech bias, -inf elsewhere); applied by "
                         f"{MODELING_FILE} (trust_remote_code=True) and by the {VLLM_PLUGIN_DIR}/, "
                         f"{SGLANG_PLUGIN_DIR}/ and {TRTLLM_PLUGIN_DIR}/ model classes. Stock Qwen2ForCausalLM "
                         "loaders (transformers without remote code, vLLM, SGLang, TensorRT-LLM's PyTorch backend) "
                         "drop it: their logits lack llm_decoder's bias and text ids score 0 instead of -inf"),
        "vllm": vllm_model.serving_note(quantization, VLLM_PLUGIN_DIR),
        "sglang": {"install": f"pip install ./{SGLANG_PLUGIN_DIR}",
                   "environment": {"SGLANG_EXTERNAL_MODEL_PACKAGE": sglang_model.PACKAGE},
                   "load": {"json_model_override_args": json.dumps({"architectures": [sglang_model.ARCHITECTURE]})},
                   "checked": "against sglang 0.5.23's sources with its last calls faked (not run: CUDA-only)"},
        "trtllm": {"load": f"a copy of this dir whose config.json architectures is [{trtllm_model.ARCHITECTURE!r}], "
                           f"served with --custom_module_dirs {TRTLLM_PLUGIN_DIR}/{trtllm_model.PACKAGE}",
                   "checked": "against TensorRT-LLM's PyTorch-backend sources (commits in the module's docstring) "
                              "with its last calls faked (not run here)"},
        "tokenizer": f"saved (speech tokens {names[0]}..{names[tmap.speech_token_size - 1]}, then "
                     f"{', '.join(names[tmap.speech_token_size:tmap.speech_token_size + 5])}"
                     f"{', ...' if tmap.rows > tmap.speech_token_size + 5 else ''})" if tokenizer is not None
                     else "none: a built-in model's stand-in tokenizer is bytes folded into the text ids",
    }
    (out / TOKEN_MAP_FILE).write_text(json.dumps(body, indent=1, sort_keys=True))
    return {"token_map": tmap.as_json(), "dtype": dtype, "quantization": quantization}


def _pyproject(dest: Path, server: str, body: str) -> None:
    """The ``pyproject.toml`` that makes ``dest`` pip-installable as ``cosyvoice-<server>`` (``body``: its
    entry points and what it packages)."""
    (dest / "pyproject.toml").write_text(f"""[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "cosyvoice-{server.lower()}"
version = "1.0"
description = "{server} model class for cosycompile's CosyVoice LM checkpoints (Qwen2 with an lm_head bias)"
requires-python = ">=3.9"
{body}""")


def write_vllm_plugin(dest: Path) -> None:
    """The installable vLLM plug-in (:mod:`.vllm_model` as module ``cosyvoice_vllm``, registered under
    vLLM's ``vllm.general_plugins`` entry point) in folder ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vllm_model.__file__, dest / f"{vllm_model.MODULE}.py")
    _pyproject(dest, "vLLM", f"""
[project.entry-points."vllm.general_plugins"]
cosyvoice_lm = "{vllm_model.MODULE}:register"

[tool.setuptools]
py-modules = ["{vllm_model.MODULE}"]
""")


def write_sglang_plugin(dest: Path) -> None:
    """The installable SGLang model package (:mod:`.sglang_model` as ``cosyvoice_sglang.model``, found
    through ``SGLANG_EXTERNAL_MODEL_PACKAGE``) in folder ``dest``."""
    pkg = dest / sglang_model.PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""SGLang model classes of a cosycompile LM checkpoint (see model.py)."""\n')
    shutil.copyfile(sglang_model.__file__, pkg / "model.py")
    _pyproject(dest, "SGLang", f"""
[tool.setuptools]
packages = ["{sglang_model.PACKAGE}"]
""")


def write_trtllm_plugin(dest: Path) -> None:
    """The TensorRT-LLM model package (:mod:`.trtllm_model` as ``cosyvoice_trtllm``, for
    ``--custom_module_dirs``) in folder ``dest``."""
    pkg = dest / trtllm_model.PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(trtllm_model.__file__, pkg / "__init__.py")


def _save_tokenizer(tokenizer: Any, tmap: TokenMap, out: Path) -> None:
    """The text tokenizer plus one token per speech-vocabulary row, checked to land where the token map says."""
    tokenizer.add_tokens(tmap.token_names())
    names = tmap.token_names()
    got = tokenizer.convert_tokens_to_ids([names[0], names[tmap.sos], names[tmap.task_id]])
    want = [tmap.speech_id(0), tmap.sos_id, tmap.task_id_id]
    if got != want:
        raise ModelError(f"the tokenizer put the speech tokens at ids {got}, not at {want} "
                         "(does it already hold some of them?)")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))


def write_hf_rewrite(lm: Any, cfg: Any, model_dir: Path, out: Path, dtype: str = "float32",
                     family: str | None = None) -> dict[str, Any]:
    """Write the unquantized rewrite of ``lm`` (the family's LM, modified in place) into ``out``;
    ``family`` None: the model dir's."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    family = _family(family, model_dir).name
    tokenizer = text_tokenizer(model_dir, cfg, family)
    tmap = token_map(cfg, tokenizer, family)
    model = rewrite_model(lm, tmap)
    model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    return finish_dir(out, lm, cfg, tmap, tokenizer, dtype)


def export_checkpoint(ctx: StepContext) -> dict[str, Any]:
    """The LLM's export step for backends that consume a checkpoint: the FP32 rewrite in ``hf/``
    and a graphs dir with no graphs (its ``info`` carries the runtime constants)."""
    import torch

    from cosycompile.families import load_models
    from cosycompile.runtime.graphs_dir import GraphsDir
    from cosycompile.stages.common import model_dir
    from cosycompile.stages.llm.export import stage_parts

    torch.manual_seed(0)
    root = model_dir(ctx)
    models = load_models(root, ("llm",), ctx.params.get("family"))
    info = stage_parts(models)[2]
    meta = write_hf_rewrite(models.llm, models.config, root, ctx.out / CHECKPOINT_DIR, "float32", models.family)
    GraphsDir(ctx.out, "llm", {}, {}, dict(info, family=models.family, precision="fp32", checkpoint=CHECKPOINT_DIR)).write()
    return meta
