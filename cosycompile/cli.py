"""Command-line interface: ``cosycompile build|plan|init-model|cache ...``.

Bad input exits with status 2 and one line on stderr; nothing heavy (torch, runtimes) is
imported unless a step actually has to run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from . import __version__
from .errors import UserError

EPILOG = """\
examples:
  cosycompile build recipes/cpu-fp32.yaml          build, validate and bundle a recipe
  cosycompile plan recipes/cpu-fp32.yaml           show what would run and why (no work)
  cosycompile init-model builtin:tiny --out m/     write a built-in model as a checkpoint dir
  cosycompile cache verify --full                  re-hash every cache entry

exit status: 0 success, 1 a check or build step failed, 2 bad input (recipe, model, data, paths)
"""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--artifacts", type=Path, default=Path("artifacts"), metavar="DIR",
                   help="cache and build output folder (default: ./artifacts)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the result")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cosycompile",
        description="Build CosyVoice2 into validated, cached engines (ONNX Runtime, TensorRT, TensorRT-LLM).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cosycompile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("build", help="run a recipe: export, simplify, build engines, check, bundle",
                       description="Run every step of RECIPE whose output is not already cached, then "
                                   "write the bundle builds/<name>-<key12>/ and print its report.")
    p.add_argument("recipe", type=Path, help="recipe YAML file")
    p.add_argument("--force", action="store_true", help="re-run every step even if cached")
    _add_common(p)

    p = sub.add_parser("plan", help="show the steps of a recipe, their keys, and which would run and why",
                       description="Work out every step's content key and compare with the cache. No work is done.")
    p.add_argument("recipe", type=Path, help="recipe YAML file")
    p.add_argument("--force", action="store_true", help="plan as if --force were given to build")
    _add_common(p)

    p = sub.add_parser("init-model", help="write a built-in model as a CosyVoice2 checkpoint dir",
                       description="Write builtin:tiny or builtin:random-0.5b in the real layout "
                                   "(cosyvoice2.yaml, llm.pt, flow.pt, hift.pt, CosyVoice-BlankEN/, front-end ONNX).")
    p.add_argument("spec", help="builtin:tiny or builtin:random-0.5b")
    p.add_argument("--out", type=Path, required=True, help="output folder (must not exist or be empty)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")

    p = sub.add_parser("cache", help="inspect or check the local cache")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    v = csub.add_parser("verify", help="check every entry against its digests; remove bad ones")
    v.add_argument("--full", action="store_true", help="re-hash every file, not only changed ones")
    _add_common(v)
    ls = csub.add_parser("ls", help="list cache entries")
    _add_common(ls)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cosycompile`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return _dispatch(args, parser)
    except UserError as exc:
        print(f"cosycompile: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cosycompile: interrupted; finished steps stay cached, the running one was discarded", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command in ("build", "plan"):
        return _build_or_plan(args)
    if args.command == "init-model":
        return _init_model(args)
    if args.command == "cache":
        return _cache(args, parser)
    parser.error(f"unknown command {args.command}")
    return 2


def _build_or_plan(args: argparse.Namespace) -> int:
    from .build import assemble_bundle, bundle_dir, executor, plan_build
    from .cache import Store
    from .graph import Reporter
    from .recipe import load_recipe

    t0 = time.perf_counter()
    recipe = load_recipe(args.recipe)
    plan = plan_build(recipe)
    store = Store(args.artifacts)
    reporter = Reporter(quiet=args.quiet)
    ex = executor(plan, store, reporter, force=args.force)
    if args.command == "plan":
        items = ex.plan()
        w = max(len(i.step.name) for i in items)
        todo = sum(not i.cached for i in items)
        print(f"recipe {recipe.name} ({recipe.source}): {len(items)} steps, {todo} to run")
        for i in items:
            state = "cached" if i.cached else "RUN   "
            why = "" if i.cached else f"  because: {i.reason}"
            print(f"  {state} {i.step.name:<{w}}  {i.key[:12]}  {i.step.describe}{why}")
        print(f"bundle: {bundle_dir(plan, store)}")
        return 0
    result = ex.run()
    bundle = assemble_bundle(plan, store, result)
    dt = time.perf_counter() - t0
    report = bundle / "report.md"
    if report.is_file() and not args.quiet:
        print(report.read_text())
    ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
    print(f"built {recipe.name} in {dt:.1f}s; ran: {ran}")
    print(f"bundle: {bundle}")
    return _checks_exit_status(bundle)


def _checks_exit_status(bundle: Path) -> int:
    import json

    report = bundle / "report.json"
    if not report.is_file():
        return 0
    body = json.loads(report.read_text())
    failed = [name for name, s in body.get("checks", {}).items() if not s.get("passed", True)]
    if failed:
        print(f"cosycompile: checks failed: {', '.join(failed)} (see {bundle / 'report.md'})", file=sys.stderr)
        return 1
    return 0


def _init_model(args: argparse.Namespace) -> int:
    from .build import BUILTIN_MODELS, BUILTIN_PREFIX

    name = args.spec[len(BUILTIN_PREFIX):] if args.spec.startswith(BUILTIN_PREFIX) else None
    if name not in BUILTIN_MODELS:
        raise UserError(f"unknown built-in model '{args.spec}' "
                        f"(known: {', '.join(BUILTIN_PREFIX + m for m in BUILTIN_MODELS)})")
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: output exists and is not an empty folder")
    from .models.loader import init_model

    init_model(args.spec, out, seed=args.seed)
    print(f"wrote {args.spec} (seed {args.seed}) to {out}")
    return 0


def _cache(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .cache import Store

    if args.cache_command is None:
        parser.parse_args(["cache", "--help"])
        return 2
    store = Store(args.artifacts)
    if args.cache_command == "verify":
        count, bad = store.verify_all(full=args.full)
        print(f"{count} entries checked, {len(bad)} bad" + (f" (removed: {', '.join(b[:12] for b in bad)})" if bad else ""))
        return 1 if bad else 0
    if args.cache_command == "ls":
        import json

        for entry_file in sorted(store.objects.glob("*/*/entry.json")):
            meta = json.loads(entry_file.read_text())
            size = sum(s for s, _ in meta.get("files", {}).values())
            print(f"{meta['key'][:12]}  {meta.get('step', '?'):<16} {size / 1e6:9.1f} MB  {meta.get('seconds', 0):6.1f}s")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
