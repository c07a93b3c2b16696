"""Engine backends as plug-ins: each sub-folder is one backend, named as recipes name it
(``stages.<stage>.engine.backend``).

A backend folder's ``__init__.py`` is light (no runtime imports): ``PLUGIN = BackendInfo(...)``
with its typed options and what it can build. Its ``build.py`` holds the two verbs every backend
has::

    build(src: Path, options: Options, target: Target, out: Path, cache_dir: Path | None) -> dict
        # graphs dir -> engine dir; cache_dir holds result-neutral caches (timing caches)
    load(engine_dir: Path, threads: int) -> dict[str, Runner]              # engine dir -> runners

``build`` returns the backend's own passport fields; the engine step adds the common ones
(backend name, target, precision, graph specs, key) and writes ``engine.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from cosycompile.core.plugins import discover, load_object, resolve_ref
from cosycompile.core.targets import Target


def option_error(key: str, value: Any, message: str) -> ValidationError:
    """The error a backend's options validator raises for one option: the recipe's message then
    names ``stages.<stage>.engine.options.<key>`` and ``message``, without pydantic's decoration."""
    return ValidationError.from_exception_data("Options", [InitErrorDetails(
        type=PydanticCustomError("backend_option", message), loc=(key,), input=value)])


@dataclass(frozen=True)
class BackendInfo:
    """What recipes and the planner need to know about a backend without importing it."""

    options: type[BaseModel]
    tools: tuple[str, ...]  # distributions whose versions enter the engine key
    target_kinds: tuple[str, ...]  # "cpu", "gpu"
    consumes: str = "onnx"  # "onnx": a graphs dir of ONNX files; "checkpoint": an LLM checkpoint export
    stages: tuple[str, ...] | None = None  # None: any stage whose graphs it consumes
    check_format: Callable[[str, str, Any, int], tuple[str, str] | None] | None = None
    check_target: Callable[[Target], str | None] | None = None
    unavailable: str | None = None  # why this version of cosycompile cannot build with it at all
    # Why this machine cannot build with it (its builder is not installed), checked before any step
    # runs; called lazily so that validating a recipe imports nothing heavy. (target, the engine's
    # options or None) -> the reason or None; the options name which builder a backend uses.
    build_problem: Callable[[Target, Any], str | None] | None = None
    # Why engines built for ``target`` cannot run on this machine (no GPU, another compute capability);
    # the build then ends "built, not validated here" instead of running the checks.
    run_problem: Callable[[Target], str | None] | None = None
    # Whether the checks run its engines on a machine of the target's kind (False: they never do, e.g.
    # an engine served by another process; a cluster then has no node to send its checks to).
    checks_run: bool = True
    build: str = ".build:build"
    load: str = ".build:load"
    name: str = ""
    package: str = ""

    def target_problem(self, target: Target) -> str | None:
        """A reason the backend cannot build for ``target``, or None."""
        if target.kind not in self.target_kinds:
            return f"it builds for {'/'.join(self.target_kinds)} targets only"
        return self.check_target(target) if self.check_target else None

    def ref(self, attr: str) -> str:
        return resolve_ref(self.package, getattr(self, attr))

    def hook(self, attr: str) -> Any:
        """Import and return ``build`` or ``load`` (heavy imports happen here)."""
        return load_object(self.ref(attr))


def backend_infos() -> dict[str, BackendInfo]:
    """Every backend plug-in by name."""
    return discover("backends")
