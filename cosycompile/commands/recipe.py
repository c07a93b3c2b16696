"""``cosycompile recipe --options``: every key a recipe may write, with its type, default and meaning,
generated from the specs and the plug-in registries (:mod:`cosycompile.recipe.options`)."""

from __future__ import annotations

import argparse
from typing import Any

from cosycompile.errors import UserError

ORDER = 35
EXAMPLES = (
    ('cosycompile recipe --options', 'every recipe key, its type, default and meaning'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("recipe", help="the recipe reference: every key, its type, default and meaning",
                       description="Print every key a recipe may write: the recipe's own, each stage's, and those "
                                   "of every quantizer, backend and stage check (which apply depends on the format "
                                   "and backend a stage names). Generated from the code, so it matches this version.")
    p.add_argument("--options", action="store_true", help="print the option reference")
    p.add_argument("--json", action="store_true", help="with --options: one JSON list of the keys")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``recipe`` command."""
    from cosycompile.recipe.options import recipe_options, render

    if not args.options:
        raise UserError("recipe: give --options (the reference of every recipe key)")
    options = recipe_options()
    if args.json:
        import dataclasses
        import json

        print(json.dumps([dataclasses.asdict(o) for o in options], indent=1))
    else:
        print(render(options), end="")
    return 0
