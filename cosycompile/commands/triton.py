"""``cosycompile triton BUNDLE --out DIR``: a Triton Inference Server model repository of a bundle.

A CPU bundle (every stage on ONNX Runtime) gives python-backend models that run its engines; a GPU
bundle (llm on TensorRT-LLM, flow and HiFT on TensorRT) gives the CosyVoice runtime's BLS layout.
The repository's README.md says how to start the server. Torch is never imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cosycompile.commands._output import check_out_dir
from cosycompile.errors import UserError


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
                          llm_url=args.llm_url)
    write_repository(bundle, out, options)
    info = read_repository_json(out) or {}
    models = ", ".join(info.get("models", {}))
    print(f"wrote {out}: {info.get('layout', '?')} repository of {bundle.name} (models: {models}); "
          f"{out / 'README.md'} says how to serve it")
    return 0
