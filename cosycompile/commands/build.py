"""``cosycompile build RECIPE``: run every step not already cached, write the bundle, apply the gate."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.commands._args import add_common, add_remote
from cosycompile.commands._build import build_recipes

ORDER = 10
EXAMPLES = (
    ('cosycompile build recipes/cpu-fp32.yaml', 'build, validate and bundle a recipe'),
    ('cosycompile build R.yaml --cache-remote s3://bucket/cosy', 'share steps through an S3-compatible store'),
    ('cosycompile build A.yaml B.yaml --executor ray --cache-remote s3://b/c', 'build a matrix on the Ray cluster'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("build", help="run a recipe: export, simplify, build engines, check, bundle",
                       description="Run every step of RECIPE whose output is not already cached, then "
                                   "write the bundle builds/<name>-<key12>/ and print its report.")
    p.add_argument("recipe", type=Path, nargs="+",
                   help="recipe YAML file; several build as one matrix (steps they share run once) and end in a table")
    p.add_argument("--force", action="store_true", help="re-run every step even if cached")
    p.add_argument("--until", choices=("export", "simplify", "quantize", "engine", "check"),
                   help="stop after this step of every stage (no pipeline check, no bundle); e.g. "
                        "--until quantize builds a GPU recipe's checkpoints and ONNX on a CPU machine")
    p.add_argument("--allow-unvalidated", action="store_true",
                   help="pass the gate for engines this machine cannot run (the bundle says 'built, not validated "
                        "here'; run `cosycompile validate BUNDLE` on a machine that can)")
    p.add_argument("--executor", default="local", metavar="NAME[://ADDRESS]",
                   help="where steps run: 'local' (this process, the default), 'ray' (the Ray cluster at "
                        "$RAY_ADDRESS) or 'ray://HOST:PORT'; on a cluster each step goes to a node with the "
                        "hardware it needs (a GPU target's sm tag, e.g. a node started with --resources "
                        "'{\"sm89\": 1}') and outputs pass through --cache-remote")
    add_common(p)
    add_remote(p)
    return p


def run(args: argparse.Namespace) -> int:
    """The ``build`` command."""
    return build_recipes(args)
