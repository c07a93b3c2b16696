"""Assemble ``builds/<name>-<key12>/`` from cache entries (hard links where possible).

A bundle is self-contained: the engines, the front end's model files (``frontend/``: tokenizer
files or ``builtin.json``, the Qwen2 ``config.json``, ``campplus.onnx``,
``speech_tokenizer_v2.onnx``), the recipe, the report and audio, and ``manifest.json`` listing
every other file of the bundle with its sha256, so that ``cosycompile pack``/``unpack`` and
another machine can check what they got.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from cosycompile.core.files import link_or_copy
from cosycompile import __version__
from cosycompile.cache.local import Store
from cosycompile.core.graph import BuildResult
from cosycompile.core.hashing import sha256_file, tool_versions
from cosycompile.runtime.bundle import FRONTEND_DIR, MANIFEST
MANIFEST_SCHEMA = 2  # 2: "files" (every file's sha256) and the front end in frontend/


def bundle_dir(plan: Any, store: Store) -> Path:
    """Where the bundle of ``plan`` lives (named by the pipeline check's key)."""
    return store.root / "builds" / f"{plan.recipe.name}-{plan.final.key(store)[:12]}"


def frontend_files(model_dir: Path, family: Any) -> list[str]:
    """The files of ``model_dir`` (relative paths) that :class:`cosycompile.runtime.frontend.Frontend` reads:
    those the plan hashes for it and those the family's bundles carry besides (``FamilyInfo``)."""
    wanted = {*family.frontend_files, *family.bundle_files}
    return sorted(f for f in wanted if (Path(model_dir) / f).is_file())


def export(plan: Any, store: Store, result: BuildResult) -> Path:
    """Publish the bundle atomically; a no-op when it is present and intact.

    A present bundle whose files no longer match its manifest (an edited or truncated file, one
    missing, or a bundle written before manifests listed files) is written again and swapped in,
    so that ``cosycompile build <recipe>`` is the repair for a damaged bundle.
    """
    dest = bundle_dir(plan, store)
    if (dest / MANIFEST).is_file() and _intact(dest, store):
        return dest
    # Concurrent builds of one recipe: the first writes the bundle, the others find it intact.
    with store.lock(f"bundle.{dest.name}"):
        if (dest / MANIFEST).is_file() and _intact(dest, store):
            return dest
        _write(plan, store, result, dest)
    return dest


def _write(plan: Any, store: Store, result: BuildResult, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    recipe = plan.recipe
    try:
        for stage, steps in plan.stage_steps.items():
            shutil.copytree(result.entries[steps["engine"].name].data, tmp / "engines" / stage, copy_function=link_or_copy)
        for f in result.entries[plan.final.name].data.iterdir():
            if f.is_file():
                link_or_copy(f, tmp / f.name)
            else:
                shutil.copytree(f, tmp / f.name, copy_function=link_or_copy)
        _copy_frontend(recipe, result, tmp / FRONTEND_DIR, plan.family)
        _write_model_speakers(tmp, plan.family)
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "cosycompile": __version__,
            "recipe": recipe.name,
            "recipe_source": recipe.source,
            "model": recipe.model,
            "family": plan.family.name,
            "target": recipe.target,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "key": plan.final.key(store),
            "steps": {name: {"key": e.key, "seconds": e.meta.get("seconds"), "peak_rss_mb": e.meta.get("peak_rss_mb"),
                             "node": e.meta.get("node")}
                      for name, e in result.entries.items()},
            "stages": {s: {"backend": recipe.stage(s).engine.backend,
                           "precision": recipe.typed(s)["quantize"].format,
                           "engine_key": result.entries[st["engine"].name].key}
                       for s, st in plan.stage_steps.items()},
            "frontend": FRONTEND_DIR,
            "tools": tool_versions(("torch", "transformers", "onnx", "onnxruntime", "onnxslim")),
        }
        (tmp / "recipe.json").write_text(recipe.model_dump_json(indent=1, exclude={"source", "base_dir"}))
        # The report's title reads the manifest: write it once without digests, render, then list every file.
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        from cosycompile.validate.report import render_bundle

        render_bundle(tmp)
        manifest["files"] = {rel: sha256_file(tmp / rel) for rel in bundle_files(tmp)}
        # Sizes let unpack refuse a member larger than its file before writing a byte of it.
        manifest["sizes"] = {rel: (tmp / rel).stat().st_size for rel in manifest["files"]}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        _publish(tmp, dest)
        # Remember the digests under the published paths, so the next no-op build checks the bundle by stat only.
        for rel, digest in manifest["files"].items():
            store.stat_cache.remember(dest / rel, digest)
        store.stat_cache.save()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bundle_files(root: Path) -> list[str]:
    """Relative paths of every file under ``root`` except the manifest itself, sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p != root / MANIFEST)


def _intact(dest: Path, store: Store) -> bool:
    """Whether ``dest`` holds exactly the files its manifest lists, with their digests (stat-cached)."""
    try:
        files = json.loads((dest / MANIFEST).read_text()).get("files")
        if not isinstance(files, dict) or set(bundle_files(dest)) != set(files):
            return False
        ok = all(store.stat_cache.digest(dest / rel) == digest for rel, digest in files.items())
    except (OSError, ValueError, AttributeError):
        return False
    store.stat_cache.save()
    return ok


def _publish(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` to ``dest``, moving a stale ``dest`` aside first (a directory cannot be replaced)."""
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.old.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        os.replace(dest, old)
    try:
        os.replace(tmp, dest)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _copy_frontend(recipe: Any, result: BuildResult, out: Path, family: Any) -> None:
    """Copy the front end's files of the model the build used into ``out`` (the model dir's layout)."""
    from cosycompile.families import BUILTIN_PREFIX

    if recipe.model.startswith(BUILTIN_PREFIX):
        # A built-in model is the ``model`` step's cache entry: immutable, so hard links are safe.
        src, copy = result.entries["model"].data, link_or_copy
    else:
        # A real model dir belongs to the user and may be edited in place: copy, never link.
        src, copy = recipe.resolve_path(recipe.model), _copy
    for rel in frontend_files(src, family):
        copy(str(src / rel), str(out / rel))


def _write_model_speakers(tmp: Path, family: Any) -> None:
    """The speakers the model ships (its family's ``model_speakers``, read from the bundle's front end) as
    the bundle's speaker cache, so ``synthesize --speaker`` and the servers find them like added ones."""
    if not family.model_speakers:
        return
    from cosycompile.runtime.speakers import SPEAKERS_DIR, speaker_file, write_speaker_file

    speakers = family.hook("model_speakers")(tmp / FRONTEND_DIR)
    if speakers:
        (tmp / SPEAKERS_DIR).mkdir(exist_ok=True)
    for sp in speakers:
        write_speaker_file(tmp / speaker_file(sp.name), sp)


def _copy(src: str, dst: str) -> None:
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
