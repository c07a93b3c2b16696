"""A bundle as the serving side reads it: its manifest (file list, digests, sizes), its recipe, its
front end and engines loaded for synthesis. Used by the bundle commands and the Triton models; no
torch, nothing of the build side."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from cosycompile.core.bounded_read import MAX_MANIFEST_BYTES
from cosycompile.errors import UserError

MANIFEST = "manifest.json"
FRONTEND_DIR = "frontend"  # fixed, never read from the manifest: an archive's manifest is not trusted with paths


def read_manifest(path: Path) -> dict[str, Any]:
    """A bundle manifest with a ``files`` mapping of relative path -> sha256 (and, from bundles written
    since sizes were listed, ``sizes``: the same paths -> bytes); one-line UserError otherwise. Read
    as a regular file of at most :data:`MAX_MANIFEST_BYTES`."""
    from cosycompile.core.bounded_read import BoundError, read_text

    try:
        manifest = json.loads(read_text(path, MAX_MANIFEST_BYTES, "a bundle manifest"))
    except BoundError as exc:
        raise UserError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise UserError(f"{path}: missing (not a bundle: give a builds/<name>-<key12>/ folder)") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not a readable bundle manifest ({exc.__class__.__name__})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise UserError(f"{path}: has no 'files' list of digests (a bundle from an older cosycompile: "
                        f"rebuild it with: cosycompile build <recipe>)")
    unsafe = next((k for k in files if not k or safe_relpath(k) != k or k == MANIFEST), None)
    if unsafe is not None:
        raise UserError(f"{path}: lists {unsafe[:80]!r}, not a plain relative path inside the bundle")
    sizes = manifest.get("sizes")
    if sizes is not None and (not isinstance(sizes, dict) or set(sizes) != set(files) or not all(
            type(v) is int and v >= 0 for v in sizes.values())):
        raise UserError(f"{path}: 'sizes' must give every listed file's byte count")
    return manifest


def safe_relpath(name: str) -> str | None:
    """``name`` as a clean relative POSIX path, or None if it is absolute or climbs out with ``..``.

    ``.`` components and a leading ``./`` are dropped; an empty result is returned as ``""``.
    Backslashes are refused too: they are separators on Windows, so a name with one means different
    paths on different machines.
    """
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def bundle_parts(bundle: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, recipe) of ``bundle``, after checking it holds what synthesis needs."""
    if not bundle.is_dir():
        raise UserError(f"{bundle}: not a bundle folder")
    manifest = read_manifest(bundle / MANIFEST)
    from cosycompile.core.bounded_read import read_json

    recipe = read_json(bundle / "recipe.json", MAX_MANIFEST_BYTES, "a bundle's recipe")
    if not isinstance(recipe, dict):
        raise UserError(f"{bundle / 'recipe.json'}: not a recipe (a JSON object)")
    stages = manifest.get("stages")
    if not isinstance(stages, dict) or not stages:
        raise UserError(f"{bundle / MANIFEST}: lists no stage, so there is nothing to synthesize with")
    for stage in stages:
        if not (bundle / "engines" / stage / "engine.json").is_file():
            raise UserError(f"{bundle / 'engines' / stage}: no engine for stage '{stage}', which the manifest lists")
    frontend = bundle / FRONTEND_DIR
    if not frontend.is_dir():
        raise UserError(f"{frontend}: missing (a bundle from before front ends were bundled: rebuild it with: "
                        f"cosycompile build {manifest.get('recipe_source') or '<recipe>'})")
    return manifest, recipe


def verify_frontend(bundle: Path, manifest: dict[str, Any]) -> None:
    """The front end's files match the manifest (engines are checked by their passports when they load)."""
    verify_files(bundle, manifest, f"{FRONTEND_DIR}/")


def verify_files(bundle: Path, manifest: dict[str, Any], prefix: str = "") -> None:
    """Every file the manifest lists (under ``prefix``) is there with its digest; a one-line error
    naming the first that is not."""
    from cosycompile.core.hashing import sha256_file

    for rel, digest in sorted(manifest["files"].items()):
        if rel.startswith(prefix):
            path = bundle / rel
            try:
                got = sha256_file(path)
            except OSError as exc:
                raise UserError(f"{path}: unreadable ({exc.strerror or exc}); copy the bundle again") from None
            if got != digest:
                raise UserError(f"{path}: digest mismatch with {bundle / MANIFEST} (changed or truncated since the "
                                f"build); copy the bundle again or rebuild with: cosycompile build "
                                f"{manifest.get('recipe_source') or '<recipe>'}")


def recipe_sampling(recipe: dict[str, Any], mode: str | None = None, seed: int | None = None,
                    max_tokens: int | None = None) -> Any:
    """The recipe's ``validation.sampling`` as a :class:`~cosycompile.runtime.sampling.Sampling`, with overrides.

    ``max_tokens=0`` means no cap; ``None`` keeps the recipe's value (as for ``mode`` and ``seed``).
    """
    from cosycompile.runtime.sampling import Sampling

    fields = {f.name for f in dataclasses.fields(Sampling)}
    spec = {k: v for k, v in recipe.get("validation", {}).get("sampling", {}).items() if k in fields}
    sampling = Sampling(**spec)
    if mode is not None:
        sampling = dataclasses.replace(sampling, mode=mode)
    if seed is not None:
        sampling = dataclasses.replace(sampling, seed=seed)
    if max_tokens is not None:
        sampling = dataclasses.replace(sampling, max_tokens=max_tokens or None)
    return sampling


@dataclasses.dataclass
class LoadedBundle:
    """A bundle opened for synthesis: what ``synthesize`` and the Triton models run."""

    path: Path
    manifest: dict[str, Any]
    recipe: dict[str, Any]
    frontend: Any  # cosycompile.runtime.frontend.Frontend
    pipeline: Any  # cosycompile.runtime.pipeline.Pipeline
    threads: int


def recipe_threads(recipe: dict[str, Any]) -> int:
    """The intra-op threads the recipe validated its engines with (``validation.speed.threads``)."""
    return int(recipe.get("validation", {}).get("speed", {}).get("threads", 2))


def load_bundle(bundle: Path, threads: int | None = None) -> LoadedBundle:
    """Check ``bundle`` (layout, front-end digests) and load its front end and engines (no torch).

    Engines are checked by their passports as they load. Bad input is a one-line UserError.
    """
    manifest, recipe = bundle_parts(bundle)
    threads = threads or recipe_threads(recipe)
    verify_frontend(bundle, manifest)

    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Pipeline, in_pipeline_order

    # One front-end thread, as the build's checks use: the prompt features are then the build's bit for bit.
    frontend = Frontend(bundle / FRONTEND_DIR, threads=1)
    runtimes = {s: stage_runtime(s, bundle / "engines" / s, threads) for s in manifest["stages"]}
    try:
        pipeline = Pipeline(in_pipeline_order(runtimes))
    except ValueError as e:
        raise UserError(f"{bundle}: cannot synthesize: {e}") from None
    return LoadedBundle(bundle, manifest, recipe, frontend, pipeline, threads)


def synthesize_pieces(pipeline: Any, ids: list[Any], prompt: Any, sampling: Any) -> Iterator[Any]:
    """The wav (float32, 24 kHz) of each piece's text ids in turn; piece ``k`` uses seed ``sampling.seed + k``."""
    for k, text_ids in enumerate(ids):
        seed = sampling.seed + k
        yield pipeline.synthesize(text_ids, prompt, dataclasses.replace(sampling, seed=seed), seed=seed).wav


def stream_pieces(pipeline: Any, ids: list[Any], prompt: Any, sampling: Any) -> Iterator[Any]:
    """The audio of each piece's text ids as token-chunk streaming cuts it
    (:class:`cosycompile.runtime.streaming.Chunk`, the last of a piece with ``final`` set); piece ``k``
    uses the seed of :func:`synthesize_pieces`."""
    from cosycompile.runtime.streaming import stream_wav

    for k, text_ids in enumerate(ids):
        seed = sampling.seed + k
        yield from stream_wav(pipeline, text_ids, prompt, dataclasses.replace(sampling, seed=seed), seed=seed)
