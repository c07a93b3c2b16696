"""Load built engine dirs into the pipeline's stage runtimes through the backend registry (no torch)."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.errors import BackendUnavailable
from cosycompile.runtime.graphs_dir import read_graphs_dir

PASSPORT = "engine.json"


def load_assets(engine_dir: Path) -> dict[str, np.ndarray]:
    """The stage's numpy assets, memory-mapped (embedding tables can be hundreds of MB)."""
    gd = read_graphs_dir(engine_dir)
    return {name: np.load(gd.asset_path(name), mmap_mode="r") for name in gd.assets}


def read_passport(engine_dir: Path) -> dict[str, Any]:
    """The engine dir's passport (which backend built it, for what)."""
    path = engine_dir / PASSPORT
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BackendUnavailable(f"{path}: not a readable engine passport ({exc})") from None


def load_runners(engine_dir: Path, threads: int) -> dict[str, Any]:
    """Runners for every graph of an engine dir, by the backend its passport names.

    The passport is checked before the backend sees the dir: the machine must be able to run what
    it was built for (:func:`check_compatibility`) and every file it lists must be intact
    (:func:`verify_files`). Both failures are :class:`BackendUnavailable` with one line that names
    the file or the hardware and the command that rebuilds the engine.
    """
    from cosycompile.backends import backend_infos

    passport = read_passport(engine_dir)
    backend = passport.get("backend")
    info = backend_infos().get(str(backend))
    if info is None:
        raise BackendUnavailable(f"{engine_dir}: built by backend '{backend}', which this installation does not have "
                                 f"(known: {', '.join(backend_infos())})")
    # Compatibility first: it reads only the passport, and an engine for other hardware is useless however intact.
    check_compatibility(engine_dir, passport, info.run_problem)
    verify_files(engine_dir, passport)
    return info.hook("load")(engine_dir, threads)


def rebuild_hint(engine_dir: Path) -> str:
    """``cosycompile build <recipe>``, naming the recipe when the engine dir sits in a bundle.

    A bundle's ``engines/<stage>/`` has the bundle's ``manifest.json`` two levels up, which records
    the recipe file the build read (a path on the build machine); a cache entry's engine has none.
    """
    manifest = Path(engine_dir).parent.parent / "manifest.json"
    recipe = "<recipe>"
    try:
        m = json.loads(manifest.read_text())
        recipe = str(m.get("recipe_source") or m.get("recipe") or recipe)
    except (OSError, ValueError, AttributeError):
        pass
    return f"cosycompile build {recipe}"


def nvidia_gpu_problem() -> str | None:
    """Why this process sees no NVIDIA GPU, or None when it sees one.

    Looks only at what the driver exposes (no CUDA library is loaded, so this stays cheap and
    torch-free): ``CUDA_VISIBLE_DEVICES`` set to nothing hides every GPU from CUDA programs;
    otherwise the driver's ``/proc/driver/nvidia/gpus`` entries or ``/dev/nvidia<N>`` device nodes
    (what a container with GPUs gets) tell whether one is there.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"this machine has no NVIDIA GPU visible (CUDA_VISIBLE_DEVICES={visible!r} hides them)"
    gpus = Path("/proc/driver/nvidia/gpus")
    try:
        if gpus.is_dir() and any(gpus.iterdir()):
            return None
        if any(p.name[len("nvidia"):].isdigit() for p in Path("/dev").glob("nvidia[0-9]*")):
            return None
    except OSError:
        pass
    return "this machine has no NVIDIA GPU"


def check_compatibility(engine_dir: Path, passport: dict[str, Any], run_problem: Any = None) -> None:
    """Refuse an engine built for a GPU (``compute_capability`` like ``sm89``) that this machine cannot run.

    CPU engines (``cpu``) pass here; their backend's ``load`` keeps its own checks (ONNX Runtime
    compares the CPU flags an ``all``-optimized engine was built with). For a GPU engine, a machine
    without an NVIDIA GPU is refused whatever the backend; with a GPU, the backend's ``run_problem``
    (when the plug-in has one) tells whether this GPU can run an engine built for the passport's target.
    """
    cc = str(passport.get("compute_capability") or "cpu")
    if cc == "cpu":
        return
    target_name = str(passport.get("target") or "?")
    built_for = f"built for {cc} (target {target_name}, backend {passport.get('backend')})"
    problem = nvidia_gpu_problem()
    if problem is not None:
        raise BackendUnavailable(f"{engine_dir}: {built_for}; {problem}; to run here, rebuild with: "
                                 f"{rebuild_hint(engine_dir)} with target: cpu")
    if run_problem is None:
        return  # the backend cannot tell which GPU this is: its load reports what it cannot run
    from cosycompile.core.targets import TARGETS, Target

    target = TARGETS.get(target_name) or Target(target_name, "gpu", _sm_of(cc))
    problem = run_problem(target)
    if problem:
        raise BackendUnavailable(f"{engine_dir}: {built_for}; {problem}; to run here, rebuild with: "
                                 f"{rebuild_hint(engine_dir)} with the target of this machine's GPU")


def _sm_of(tag: str) -> tuple[int, int] | None:
    """(major, minor) of an ``sm89``-style tag, None if it is not one."""
    digits = tag[2:] if tag.startswith("sm") else ""
    return (int(digits[:-1]), int(digits[-1])) if len(digits) >= 2 and digits.isdigit() else None


# Digests already checked in this process, by (path, size, mtime, ctime, inode): a server or a build
# loading the same engine several times hashes it once, and any write to a file changes its stamp.
_VERIFIED: dict[tuple[str, int, int, int, int], str] = {}


def _file_digest(path: Path) -> str:
    st = path.stat()
    stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    digest = _VERIFIED.get(stamp)
    if digest is None:
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        _VERIFIED[stamp] = digest
    return digest


def verify_files(engine_dir: Path, passport: dict[str, Any]) -> None:
    """Every file the passport lists exists with its recorded sha256 (the engine step wrote them).

    Files are hashed in parallel threads (hashlib releases the GIL on large reads), once per
    process per file version. A missing, truncated or edited file is a one-line error naming it.
    """
    files = passport.get("files") or {}
    if not isinstance(files, dict):
        raise BackendUnavailable(f"{engine_dir / PASSPORT}: 'files' is not a mapping of file -> sha256")
    hint = rebuild_hint(engine_dir)
    paths = {}
    for rel in sorted(files):
        path = engine_dir / rel
        if not path.is_file():
            raise BackendUnavailable(f"{path}: missing (listed in {engine_dir / PASSPORT}); rebuild with: {hint} "
                                     f"(or copy the bundle again)")
        paths[rel] = path
    workers = max(1, min(len(paths), os.cpu_count() or 1, 8))
    with ThreadPoolExecutor(workers) as pool:
        digests = dict(zip(paths, pool.map(_file_digest, paths.values())))
    for rel, digest in digests.items():
        if digest != files[rel]:
            raise BackendUnavailable(f"{paths[rel]}: digest mismatch (sha256 {digest[:12]}..., passport "
                                     f"{str(files[rel])[:12]}...: changed or truncated since the build); "
                                     f"rebuild with: {hint} (or copy the bundle again)")


# The engine each stage last loaded with ``share=True`` in this process. A build's stage check and
# its pipeline check read the same (immutable, content-addressed) engine dir one after the other,
# and loading the sessions of a 0.5B LLM costs seconds; one slot per stage bounds the memory held.
_SHARED: dict[str, tuple[tuple[str, int, int], Any]] = {}


def stage_runtime(stage: str, engine_dir: Path, threads: int, share: bool = False) -> Any:
    """The runtime object of one stage over its built engine; with ``share``, the one this process
    already loaded from the same dir with the same threads is reused."""
    from cosycompile.families import stage_runtime_class

    passport = engine_dir / PASSPORT
    ident = (str(engine_dir.resolve()), threads, passport.stat().st_mtime_ns) if share and passport.is_file() else None
    if ident is not None and stage in _SHARED and _SHARED[stage][0] == ident:
        return _SHARED[stage][1]
    runners = load_runners(engine_dir, threads)
    gd = read_graphs_dir(engine_dir)
    # The family that exported the graphs (written into their info) owns the runtime that runs them.
    runtime = stage_runtime_class(stage, gd.info).from_runners(runners, load_assets(engine_dir), gd.info)
    if ident is not None:
        _SHARED[stage] = (ident, runtime)
    return runtime
