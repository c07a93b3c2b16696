"""``--executor``: the values it takes, one-line errors for the rest, and no Ray unless asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cosycompile.errors import UserError
from cosycompile.executors import parse_executor
from helpers import REPO, one_line_error, write_recipe


def test_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    info, address = parse_executor("local")
    assert (info.name, address) == ("local", None)
    info, address = parse_executor("ray://head:10001")
    assert (info.name, address) == ("ray", "ray://head:10001")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert parse_executor("ray")[1] == "10.0.0.5:6379"


@pytest.mark.parametrize("value, says", [
    ("slurm", "unknown executor 'slurm' (known: local, ray)"),
    ("local://x:1", "executor 'local' takes no address"),
    ("ray", "no cluster named: give --executor ray://HOST:PORT or set $RAY_ADDRESS"),
])
def test_bad_values(value: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UserError, match=says.replace("$", r"\$").replace("(", r"\(").replace(")", r"\)")):
        parse_executor(value)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


def test_a_dead_cluster_address_is_one_line_within_seconds(tmp_path: Path) -> None:
    from helpers import free_ports

    port = free_ports(1)[0]
    res = _cli("build", str(REPO / "recipes" / "cpu-int8.yaml"), "--executor", f"ray://127.0.0.1:{port}",
               "--artifacts", str(tmp_path), "--cache-remote", "")
    says = f"cosycompile: error: Ray cluster ray://127.0.0.1:{port}: nothing answers at 127.0.0.1:{port}"
    assert one_line_error(res).startswith(says)


def test_force_is_refused_by_the_ray_executor(tmp_path: Path) -> None:
    res = _cli("build", str(REPO / "recipes" / "cpu-int8.yaml"), "--executor", "ray://127.0.0.1:1", "--force",
               "--artifacts", str(tmp_path))
    assert res.returncode == 2 and "--force with --executor ray: not supported" in one_line_error(res)


def test_the_local_executor_imports_no_ray(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", {"extends": str(REPO / "recipes" / "cpu-fp32.yaml"),
                                                "validation": {"max_items": 1}}, base=False)
    code = ("import sys; from cosycompile.cli import main; rc = main(sys.argv[1:]); "
            "print('ray imported' if 'ray' in sys.modules else 'no ray'); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, "build", str(recipe), "--until", "export",
                          "--artifacts", str(tmp_path / "art"), "--cache-remote", "", "-q"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "no ray"
