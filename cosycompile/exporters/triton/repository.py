"""Write a bundle's Triton model repository: pick the layout, write into a temp dir, rename into place.

The repository is self-contained: each model's version dir ``1/`` holds what it runs (hard links
to the bundle's files where the file system allows, copies otherwise), every ``config.pbtxt`` is
generated from the bundle's manifest, passports and recipe, and ``repository.json`` lists every
file with its sha256. Nothing in it names an absolute path, except the ``gpt_model_path`` that
Triton's TensorRT-LLM backend requires (see the GPU layout's README section).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosycompile import __version__
from cosycompile.core.hashing import sha256_file
from cosycompile.errors import UserError
from cosycompile.exporters.triton.config import ModelConfig
from cosycompile.runtime.text import DEFAULT_MAX_CHARS

REPOSITORY_JSON = "repository.json"  # Triton skips plain files at the repository's root
SCHEMA = 1
STAGES = ("llm", "flow", "hift")
CPU_BACKENDS = {"llm": "onnxruntime", "flow": "onnxruntime", "hift": "onnxruntime"}
GPU_BACKENDS = {"llm": "trtllm", "flow": "tensorrt", "hift": "tensorrt"}


@dataclass(frozen=True)
class RepoOptions:
    """Choices a bundle does not make: instance counts, threads, text piece length, LLM server URL."""

    instances: int = 1
    threads: int | None = None  # intra-op threads per instance; None: the recipe's validation.speed.threads
    max_chars: int = DEFAULT_MAX_CHARS
    llm_url: str | None = None  # GPU: call a trtllm-serve at this URL instead of a tensorrt_llm model
    # Request limits of the CPU models: a longer text is refused at once (100,000 characters once held
    # an instance for 11 minutes); a request still running after the timeout stops at its next piece.
    max_text_chars: int = 2000
    request_timeout_s: float = 300.0
    # CPU models: idle intra-op threads sleep unless this is set (see cosycompile.runtime.idle_wait).
    spin_wait: bool = False


@dataclass
class Writer:
    """Collects a repository's files under ``root`` and their digests (for ``repository.json``)."""

    root: Path
    bundle: Path
    manifest: dict[str, Any]
    recipe: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)

    def bundle_json(self, rel: str) -> dict[str, Any]:
        """A JSON file of the bundle; a one-line error if it cannot be read."""
        from cosycompile.core.bounded_read import MAX_MANIFEST_BYTES, read_json

        # A passport or graphs.json is kB, bounded like the manifest beside it.
        return read_json(self.bundle / rel, MAX_MANIFEST_BYTES, "a bundle JSON file")

    def sample_rate(self) -> int:
        """The rate of the bundle's audio, from its vocoder graphs' info (the model's config)."""
        rel = "engines/hift/graphs.json"
        rate = (self.bundle_json(rel).get("info") or {}).get("sample_rate")
        if not isinstance(rate, int) or rate <= 0:
            raise UserError(f"{self.bundle / rel}: no sample_rate in its info (rebuild the bundle with this cosycompile)")
        return rate

    def text(self, rel: str, content: str) -> None:
        """Write a generated text file."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        self.files[rel] = hashlib.sha256(content.encode("utf-8")).hexdigest()

    def link(self, bundle_rel: str, rel: str) -> None:
        """Hard-link (or copy) the bundle's file ``bundle_rel`` to ``rel``; its digest is the manifest's."""
        dst = self.root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(self.bundle / bundle_rel, dst)
        except OSError:
            shutil.copy2(self.bundle / bundle_rel, dst)
        self.files[rel] = self.manifest["files"][bundle_rel]

    def link_tree(self, bundle_prefix: str, rel: str, skip: tuple[str, ...] = ()) -> None:
        """Link every manifest file under ``bundle_prefix`` (a folder, or "" for the whole bundle) to ``rel``."""
        for name in sorted(self.manifest["files"]):
            if bundle_prefix and not name.startswith(bundle_prefix.rstrip("/") + "/"):
                continue
            sub = name[len(bundle_prefix.rstrip("/")) + 1:] if bundle_prefix else name
            if skip and sub.endswith(skip):
                continue
            self.link(name, f"{rel}/{sub}")
        if not bundle_prefix:  # the manifest is not in its own file list
            self.link_manifest(f"{rel}/manifest.json")

    def link_manifest(self, rel: str) -> None:
        """Copy the bundle's ``manifest.json`` (it is not listed in itself)."""
        dst = self.root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.bundle / "manifest.json", dst)
        self.files[rel] = sha256_file(dst)

    def config(self, cfg: ModelConfig, role: str) -> None:
        """Write ``<model>/config.pbtxt`` and record the model's role for ``repository.json``."""
        self.text(f"{cfg.name}/config.pbtxt", cfg.text())
        self.models[cfg.name] = {"role": role, "decoupled": cfg.decoupled,
                                 "backend": cfg.backend or cfg.platform}


def bundle_layout(manifest: dict[str, Any], where: Path) -> str:
    """``cpu`` or ``gpu`` from the stages' backends in the manifest; UserError for a mix no layout serves."""
    stages = manifest.get("stages") or {}
    backends = {s: str((stages.get(s) or {}).get("backend")) for s in STAGES}
    if backends == CPU_BACKENDS:
        return "cpu"
    if backends == GPU_BACKENDS:
        return "gpu"
    have = ", ".join(f"{s}={b}" for s, b in backends.items())
    raise UserError(f"{where}: stages built with {have}; a Triton repository serves a CPU bundle (every stage on "
                    f"onnxruntime) or a GPU bundle (llm=trtllm, flow=tensorrt, hift=tensorrt)")


def write_repository(bundle: Path, out: Path, options: RepoOptions = RepoOptions()) -> Path:
    """Write the repository of ``bundle`` to ``out`` (which must not exist, or be empty) atomically."""
    from cosycompile.runtime.bundle import bundle_parts, verify_files

    manifest, recipe = bundle_parts(bundle)
    layout = bundle_layout(manifest, bundle)
    verify_files(bundle, manifest)  # a damaged bundle makes no repository
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    try:
        w = Writer(tmp, bundle, manifest, recipe)
        if layout == "cpu":
            from cosycompile.exporters.triton.cpu import write_cpu

            readme = write_cpu(w, options)
        else:
            from cosycompile.exporters.triton.gpu import write_gpu

            readme = write_gpu(w, options, out)
        w.text("README.md", readme)
        info = {"schema": SCHEMA, "cosycompile": __version__, "layout": layout, "bundle": bundle.name,
                "bundle_key": manifest.get("key"), "recipe": manifest.get("recipe"), "models": w.models,
                "files": dict(sorted(w.files.items()))}
        (tmp / REPOSITORY_JSON).write_text(json.dumps(info, indent=1, sort_keys=True))
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def publish(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` to ``dest``; a stale ``dest`` is moved aside first and removed after (as the bundle does)."""
    from cosycompile.exporters.bundle.export import _publish

    _publish(tmp, dest)


def read_repository_json(root: Path) -> dict[str, Any] | None:
    """The repository's ``repository.json``, or None when absent or unreadable."""
    try:
        data = json.loads((root / REPOSITORY_JSON).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

