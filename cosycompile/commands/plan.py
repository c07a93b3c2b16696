"""``cosycompile plan RECIPE``: every step's key and whether it would run, and why; no work."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.commands._args import add_common, add_remote
from cosycompile.commands._build import plan_recipe

ORDER = 20
EXAMPLES = (
    ('cosycompile plan recipes/cpu-fp32.yaml', 'show what would run and why (no work)'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("plan", help="show the steps of a recipe, their keys, and which would run and why",
                       description="Work out every step's content key and compare with the cache. No work is done.")
    p.add_argument("recipe", type=Path, help="recipe YAML file")
    p.add_argument("--force", action="store_true", help="plan as if --force were given to build")
    p.add_argument("--todo", action="store_true",
                   help="list only the steps that would run (after a split build: the ones left)")
    p.add_argument("--json", action="store_true",
                   help="with --todo: print the steps that would run as one JSON object (name, kind, key, why, "
                        "and what each needs: target, backend, blocked here and why) for an orchestrator")
    add_common(p)
    add_remote(p)
    return p


def run(args: argparse.Namespace) -> int:
    """The ``plan`` command."""
    return plan_recipe(args)
