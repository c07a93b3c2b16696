"""Command-line interface: discovery and dispatch of the commands under ``cosycompile/commands/``.

Each command is one module there (a name without a leading underscore) with ``ORDER`` (its place in
``--help``), ``add_parser(sub)`` (which names it) and ``run(args) -> int``. Bad input exits with
status 2 and one line on stderr; nothing heavy (torch, runtimes) is imported unless a step actually
has to run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import sys
import threading
import traceback
from types import ModuleType
from typing import Any, Sequence

from cosycompile import __version__
from cosycompile.errors import BuildFailed, UserError

EXIT_STATUS = """\
exit status: 0 success, 1 a check or build step failed, 2 bad input (recipe, model, data, paths),
  3 built in part: the steps this machine cannot run (e.g. a GPU engine builder that is not installed)
  are listed with the command that finishes them elsewhere
"""


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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so it unwinds as Ctrl-C does (staging dirs removed)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def one_line(message: str) -> str:
    """``message`` with control characters (a newline in a file name, say) written as escapes, so an
    error is always one line."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in message)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cosycompile`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(args.run(args))
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"cosycompile: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BuildFailed as exc:
        print(f"cosycompile: build failed: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`cosycompile cache ls | head`): stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        if not exc.filename:
            raise  # not about a path: a bug, shown as one
        # A path the system refuses (a name too long, a loop of links, no permission, a full
        # disk): the file and the reason are the whole story.
        if args.debug:
            traceback.print_exc()
        print(f"cosycompile: error: {one_line(str(exc.filename))}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        how, status = ("terminated", 143) if isinstance(exc, Terminated) else ("interrupted", 130)
        print(f"cosycompile: {how}; finished steps stay cached, the running one was discarded", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
