"""Write the fixtures that pin cosycompile's CosyVoice-300M LM to upstream's own classes (FP32).

Runs upstream FunAudioLLM/CosyVoice at commit ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40
("Merge pull request #1850 from yuekaizhang/cosy3_pr", 2026-03-16): ``cosyvoice.llm.llm.TransformerLM``
with a ``cosyvoice.transformer.encoder.ConformerEncoder`` text encoder and a ``TransformerEncoder``
decoder, built with the settings of the ``llm`` section of
``examples/libritts/cosyvoice/conf/cosyvoice.yaml`` (read from the same commit) at the tiny shapes of
``cv1_tiny()``, seeded, and writes to ``tests/data/cv1_upstream/``:

- ``lm.pt``: upstream's state dict (parameters rounded to float16 values and stored as float16, exact;
  LayerNorm weights and biases randomised so that a wrong norm cannot pass);
- ``lm.npz``: text ids, prompt text ids, prompt speech tokens, a speaker embedding; upstream's
  ``encode`` of the prompt text and text; the ``lm_input`` that ``inference`` builds, with and without
  the speaker embedding (recorded from inside ``inference``); the prefill logits (``llm_decoder`` over
  ``llm.forward_chunk`` at every position), then four ``forward_chunk`` decode steps fed chosen speech
  tokens (each step's logits, the final ``att_cache``); the first tokens of ``inference`` with a
  sampling function that takes the argmax (deterministic decoding);
- ``shapes_300m_lm.json``: every key and shape of upstream's TransformerLM as the yaml builds it
  (300M; built on the meta device, nothing allocated), with the yaml's settings it was built from.

Re-run (no network needed once the mirror and packages are here), from the repository root::

    .venv/bin/python tests/families/cosyvoice/make_upstream_fixtures_lm.py <upstream>

``<upstream>`` is a source tree of upstream or a git directory holding the commit above (for example
the bare mirror the search tool's ``fetch github:FunAudioLLM/CosyVoice`` leaves under /work/.mirror);
from a git directory ``cosyvoice/`` and the yaml of that commit are exported to a temporary folder
first. ``--commit`` picks another commit (the tests then compare against it).

No extra packages. Upstream imports that the LM does not run are stubbed, not installed:
``transformers`` (``llm.py`` imports ``Qwen2ForCausalLM`` for the second generation's LM),
``cosyvoice.utils.onnx`` (ONNX front ends), ``cosyvoice.utils.file_utils`` (imports torchaudio; the
LM reads only its ``logging``) and ``cosyvoice.utils.class_utils``, whose registry is rebuilt here from
upstream's own transformer modules (the real one imports every network and the CLI).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "tests" / "data" / "cv1_upstream"
COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"
YAML = "examples/libritts/cosyvoice/conf/cosyvoice.yaml"
# Decode steps recorded with chosen tokens, and greedy tokens taken from upstream's inference.
CACHED_STEPS = 4
GREEDY_TOKENS = 16
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cosycompile.families.cosyvoice.config import EncoderConfig, LMConfig, cv1_tiny  # noqa: E402
from upstream_source import source_tree  # noqa: E402


# -- upstream on sys.path -------------------------------------------------------------------------
def install_stubs() -> None:
    """Modules upstream imports at module level but never runs for TransformerLM."""

    def module(name: str, **attrs: object) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    if "transformers" not in sys.modules:
        module("transformers", Qwen2ForCausalLM=None)
    module("cosyvoice.utils.onnx", SpeechTokenExtractor=None, EmbeddingExtractor=None, online_feature=False,
           onnx_path=None, embedding_extractor=None)
    module("cosyvoice.utils.file_utils", logging=logging)

    # The registry's entries as upstream's class_utils lists them (those of its transformer modules).
    from cosyvoice.transformer import attention, embedding, subsampling
    from cosyvoice.transformer.activation import Swish

    module("cosyvoice.utils.class_utils",
           COSYVOICE_ACTIVATION_CLASSES={"hardtanh": torch.nn.Hardtanh, "tanh": torch.nn.Tanh, "relu": torch.nn.ReLU,
                                         "selu": torch.nn.SELU, "swish": getattr(torch.nn, "SiLU", Swish),
                                         "gelu": torch.nn.GELU},
           COSYVOICE_SUBSAMPLE_CLASSES={"linear": subsampling.LinearNoSubsampling,
                                        "linear_legacy": subsampling.LegacyLinearNoSubsampling,
                                        "embed": subsampling.EmbedinigNoSubsampling,
                                        "conv1d2": subsampling.Conv1dSubsampling2,
                                        "conv2d": subsampling.Conv2dSubsampling4,
                                        "conv2d6": subsampling.Conv2dSubsampling6,
                                        "conv2d8": subsampling.Conv2dSubsampling8},
           COSYVOICE_EMB_CLASSES={"embed": embedding.PositionalEncoding, "abs_pos": embedding.PositionalEncoding,
                                  "rel_pos": embedding.RelPositionalEncoding,
                                  "rel_pos_espnet": embedding.EspnetRelPositionalEncoding,
                                  "no_pos": embedding.NoPositionalEncoding},
           COSYVOICE_ATTENTION_CLASSES={"selfattn": attention.MultiHeadedAttention,
                                        "rel_selfattn": attention.RelPositionMultiHeadedAttention})


# -- the yaml's llm section -----------------------------------------------------------------------
class _TagLoader(yaml.SafeLoader):
    """Reads hyperpyyaml tags as plain data: ``!new:cls`` a mapping with ``_class``, ``!ref <k>`` the string."""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return {"_class": suffix.partition(":")[2], **loader.construct_mapping(node, deep=True)}
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_TagLoader.add_multi_constructor("!", _tagged)


def yaml_llm(tree: Path) -> dict[str, Any]:
    """The yaml's ``llm`` mapping, ``!ref <key>`` replaced by the top-level value it names."""
    doc = yaml.load((tree / YAML).read_text(), Loader=_TagLoader)

    def resolve(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: resolve(x) for k, x in v.items()}
        if isinstance(v, str) and v.startswith("<") and v.endswith(">"):
            return doc[v[1:-1]]
        return v

    return resolve(doc["llm"])


def with_shapes(section: dict[str, Any], cfg: LMConfig) -> dict[str, Any]:
    """The yaml's llm settings with every shape taken from ``cfg`` (the tiny preset)."""

    def enc(base: dict[str, Any], e: EncoderConfig) -> dict[str, Any]:
        return {**base, "input_size": e.input_size, "output_size": e.output_size, "attention_heads": e.attention_heads,
                "linear_units": e.linear_units, "num_blocks": e.num_blocks, "static_chunk_size": e.static_chunk_size}

    return {**section, "text_encoder_input_size": cfg.text_encoder.input_size, "llm_input_size": cfg.decoder.input_size,
            "llm_output_size": cfg.decoder.output_size, "text_token_size": cfg.text_token_size,
            "speech_token_size": cfg.speech_token_size, "spk_embed_dim": cfg.spk_embed_dim,
            "text_encoder": enc(section["text_encoder"], cfg.text_encoder), "llm": enc(section["llm"], cfg.decoder)}


def argmax_sampling(weighted_scores: torch.Tensor, decoded_tokens: list[int], sampling: int) -> int:
    """Stands in for the yaml's ras_sampling: the best token, so that decoding is deterministic."""
    return int(weighted_scores.argmax())


def build_lm(section: dict[str, Any]) -> torch.nn.Module:
    """upstream TransformerLM as the yaml nests it (inner objects first)."""
    from cosyvoice.llm.llm import TransformerLM
    from cosyvoice.transformer.encoder import ConformerEncoder, TransformerEncoder

    classes = {"cosyvoice.transformer.encoder.ConformerEncoder": ConformerEncoder,
               "cosyvoice.transformer.encoder.TransformerEncoder": TransformerEncoder}

    def args(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k != "_class"}

    assert section["_class"] == "cosyvoice.llm.llm.TransformerLM", section["_class"]
    te, llm = section["text_encoder"], section["llm"]
    rest = {k: v for k, v in args(section).items() if k not in ("text_encoder", "llm", "sampling")}
    return TransformerLM(text_encoder=classes[te["_class"]](**args(te)), llm=classes[llm["_class"]](**args(llm)),
                         sampling=argmax_sampling, **rest)


# -- fixtures -------------------------------------------------------------------------------------
def randomise_and_round(net: torch.nn.Module) -> None:
    """LayerNorm scales and shifts away from 1 and 0 (a wrong eps or a skipped norm then shows); attention
    values and outputs, and the speaker projection, scaled up; then every parameter rounded to a float16
    value (kept float32) so that the .pt stores them as float16 without loss.

    At init the input layer's sqrt(d)-scaled residual drowns attention: each token's logits then depend on
    that token alone, greedy decoding repeats one token after six, and the speaker row changes nothing.
    Scaled, the greedy tokens vary and differ with and without the speaker.
    """
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))
                m.bias.copy_(0.1 * torch.randn_like(m.bias))
        for name, p in net.named_parameters():
            if name.endswith(("linear_v.weight", "linear_out.weight")):
                p.mul_(4.0)
        net.spk_embed_affine_layer.weight.mul_(5.0)
        for p in net.parameters():
            p.copy_(p.half().float())


def recorded_inference(lm: torch.nn.Module, text: torch.Tensor, prompt_text: torch.Tensor,
                       prompt_speech: torch.Tensor, embedding: torch.Tensor, tokens: int
                       ) -> tuple[torch.Tensor, list[int]]:
    """Run upstream's ``inference`` for up to ``tokens`` tokens; returns the ``lm_input`` it fed its first
    ``forward_chunk`` call (its prefix, built by upstream's own code) and the tokens it yielded."""
    calls: list[torch.Tensor] = []
    margins: list[float] = []
    original = lm.llm.forward_chunk

    def spy(xs: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(xs.clone())
        out = original(xs, *args, **kwargs)
        top = lm.llm_decoder(out[0][0, -1]).topk(2).values
        margins.append(float(top[0] - top[1]))
        return out

    lm.llm.forward_chunk = spy
    try:
        gen = lm.inference(text, torch.tensor([text.shape[1]]), prompt_text, torch.tensor([prompt_text.shape[1]]),
                           prompt_speech, torch.tensor([prompt_speech.shape[1]]), embedding)
        out = [int(t) for t in itertools.islice(gen, tokens)]
    finally:
        del lm.llm.forward_chunk
    # Greedy tokens are compared exactly: a near tie would make them hang on rounding.
    print(f"lm: greedy {out}, smallest top-2 logit margin {min(margins):.3g}")
    return calls[0], out


def lm_fixtures(lm: torch.nn.Module, cfg: LMConfig) -> None:
    torch.manual_seed(3)
    text = torch.randint(0, cfg.text_token_size, (1, 7))
    prompt_text = torch.randint(0, cfg.text_token_size, (1, 4))
    prompt_speech = torch.randint(0, cfg.speech_token_size, (1, 5))
    embedding = (torch.randn(1, cfg.spk_embed_dim) * 3.0).half().float()
    step_tokens = torch.randint(0, cfg.speech_token_size, (CACHED_STEPS,))
    with torch.inference_mode():
        all_text = torch.cat([prompt_text, text], dim=1)
        encoded, _ = lm.encode(lm.text_embedding(all_text), torch.tensor([all_text.shape[1]]))
        lm_input, greedy = recorded_inference(lm, text, prompt_text, prompt_speech, embedding, GREEDY_TOKENS)
        lm_input_nospk, greedy_nospk = recorded_inference(lm, text, prompt_text, prompt_speech,
                                                          torch.zeros(0, cfg.spk_embed_dim), GREEDY_TOKENS)
        # The calls inference makes: a prefill with a tril mask and empty caches, then one token at a time.
        S = lm_input.shape[1]
        empty = torch.zeros(0, 0, 0, 0)
        y, att_cache, cnn_cache = lm.llm.forward_chunk(lm_input, offset=0, required_cache_size=-1, att_cache=empty,
                                                       cnn_cache=empty,
                                                       att_mask=torch.tril(torch.ones(1, S, S)).to(torch.bool))
        arrays = {"prefill_logits": lm.llm_decoder(y)}
        offset = S
        for i, tok in enumerate(step_tokens.tolist()):
            x = lm.speech_embedding.weight[tok].reshape(1, 1, -1)
            y, att_cache, cnn_cache = lm.llm.forward_chunk(x, offset=offset, required_cache_size=-1,
                                                           att_cache=att_cache, cnn_cache=cnn_cache,
                                                           att_mask=torch.tril(torch.ones(1, 1, 1)).to(torch.bool))
            arrays[f"step{i}_logits"] = lm.llm_decoder(y)
            offset += 1
    print(f"lm: prefix of {S} rows; greedy tokens differ without the speaker: {greedy != greedy_nospk}")
    arrays |= {"text": text, "prompt_text": prompt_text, "prompt_speech_token": prompt_speech,
               "embedding": embedding, "encode": encoded, "lm_input": lm_input, "lm_input_nospk": lm_input_nospk,
               "step_tokens": step_tokens, "att_cache": att_cache, "greedy_tokens": torch.tensor(greedy),
               "greedy_tokens_nospk": torch.tensor(greedy_nospk)}
    np.savez_compressed(OUT / "lm.npz", **{k: v.detach().cpu().numpy() for k, v in arrays.items()})


def half_state_dict(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with float parameters as float16 (exact after :func:`randomise_and_round`)."""
    return {k: v.half() if v.is_floating_point() else v for k, v in net.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("upstream", type=Path, help="upstream source tree, or a git dir holding the commit")
    ap.add_argument("--commit", default=COMMIT)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree, rev = source_tree(args.upstream.resolve(), args.commit, ["cosyvoice", YAML], Path(tmp))
        sys.path.insert(0, str(tree))
        install_stubs()
        torch.set_num_threads(2)
        section = yaml_llm(tree)
        cfg = cv1_tiny().lm

        torch.manual_seed(0)
        lm = build_lm(with_shapes(section, cfg)).eval()
        randomise_and_round(lm)
        torch.save(half_state_dict(lm), OUT / "lm.pt")
        lm_fixtures(lm, cfg)

        with torch.device("meta"):
            big = build_lm(section)
        record = {"lm": {k: list(v.shape) for k, v in big.state_dict().items()},
                  "_source": {"repository": "FunAudioLLM/CosyVoice", "commit": rev, "yaml": YAML,
                              "llm": {k: v for k, v in section.items() if k != "sampling"},
                              "torch": torch.__version__}}
        (OUT / "shapes_300m_lm.json").write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
    for name in ("lm.pt", "lm.npz", "shapes_300m_lm.json"):
        print(f"wrote {OUT / name} ({(OUT / name).stat().st_size / 1e3:.1f} kB) from upstream {rev}")


if __name__ == "__main__":
    main()
