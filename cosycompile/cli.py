"""Command-line interface: discovery and dispatch of the commands under ``cosycompile/commands/``.

Each command is one module there (a name without a leading underscore) with ``ORDER`` (its place in
``--help``), ``add_parser(sub)`` (which names it) and ``run(args) -> int``. Bad input exits with
status 2 and one line on stderr; nothing heavy (torch, runtimes) is imported unless a step actually
has to run. How a command's end becomes its exit status lives in ``errors``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType
from typing import Sequence

from cosycompile import __version__
from cosycompile.errors import EXIT_STATUS, exit_status


def command_modules() -> list[ModuleType]:
    """Every command module, in ``--help`` order."""
    from cosycompile import commands

    mods = [importlib.import_module(f"{commands.__name__}.{m.name}") for m in pkgutil.iter_modules(commands.__path__)
            if not m.name.startswith("_")]
    return sorted(mods, key=lambda m: m.ORDER)


def build_parser() -> argparse.ArgumentParser:
    """The ``cosycompile`` parser with every command's sub-parser."""
    mods = command_modules()
    # Each command brings its own examples (EXAMPLES: (command line, what it does) pairs).
    examples = [e for m in mods for e in getattr(m, "EXAMPLES", ())]
    width = max(len(cmd) for cmd, _ in examples)
    epilog = "examples:\n" + "".join(f"  {cmd:<{width}}  {what}\n" for cmd, what in examples) + "\n" + EXIT_STATUS
    parser = argparse.ArgumentParser(
        prog="cosycompile",
        description="Build CosyVoice models into validated, cached engines (ONNX Runtime, TensorRT, TensorRT-LLM).",
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cosycompile {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the Python traceback too (for a bug report)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in mods:
        mod.add_parser(sub).set_defaults(run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cosycompile`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    return exit_status(lambda: args.run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
