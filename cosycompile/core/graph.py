"""The build graph: steps with content keys, and an executor that runs only what is missing.

A step's key hashes (kind, implementation source, resolved params, its inputs' keys, external
files' content digests, tool releases, target) — never its outputs, which need not be
deterministic. Working out every key touches no heavy library, so a fully cached build is fast.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

from cosycompile.core.finite import check_finite_outputs
from cosycompile.core.memory import peak_mb, release_free_memory, reset_peak
from cosycompile.core.store import ArtifactStore, Entry
from cosycompile.core.hashing import digest_files, digest_obj, tool_identities

T = TypeVar("T")


class RemoteTier(Protocol):
    """What the executor needs of a remote cache (``cosycompile.cache.remote.RemoteCache``).

    Named structurally, not imported: this module is in every step's code digest, and how entries
    travel to other machines must not change any key.
    """

    url: str

    def has(self, key: str) -> bool: ...

    def pull(self, store: ArtifactStore, key: str) -> Entry | None: ...

    def push(self, store: ArtifactStore, entry: Entry) -> Any: ...

    def claim(self, store: ArtifactStore, key: str, step: str, waiting: Callable[[str], None]) -> Any: ...


@dataclass
class Claimed:
    """What waiting on another machine's claim came to: ``pulled`` when it built the step meanwhile."""

    pulled: bool = False


@dataclass
class StepContext:
    """What a running step sees: its params, its inputs' output dirs, and a place to write."""

    name: str
    key: str
    params: dict[str, Any]
    inputs: dict[str, Path]
    files: dict[str, list[Path]]
    file_roots: dict[str, Path]
    out: Path
    target: str | None
    reporter: "Reporter"
    spec: Any = None  # the plug-in's typed spec (quantizer spec, backend options, check workload)
    # A folder shared across steps for caches that speed work up without changing results
    # (TensorRT timing caches); never part of a key.
    cache_dir: Path | None = None

    def progress(self, items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
        """Iterate with a progress bar on a terminal (plain when not)."""
        return self.reporter.progress(items, total=total, desc=f"{self.name} {desc}".strip())

    def log(self, msg: str) -> None:
        self.reporter.detail(self.name, msg)


@dataclass(eq=False)
class Step:
    """A node of the build graph.

    ``run`` fills ``ctx.out`` and may return JSON-able metadata that is stored with the entry.
    The key's code digest is the static import closure of ``run``'s module plus ``code`` (modules
    the body reaches through a plug-in registry, which no import statement names); ``spec`` is the
    plug-in's typed spec, hashed as JSON and handed to the body; ``tools`` are distributions whose
    releases matter to the output (keyed by :func:`~cosycompile.core.hashing.tool_identity`, so other
    builds of the same release, e.g. a CUDA torch, reuse the step).
    """

    name: str
    kind: str
    run: Callable[[StepContext], dict[str, Any] | None]
    params: dict[str, Any] = field(default_factory=dict)
    deps: dict[str, "Step"] = field(default_factory=dict)
    files: dict[str, tuple[Path, list[Path]]] = field(default_factory=dict)  # name -> (root, files)
    code: tuple[str, ...] = ()
    spec: Any = None
    tools: tuple[str, ...] = ()
    target: str | None = None
    describe: str = ""
    preflight: Callable[[], None] | None = None  # cheap input check run before any step executes
    # Why this machine cannot run the step (its tool is not installed here), or None. A blocked step
    # does not fail the build: every step that does not need it still runs (a split build).
    blocked: Callable[[], str | None] | None = None
    # The hardware the step must run on: a GPU target's ``sm_tag`` for what builds or runs that GPU's
    # engines, None for work any CPU machine does. An executor that places steps on a cluster asks
    # for it; it is not part of the key (the target is).
    hardware: str | None = None

    _key: str | None = field(default=None, repr=False)
    _components: dict[str, Any] | None = field(default=None, repr=False)

    def components(self, store: ArtifactStore) -> dict[str, Any]:
        """Everything the key is made of, as a JSON-able dict (also used to explain rebuilds)."""
        if self._components is None:
            from cosycompile.core.keys import code_digest

            params = dict(self.params)
            if self.spec is not None:
                params["spec"] = self.spec.model_dump(mode="json")
            roots = self.code_roots()
            ours = tuple(r for r in roots if r == "cosycompile" or r.startswith("cosycompile."))
            self._components = {
                "kind": self.kind,
                "code": code_digest(ours) + _external_digest(tuple(r for r in roots if r not in ours)),
                "params": params,
                "inputs": {n: d.key(store) for n, d in sorted(self.deps.items())},
                "files": {
                    n: digest_files(fs, store.stat_cache, root) for n, (root, fs) in sorted(self.files.items())
                },
                "tools": tool_identities(self.tools),
                "target": self.target,
            }
        return self._components

    def code_roots(self) -> tuple[str, ...]:
        """Modules whose import closure is this step's code."""
        return (getattr(self.run, "module", self.run.__module__),) + self.code

    def key(self, store: ArtifactStore) -> str:
        if self._key is None:
            self._key = digest_obj(self.components(store))
        return self._key


def _external_digest(modules: tuple[str, ...]) -> str:
    """Modules outside the package (a plug-in from another distribution, a test's step body): their
    source file's digest, found without importing them. An unfindable module is an error."""
    if not modules:
        return ""
    from importlib.util import find_spec

    from cosycompile.core.hashing import sha256_file

    parts = []
    for m in sorted(set(modules)):
        spec = find_spec(m)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            raise RuntimeError(f"step code module '{m}' cannot be found")
        parts.append((m, sha256_file(Path(spec.origin))))
    return ":" + digest_obj(parts)


def lazy(ref: str) -> Callable[[StepContext], Any]:
    """A step body ``"module:function"`` imported only when the step actually runs (torch stays
    unimported on a cached build); ``.module`` names it for the code digest."""

    def run(ctx: StepContext) -> Any:
        from cosycompile.core.plugins import load_object

        return load_object(ref)(ctx)

    run.module = ref.split(":")[0]  # type: ignore[attr-defined]
    run.__qualname__ = ref
    return run


def topo_order(steps: Iterable[Step]) -> list[Step]:
    """Steps and their transitive deps, dependencies first, in a stable order."""
    order: list[Step] = []
    seen: set[int] = set()

    def visit(s: Step) -> None:
        if id(s) in seen:
            return
        seen.add(id(s))
        for d in s.deps.values():
            visit(d)
        order.append(s)

    for s in steps:
        visit(s)
    return order


@dataclass
class PlanItem:
    step: Step
    key: str
    cached: bool
    reason: str
    left: bool = False  # would not run here: blocked on this machine or downstream of a blocked step
    remote: bool = False  # not cached here, but the remote cache has it: a build pulls it


@dataclass
class BuildResult:
    ran: list[str]
    cached: list[str]
    entries: dict[str, Entry]
    seconds: dict[str, float]
    left: dict[str, str] = field(default_factory=dict)  # steps this machine could not run -> why
    pulled: list[str] = field(default_factory=list)  # taken from the remote cache (neither ran nor cached here)


class Reporter:
    """Progress output on stderr: one line per step, bars for long loops on a terminal."""

    def __init__(self, quiet: bool = False, stream: Any = None) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.width = 22

    def line(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self.stream, flush=True)

    def warn(self, msg: str) -> None:
        """A warning line, printed even with ``--quiet``."""
        print(f"warning: {msg}", file=self.stream, flush=True)

    def detail(self, step: str, msg: str) -> None:
        self.line(f"      {step}: {msg}")

    def progress(self, items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
        if self.quiet or not self.tty:
            return iter(items)
        from tqdm import tqdm

        return iter(tqdm(items, total=total, desc=f"      {desc}", file=self.stream, leave=False, dynamic_ncols=True))


class StateFile:
    """Last-built key components per step of a recipe, to say *why* a step will run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            self.data = {}

    def reason(self, step: Step, comps: dict[str, Any]) -> str:
        old = self.data.get(step.name)
        if not old:
            return "never built"
        diffs = []
        if old.get("code") != comps["code"]:
            diffs.append("code changed")
        if old.get("params") != comps["params"]:
            keys = _changed_keys(old.get("params", {}), comps["params"])
            diffs.append("params changed: " + ", ".join(keys[:4]))
        for n, k in comps["inputs"].items():
            if old.get("inputs", {}).get(n) != k:
                diffs.append(f"input '{n}' changed")
        for n, k in comps["files"].items():
            if old.get("files", {}).get(n) != k:
                diffs.append(f"files '{n}' changed")
        if old.get("tools") != comps["tools"]:
            changed = [f"{d} {old.get('tools', {}).get(d, '?')}->{v}" for d, v in comps["tools"].items()
                       if old.get("tools", {}).get(d) != v]
            diffs.append("tool versions changed: " + ", ".join(changed))
        if old.get("target") != comps["target"]:
            diffs.append("target changed")
        return "; ".join(diffs) if diffs else "cache entry missing or failed verification"

    def record(self, step: Step, comps: dict[str, Any]) -> None:
        self.data[step.name] = comps

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)


def _changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += _changed_keys(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [prefix.rstrip(".")] if old != new else []


NODE_ENV = "COSYCOMPILE_NODE"


def node_name() -> str:
    """What built a step, as entries, manifests and reports name it: ``$COSYCOMPILE_NODE`` (a cluster
    node's label) or the host name."""
    import socket

    return os.environ.get(NODE_ENV) or socket.gethostname()


class Executor:
    """Plans and runs a set of target steps against a store.

    With a ``remote`` cache, a step missing from the store is pulled from the remote (verified and
    committed into the store) before anything runs, and every step built here is pushed after its
    commit. The store stays the only thing steps read from. Any remote failure prints one warning
    and the rest of the build goes on with the local store alone.
    """

    def __init__(self, store: ArtifactStore, targets: list[Step], state: StateFile, reporter: Reporter,
                 force: bool = False, remote: RemoteTier | None = None) -> None:
        from cosycompile.core.keys import set_persistent_cache

        self.store = store
        set_persistent_cache(store.cache_dir / "codecache.json")
        self.steps = topo_order(targets)
        self.state = state
        self.reporter = reporter
        self.force = force
        self.remote = remote

    def _remote_call(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run one remote operation; on failure warn once, drop the remote for the rest of this
        build (so a dead server costs one timeout, not one per step) and return None. A corrupt
        remote entry (an error with ``remote_usable`` set) only skips that entry."""
        if self.remote is None:
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - the remote is an optimisation; the build goes on locally
            if getattr(exc, "remote_usable", False):
                self.reporter.warn(f"remote cache {self.remote.url}: {what}: {exc}; building it here")
                return None
            text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            self.reporter.warn(f"remote cache {self.remote.url}: {what} failed ({text}); "
                               "continuing with the local cache only")
            self.remote = None
        return None

    def _pull_missing(self, missing: set[str]) -> tuple[set[str], dict[str, float]]:
        """Pull every missing step the remote has, in dependency order, each under its key's lock.
        Returns the steps now in the store (pulled, or built by another process meanwhile) and the
        seconds each pull took."""
        found: set[str] = set()
        seconds: dict[str, float] = {}
        if self.remote is None or self.force:
            return found, seconds
        for s in self.steps:
            if s.name not in missing or self.remote is None:
                continue
            key = s.key(self.store)
            t0 = time.perf_counter()
            with self.store.lock(key):
                if self.store.lookup(key) is not None:
                    found.add(s.name)
                    continue
                remote = self.remote
                entry = self._remote_call(f"pull of {s.name} ({key[:12]})", lambda: remote.pull(self.store, key))
            if entry is not None:
                found.add(s.name)
                seconds[s.name] = time.perf_counter() - t0
        return found, seconds

    @contextmanager
    def _claimed(self, step: str, key: str, tag: str) -> Iterator[Claimed]:
        """Around building ``key`` (inside its local lock): with a remote, hold its claim there, or
        wait for the machine that holds it and pull its entry (``pulled``), so that machines sharing
        the remote build each step once. Without a remote, or with --force, nothing."""
        state = Claimed()
        remote = self.remote
        if remote is None or self.force or self.store.lookup(key) is not None:
            yield state
            return

        def waiting(text: str) -> None:
            self.reporter.line(f"{tag}  waiting  ({text})")

        claim = self._remote_call(f"claim of {step} ({key[:12]})", lambda: remote.claim(self.store, key, step, waiting))
        state.pulled = claim is None and self.store.lookup(key) is not None
        try:
            yield state
        finally:
            if claim is not None:
                claim.release()

    def _pending(self, key: str) -> Path:
        # A marker per entry built while a remote was set, removed once its push completed: a build
        # killed mid-upload (or before it) leaves the marker, and the next build with a remote
        # pushes that entry, which a local cache hit would otherwise never do.
        return self.store.cache_dir / "push-pending" / key

    def _push(self, step: str, entry: Entry) -> None:
        remote = self.remote
        if remote is None:
            return
        if self._remote_call(f"push of {step} ({entry.key[:12]})", lambda: remote.push(self.store, entry)) is not None:
            self._pending(entry.key).unlink(missing_ok=True)

    def _push_pending(self) -> None:
        """Push entries whose push an earlier build did not finish (nothing to do: no network call)."""
        folder = self.store.cache_dir / "push-pending"
        for marker in sorted(folder.glob("*")) if folder.is_dir() else []:
            if self.remote is None:
                return
            entry = self.store.lookup(marker.name)
            if entry is None:  # the step never finished: nothing to push
                marker.unlink(missing_ok=True)
                continue
            self._push(str(entry.meta.get("step", marker.name[:12])), entry)

    def plan(self) -> list[PlanItem]:
        """What would run and why, without running anything."""
        items = []
        for s in self.steps:
            key = s.key(self.store)
            entry = None if self.force else self.store.lookup(key)
            if entry is not None:
                items.append(PlanItem(s, key, True, "cached"))
            elif not self.force and self.remote is not None and self._remote_has(s.name, key):
                items.append(PlanItem(s, key, False, "in the remote cache (a build pulls it)", remote=True))
            else:
                reason = "--force" if self.force else self.state.reason(s, s.components(self.store))
                items.append(PlanItem(s, key, False, reason))
        left = self._left({i.step.name for i in items if not i.cached and not i.remote})
        for i in items:
            if i.step.name in left:
                i.reason, i.left = f"{i.reason}; {left[i.step.name]}", True
        self.store.stat_cache.save()
        return items

    def _remote_has(self, step: str, key: str) -> bool:
        remote = self.remote
        return bool(remote is not None and self._remote_call(f"lookup of {step}", lambda: remote.has(key)))

    def _left(self, missing: set[str]) -> dict[str, str]:
        """Steps among ``missing`` (no cache entry) that this machine cannot run: the blocked ones and
        everything downstream of them, each with the reason."""
        left: dict[str, str] = {}
        for s in self.steps:  # topological order: a dependency is decided before its dependents
            if s.name not in missing:
                continue
            why = s.blocked() if s.blocked else None
            if why:
                left[s.name] = f"cannot run on this machine: {why}"
                continue
            upstream = sorted(d.name for d in s.deps.values() if d.name in left)
            if upstream:
                left[s.name] = f"waits for {', '.join(upstream)}"
        return left

    def run(self) -> BuildResult:
        """Run every step whose entry is missing; reuse verified entries for the rest."""
        self.store.ensure_writable()
        ran: list[str] = []
        cached: list[str] = []
        entries: dict[str, Entry] = {}
        seconds: dict[str, float] = {}
        pulled_here: list[str] = []
        missing = {s.name for s in self.steps if self.force or self.store.lookup(s.key(self.store)) is None}
        # Only a local miss asks the remote: a fully cached build makes no network call.
        pulled, pull_seconds = self._pull_missing(missing) if missing else (set(), {})
        missing -= pulled
        if self.remote is not None:
            self._push_pending()
        left = self._left(missing)
        # Bad inputs of steps that will run fail here, before any work and before any entry is written.
        for s in self.steps:
            if s.preflight and s.name in missing and s.name not in left:
                s.preflight()
        n = len(self.steps)
        w = max(len(s.name) for s in self.steps)
        for i, s in enumerate(self.steps, 1):
            key = s.key(self.store)
            comps = s.components(self.store)
            tag = f"[{i:>2}/{n}] {s.name:<{w}}"
            if s.name in left:
                self.reporter.line(f"{tag}  left     ({left[s.name]})")
                continue
            entry = None if self.force else self.store.lookup(key)
            if entry is not None:
                entries[s.name] = entry
                self.state.record(s, comps)
                if s.name in pull_seconds:
                    pulled_here.append(s.name)
                    self.reporter.line(f"{tag}  pulled   {key[:12]}  {pull_seconds[s.name]:.1f}s  (remote cache)")
                    continue
                cached.append(s.name)
                self.reporter.line(f"{tag}  cached   {key[:12]}")
                continue
            reason = "--force" if self.force else self.state.reason(s, comps)
            self.reporter.line(f"{tag}  running  ({reason})")
            if self.remote is not None:
                self._pending(key).parent.mkdir(parents=True, exist_ok=True)
                self._pending(key).touch()
            t0 = time.perf_counter()
            with self.store.lock(key), self._claimed(s.name, key, tag) as claimed:
                # Another process may have built it while we waited for the lock, or another machine
                # while we waited for its claim (then it was pulled).
                entry = None if self.force else self.store.lookup(key)
                built_here = entry is None
                if built_here:
                    with self.store.staging(key) as stage, self.store.space_errors(s.name):
                        ctx = StepContext(
                            name=s.name,
                            key=key,
                            params=s.params,
                            inputs={n_: entries[d.name].data for n_, d in s.deps.items()},
                            files={n_: fs for n_, (_, fs) in s.files.items()},
                            file_roots={n_: root for n_, (root, _) in s.files.items()},
                            out=stage / "data",
                            target=s.target,
                            reporter=self.reporter,
                            spec=s.spec,
                            cache_dir=self.store.cache_dir / "shared",
                        )
                        own_peak = reset_peak()
                        meta = s.run(ctx) or {}
                        peak = peak_mb() if own_peak else None
                        check_finite_outputs(s.name, ctx.out)
                        dt = time.perf_counter() - t0
                        entry = self.store.commit(key, stage, {
                            "step": s.name, "components": comps, "meta": meta, "seconds": dt, "peak_rss_mb": peak,
                            "node": node_name(),
                        })
                    # After the commit, so the remote only ever gets complete, verified outputs; before
                    # the claim is released, so a machine waiting on it finds the entry.
                    self._push(s.name, entry)
            dt = time.perf_counter() - t0
            if built_here:
                # The next step starts from what is in use, not from this one's peak.
                release_free_memory(entry.meta.get("peak_rss_mb"))
            entries[s.name] = entry
            self.state.record(s, comps)
            self.state.save()
            if not built_here and claimed.pulled:
                pulled_here.append(s.name)
                self.reporter.line(f"{tag}  pulled   {key[:12]}  {dt:.1f}s  (built by {entry.meta.get('node')} meanwhile)")
                continue
            if not built_here:
                cached.append(s.name)
                self.reporter.line(f"{tag}  cached   {key[:12]}  (built by another process meanwhile)")
                continue
            seconds[s.name] = dt
            ran.append(s.name)
            peak = entry.meta.get("peak_rss_mb")
            self.reporter.line(f"{tag}  done     {key[:12]}  {dt:.1f}s" + (f", peak {peak:,.0f} MiB" if peak else ""))
        self.state.save()
        self.store.stat_cache.save()
        return BuildResult(ran, cached, entries, seconds, left, pulled_here)
