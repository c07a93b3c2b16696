"""What ``build`` and ``plan`` share: loading the recipe, planning its steps against the store,
then running them (with the split-build hand-off and the gate) or listing them."""

from __future__ import annotations

import argparse
import time
from typing import Any

from cosycompile.commands.gate import apply_gate
from cosycompile.errors import UserError
from cosycompile.split import EXIT_SPLIT


def build_or_plan(args: argparse.Namespace) -> int:
    """``build`` and ``plan``: plan the recipe's steps, then run them (build) or list them (plan)."""
    from cosycompile.exporters.bundle.export import bundle_dir
    from cosycompile.plan import executor, plan_build
    from cosycompile.cache.local import Store
    from cosycompile.core.graph import Reporter
    from cosycompile.cache.remote import remote_from
    from cosycompile.recipe.schema import load_recipe

    t0 = time.perf_counter()
    remote = remote_from(args.cache_remote)  # a mistyped URL is refused before any work
    recipe = load_recipe(args.recipe)
    g = recipe.validation.gate
    if g.baseline:
        from cosycompile.validate.gate import load_report

        load_report(recipe.resolve_path(g.baseline))  # read before any work: the gate compares with it last
    until = getattr(args, "until", None)
    plan = plan_build(recipe, until=until)
    store = Store(args.artifacts)
    reporter = Reporter(quiet=args.quiet)
    # `plan` never asks the remote: a lookup per missing step could wait on a silent server, and
    # the plan is only a forecast (a build pulls whatever the remote holds when it runs).
    ex = executor(plan, store, reporter, force=args.force, remote=remote if args.command == "build" else None)
    if args.command == "plan":
        if args.json and not args.todo:
            raise UserError("plan --json lists the steps that would run: give it with --todo")
        items = ex.plan()
        if args.json:
            import json

            from cosycompile.core.targets import TARGETS
            from cosycompile.split import todo_json

            print(json.dumps(todo_json(recipe, items, TARGETS[recipe.target]), indent=1))
            return 0
        w = max(len(i.step.name) for i in items)
        todo = sum(not i.cached for i in items)
        n_left = sum(i.left for i in items)
        here = f" ({n_left} of them not on this machine)" if n_left else ""
        print(f"recipe {recipe.name} ({recipe.source}): {len(items)} steps, {todo} to run{here}")
        for i in items:
            if i.cached and args.todo:
                continue
            state = "cached" if i.cached else "remote" if i.remote else "LEFT  " if i.left else "RUN   "
            why = "" if i.cached else f"  because: {i.reason}"
            print(f"  {state} {i.step.name:<{w}}  {i.key[:12]}  {i.step.describe}{why}")
        if remote is not None and todo:
            print(f"remote cache {remote.url}: not asked (plan makes no network call); a build pulls the steps "
                  "it holds instead of running them")
        print(f"bundle: {bundle_dir(plan, store)}")
        return 0
    result = ex.run()
    if result.pulled:
        print(f"pulled from the remote cache: {', '.join(result.pulled)}")
    if result.left:
        return split_build(args, recipe.name, result, time.perf_counter() - t0, remote)
    if until is not None:
        ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
        print(f"built {recipe.name} until '{until}' in {time.perf_counter() - t0:.1f}s; ran: {ran}")
        for s in plan.steps:
            print(f"  {s.name}: {result.entries[s.name].data}")
        return 0
    from cosycompile.exporters import exporter_infos

    outputs = {name: exporter_infos()[name].hook("export")(plan, store, result) for name in recipe.exports}
    bundle = outputs.get("bundle") or exporter_infos()["bundle"].hook("export")(plan, store, result)
    dt = time.perf_counter() - t0
    report = bundle / "report.md"
    if report.is_file() and not args.quiet:
        print(report.read_text())
    ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
    print(f"built {recipe.name} in {dt:.1f}s; ran: {ran}")
    print(f"bundle: {bundle}")
    g = recipe.validation.gate
    baseline = recipe.resolve_path(g.baseline) if g.baseline else None
    th = g.thresholds()
    return apply_gate(bundle, baseline, th["min"], th["max"], g.max_quality_drop, g.max_slowdown,
                       args.allow_unvalidated)


def split_build(args: argparse.Namespace, name: str, result: Any, seconds: float, remote: Any = None) -> int:
    """Exit 3: what this machine could build is cached; say which steps are left and the command that
    finishes them on the other machine (``split.finish_command``: keeps the remote, names no path of
    this machine's that the other lacks)."""
    from cosycompile.split import finish_command

    ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
    print(f"built {name} in part in {seconds:.1f}s; ran: {ran}")
    print(f"{len(result.left)} steps left for a machine that can run them:")
    for step, why in result.left.items():
        print(f"  {step}: {why}")
    cmd, plan, needs = finish_command(args.recipe, args.artifacts, remote.url if remote is not None else None,
                                      until=getattr(args, "until", None), allow_unvalidated=args.allow_unvalidated)
    print(f"finish with: {cmd}\n"
          f"  on a machine that has what is named above ({needs}); `{plan}` lists them")
    return EXIT_SPLIT
