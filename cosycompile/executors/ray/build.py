"""The Ray executor's driver: the recipes' steps as Ray tasks, each step of the matrix once.

The driver plans every recipe here, merges their steps by key (a ``reference`` or an export that
several recipes share is one task), and submits a step once its inputs are in the remote cache. A
step that builds or runs a GPU target's engines asks for the target's ``sm_tag`` as a Ray resource
(a node started with ``--resources '{"sm89": 1}'`` offers it); every other step asks for the CPUs it
runs on (its ``threads``, one by default) and goes to any node. A step also asks for the memory its
last runs peaked at (the largest ``peak_rss_mb`` the driver's cache recorded for a step of the same
name and kind, with a margin), so Ray does not start more of them on a node than it holds;
requests are capped at what the largest live node offers, so a step never waits for a node that
cannot exist. Tasks move no artifact bytes through Ray: each pulls its inputs from the remote
cache and pushes its output there (:mod:`.task`). A step that no live node can run is left, as in a
split build (exit 3), after :data:`NO_NODE_GRACE_S` at most: never waited on without end.

A GPU recipe whose engines this machine cannot run is planned as its target's machine would plan
it, checks included, when the cluster has a node that offers the target's sm tag and a GPU
(``ray start`` counts a machine's GPUs itself): its checks go to that node like its engines. Without
such a node the recipe ends "built, not validated", as on this machine alone.

When every step of a recipe is built, the recipe is assembled here through the local executor,
which pulls what the bundle holds from the remote cache and builds nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosycompile.core.graph import BuildResult, Step, topo_order
from cosycompile.errors import BuildFailed, UserError

POLL_S = 2.0
# How long a step may wait for a node with its hardware once none is alive (a node restarting
# rejoins within it; a kind the cluster never had is known at once and left without waiting).
NO_NODE_GRACE_S = 30.0
# A task whose node dies is run again elsewhere this many times (Ray's own retry of system failures).
MAX_RETRIES = 3
# A step's memory request over the largest peak recorded for its kind: the same step on other inputs
# (another recipe's model, more eval items) may need somewhat more.
MEMORY_MARGIN = 1.25


@dataclass
class Job:
    """One step of the matrix (one key), whichever recipes share it."""

    step: Step
    key: str
    recipe: Path  # a recipe that has it: the node plans that one
    on_target: bool = False  # ... as a machine of its target would (BuildPlan.on_target)
    recipes: list[str] = field(default_factory=list)
    state: str = "todo"  # todo, done (in a cache before the build), built, left
    why: str = ""
    node: str = ""
    seconds: float = 0.0

    @property
    def needs(self) -> str:
        return self.step.hardware or "CPU"


def build(plans: list[Any], store: Any, reporter: Any, *, remote: Any, address: str | None,
          force: bool = False) -> list[BuildResult]:
    """Build every plan's steps on the cluster at ``address``, then assemble each recipe here. A plan
    whose checks go to the cluster's GPU nodes is replaced in ``plans`` (:func:`plan_checks_on_gpu_nodes`)."""
    from cosycompile.executors.ray.cluster import connect, describe, live_nodes

    assert address is not None  # parse_executor names one or refuses
    if force:
        raise UserError("--force with --executor ray: not supported (steps are found by key in the remote "
                        "cache); remove the entries with `cosycompile cache gc` or build with the local executor")
    jobs = _jobs(plans, store)
    _prune(jobs, plans, store, remote)
    if any(j.state == "todo" for j in jobs.values()):  # a build with nothing to run needs no cluster
        ray = connect(address)
        try:
            nodes = live_nodes(ray)
            reporter.line(f"ray cluster {address}: {describe(nodes)}")
            if remote is None and len(nodes) > 1:
                raise UserError(f"Ray cluster {address}: {len(nodes)} nodes share no cache: give --cache-remote "
                                "URL (an S3 bucket every node reaches), through which steps pass their outputs")
            if plan_checks_on_gpu_nodes(plans, nodes, reporter):
                jobs = _jobs(plans, store)
                _prune(jobs, plans, store, remote)
            _schedule(ray, jobs, store, remote, reporter)
        finally:
            ray.shutdown()
    return _assemble(plans, jobs, store, reporter, remote)


def _jobs(plans: list[Any], store: Any) -> dict[str, Job]:
    """Every step of every plan by key, in dependency order (dicts keep insertion order)."""
    jobs: dict[str, Job] = {}
    for plan in plans:
        for s in topo_order(plan.steps):
            key = s.key(store)
            if key not in jobs:
                jobs[key] = Job(s, key, Path(plan.recipe.source).resolve(), plan.on_target)
            jobs[key].recipes.append(plan.recipe.name)
    store.stat_cache.save()
    return jobs


def plan_checks_on_gpu_nodes(plans: list[Any], nodes: list[Any], reporter: Any) -> bool:
    """Replace, in ``plans``, each whole plan that ends "built, not validated" here with the plan of its
    target's machine (checks included), when a live node offers the target's sm tag and a GPU and the
    checks run the recipe's backends. True if any plan was replaced."""
    from cosycompile.core.targets import TARGETS
    from cosycompile.plan import checks_run_on_target, plan_build

    replaced = False
    for i, plan in enumerate(plans):
        target = TARGETS[plan.recipe.target]
        if not plan.not_validated or plan.steps != [plan.final] or target.kind != "gpu":
            continue
        if not checks_run_on_target(plan.recipe) or not any(n.offers(target.sm_tag) and n.offers("GPU") for n in nodes):
            continue
        plans[i] = plan_build(plan.recipe, on_target=True)
        reporter.line(f"{plan.recipe.name}: its checks go to the cluster's {target.sm_tag} GPU nodes "
                      "(this machine cannot run its engines)")
        replaced = True
    return replaced


def _prune(jobs: dict[str, Job], plans: list[Any], store: Any, remote: Any) -> None:
    """Mark what is already built (here or in the remote) done, and what nothing needs skipped: a
    step whose dependents are all built is not run again, whatever became of its own entry."""
    def built(job: Job) -> bool:
        if store.lookup(job.key) is not None:
            return True
        try:
            return remote is not None and remote.has(job.key)
        except Exception as exc:  # noqa: BLE001 - one line, whatever the storage library raised
            raise UserError(f"remote cache {remote.url}: lookup failed ({_first_line(exc)}); the cluster's tasks "
                            "exchange their outputs through it") from None

    needed: set[str] = set()

    def visit(s: Step) -> None:
        key = s.key(store)
        if key in needed or jobs[key].state == "done":
            return
        if built(jobs[key]):
            jobs[key].state, jobs[key].why = "done", "cached"
            return
        needed.add(key)
        for d in s.deps.values():
            visit(d)

    for plan in plans:
        for s in plan.steps:
            visit(s)
    for key, job in jobs.items():
        if job.state == "todo" and key not in needed:
            job.state, job.why = "skip", "not needed: what depends on it is built"


def recorded_peaks(store: Any) -> dict[tuple[str, str], float]:
    """(step name, kind) -> the largest peak RSS in MiB that the store's entries recorded for it."""
    peaks: dict[tuple[str, str], float] = {}
    for body in store.bodies():
        peak, kind = body.get("peak_rss_mb"), (body.get("components") or {}).get("kind")
        if isinstance(peak, (int, float)) and peak > 0 and isinstance(kind, str):
            k = (str(body.get("step")), kind)
            peaks[k] = max(peaks.get(k, 0.0), float(peak))
    return peaks


def step_threads(step: Step) -> int:
    """The CPUs a step runs on: its ``threads`` (the reference, the stage checks) or its validation's
    speed threads (the pipeline check); 1 for the rest."""
    p = step.params
    validation = p.get("validation") if isinstance(p.get("validation"), dict) else {}
    threads = p.get("threads") or (validation.get("speed") or {}).get("threads")
    return max(1, int(threads or 1))


def expected_peak(step: Step, peaks: dict[tuple[str, str], float]) -> float | None:
    """The peak RSS in MiB ``step`` is expected to reach: its kind's recorded peak, else the largest
    recorded for a step of the same name (the stage's step built with another format or backend: a
    kind never built here still asks for about what its stage needed), else None."""
    same_name = [v for (name, _), v in peaks.items() if name == step.name]
    return peaks.get((step.name, step.kind)) or (max(same_name) if same_name else None)


def task_options(step: Step, peaks: dict[tuple[str, str], float], nodes: list[Any]) -> dict[str, Any]:
    """Ray's ``num_cpus``, ``resources`` and (when a peak is expected, :func:`expected_peak`) ``memory``
    for ``step``.

    A GPU-kind step is counted in its GPU kind (one at a time per unit a node offers), not in CPUs: a
    GPU node started with --num-cpus=0 then takes only the steps that need it. CPU and memory
    requests are capped at the largest of the live nodes that can run it, so they stay placeable.
    """
    hw = step.hardware
    eligible = [n for n in nodes if n.offers(hw or "CPU")]
    if hw:
        options: dict[str, Any] = {"num_cpus": 0, "resources": {hw: 1}}
        if any(n.offers("GPU") for n in eligible):
            # A node of that kind with its GPUs counted by Ray: one of them, so the step gets a GPU of
            # its own (CUDA_VISIBLE_DEVICES) and goes to a node that has one.
            options["num_gpus"] = 1
    else:
        most_cpus = max((n.resources.get("CPU", 0.0) for n in eligible), default=0.0)
        options = {"num_cpus": max(1, min(step_threads(step), int(most_cpus))), "resources": {}}
    peak = expected_peak(step, peaks)
    most_memory = max((n.resources.get("memory", 0.0) for n in eligible), default=0.0)
    if peak and most_memory:  # no node reports its memory: Ray would not count a request either
        options["memory"] = min(int(peak * MEMORY_MARGIN * 2**20), int(most_memory))
    return options


def describe_request(options: dict[str, Any]) -> str:
    """``CPU x2, 1.9 GB`` / ``sm89``: what a step's Ray options ask for, for the progress line."""
    parts = [*options["resources"], *(["GPU"] if options.get("num_gpus") else [])] or [f"CPU x{options['num_cpus']}"]
    if options.get("memory"):
        parts.append(f"{options['memory'] / 2**30:.1f} GB")
    return ", ".join(parts)


def _schedule(ray: Any, jobs: dict[str, Job], store: Any, remote: Any, reporter: Any) -> None:
    """Submit each step once its inputs are built; wait, a poll at a time; leave what no node can run."""
    from cosycompile.executors.ray.cluster import live_nodes
    from cosycompile.executors.ray.task import run_step

    task = ray.remote(run_step)
    peaks = recorded_peaks(store)
    todo = [k for k, j in jobs.items() if j.state == "todo"]
    total = len(todo)
    width = max((len(jobs[k].step.name) for k in todo), default=0)
    number = {k: i for i, k in enumerate(todo, 1)}
    running: dict[Any, str] = {}
    unplaceable_since: dict[str, float] = {}

    def tag(key: str) -> str:
        return f"[{number[key]:>2}/{total}] {jobs[key].step.name:<{width}}"

    def leave(key: str, why: str) -> None:
        jobs[key].state, jobs[key].why = "left", why
        reporter.line(f"{tag(key)}  left     ({why})")

    def deps_state(job: Job) -> set[str]:
        return {jobs[d.key(store)].state for d in job.step.deps.values()}

    while True:
        nodes = live_nodes(ray)
        # Left: steps whose input was left, and steps whose hardware no live node offers.
        for key in todo:
            job = jobs[key]
            if job.state != "todo":
                continue
            upstream = sorted(d.name for d in job.step.deps.values() if jobs[d.key(store)].state == "left")
            if upstream:
                leave(key, f"waits for {', '.join(upstream)}")
            elif not any(n.offers(job.needs) for n in nodes):
                leave(key, f"no node of the cluster offers {job.needs}")
        now = time.monotonic()
        for ref, key in list(running.items()):
            if any(n.offers(jobs[key].needs) for n in nodes):
                unplaceable_since.pop(key, None)
            elif now - unplaceable_since.setdefault(key, now) > NO_NODE_GRACE_S:
                ray.cancel(ref, force=True)
                del running[ref]
                leave(key, f"the nodes offering {jobs[key].needs} left the cluster")
        for key in todo:
            job = jobs[key]
            if job.state == "todo" and key not in running.values() and deps_state(job) <= {"done", "built"}:
                options = {**task_options(job.step, peaks, nodes), "max_retries": MAX_RETRIES,
                           "retry_exceptions": False, "name": f"cosycompile {job.step.name}"}
                ref = task.options(**options).remote(str(job.recipe), job.step.name, key,
                                                     remote.url if remote is not None else None,
                                                     str(store.root.resolve()), job.on_target)
                running[ref] = key
                job.state = "running"
                reporter.line(f"{tag(key)}  queued   (needs {describe_request(options)}; in no cache)")
        if not running:
            return
        finished, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
        for ref in finished:
            key = running.pop(ref)
            _finish(ray, ref, jobs[key], running, tag(key), reporter)


def _finish(ray: Any, ref: Any, job: Job, running: dict[Any, str], tag: str, reporter: Any) -> None:
    """Record a finished task; a failed step stops the build with one line (the others are cancelled)."""
    try:
        out = ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - a step's error or a node lost more than MAX_RETRIES times
        for other in running:
            ray.cancel(other, force=True)
        raise BuildFailed(f"step {job.step.name} ({job.key[:12]}) failed on the cluster: {_first_line(exc)}") from None
    job.node = out.get("node", "")
    if "left" in out:
        job.state, job.why = "left", f"node {job.node} cannot run it: {out['left']}"
        reporter.line(f"{tag}  left     ({job.why})")
        return
    job.state, job.seconds = "built", float(out.get("seconds") or 0.0)
    how = "built" if out.get("ran") else "found"
    reporter.line(f"{tag}  done     {job.key[:12]}  {job.seconds:.1f}s  {how} on {job.node}")


def _first_line(exc: BaseException) -> str:
    """The step's own error, not Ray's wrapper of it."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # A Ray task error's text ends with the exception line itself.
    return (lines[-1] if lines else type(cause).__name__)[:300]


def _assemble(plans: list[Any], jobs: dict[str, Job], store: Any, reporter: Any, remote: Any) -> list[BuildResult]:
    """Each recipe's BuildResult: pulled through the local executor when all its steps are built, else
    the steps the cluster left (a split build)."""
    from cosycompile.core.graph import Reporter
    from cosycompile.plan import executor

    results = []
    for plan in plans:
        own = {s.key(store): s.name for s in topo_order(plan.steps)}
        left = {name: jobs[k].why for k, name in own.items() if jobs[k].state == "left"}
        ran = [name for k, name in own.items() if jobs[k].state == "built"]
        if left:
            results.append(BuildResult(ran, [], {}, {}, left))
            continue
        reporter.line(f"assembling {plan.recipe.name} here from the remote cache")
        result = executor(plan, store, Reporter(quiet=True), remote=remote).run()
        # What this machine ran while assembling is nothing, unless the remote failed it.
        result.ran = ran + result.ran
        results.append(result)
    return results
