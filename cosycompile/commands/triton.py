"""``cosycompile triton BUNDLE --out DIR``: a Triton Inference Server model repository of a bundle.

A CPU bundle (every stage on ONNX Runtime) gives python-backend models that run its engines; a GPU
bundle (llm on TensorRT-LLM, flow and HiFT on TensorRT) gives the CosyVoice runtime's BLS layout.
The repository's README.md says how to start the server. Torch is never imported.
"""

from __future__ import annotations

import argparse
from typing import Any
from pathlib import Path

from cosycompile.commands._args import add_spin_wait
from cosycompile.commands._output import check_out_dir
from cosycompile.errors import UserError
from cosycompile.runtime.text import DEFAULT_MAX_CHARS


ORDER = 120
EXAMPLES = (
    ('cosycompile triton DIR --out repo/', 'Triton model repository of a bundle'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("triton", help="write a Triton Inference Server model repository of a bundle",
                       description="Write DIR as a Triton model repository serving BUNDLE. A CPU bundle (every "
                                   "stage on onnxruntime) gives python-backend models running its engines: "
                                   "FAMILY (decoupled, gRPC streaming, one response per token chunk) and "
                                   "FAMILY_offline (HTTP), FAMILY the bundle's model family (cosyvoice2, "
                                   "cosyvoice3). A GPU bundle (llm trtllm, flow/hift tensorrt) gives "
                                   "the CosyVoice runtime layout: BLS FAMILY and FAMILY_offline, token2wav, vocoder, "
                                   "speaker_embedding, audio_tokenizer and tensorrt_llm (or --llm-url). Configs come "
                                   "from the bundle's manifest and recipe; DIR/README.md says how to start the server.")
    p.add_argument("bundle", type=Path, help="bundle dir (a build's, or one from cosycompile unpack)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="repository folder to create (must not exist, or be empty)")
    p.add_argument("--instances", type=int, default=1, metavar="N", help="instances per model (default 1)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="intra-op threads per CPU instance (default: the recipe's validation.speed.threads)")
    add_spin_wait(p)
    p.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS, metavar="N",
                   help="longest text piece in English-character equivalents, as for synthesize (default %(default)s)")
    p.add_argument("--llm-url", metavar="URL",
                   help="GPU bundles: call a trtllm-serve at URL (TensorRT-LLM > 1.2 has no Triton backend) "
                        "instead of generating a tensorrt_llm model")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``triton`` command."""
    from cosycompile.exporters.triton.repository import RepoOptions, read_repository_json, write_repository

    bundle: Path = args.bundle
    out: Path = args.out
    if args.instances < 1:
        raise UserError(f"--instances {args.instances}: needs at least 1")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: needs at least 1")
    if args.max_chars < 10:
        raise UserError(f"--max-chars {args.max_chars}: too short to hold a phrase (at least 10)")
    if args.llm_url is not None and not args.llm_url.startswith(("http://", "https://")):
        raise UserError(f"--llm-url {args.llm_url}: give the trtllm-serve address as http://HOST:PORT")
    if not bundle.is_dir():
        raise UserError(f"{bundle}: not a bundle folder")
    check_out_dir(out, "--out")
    if out.resolve().is_relative_to(bundle.resolve()):
        raise UserError(f"{out}: inside the bundle {bundle} (its manifest lists every file); write it elsewhere")
    options = RepoOptions(instances=args.instances, threads=args.threads, max_chars=args.max_chars,
                          llm_url=args.llm_url, spin_wait=args.spin_wait)
    write_repository(bundle, out, options)
    info = read_repository_json(out) or {}
    models = ", ".join(info.get("models", {}))
    print(f"wrote {out}: {info.get('layout', '?')} repository of {bundle.name} (models: {models}); "
          f"{out / 'README.md'} says how to serve it")
    return 0
