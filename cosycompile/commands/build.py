"""``cosycompile build RECIPE``: run every step not already cached, write the bundle, apply the gate."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.commands._args import add_common, add_remote
from cosycompile.commands._build import build_or_plan

ORDER = 10
EXAMPLES = (
    ('cosycompile build recipes/cpu-fp32.yaml', 'build, validate and bundle a recipe'),
    ('cosycompile build R.yaml --cache-remote s3://bucket/cosy', 'share steps through an S3-compatible store'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("build", help="run a recipe: export, simplify, build engines, check, bundle",
                       description="Run every step of RECIPE whose output is not already cached, then "
                                   "write the bundle builds/<name>-<key12>/ and print its report.")
    p.add_argument("recipe", type=Path, help="recipe YAML file")
    p.add_argument("--force", action="store_true", help="re-run every step even if cached")
    p.add_argument("--until", choices=("export", "simplify", "quantize", "engine", "check"),
                   help="stop after this step of every stage (no pipeline check, no bundle); e.g. "
                        "--until quantize builds a GPU recipe's checkpoints and ONNX on a CPU machine")
    p.add_argument("--allow-unvalidated", action="store_true",
                   help="pass the gate for engines this machine cannot run (the bundle says 'built, not validated "
                        "here'; run `cosycompile validate BUNDLE` on a machine that can)")
    add_common(p)
    add_remote(p)
    return p


def run(args: argparse.Namespace) -> int:
    """The ``build`` command."""
    return build_or_plan(args)
