"""The folder format passed between export, simplify and engine steps.

A graphs dir holds one or more ONNX graphs of a stage, numpy assets the runtime needs next to
them (embedding tables, the CFM's fixed noise), and ``graphs.json`` describing both plus the
stage's runtime constants. Engine dirs use the same format with an ``engine.json`` passport.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosycompile.core.files import link_or_copy

MANIFEST = "graphs.json"


@dataclass
class GraphsDir:
    """Parsed ``graphs.json``."""

    root: Path
    stage: str
    graphs: dict[str, dict[str, Any]]
    assets: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def graph_path(self, name: str) -> Path:
        return self.root / self.graphs[name]["file"]

    def asset_path(self, name: str) -> Path:
        return self.root / self.assets[name]

    def write(self) -> None:
        """Write ``graphs.json`` into ``root``."""
        body = {"stage": self.stage, "graphs": self.graphs, "assets": self.assets, "info": self.info}
        (self.root / MANIFEST).write_text(json.dumps(body, indent=1, sort_keys=True))

    def with_root(self, root: Path) -> "GraphsDir":
        return GraphsDir(root, self.stage, json.loads(json.dumps(self.graphs)), dict(self.assets), dict(self.info))


def read_graphs_dir(root: Path) -> GraphsDir:
    """Read the manifest of a graphs or engine dir."""
    body = json.loads((root / MANIFEST).read_text())
    return GraphsDir(root, body["stage"], body["graphs"], body.get("assets", {}), body.get("info", {}))


def copy_assets(src: GraphsDir, dst_root: Path) -> GraphsDir:
    """A GraphsDir for ``dst_root`` with ``src``'s assets linked in (graphs left to the caller)."""
    out = src.with_root(dst_root)
    for rel in src.assets.values():
        link_or_copy(src.root / rel, dst_root / rel)
    return out
