"""Where a CPU machine's ``tritonserver`` lives and how to start it for a generated repository.

The ``nvidia-pytriton`` wheel ships tritonserver (``pytriton/tritonserver/bin/tritonserver``), its
shared libraries (``nvidia_pytriton.libs/``), the python backend and one python-backend stub per
Python version. A backend dir for the server is the python backend plus the stub that matches the
Python whose packages the models import. Used by the generated README and the tests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import sys
import sysconfig
from pathlib import Path

import cosycompile


def pytriton_root() -> Path | None:
    """The installed ``pytriton`` package folder (found, not imported), or None."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def tritonserver_binary() -> Path | None:
    """The ``tritonserver`` executable that ``nvidia-pytriton`` ships, or None when it is not installed."""
    root = pytriton_root()
    binary = root / "tritonserver" / "bin" / "tritonserver" if root else None
    return binary if binary is not None and binary.is_file() else None


def prepare_backend_dir(dest: Path) -> Path:
    """``dest/python/``: the wheel's python backend with the stub of this Python; returns ``dest``."""
    root = pytriton_root()
    if root is None:
        raise FileNotFoundError("nvidia-pytriton is not installed (pip install --no-deps nvidia-pytriton==0.7.0)")
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "tritonserver" / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise FileNotFoundError(f"{stub}: no python-backend stub for Python {ver}")
    py = dest / "python"
    py.mkdir(parents=True, exist_ok=True)
    for f in (root / "tritonserver" / "backends" / "python").iterdir():
        if f.is_file():
            shutil.copy2(f, py / f.name)
    shutil.copy2(stub, py / stub.name)
    return dest


def server_pythonpath() -> str:
    """``PYTHONPATH`` for the server: this environment's site-packages, then cosycompile's source root."""
    dirs = [*site.getsitepackages(), str(Path(cosycompile.__file__).resolve().parents[1])]
    return os.pathsep.join(dict.fromkeys(dirs))


def server_ld_library_path() -> str:
    """``LD_LIBRARY_PATH`` for the server: the wheel's libraries, then this Python's libpython folder.

    The stub links ``libpython3.X.so.1.0``; this Python's own must win over a system one of the
    same soname, so that the stub runs the interpreter whose packages the models import.
    """
    root = pytriton_root()
    libs = [str(root.parent / "nvidia_pytriton.libs")] if root else []
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        libs.append(str(libdir))
    return os.pathsep.join(libs)


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to start tritonserver with (``base`` or ``os.environ`` plus the two paths)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = server_pythonpath()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (server_ld_library_path(), env.get("LD_LIBRARY_PATH")) if p)
    return env


def server_command(repository: Path, backend_dir: Path, http_port: int, grpc_port: int,
                   metrics_port: int, binary: Path | None = None, host: str = "127.0.0.1") -> list[str]:
    """The tritonserver command line for ``repository`` on ``host`` (python backend from ``backend_dir``)."""
    binary = binary or tritonserver_binary() or Path("tritonserver")
    return [str(binary), "--model-repository", str(repository), "--backend-directory", str(backend_dir),
            "--http-address", host, "--grpc-address", host,
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
            "--allow-metrics", "false", "--disable-auto-complete-config", "--exit-on-error", "true",
            "--log-verbose", "0"]
