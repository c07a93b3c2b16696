"""``build`` and ``plan``: loading recipes and planning their steps against the store, then running
them with an executor (with the split-build hand-off, the exports and the gate) or listing them."""

from __future__ import annotations

import argparse
import time
from typing import Any

from cosycompile.commands.gate import apply_gate
from cosycompile.errors import UserError
from cosycompile.split import EXIT_SPLIT


def plan_recipe(args: argparse.Namespace) -> int:
    """``plan``: every step of the recipe with its key, and which would run and why (no work, and no
    network call: a lookup per missing step could wait on a silent server, and the plan is only a
    forecast; a build pulls whatever the remote holds when it runs)."""
    from cosycompile.exporters.bundle.export import bundle_dir
    from cosycompile.plan import executor, plan_build
    from cosycompile.cache.local import Store
    from cosycompile.core.graph import Reporter
    from cosycompile.cache.remote import remote_from
    from cosycompile.recipe.schema import load_recipe

    remote = remote_from(args.cache_remote)  # a mistyped URL is refused before any work
    recipe = load_recipe(args.recipe)
    if args.json and not args.todo:
        raise UserError("plan --json lists the steps that would run: give it with --todo")
    plan = plan_build(recipe)
    store = Store(args.artifacts)
    ex = executor(plan, store, Reporter(quiet=args.quiet), force=args.force)
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


def build_recipes(args: argparse.Namespace) -> int:
    """``build``: every recipe planned before any work, built by the chosen executor (steps the
    recipes share run once), then each bundle exported and gated; a matrix ends in one table.

    Exit status: 1 if any recipe failed its gate, else 3 if any was left in part, else 0.
    """
    from cosycompile.cache.local import Store
    from cosycompile.cache.remote import remote_from
    from cosycompile.core.graph import Reporter
    from cosycompile.executors import parse_executor
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    t0 = time.perf_counter()
    info, address = parse_executor(args.executor)  # a bad value is refused before any work
    remote = remote_from(args.cache_remote)
    recipes = [load_recipe(path) for path in args.recipe]
    for recipe in recipes:
        if recipe.validation.gate.baseline:
            from cosycompile.validate.gate import load_report

            load_report(recipe.resolve_path(recipe.validation.gate.baseline))  # read before any work
    until = getattr(args, "until", None)
    plans = [plan_build(recipe, until=until) for recipe in recipes]
    store = Store(args.artifacts)
    reporter = Reporter(quiet=args.quiet)
    results = info.hook("build")(plans, store, reporter, remote=remote, address=address, force=args.force)
    rows = []
    statuses = []
    for path, plan, result in zip(args.recipe, plans, results):
        status, bundle = _finish(args, path, plan, store, result, remote, time.perf_counter() - t0)
        statuses.append(status)
        rows.append(_summary_row(plan, result, bundle, status))
    if len(plans) > 1:
        _print_summary(rows, time.perf_counter() - t0, info.name)
    return 1 if 1 in statuses else EXIT_SPLIT if EXIT_SPLIT in statuses else max(statuses)


def _finish(args: argparse.Namespace, path: Any, plan: Any, store: Any, result: Any, remote: Any,
            seconds: float) -> tuple[int, Any]:
    """One recipe after its steps ran: the split-build hand-off, the --until listing, or its exports
    and gate. Returns the exit status and the bundle (None when none was written)."""
    recipe = plan.recipe
    until = getattr(args, "until", None)
    if result.pulled:
        print(f"pulled from the remote cache: {', '.join(result.pulled)}")
    if result.left:
        return split_build(args, path, recipe.name, result, seconds, remote), None
    if until is not None:
        ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
        print(f"built {recipe.name} until '{until}' in {seconds:.1f}s; ran: {ran}")
        for s in plan.steps:
            print(f"  {s.name}: {result.entries[s.name].data}")
        return 0, None
    from cosycompile.exporters import exporter_infos

    outputs = {name: exporter_infos()[name].hook("export")(plan, store, result) for name in recipe.exports}
    bundle = outputs.get("bundle") or exporter_infos()["bundle"].hook("export")(plan, store, result)
    report = bundle / "report.md"
    if report.is_file() and not args.quiet:
        print(report.read_text())
    ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
    print(f"built {recipe.name} in {seconds:.1f}s; ran: {ran}")
    print(f"bundle: {bundle}")
    g = recipe.validation.gate
    baseline = recipe.resolve_path(g.baseline) if g.baseline else None
    th = g.thresholds()
    return apply_gate(bundle, baseline, th["min"], th["max"], g.max_quality_drop, g.max_slowdown,
                      args.allow_unvalidated), bundle


def _summary_row(plan: Any, result: Any, bundle: Any, status: int) -> list[str]:
    from collections import Counter

    nodes = Counter(str(e.meta.get("node") or "?") for e in result.entries.values())
    built_on = ", ".join(f"{n} {c}" for n, c in sorted(nodes.items())) or "-"
    gate = {0: "pass", 1: "FAIL", EXIT_SPLIT: f"left {len(result.left)} steps"}.get(status, str(status))
    return [plan.recipe.name, plan.recipe.target, bundle.name if bundle is not None else "-", gate,
            str(len(result.ran)), built_on]


def _print_summary(rows: list[list[str]], seconds: float, executor: str) -> None:
    head = ["recipe", "target", "bundle", "gate", "steps run", "steps built on (node: steps)"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print(f"\n{len(rows)} recipes with the {executor} executor in {seconds:.1f}s:")
    for r in [head, *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def split_build(args: argparse.Namespace, recipe_path: Any, name: str, result: Any, seconds: float,
                remote: Any = None) -> int:
    """Exit 3: what this machine could build is cached; say which steps are left and the command that
    finishes them on the other machine (``split.finish_command``: keeps the remote, names no path of
    this machine's that the other lacks)."""
    from cosycompile.split import finish_command

    ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
    print(f"built {name} in part in {seconds:.1f}s; ran: {ran}")
    print(f"{len(result.left)} steps left for a machine that can run them:")
    for step, why in result.left.items():
        print(f"  {step}: {why}")
    cmd, plan, needs = finish_command(recipe_path, args.artifacts, remote.url if remote is not None else None,
                                      until=getattr(args, "until", None), allow_unvalidated=args.allow_unvalidated)
    print(f"finish with: {cmd}\n"
          f"  on a machine that has what is named above ({needs}); `{plan}` lists them")
    return EXIT_SPLIT
