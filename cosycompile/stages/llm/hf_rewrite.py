"""The speech-token LM as one plain Qwen2 checkpoint with the speech tokens in its vocabulary.

TensorRT-LLM cannot feed input embeddings to a custom LLM (its issue #15885), so servers (its
PyTorch backend, vLLM, SGLang) get CosyVoice2's LM as an ordinary causal LM over token ids, laid
out as CosyVoice's ``examples/grpo/cosyvoice2/pretrained_to_huggingface.py`` does:

- ids ``0..T-1`` are the text tokens (``T`` = the text tokenizer's length with CosyVoice's special
  tokens, 151,663 for CosyVoice2-0.5B; a built-in model's stand-in tokenizer spans the config's
  ``vocab_size``); speech token ``s`` is id ``T + s`` for ``s`` in ``0..S+2`` (the three stop tokens
  included), then ``<|sos|>`` = ``T+S+3`` and ``<|task_id|>`` = ``T+S+4``; the vocabulary is
  padded to a multiple of 128;
- ``embed_tokens``: text rows kept, speech rows from ``speech_embedding``, sos / task_id rows from
  ``llm_embedding``, so the prompt ``[sos | text | task_id | prompt speech]`` is a list of ids;
- an untied ``lm_head`` with a bias: speech and stop rows are ``llm_decoder``'s, every other row
  has weight 0 and bias ``-inf`` (finite-free: safetensors and bf16 both store ``-inf``).

No stock Qwen2 implementation applies an lm_head bias (see :mod:`.hf_modeling`): the dir ships
``modeling_cosyvoice2_lm.py`` for transformers (``trust_remote_code=True``) and records in
``cosycompile_llm.json`` that a stock loader drops the bias.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.errors import ModelError

CHECKPOINT_DIR = "hf"  # where export and quantize steps put the rewrite inside their output
MODELING_FILE = "modeling_cosyvoice2_lm.py"
MODEL_CLASS = "CosyVoice2LMForCausalLM"
TOKEN_MAP_FILE = "cosycompile_llm.json"
PREFIX_FILE = "prefix_embeddings.safetensors"
PAD_MULTIPLE = 128
DTYPES = ("float32", "bfloat16")
# The special tokens CosyVoice2's front end adds to the Qwen tokenizer before any speech token
# (upstream's pretrained_to_huggingface.py and cosyvoice/tokenizer/tokenizer.py): they fix T.
COSYVOICE_SPECIAL_TOKENS: dict[str, Any] = {
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "additional_special_tokens": [
        "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]",
        "[laughter]", "[cough]", "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>",
        "[hissing]", "[sigh]", "[vocalized-noise]", "[lipsmack]", "[mn]"],
}
CHAT_TEMPLATE = ("{%- for message in messages %}{%- if message['role'] == 'user' %}"
                 "{{- '<|sos|>' + message['content'] + '<|task_id|>' }}{%- elif message['role'] == 'assistant' %}"
                 "{{- message['content'] }}{%- endif %}{%- endfor %}")


@dataclass(frozen=True)
class TokenMap:
    """Where CosyVoice2's tokens sit in the merged vocabulary."""

    text_vocab: int  # T: ids below it are text tokens; speech token s is T + s
    speech_token_size: int  # S (6561): speech tokens 0..S-1, then the stop tokens S, S+1, S+2
    vocab_size: int  # padded to a multiple of 128
    min_token_text_ratio: float
    max_token_text_ratio: float

    @property
    def stop_ids(self) -> list[int]:
        """eos1..eos3: the end token (masked before the minimum length), then two more stop tokens."""
        return [self.text_vocab + self.speech_token_size + i for i in range(3)]

    @property
    def sos_id(self) -> int:
        return self.text_vocab + self.speech_token_size + 3

    @property
    def task_id_id(self) -> int:
        return self.text_vocab + self.speech_token_size + 4

    def speech_id(self, token: int) -> int:
        """The merged-vocabulary id of speech token ``token`` (0..S+2)."""
        return self.text_vocab + token

    def prompt_ids(self, text: list[int], prompt_speech: list[int] | None = None) -> list[int]:
        """``[sos | text | task_id | prompt speech]`` as ids (text = prompt text followed by the text)."""
        return [self.sos_id, *text, self.task_id_id, *(self.speech_id(t) for t in prompt_speech or [])]

    def as_json(self) -> dict[str, Any]:
        """The token mapping a server needs, as written to ``cosycompile_llm.json``."""
        return {**asdict(self), "speech_offset": self.text_vocab, "stop_ids": self.stop_ids,
                "eos_id": self.stop_ids[0], "sos_id": self.sos_id, "task_id_id": self.task_id_id,
                "speech_ids": [self.text_vocab, self.text_vocab + self.speech_token_size + 3]}


def padded_vocab(n: int, multiple: int = PAD_MULTIPLE) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (as ``resize_token_embeddings(pad_to_multiple_of=128)``)."""
    return -(-n // multiple) * multiple


def text_tokenizer(model_dir: Path) -> Any | None:
    """CosyVoice2's text tokenizer with its special tokens, or None for a built-in model (stand-in tokenizer)."""
    from cosycompile.families.cosyvoice2 import QWEN_DIR

    if (Path(model_dir) / "builtin.json").is_file():
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(Path(model_dir) / QWEN_DIR), local_files_only=True)
    tok.add_special_tokens(COSYVOICE_SPECIAL_TOKENS)
    return tok


def token_map(cfg: Any, tokenizer: Any | None) -> TokenMap:
    """The merged vocabulary of model config ``cfg`` (a ModelConfig) with ``tokenizer`` (None: built-in)."""
    vocab = cfg.llm.vocab_size
    # Upstream offsets speech by the tokenizer's length (151,663), not the embedding's 151,936 rows;
    # the built-in stand-in tokenizer folds bytes into all of the config's rows.
    text_vocab = vocab if tokenizer is None else len(tokenizer)
    if text_vocab > vocab:
        raise ModelError(f"the text tokenizer has {text_vocab} tokens but the LM embeds only {vocab} "
                         "(CosyVoice-BlankEN/config.json vocab_size)")
    s = cfg.speech_token_size
    return TokenMap(text_vocab, s, padded_vocab(text_vocab + s + 5), cfg.llm.min_token_text_ratio,
                    cfg.llm.max_token_text_ratio)


def rewrite_model(lm: Any, tmap: TokenMap) -> Any:
    """``lm.qwen`` (a Qwen2ForCausalLM, possibly ModelOpt-quantized) rewritten IN PLACE to the merged
    vocabulary: new ``embed_tokens`` and a biased ``lm_head``; returns it. Pass a copy to keep ``lm``."""
    import torch
    from torch import nn

    model = lm.qwen
    hidden = model.config.hidden_size
    T, S, V = tmap.text_vocab, tmap.speech_token_size, tmap.vocab_size
    old = model.model.embed_tokens.weight.detach()
    with torch.no_grad():
        emb = nn.Embedding(V, hidden, dtype=old.dtype)
        emb.weight.zero_()  # padding rows: never fed
        emb.weight[:T] = old[:T]
        emb.weight[T:T + S + 3] = lm.speech_embedding.weight.detach().to(old.dtype)
        emb.weight[T + S + 3:T + S + 5] = lm.llm_embedding.weight.detach().to(old.dtype)
        head = nn.Linear(hidden, V, bias=True, dtype=old.dtype)
        head.weight.zero_()
        head.bias.fill_(float("-inf"))
        head.weight[T:T + S + 3] = lm.llm_decoder.weight.detach().to(old.dtype)
        head.bias[T:T + S + 3] = lm.llm_decoder.bias.detach().to(old.dtype)
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


def generation_config(tmap: TokenMap, sampling: Any) -> Any:
    """Stop at any stop token; CosyVoice's nucleus settings (RAS's repetition re-draw has no HF form)."""
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=tmap.sos_id, eos_token_id=tmap.stop_ids, pad_token_id=tmap.stop_ids[0],
                            do_sample=True, temperature=1.0, top_p=sampling.top_p, top_k=sampling.top_k)


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
    generation_config(tmap, cfg.llm.sampling).save_pretrained(str(out))
    shutil.copyfile(Path(__file__).with_name("hf_modeling.py"), out / MODELING_FILE)
    prefix = lm.llm_embedding.weight.detach().float().contiguous()
    save_file({"sos": prefix[0].clone(), "task_id": prefix[1].clone()}, str(out / PREFIX_FILE))
    if tokenizer is not None:
        _save_tokenizer(tokenizer, tmap, out)
    body = {
        "format": "cosyvoice2-hf-rewrite",
        "token_map": tmap.as_json(),
        "prompt": "[sos | prompt text + text | task_id | prompt speech] as ids (prompt_ids); "
                  "or inputs_embeds with prefix_embeddings.safetensors (sos, task_id rows)",
        "decoding": {"min_tokens": "floor(min_token_text_ratio x text tokens, prompt text excluded): mask eos_id "
                                   "(stop_ids[0]) until then", "max_tokens": "floor(max_token_text_ratio x text tokens)"},
        "dtype": dtype,
        "quantization": quantization,
        "lm_head_bias": ("in model.safetensors (lm_head.bias: speech bias, -inf elsewhere); applied by "
                         f"{MODELING_FILE} (trust_remote_code=True). Stock Qwen2ForCausalLM loaders (transformers "
                         "without remote code, TensorRT-LLM's PyTorch backend, vLLM, SGLang) drop it: their logits "
                         "lack llm_decoder's bias and text ids score 0 instead of -inf"),
        "tokenizer": "saved (speech tokens <|s_N|>, <|eos1..3|>, <|sos|>, <|task_id|>)" if tokenizer is not None
                     else "none: a built-in model's stand-in tokenizer is bytes folded into the text ids",
    }
    (out / TOKEN_MAP_FILE).write_text(json.dumps(body, indent=1, sort_keys=True))
    return {"token_map": tmap.as_json(), "dtype": dtype, "quantization": quantization}


def _save_tokenizer(tokenizer: Any, tmap: TokenMap, out: Path) -> None:
    """The text tokenizer plus one token per speech id, checked to land where the token map says."""
    speech = [f"<|s_{i}|>" for i in range(tmap.speech_token_size)] + ["<|eos1|>", "<|eos2|>", "<|eos3|>"]
    tokenizer.add_tokens(speech + ["<|sos|>", "<|task_id|>"])
    got = tokenizer.convert_tokens_to_ids(["<|s_0|>", "<|sos|>", "<|task_id|>"])
    if got != [tmap.speech_id(0), tmap.sos_id, tmap.task_id_id]:
        raise ModelError(f"the tokenizer put the speech tokens at ids {got}, not at "
                         f"{[tmap.speech_id(0), tmap.sos_id, tmap.task_id_id]} (does it already hold some of them?)")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))


def write_hf_rewrite(lm: Any, cfg: Any, model_dir: Path, out: Path, dtype: str = "float32") -> dict[str, Any]:
    """Write the unquantized rewrite of ``lm`` (a Qwen2LM, modified in place) into ``out``."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    tokenizer = text_tokenizer(model_dir)
    tmap = token_map(cfg, tokenizer)
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
    meta = write_hf_rewrite(models.llm, models.config, root, ctx.out / CHECKPOINT_DIR, "float32")
    GraphsDir(ctx.out, "llm", {}, {}, dict(info, family=models.family, precision="fp32", checkpoint=CHECKPOINT_DIR)).write()
    return meta
