"""Code digests from the static import closure (cosycompile.core.keys).

The closure is checked against the stdlib's ``modulefinder`` (an independent bytecode-level
implementation of the same import rules) on the real package, and edited in a temp copy of the
package to check that digests move exactly when a file in a root's closure changes.
"""

from __future__ import annotations

import json
import modulefinder
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import cosycompile
from cosycompile.core import keys
from cosycompile.core.keys import CodeDigestError, code_digest, module_closure, set_persistent_cache

PKG_DIR = Path(cosycompile.__file__).resolve().parent
REPO = PKG_DIR.parent

ORACLE_ROOTS = [
    "cosycompile.cli",
    "cosycompile.validate.pipeline_check",
    "cosycompile.quantize.calibrate",
    "cosycompile.families.cosyvoice2.loader",
    "cosycompile.stages.flow",
    "cosycompile.plan",
]


def _all_modules(pkg_dir: Path) -> list[str]:
    """Every module of a package tree, by its files (independent of keys._index_modules)."""
    names = []
    for f in sorted(pkg_dir.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        parts = f.relative_to(pkg_dir.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _file_of(name: str, search_root: Path) -> Path | None:
    """Source file of module ``name`` under ``search_root`` (a package's ``__init__.py`` wins)."""
    base = search_root.joinpath(*name.split("."))
    for f in (base / "__init__.py", base.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _is_module_file(name: str, search_root: Path) -> bool:
    return _file_of(name, search_root) is not None


def _modulefinder_closure(root: str, search_root: Path) -> set[str]:
    """Package modules that modulefinder reaches from ``root``.

    Only the repo (or temp copy) is on its path, so third-party and stdlib imports are recorded as
    bad modules instead of being walked (torch alone would take minutes). ``from pkg import name``
    where ``name`` is an attribute lands in ``badmodules``; the file filter is a second guard.
    """
    mf = modulefinder.ModuleFinder(path=[str(search_root)])
    mf.import_hook(root)
    return {n for n in mf.modules if n.split(".")[0] == "cosycompile" and _is_module_file(n, search_root)}


@pytest.fixture
def pkg_copy(tmp_path: Path) -> Path:
    """A private copy of the package folder (``<tmp>/cosycompile``) that a test may edit."""
    dst = tmp_path / "src" / "cosycompile"
    shutil.copytree(PKG_DIR, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write("\n" + textwrap.dedent(text))


# ---------------------------------------------------------------------------------------------
# Oracle: modulefinder on the real package


@pytest.mark.parametrize("root", ORACLE_ROOTS)
def test_closure_matches_modulefinder(root: str) -> None:
    ours = module_closure([root])
    assert root in ours and "cosycompile" in ours
    assert set(ours) == _modulefinder_closure(root, REPO)


def test_closure_matches_modulefinder_for_every_module() -> None:
    # ~1.5 s: every module as a root, so a construct used anywhere in the package is covered.
    mismatches = {}
    for root in _all_modules(PKG_DIR):
        ours, theirs = set(module_closure([root])), _modulefinder_closure(root, REPO)
        if ours != theirs:
            mismatches[root] = {"only_keys": sorted(ours - theirs), "only_modulefinder": sorted(theirs - ours)}
    assert not mismatches


def test_closure_of_several_roots_is_the_union() -> None:
    a, b = "cosycompile.families.cosyvoice2.loader", "cosycompile.validate.metrics"
    assert module_closure([a, b]) == sorted(set(module_closure([a])) | set(module_closure([b])))
    assert module_closure([]) == []


def test_closure_is_sorted_and_includes_parent_packages() -> None:
    closure = module_closure(["cosycompile.stages.flow"])
    assert closure == sorted(closure)
    for name in closure:
        parts = name.split(".")
        for i in range(1, len(parts)):
            assert ".".join(parts[:i]) in closure, f"{name}: parent package missing"


# ---------------------------------------------------------------------------------------------
# Import forms, in a temp copy


def test_relative_nested_conditional_and_dynamic_imports(pkg_copy: Path) -> None:
    extra = pkg_copy / "extra"
    (extra / "sub").mkdir(parents=True)
    # In an __init__.py, "." is the package itself.
    (extra / "__init__.py").write_text("from . import a\n")
    (extra / "a.py").write_text(
        textwrap.dedent(
            """
            from .sub import b
            from ..runtime import dsp          # a submodule through a relative from-import
            from .. import errors              # "..": cosycompile itself, then its submodule
            from ..families.cosyvoice2.config import PRESETS  # an attribute: loads only that module
            """
        )
    )
    (extra / "sub" / "__init__.py").write_text("")
    (extra / "sub" / "b.py").write_text(
        textwrap.dedent(
            """
            from __future__ import annotations

            import importlib
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from ..a import Anything
                from cosycompile.core import targets

            try:
                import cosycompile.onnx.tools as tools
            except ImportError:
                tools = None


            class K:
                def method(self):
                    from ...cache import local
                    return local


            def f():
                def g():
                    import cosycompile.validate.speed
                return g


            def dyn():
                importlib.import_module("cosycompile.validate.metrics")
                importlib.import_module("numpy")           # external: ignored
                importlib.import_module(f"cosycompile.stages.{dyn.__name__}")  # not constant: ignored
            """
        )
    )
    closure = set(module_closure(["cosycompile.extra"], package_root=pkg_copy))
    ours = {"cosycompile.extra", "cosycompile.extra.a", "cosycompile.extra.sub", "cosycompile.extra.sub.b"}
    imported = [
        "cosycompile.runtime.dsp",
        "cosycompile.errors",
        "cosycompile.families.cosyvoice2.config",
        "cosycompile.core.targets",
        "cosycompile.onnx.tools",
        "cosycompile.cache.local",
        "cosycompile.validate.speed",
        "cosycompile.validate.metrics",
    ]
    assert closure == ours | set(module_closure(imported, package_root=pkg_copy))

    # modulefinder agrees except on the constant importlib.import_module string, which it does not
    # interpret: what only we see must be explained by validate.metrics' closure.
    theirs = _modulefinder_closure("cosycompile.extra", pkg_copy.parent)
    assert theirs <= closure
    assert closure - theirs <= set(module_closure(["cosycompile.validate.metrics"], package_root=pkg_copy))
    assert closure == theirs | set(module_closure(["cosycompile.validate.metrics"], package_root=pkg_copy))


def test_from_package_import_submodule(pkg_copy: Path) -> None:
    (pkg_copy / "probe.py").write_text("from cosycompile.stages import flow\nfrom cosycompile import errors, __version__\n")
    closure = module_closure(["cosycompile.probe"], package_root=pkg_copy)
    assert {"cosycompile.stages", "cosycompile.stages.flow", "cosycompile.errors"} <= set(closure)
    assert set(closure) == _modulefinder_closure("cosycompile.probe", pkg_copy.parent)


def test_star_import_takes_every_submodule_of_a_package(pkg_copy: Path) -> None:
    # Which submodules ``from pkg import *`` loads depends on ``pkg.__all__`` at run time, so the
    # walk takes all of them (a spurious rebuild at worst). A genuine disagreement: modulefinder
    # takes none (it drops "*" from the fromlist in scan_code), which can miss a real dependency.
    (pkg_copy / "probe.py").write_text("from cosycompile.recipe import *\nfrom cosycompile.errors import *\n")
    closure = set(module_closure(["cosycompile.probe"], package_root=pkg_copy))
    recipe_subs = sorted(f"cosycompile.recipe.{f.stem}" for f in (pkg_copy / "recipe").glob("*.py") if f.stem != "__init__")
    assert recipe_subs and set(recipe_subs) <= closure
    theirs = _modulefinder_closure("cosycompile.probe", pkg_copy.parent)
    assert not set(recipe_subs) & theirs
    assert closure == theirs | set(module_closure(recipe_subs, package_root=pkg_copy))


# ---------------------------------------------------------------------------------------------
# Digests move exactly with the closure


def test_comment_changes_digest_of_exactly_the_roots_that_reach_it(pkg_copy: Path) -> None:
    # Names, not paths: the package layout evolves (a module may become a package); the files are
    # looked up in the copy. Names that no longer exist are skipped.
    src = pkg_copy.parent
    roots = [
        r
        for r in (
            "cosycompile.cli",
            "cosycompile.stages.flow",
            "cosycompile.stages.hift",
            "cosycompile.families.cosyvoice2.loader",
            "cosycompile.runtime.dsp",
            "cosycompile.validate.metrics",
            "cosycompile.errors",
        )
        if _is_module_file(r, src)
    ]
    closures = {r: set(module_closure([r], package_root=pkg_copy)) for r in roots}
    targets = [
        m
        for m in (
            "cosycompile",
            "cosycompile.errors",
            "cosycompile.runtime.dsp",
            "cosycompile.families.cosyvoice2.config",
            "cosycompile.stages.common",
            "cosycompile.stages.hift",
            "cosycompile.validate.gate",
        )
        if _is_module_file(m, src)
    ]
    assert len(roots) >= 5 and len(targets) >= 5
    for module in targets:
        before = {r: code_digest([r], package_root=pkg_copy) for r in roots}
        _append(_file_of(module, src), "# an edit that changes no behaviour\n")
        after = {r: code_digest([r], package_root=pkg_copy) for r in roots}
        changed = {r for r in roots if before[r] != after[r]}
        assert changed == {r for r in roots if module in closures[r]}, module
    # Guard against a vacuous pass: some edits must have been outside some closures.
    assert any(m not in c for m in targets for c in closures.values())


def test_native_source_of_a_package_changes_the_digest_of_the_steps_that_import_it(pkg_copy: Path) -> None:
    # The torch operators are compiled from C++ at build time: a kernel edit must re-key the steps
    # that write programs calling it, and only those.
    cpp = pkg_copy / "runtime" / "torch_ops" / "int8_linear.cpp"
    user, other = "cosycompile.quantize.torch_dynamic.quantize", "cosycompile.runtime.dsp"
    assert "cosycompile.runtime.torch_ops" in module_closure([user], package_root=pkg_copy)
    assert "cosycompile.runtime.torch_ops" not in module_closure([other], package_root=pkg_copy)
    before = {r: code_digest([r], package_root=pkg_copy) for r in (user, other)}
    cpp.write_text(cpp.read_text() + "\n// an edit\n")
    assert code_digest([user], package_root=pkg_copy) != before[user]
    assert code_digest([other], package_root=pkg_copy) == before[other]


def test_digest_is_independent_of_location_and_stable(tmp_path: Path, pkg_copy: Path) -> None:
    other = tmp_path / "elsewhere" / "cosycompile"
    shutil.copytree(pkg_copy, other)
    roots = ["cosycompile.cli", "cosycompile.families.cosyvoice2.loader"]
    d = code_digest(roots, package_root=pkg_copy)
    assert len(d) == 64 and int(d, 16) >= 0
    assert code_digest(roots, package_root=other) == d
    assert code_digest(list(reversed(roots)), package_root=pkg_copy) == d
    assert code_digest(roots, package_root=pkg_copy) == d


def test_edit_that_keeps_mtime_is_still_seen(pkg_copy: Path) -> None:
    # Coarse-mtime file systems and tools that restore mtimes: the size is part of the cache key.
    target = pkg_copy / "errors.py"
    before = code_digest(["cosycompile.errors"], package_root=pkg_copy)
    st = target.stat()
    _append(target, "# same mtime\n")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert code_digest(["cosycompile.errors"], package_root=pkg_copy) != before


def test_new_import_enters_the_digest(pkg_copy: Path) -> None:
    root = "cosycompile.runtime.dsp"
    before = code_digest([root], package_root=pkg_copy)
    assert "cosycompile.validate.report" not in module_closure([root], package_root=pkg_copy)
    _append(pkg_copy / "runtime" / "dsp.py", "def _late():\n    from cosycompile.validate import report\n")
    assert "cosycompile.validate.report" in module_closure([root], package_root=pkg_copy)
    assert code_digest([root], package_root=pkg_copy) != before


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    "line, missing",
    [
        ("import cosycompile.runtime.gone\n", "cosycompile.runtime.gone"),
        ("from cosycompile.nothere.sub import x\n", "cosycompile.nothere.sub"),
        ("def f():\n    from .gone import x\n", "cosycompile.runtime.gone"),
    ],
)
def test_missing_package_module_names_importer_and_module(pkg_copy: Path, line: str, missing: str) -> None:
    dsp = pkg_copy / "runtime" / "dsp.py"
    _append(dsp, line)
    (pkg_copy / "importer.py").write_text("def f():\n    from cosycompile.runtime import dsp\n")
    with pytest.raises(CodeDigestError) as info:
        code_digest(["cosycompile.importer"], package_root=pkg_copy)
    assert isinstance(info.value, RuntimeError)
    assert str(dsp) in str(info.value) and missing in str(info.value)
    assert info.value.importer == str(dsp) and info.value.missing == missing
    # Roots that never reach the broken file are unaffected.
    assert module_closure(["cosycompile.errors"], package_root=pkg_copy) == ["cosycompile", "cosycompile.errors"]


def test_from_import_of_an_attribute_is_not_an_error(pkg_copy: Path) -> None:
    _append(pkg_copy / "runtime" / "dsp.py", "from cosycompile.errors import NoSuchName\nfrom . import no_such_name\n")
    closure = module_closure(["cosycompile.runtime.dsp"], package_root=pkg_copy)
    assert "cosycompile.errors" in closure


def test_missing_root_raises() -> None:
    with pytest.raises(CodeDigestError, match="cosycompile.no_such_module"):
        module_closure(["cosycompile.no_such_module"])
    with pytest.raises(CodeDigestError, match="numpy"):
        module_closure(["numpy"])


@pytest.mark.parametrize(
    "rel, line",
    [
        ("errors.py", "from .. import x\n"),  # a top-level module: ".." is above cosycompile
        ("__init__.py", "from .. import x\n"),  # the package itself: "." is cosycompile
        ("runtime/dsp.py", "def f():\n    from ...x import y\n"),
    ],
)
def test_relative_import_beyond_top_level_raises(pkg_copy: Path, rel: str, line: str) -> None:
    _append(pkg_copy / rel, line)
    with pytest.raises(CodeDigestError, match="beyond the top-level package") as info:
        code_digest(["cosycompile.errors", "cosycompile.runtime.dsp"], package_root=pkg_copy)
    assert str(pkg_copy / rel) in str(info.value)


def test_relative_import_to_the_top_is_fine(pkg_copy: Path) -> None:
    _append(pkg_copy / "errors.py", "from . import plan\n")
    _append(pkg_copy / "runtime" / "dsp.py", "from .. import plan\n")
    assert "cosycompile.plan" in module_closure(["cosycompile.errors"], package_root=pkg_copy)
    assert "cosycompile.plan" in module_closure(["cosycompile.runtime.dsp"], package_root=pkg_copy)


def test_syntax_error_names_the_file(pkg_copy: Path) -> None:
    _append(pkg_copy / "runtime" / "dsp.py", "def broken(:\n")
    with pytest.raises(CodeDigestError, match="dsp.py"):
        code_digest(["cosycompile.runtime.dsp"], package_root=pkg_copy)


# ---------------------------------------------------------------------------------------------
# Caches


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch):
    """An empty in-memory cache, and no persistent file left configured afterwards."""
    monkeypatch.setattr(keys, "_facts", {})
    yield
    set_persistent_cache(None)


def test_persistent_cache_round_trip(tmp_path: Path, pkg_copy: Path, fresh_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "state" / "code-keys.json"
    roots = ["cosycompile.cli"]
    set_persistent_cache(cache)
    d = code_digest(roots, package_root=pkg_copy)
    data = json.loads(cache.read_text())
    assert data["version"] == 1
    assert str(pkg_copy / "cli.py") in data["files"]
    assert not list(cache.parent.glob("*.tmp"))

    # A new "process": facts come from the file, no source is re-read for unchanged files.
    monkeypatch.setattr(keys, "_facts", {})
    set_persistent_cache(cache)
    assert len(keys._facts) == len(data["files"])
    read: list[str] = []
    real_parse = keys._parse_imports
    monkeypatch.setattr(keys, "_parse_imports", lambda src, name: read.append(name) or real_parse(src, name))
    assert code_digest(roots, package_root=pkg_copy) == d
    assert read == []

    # A stale entry (file edited since) is recomputed, and only that one.
    _append(pkg_copy / "errors.py", "# edited\n")
    assert code_digest(roots, package_root=pkg_copy) != d
    assert read == [str(pkg_copy / "errors.py")]


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"version": 1, "files": {"x": [1]}}', '{"version": 99, "files": {}}'])
def test_corrupt_persistent_cache_is_ignored(tmp_path: Path, pkg_copy: Path, fresh_cache: None, garbage: str) -> None:
    expected = code_digest(["cosycompile.families.cosyvoice2.loader"], package_root=pkg_copy)
    keys._facts.clear()
    cache = tmp_path / "code-keys.json"
    cache.write_text(garbage)
    set_persistent_cache(cache)
    assert code_digest(["cosycompile.families.cosyvoice2.loader"], package_root=pkg_copy) == expected
    assert json.loads(cache.read_text())["version"] == 1  # rewritten in the current format


def test_warm_digests_are_fast() -> None:
    # A no-op build computes ~20 code digests; with warm caches they must cost a few ms in all.
    roots = [[m] for m in _all_modules(PKG_DIR)][:20]
    for r in roots:
        code_digest(r)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for r in roots:
            code_digest(r)
        best = min(best, time.perf_counter() - t)
    assert best < 0.05, f"20 warm code digests took {best * 1000:.1f} ms"


# ---------------------------------------------------------------------------------------------
# No imports


def test_closure_imports_nothing(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys
        before = set(sys.modules)
        from cosycompile.core.keys import code_digest, module_closure
        closure = module_closure(["cosycompile.cli", "cosycompile.stages.flow", "cosycompile.families.cosyvoice2.loader"])
        code_digest(["cosycompile.cli"])
        print(json.dumps({"closure": closure, "new": sorted(set(sys.modules) - before)}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path, env=env)
    result = json.loads(out.stdout)
    assert "cosycompile.families.cosyvoice2.flow" in result["closure"]  # the walk did reach torch users
    new = set(result["new"])
    assert not {"torch", "numpy", "onnx", "onnxruntime", "transformers"} & new
    assert {m for m in new if m.startswith("cosycompile")} == {"cosycompile", "cosycompile.core", "cosycompile.core.keys"}
