"""Assemble ``builds/<name>-<key12>/`` from cache entries (hard links where possible)."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from cosycompile import __version__
from cosycompile.cache.local import Store
from cosycompile.core.graph import BuildResult
from cosycompile.core.hashing import tool_versions


def bundle_dir(plan: Any, store: Store) -> Path:
    """Where the bundle of ``plan`` lives (named by the pipeline check's key)."""
    return store.root / "builds" / f"{plan.recipe.name}-{plan.final.key(store)[:12]}"


def export(plan: Any, store: Store, result: BuildResult) -> Path:
    """Publish the bundle atomically (no-op if present)."""
    dest = bundle_dir(plan, store)
    if (dest / "manifest.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    recipe = plan.recipe
    try:
        for stage, steps in plan.stage_steps.items():
            shutil.copytree(result.entries[steps["engine"].name].data, tmp / "engines" / stage, copy_function=_link)
        for f in result.entries[plan.final.name].data.iterdir():
            if f.is_file():
                _link(str(f), str(tmp / f.name))
            else:
                shutil.copytree(f, tmp / f.name, copy_function=_link)
        manifest = {
            "schema": 1,
            "cosycompile": __version__,
            "recipe": recipe.name,
            "recipe_source": recipe.source,
            "model": recipe.model,
            "target": recipe.target,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "key": plan.final.key(store),
            "steps": {name: {"key": e.key, "seconds": e.meta.get("seconds")} for name, e in result.entries.items()},
            "stages": {s: {"backend": recipe.stage(s).engine.backend,
                           "precision": recipe.typed(s)["quantize"].format,
                           "engine_key": result.entries[st["engine"].name].key}
                       for s, st in plan.stage_steps.items()},
            "tools": tool_versions(("torch", "transformers", "onnx", "onnxruntime", "onnxslim")),
        }
        (tmp / "recipe.json").write_text(recipe.model_dump_json(indent=1, exclude={"source", "base_dir"}))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        from cosycompile.validate.report import render_bundle

        render_bundle(tmp)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _link(src: str, dst: str) -> None:
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
