"""A bundle's stages run in the order of what they make, whatever order its manifest lists them in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cosycompile.runtime.pipeline import in_pipeline_order


def _stage(product: str) -> SimpleNamespace:
    return SimpleNamespace(product=product)


def test_stages_are_ordered_by_what_they_make() -> None:
    # A manifest lists its stages sorted by name: flow, hift, llm.
    ordered = in_pipeline_order({"flow": _stage("mel"), "hift": _stage("wav"), "llm": _stage("tokens")})
    assert list(ordered) == ["llm", "flow", "hift"]


def test_a_missing_product_is_named() -> None:
    with pytest.raises(ValueError, match="no stage makes mel"):
        in_pipeline_order({"llm": _stage("tokens"), "hift": _stage("wav")})
