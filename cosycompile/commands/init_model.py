"""``cosycompile init-model builtin:NAME --out DIR``: a built-in model written as its family's checkpoint dir."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.errors import UserError

ORDER = 30
EXAMPLES = (
    ('cosycompile init-model builtin:tiny --out m/', 'write a built-in model as a checkpoint dir'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    # Static text: listing the built-ins here would import every family on each start of the CLI; an
    # unknown name's error lists them.
    p = sub.add_parser("init-model", help="write a built-in model as a checkpoint dir of its family",
                       description="Write a built-in model in the real layout of its model family (e.g. "
                                   "CosyVoice2: cosyvoice2.yaml, llm.pt, flow.pt, hift.pt, CosyVoice-BlankEN/, "
                                   "front-end ONNX; CosyVoice-300M: cosyvoice.yaml, the three checkpoints, "
                                   "spk2info.pt, front-end ONNX).")
    p.add_argument("spec", help="builtin:NAME, e.g. builtin:tiny, builtin:cv3-tiny, builtin:cv1-tiny (an unknown "
                                "name's error lists them all)")
    p.add_argument("--out", type=Path, required=True, help="output folder (must not exist or be empty)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``init-model`` command."""
    from cosycompile.errors import ModelError
    from cosycompile.families import BUILTIN_PREFIX, builtin_family

    try:
        if not args.spec.startswith(BUILTIN_PREFIX):
            raise ModelError(f"'{args.spec}' is not a built-in model ({BUILTIN_PREFIX}<name>)")
        family = builtin_family(args.spec)
    except ModelError as exc:
        raise UserError(str(exc)) from None
    out: Path = args.out
    from cosycompile.commands._output import check_out_dir

    check_out_dir(out, "--out", need_parent=False)
    family.hook("init_model")(args.spec, out, seed=args.seed)
    print(f"wrote {args.spec} (seed {args.seed}) to {out}")
    return 0
