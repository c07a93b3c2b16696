"""Code digests for build keys: the static import closure of a step's implementation.

A step's key must change whenever any code it can run changes. A hand-written list of source
files drifts (a new helper module is imported and forgotten), so the code a step depends on is
derived from its entry modules by walking their imports in the source text (``ast``). Nothing is
imported: the modules pull in torch, which takes seconds and must not be needed to decide that a
build is a no-op.

The walk over-approximates rather than under-approximates: imports inside functions, ``try``
blocks and ``if TYPE_CHECKING:`` all count, because a missed dependency gives a stale cache hit
(wrong output) while an extra one only costs a rebuild.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cosycompile

__all__ = [
    "CodeDigestError",
    "PACKAGE",
    "code_digest",
    "default_package_root",
    "module_closure",
    "module_files",
    "set_persistent_cache",
]

PACKAGE = "cosycompile"
NATIVE_SUFFIXES = (".cpp", ".h")
_CACHE_VERSION = 1

# One raw import fact of a file: (level, module, names). ``names`` is empty for ``import a.b``
# and for constant ``importlib.import_module("a.b")``; for ``from X import a, b`` it holds the
# imported names, since each may be a submodule. Relative levels are resolved at walk time (the
# importing module's name comes from where the file sits, not from its text).
_ImportFact = tuple[int, str, tuple[str, ...]]


class CodeDigestError(RuntimeError):
    """A module named by a root or by an import inside the package has no file on disk.

    This is a bug in the package (or in a step's declared roots), not bad user input, hence not a
    :class:`cosycompile.errors.UserError`.
    """

    def __init__(self, importer: str, missing: str, detail: str = "") -> None:
        self.importer = importer
        self.missing = missing
        msg = f"{importer}: imports {missing!r}, which is not a module of the {PACKAGE} package"
        super().__init__(f"{msg} ({detail})" if detail else msg)


def default_package_root() -> Path:
    """Folder of the installed ``cosycompile`` package (the one holding its ``__init__.py``)."""
    return Path(cosycompile.__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# Per-file facts, cached against (path, size, mtime_ns)

@dataclass(frozen=True)
class _FileFacts:
    size: int
    mtime_ns: int
    sha256: str
    imports: tuple[_ImportFact, ...]


_facts: dict[str, _FileFacts] = {}
_persist_path: Path | None = None
_persist_dirty = False


def set_persistent_cache(path: Path | None) -> None:
    """Keep the per-file cache (digest and imports of each source file) in a JSON file at ``path``.

    It lets a fresh process skip reading and parsing unchanged sources. ``None`` stops persisting
    (the in-memory cache stays). A missing, corrupt or foreign file is ignored and rewritten.
    """
    global _persist_path, _persist_dirty
    _persist_path = Path(path) if path is not None else None
    _persist_dirty = False
    if _persist_path is None:
        return
    try:
        data = json.loads(_persist_path.read_text())
        if data.get("version") != _CACHE_VERSION:
            return
        for file, (size, mtime_ns, sha, imports) in data["files"].items():
            facts = _FileFacts(
                int(size), int(mtime_ns), str(sha),
                tuple((int(level), str(mod), tuple(str(n) for n in names)) for level, mod, names in imports),
            )
            # Whatever this process has already computed is at least as fresh as the file on disk.
            _facts.setdefault(str(file), facts)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass


def _save_persistent() -> None:
    global _persist_dirty
    if not (_persist_dirty and _persist_path):
        return
    data = {
        "version": _CACHE_VERSION,
        "files": {
            f: [x.size, x.mtime_ns, x.sha256, [[lvl, mod, list(names)] for lvl, mod, names in x.imports]]
            for f, x in sorted(_facts.items())
        },
    }
    try:
        _persist_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _persist_path.with_name(f".{_persist_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, _persist_path)
        _persist_dirty = False
    except OSError:
        # The cache only saves time; failing to write it must not fail a build.
        pass


def _is_import_module(func: ast.expr) -> bool:
    # Both ``importlib.import_module(...)`` and a bare ``import_module(...)`` (from importlib).
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module" and isinstance(func.value, ast.Name) and func.value.id == "importlib"
    return isinstance(func, ast.Name) and func.id == "import_module"


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _parse_imports(source: bytes, filename: str) -> tuple[_ImportFact, ...]:
    """Every import of a package module in ``source``, wherever it occurs in the file."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise CodeDigestError(filename, "?", f"cannot parse: {e}") from e
    facts: list[_ImportFact] = []
    # ast.walk reaches function bodies, class bodies, try/except and TYPE_CHECKING blocks alike.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            facts.extend((0, a.name, ()) for a in node.names if _ours(a.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level or _ours(node.module or ""):
                facts.append((node.level, node.module or "", tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Call) and node.args and _is_import_module(node.func):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith(PACKAGE + "."):
                facts.append((0, arg.value, ()))
    return tuple(facts)


def _file_facts(path: str) -> _FileFacts:
    global _persist_dirty
    st = os.stat(path)
    hit = _facts.get(path)
    if hit is not None and hit.size == st.st_size and hit.mtime_ns == st.st_mtime_ns:
        return hit
    with open(path, "rb") as f:
        data = f.read()
    imports = _parse_imports(data, path) if path.endswith(".py") else ()  # a native source imports nothing
    facts = _FileFacts(st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest(), imports)
    _facts[path] = facts
    _persist_dirty = True
    return facts


# --------------------------------------------------------------------------------------------
# Module index: which dotted names are modules of the package, and where their files are

def _index_modules(package_root: Path) -> tuple[dict[str, tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """Map every module of the package to (absolute file path, package-relative posix path), and every
    package to the C++ sources in its folder (compiled at build time, e.g. runtime/torch_ops: code the
    steps that import the package run), as the same pairs.

    The tree is listed once per walk.

    One ``scandir`` per package folder is far cheaper than probing candidate paths for each
    imported name, and lets ``from pkg import name`` tell a submodule from an attribute by lookup.
    Folders without ``__init__.py`` (data, ``__pycache__``) are not packages and are skipped.
    """
    # Plain strings, not Path objects: pathlib's parsing dominated the warm no-op timing.
    index: dict[str, tuple[str, str]] = {}
    natives: dict[str, list[tuple[str, str]]] = {}
    top = str(package_root)
    if not os.path.isfile(os.path.join(top, "__init__.py")):
        return index, natives
    stack: list[tuple[str, str, str]] = [(top, "", PACKAGE)]  # (folder, relative prefix, dotted name)
    while stack:
        folder, rel, dotted = stack.pop()
        index[dotted] = (os.path.join(folder, "__init__.py"), rel + "__init__.py")
        with os.scandir(folder) as entries:
            for e in entries:
                name = e.name
                if e.is_dir():
                    if name.isidentifier() and os.path.isfile(os.path.join(e.path, "__init__.py")):
                        stack.append((e.path, f"{rel}{name}/", f"{dotted}.{name}"))
                elif name.endswith(".py") and name != "__init__.py" and name[:-3].isidentifier():
                    # setdefault + the later pop of a same-named subfolder: a package shadows a
                    # module of the same name, as in the import system.
                    index.setdefault(f"{dotted}.{name[:-3]}", (e.path, rel + name))
                elif name.endswith(NATIVE_SUFFIXES):
                    natives.setdefault(dotted, []).append((e.path, rel + name))
    return index, natives


def _parents(module: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b, a.b.c]``: importing a module runs every parent's ``__init__``."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _resolve_base(importer: str, is_package: bool, level: int, module: str, importer_file: str) -> str:
    """Absolute module named by ``from <'.' * level><module> import ...`` inside ``importer``."""
    if level == 0:
        return module
    # The package a relative import starts from: the module itself for an __init__.py.
    package = importer if is_package else importer.rpartition(".")[0]
    parts = package.split(".") if package else []
    if level - 1 >= len(parts):
        raise CodeDigestError(
            importer_file, "." * level + module, "relative import beyond the top-level package"
        )
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{module}" if module else base


def _closure(roots: Iterable[str], package_root: Path) -> tuple[dict[str, tuple[str, str, _FileFacts]],
                                                                  list[tuple[str, str, _FileFacts]]]:
    """module -> (absolute path, package-relative posix path, file facts) for the closure of roots, and
    the same triples for the native sources of the packages in it."""
    index, natives = _index_modules(package_root)
    done: dict[str, tuple[str, str, _FileFacts]] = {}
    todo: list[tuple[str, str]] = []  # (module, who asked for it) so errors can name the importer

    def need(module: str, importer: str) -> None:
        if module in done:
            return
        if module not in index:
            raise CodeDigestError(importer, module)
        for m in _parents(module):
            if m not in done:
                todo.append((m, importer))

    for root in roots:
        if not _ours(root):
            raise CodeDigestError("<roots>", root, f"roots must be modules of the {PACKAGE} package")
        need(root, "<roots>")

    while todo:
        module, importer = todo.pop()
        if module in done:
            continue
        if module not in index:
            raise CodeDigestError(importer, module)
        here, rel = index[module]
        facts = _file_facts(here)
        done[module] = (here, rel, facts)
        is_package = rel.endswith("__init__.py")
        for level, mod, names in facts.imports:
            base = _resolve_base(module, is_package, level, mod, here)
            need(base, here)
            for name in names:
                if name == "*":
                    # ``from pkg import *`` loads the submodules that ``pkg.__all__`` names, which
                    # only running ``pkg`` reveals: take them all (modulefinder takes none).
                    prefix = base + "."
                    for sub in [m for m in index if m.startswith(prefix) and "." not in m[len(prefix):]]:
                        need(sub, here)
                    continue
                sub = f"{base}.{name}"
                # Otherwise ``name`` is an attribute of ``base``, which exists: nothing more to load.
                if sub in index:
                    need(sub, here)
    native = [(here, rel, _file_facts(here)) for m in done for here, rel in natives.get(m, ())]
    _save_persistent()
    return done, native


# --------------------------------------------------------------------------------------------
# Public API

def module_closure(roots: Iterable[str], package_root: Path | None = None) -> list[str]:
    """Sorted names of the package modules that importing ``roots`` runs, found without importing.

    ``roots`` are dotted module names inside the package (``"cosycompile.stages.flow"``); the
    result includes them, every module they import transitively (absolute, relative, nested,
    conditional, constant ``importlib.import_module`` strings) and every parent package.
    ``package_root`` is the folder holding the package's ``__init__.py`` (default: the installed
    package); tests point it at a copy. Raises :class:`CodeDigestError` for a module that has no
    file, naming the file that imports it.
    """
    root = Path(package_root) if package_root is not None else default_package_root()
    return sorted(_closure(roots, root)[0])


def module_files(roots: Iterable[str], package_root: Path | None = None) -> dict[str, Path]:
    """Like :func:`module_closure`, mapping each module name to its source file."""
    root = Path(package_root) if package_root is not None else default_package_root()
    return {m: Path(p) for m, (p, _, _) in sorted(_closure(roots, root)[0].items())}


def code_digest(roots: Iterable[str], package_root: Path | None = None) -> str:
    """Hex sha256 identifying the code that ``roots`` can run: their import closure's sources, with the
    C++ sources of the packages in it.

    It hashes the sorted ``(package-relative posix path, sha256 of the file's bytes)`` pairs, so
    it is independent of where the package is installed and changes exactly when a file in the
    closure is edited, added to it or dropped from it. File digests are cached against
    (path, size, mtime_ns), in memory and optionally on disk (:func:`set_persistent_cache`).
    """
    root = Path(package_root) if package_root is not None else default_package_root()
    modules, native = _closure(roots, root)
    entries = sorted((rel, facts.sha256) for _, rel, facts in [*modules.values(), *native])
    return _sha256_json(entries)


def _sha256_json(obj: Any) -> str:
    # Same canonical form as hashing.digest_obj, kept local so this module stays stdlib-only.
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
