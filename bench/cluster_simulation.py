"""Benchmark (simulated): how long a families x recipes x GPU kinds matrix takes on 1, 4 and 16 nodes,
and its critical path, from step durations recorded in caches.

The graph is the real one. Each family's rows are every shape a GPU recipe of the repository
builds ((stage, backend, format) per stage): the family's own recipe of that shape, else another
family's recipe with this family's model in its place (``NAME.FAMILY``); a shape the family cannot
plan is skipped and listed. Each row is retargeted to every GPU kind given (a combination the
recipe's formats cannot run on is skipped too), planned as a node of that kind would plan it, its
checks included (unless the checks do not run its engines: TensorRT-LLM, vLLM), and merged by key
as the Ray executor merges them (a shared ``reference`` or export is one step).
Each step's duration is the median ``seconds`` that caches (``--artifacts``, one or more; with
``--min-model-mb``, only entries built from a model that large) recorded for steps of the same name
and kind; a step no cache has run is given the median of the recorded steps of its kind's first
word (``engine``, ``quantize``, ...) and counted as assumed, or ``--default`` seconds. The nodes:
node i has a GPU of kind ``i mod K`` (K GPU kinds) and runs any CPU step; a GPU step runs on a node
of its kind; one step per node at a time. Scheduling is greedy list scheduling, ready steps taken
longest remaining path first, as a cluster scheduler that knew the durations would.

Usage: python bench/cluster_simulation.py --artifacts DIR [DIR ...] [--min-model-mb MB]
       [--nodes 1 4 16] [--targets h100 l20 a100 b200] [--json OUT]
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Each family's GPU recipes (the matrix's rows): every recipe of recipes/ whose target is a GPU, by family.
TARGETS = ("h100", "l20", "a100", "b200")  # four GPU kinds: sm90, sm89, sm80, sm100


@dataclass
class Node:
    """A step of the merged matrix."""

    name: str
    kind: str
    hardware: str | None
    seconds: float
    assumed: bool
    deps: set[str] = field(default_factory=set)
    recipes: set[str] = field(default_factory=set)


def recorded_seconds(caches: list[Path], min_model_mb: float = 0.0) -> dict[tuple[str, str], list[float]]:
    """(step name, kind) -> every ``seconds`` the caches' entries recorded; with ``min_model_mb``, only
    entries built from a ``model`` step whose files hold at least that many MB (one cache may hold
    builds of the tiny built-ins and of the 0.5B ones: their durations must not be mixed)."""
    bodies: dict[str, dict[str, Any]] = {}
    for cache in caches:
        for f in (cache / "cache" / "objects").glob("*/*/entry.json"):
            body = json.loads(f.read_text())
            if body.get("components"):
                bodies[body["key"]] = body
    sizes: dict[str, float | None] = {}

    def model_mb(key: str) -> float | None:
        """MB of the model the entry was built from (its ``model`` ancestor), None if not in the caches."""
        if key not in sizes:
            sizes[key] = None  # a cycle cannot occur (keys hash their inputs); this guards a bad cache
            body = bodies.get(key)
            if body is not None and body["step"] == "model":
                sizes[key] = sum(size for size, _ in body["files"].values()) / 1e6
            elif body is not None:
                found = [model_mb(k) for k in body["components"].get("inputs", {}).values()]
                sizes[key] = max((m for m in found if m is not None), default=None)
        return sizes[key]

    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for key, body in bodies.items():
        if body.get("seconds") is None:
            continue
        if min_model_mb > 0 and (model_mb(key) or 0.0) < min_model_mb:
            continue
        out[(body["step"], body["components"]["kind"])].append(float(body["seconds"]))
    return out


def gpu_recipes() -> dict[str, list[Path]]:
    """Family -> the repository's GPU recipes of it."""
    from cosycompile.core.targets import TARGETS as KNOWN
    from cosycompile.plan import model_input
    from cosycompile.recipe.schema import load_recipe

    out: dict[str, list[Path]] = defaultdict(list)
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        try:
            recipe = load_recipe(path)
        except Exception:  # noqa: BLE001 - a base recipe (no target of its own) is not a matrix row
            continue
        if KNOWN[recipe.target].kind == "gpu":
            out[model_input(recipe).family.name].append(path)
    return out


def shape(path: Path) -> tuple[tuple[str, str, str], ...]:
    """What a recipe builds, whatever its model and target: (stage, backend, format) per enabled stage."""
    from cosycompile.recipe.schema import load_recipe

    recipe = load_recipe(path)
    return tuple((s, recipe.stage(s).engine.backend, recipe.typed(s)["quantize"].format)
                 for s in recipe.enabled_stages())


def rows_by_family() -> dict[str, list[tuple[str, Path, str | None]]]:
    """Family -> its rows (name, recipe, model to put in its place or None): every shape that a GPU recipe
    of any family builds, taken from the family's own recipe of that shape where it has one, else from
    the other family's recipe with this family's model (``NAME.FAMILY``)."""
    from cosycompile.recipe.schema import load_recipe

    by_family = gpu_recipes()
    shapes: dict[tuple, Path] = {}
    for _, paths in sorted(by_family.items()):
        for path in paths:
            shapes.setdefault(shape(path), path)
    out: dict[str, list[tuple[str, Path, str | None]]] = {}
    for family, paths in sorted(by_family.items()):
        own = {shape(p): p for p in paths}
        model = load_recipe(paths[0]).model
        out[family] = [(own[sig].stem, own[sig], None) if sig in own else (f"{src.stem}.{family}", src, model)
                       for sig, src in shapes.items()]
    return out


def matrix(targets: tuple[str, ...], durations: dict[tuple[str, str], list[float]],
           default: float) -> tuple[dict[str, Node], list[str], list[str], list[str]]:
    """The merged step graph of every (family, recipe, target), the rows planned, those of them
    planned without checks (their engines are served by a process the checks do not run), and the
    rows skipped. Every other row is planned as a node of its GPU kind would plan it, checks included."""
    from cosycompile.cache.local import Store
    from cosycompile.core.graph import topo_order
    from cosycompile.plan import checks_run_on_target, plan_build
    from cosycompile.recipe.schema import load_recipe

    by_prefix: dict[str, list[float]] = defaultdict(list)
    for (_, kind), secs in durations.items():
        by_prefix[kind.split(".")[0]] += secs
    nodes: dict[str, Node] = {}
    rows, unchecked, skipped = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "keys")
        for family, recipes in rows_by_family().items():
            for name, path, model in recipes:
                for target in targets:
                    derived = Path(tmp) / f"{name}@{target}.yaml"
                    body = {"extends": str(path), "target": target, "name": f"{name}.{target}"}
                    derived.write_text(json.dumps(body | ({"model": model} if model else {})))
                    row = f"{family}/{name}@{target}"
                    try:
                        recipe = load_recipe(derived)
                        on_target = checks_run_on_target(recipe)
                        plan = plan_build(recipe, on_target=on_target)
                    except Exception as exc:  # noqa: BLE001 - a format the GPU or the family cannot run: not a row
                        skipped.append(f"{row}: {str(exc).splitlines()[0].replace(tmp + '/', '')[:240]}")
                        continue
                    rows.append(row)
                    if not on_target:
                        unchecked.append(row)
                    for s in topo_order(plan.steps):
                        key = s.key(store)
                        if key not in nodes:
                            secs = durations.get((s.name, s.kind))
                            prefix = by_prefix.get(s.kind.split(".")[0])
                            seconds = statistics.median(secs) if secs else statistics.median(prefix) if prefix else default
                            nodes[key] = Node(s.name, s.kind, s.hardware, seconds, not secs)
                        nodes[key].deps |= {d.key(store) for d in s.deps.values()}
                        nodes[key].recipes.add(row)
    return nodes, rows, unchecked, skipped


def critical_path(nodes: dict[str, Node]) -> tuple[float, list[str], dict[str, float]]:
    """The longest chain of step durations (a lower bound on any cluster's wall time), its steps, and
    each step's longest remaining path (itself and what must follow it)."""
    users: dict[str, list[str]] = defaultdict(list)
    for k, n in nodes.items():
        for d in n.deps:
            users[d].append(k)
    tail: dict[str, float] = {}

    def rest(k: str) -> float:
        if k not in tail:
            tail[k] = nodes[k].seconds + max((rest(u) for u in users[k]), default=0.0)
        return tail[k]

    for k in nodes:
        rest(k)
    start = max((k for k in nodes if not nodes[k].deps), key=tail.__getitem__)
    chain = [start]
    while users[chain[-1]]:
        chain.append(max(users[chain[-1]], key=tail.__getitem__))
    return tail[start], chain, tail


def simulate(nodes: dict[str, Node], n_nodes: int, kinds: list[str], tail: dict[str, float]) -> dict[str, Any]:
    """Greedy list scheduling on ``n_nodes``: GPU kind j is on node ``j mod n_nodes`` and, with more
    nodes than kinds, node i has kind ``i mod K`` (so one node has every kind, 16 nodes have 4 of each)."""
    kind_of = [{kinds[j] for j in range(len(kinds)) if j % n_nodes == i} | {kinds[i % len(kinds)]}
               for i in range(n_nodes)]
    waiting = {k: set(n.deps) for k, n in nodes.items()}
    users: dict[str, list[str]] = defaultdict(list)
    for k, n in nodes.items():
        for d in n.deps:
            users[d].append(k)
    ready = [k for k, deps in waiting.items() if not deps]
    free = list(range(n_nodes))
    events: list[tuple[float, str, int]] = []
    now, busy, done = 0.0, [0.0] * n_nodes, 0
    while ready or events:
        ready.sort(key=lambda k: -tail[k])
        for k in list(ready):
            hw = nodes[k].hardware
            fit = [i for i in free if hw is None or hw in kind_of[i]]
            if not fit:
                continue
            # A CPU step prefers a node whose GPU no ready step is waiting for.
            i = fit[0] if hw else min(fit, key=lambda j: sum(nodes[r].hardware in kind_of[j] for r in ready))
            free.remove(i)
            ready.remove(k)
            busy[i] += nodes[k].seconds
            heapq.heappush(events, (now + nodes[k].seconds, k, i))
        if not events:
            break
        now, k, i = heapq.heappop(events)
        free.append(i)
        done += 1
        for u in users[k]:
            waiting[u].discard(k)
            if not waiting[u]:
                ready.append(u)
    return {"nodes": n_nodes, "wall_s": now, "steps_run": done, "busy_share": sum(busy) / (n_nodes * now) if now else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, nargs="+", required=True, help="caches whose entries give durations")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--targets", nargs="+", default=list(TARGETS))
    ap.add_argument("--default", type=float, default=60.0, help="seconds of a step kind no cache recorded")
    ap.add_argument("--min-model-mb", type=float, default=0.0,
                    help="take durations only from entries built from a model of at least this many MB "
                         "(e.g. 500: the 0.5B built-ins, not the tiny ones in the same cache)")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    durations = recorded_seconds(args.artifacts, args.min_model_mb)
    nodes, rows, unchecked, skipped = matrix(tuple(args.targets), durations, args.default)
    length, chain, tail = critical_path(nodes)
    from cosycompile.core.targets import TARGETS as KNOWN

    kinds = sorted({KNOWN[t].sm_tag for t in args.targets})
    total = sum(n.seconds for n in nodes.values())
    runs = [simulate(nodes, n, kinds, tail) for n in args.nodes]
    assumed = sorted({f"{n.name} ({n.kind})" for n in nodes.values() if n.assumed})
    print(f"matrix: {len(rows)} (family, recipe, target) rows, {len(nodes)} distinct steps "
          f"({sum(len(n.recipes) for n in nodes.values())} before merging by key); {len(skipped)} rows skipped")
    recipes = {family: [name for name, _, _ in rs] for family, rs in rows_by_family().items()}
    for family, names in recipes.items():
        planned = [r for r in rows if r.startswith(f"{family}/")]
        some = [n for n in names if any(r.startswith(f"{family}/{n}@") for r in planned)]
        print(f"  {family}: {len(some)} of {len(names)} recipes plannable ({', '.join(names)}); {len(planned)} rows")
    print(f"rows planned without checks (engines served by a process the checks do not run): {len(unchecked)}")
    print(f"work: {total:.1f} s in all; critical path {length:.1f} s: "
          + " -> ".join(f"{nodes[k].name} ({nodes[k].seconds:.1f})" for k in chain))
    print(f"durations assumed (no cache recorded the step): {', '.join(assumed) or 'none'}")
    print("GPU kinds: " + ", ".join(kinds) + "; kind j on node j mod N, node i has kind i mod %d; "
          "every node runs CPU steps" % len(kinds))
    print("| nodes | wall s | speed-up vs 1 | busy share |\n|---|---|---|---|")
    for r in runs:
        print(f"| {r['nodes']} | {r['wall_s']:.1f} | {runs[0]['wall_s'] / r['wall_s']:.2f} | {r['busy_share']:.0%} |")
    for s in skipped:
        print(f"skipped: {s}")
    if args.json:
        args.json.write_text(json.dumps({"recipes": recipes, "rows": rows, "unchecked": unchecked, "skipped": skipped,
                                         "steps": len(nodes),
                                         "work_s": total,
                                         "critical_path_s": length,
                                         "critical_path": [nodes[k].name for k in chain], "assumed": assumed,
                                         "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
