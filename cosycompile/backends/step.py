"""The engine step body shared by every backend: hand the graphs dir to the recipe's backend,
then write the passport (what built it, for what, from which key, and each file's digest)."""

from __future__ import annotations

import json
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.runtime.loading import PASSPORT


def build_engine(ctx: StepContext) -> dict[str, Any]:
    """The ``<stage>.engine`` step."""
    from cosycompile.backends import backend_infos
    from cosycompile.core.hashing import sha256_file
    from cosycompile.core.targets import TARGETS
    from cosycompile.runtime.graphs_dir import read_graphs_dir

    info = backend_infos()[ctx.params["backend"]]
    target = TARGETS[ctx.target or "cpu"]
    fields = info.hook("build")(ctx.inputs["graphs"], ctx.spec, target, ctx.out, cache_dir=ctx.cache_dir) or {}
    gd = read_graphs_dir(ctx.out)
    passport = {
        **fields,
        "backend": info.name,
        "target": target.name,
        "compute_capability": target.sm_tag,
        "precision": ctx.params["precision"],
        "options": ctx.spec.model_dump(mode="json"),
        "graphs": {name: g.get("spec") for name, g in gd.graphs.items()},
        "key": ctx.key,
        "files": {str(f.relative_to(ctx.out)): sha256_file(f) for f in sorted(ctx.out.rglob("*")) if f.is_file()},
    }
    (ctx.out / PASSPORT).write_text(json.dumps(passport, indent=1, sort_keys=True))
    return {"passport": {k: v for k, v in passport.items() if k != "files"}}


def import_engine(ctx: StepContext) -> dict[str, Any]:
    """The engine step of ``cosycompile validate``: copy a bundle's engine dir, checking every digest."""
    import shutil
    from pathlib import Path

    from cosycompile.core.hashing import sha256_file
    from cosycompile.errors import UserError

    src = Path(ctx.file_roots["engine"])
    shutil.copytree(src, ctx.out, dirs_exist_ok=True)
    for rel, digest in ctx.params["digests"].items():
        f = ctx.out / rel
        if not f.is_file() or sha256_file(f) != digest:
            raise UserError(f"{src / rel}: does not match the digest in {src / PASSPORT}; the bundle was changed "
                            "after it was built")
    return {"imported_from": str(src), "key": ctx.params["key"]}
