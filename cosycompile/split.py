"""Split builds across machines: the command that finishes one elsewhere, and the steps left as JSON.

A build that exits 3 has cached every step this machine can run; another machine (a GPU server, a
CI job, an orchestrator's worker) finishes it. What is printed or emitted here is read on that other
machine, so it names nothing that exists only here. No step imports this module: how a build is
handed on must not change any key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

DEFAULT_ARTIFACTS = Path("artifacts")
EXIT_SPLIT = 3  # a split build: every step this machine can run is cached, the rest is listed


def portable_path(path: Path, cwd: Path | None = None) -> str:
    """``path`` as the other machine can use it, from a checkout of the same repository.

    A relative path is kept as the user gave it (it names the same file in that checkout). An
    absolute path inside the working directory (the repository) becomes relative to it: the other
    machine's checkout sits elsewhere. Any other absolute path is kept: nothing better names it.
    """
    if not path.is_absolute():
        return str(path)
    here = (cwd or Path.cwd()).resolve()
    try:
        return str(path.resolve().relative_to(here))
    except ValueError:
        return str(path)


def finish_command(recipe: Path, artifacts: Path, remote_url: str | None, until: str | None = None,
                   allow_unvalidated: bool = False, cwd: Path | None = None) -> tuple[str, str, str]:
    """The ``cosycompile build`` that finishes a split build on another machine, the ``plan --todo``
    that lists what it will run there, and what that machine needs besides.

    With a remote cache the steps built here travel through it, so the commands keep
    ``--cache-remote`` and name no artifacts dir that lies outside the repository (this machine's
    absolute folder would not exist there; the other machine's own cache pulls what it needs).
    Without one, the other machine must see this cache (the same folder, a shared mount or a copy
    of its ``cache/``), so the artifacts dir is named as portably as it can be.
    """
    common = [portable_path(recipe, cwd)]
    art = portable_path(artifacts, cwd)
    if artifacts != DEFAULT_ARTIFACTS and (remote_url is None or not Path(art).is_absolute()):
        common += ["--artifacts", art]
    if remote_url:
        common += ["--cache-remote", remote_url]
    build = ["cosycompile", "build", *common]
    if until:
        build += ["--until", until]
    if allow_unvalidated:
        build.append("--allow-unvalidated")
    plan = ["cosycompile", "plan", *common, "--todo"]
    if remote_url:
        needs = f"the steps built here are in the remote cache {remote_url}"
    else:
        needs = f"with this artifacts dir ({art}), a shared mount of it or a copy of its cache/"
    return _join(build), _join(plan), needs


def _join(parts: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(p) for p in parts)


def todo_json(recipe: Any, items: Iterable[Any], target: Any) -> dict[str, Any]:
    """The steps a plan would run (``plan --todo --json``), one JSON-able object for an orchestrator.

    Each step: ``name``, ``kind``, ``key``, ``why`` (the reason the text form prints), ``state``
    (``run``: this machine runs it; ``left``: it does not; ``remote``: a build pulls it) and
    ``needs``: the ``target`` (name, ``cpu``/``gpu``, compute capability, GPU) where the step's
    output depends on it, the ``backend`` it builds or runs with, ``blocked`` (why this machine
    cannot run it itself, or null) and ``waits_for`` (the left steps it needs first).
    """
    items = list(items)
    left = {i.step.name for i in items if i.left}
    steps = []
    for i in items:
        if i.cached:
            continue
        s = i.step
        blocked = s.blocked() if (i.left and s.blocked) else None
        steps.append({
            "name": s.name,
            "kind": s.kind,
            "key": i.key,
            "why": i.reason,
            "state": "remote" if i.remote else "left" if i.left else "run",
            "needs": {
                "target": _target(target) if s.target else None,
                "backend": s.params.get("backend") if isinstance(s.params.get("backend"), str) else None,
                "blocked": blocked,
                "waits_for": sorted(d.name for d in s.deps.values() if d.name in left),
            },
        })
    return {
        "recipe": recipe.name,
        "source": str(recipe.source),
        "steps_total": len(items),
        "todo": len(steps),
        "left": sum(st["state"] == "left" for st in steps),
        "steps": steps,
    }


def _target(target: Any) -> dict[str, Any]:
    return {"name": target.name, "kind": target.kind, "sm": target.sm_tag if target.sm else None,
            "gpu": target.gpu_name or None}
