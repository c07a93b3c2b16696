"""Every executor plug-in keeps the registry's promises, checked over the registry."""

from __future__ import annotations

import inspect

import pytest

from cosycompile.executors import executor_infos

EXECUTORS = sorted(executor_infos())


def test_local_is_an_executor_and_needs_no_address() -> None:
    assert "local" in EXECUTORS and not executor_infos()["local"].address_env


@pytest.mark.parametrize("name", EXECUTORS)
def test_executor_keeps_the_registry_promises(name: str) -> None:
    info = executor_infos()[name]
    assert info.name == name and info.package == f"cosycompile.executors.{name}" and info.summary
    build = info.hook("build")
    params = inspect.signature(build).parameters
    assert list(params)[:3] == ["plans", "store", "reporter"]
    assert {"remote", "address", "force"} <= {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
