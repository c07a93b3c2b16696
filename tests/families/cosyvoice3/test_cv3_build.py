"""CosyVoice3 end to end on a CPU: the shipped recipes/cv3-cpu-int8.yaml builds builtin:cv3-tiny and
passes its gate; its bundle, packed and unpacked elsewhere, synthesizes the build's audio with no model
dir and no cache; the real tritonserver serves its CPU repository and returns the same audio
(families/shipped_cpu_build.py holds what every family's test does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from families.shipped_cpu_build import (build_shipped, check_gate_and_bundle, check_tritonserver_serves_the_same_audio,
                               check_unpacked_bundle_reproduces_the_build)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_shipped(tmp_path_factory, "cv3-cpu-int8")


def test_the_shipped_recipe_passes_its_gate_on_real_tokens(build: dict[str, Any]) -> None:
    check_gate_and_bundle(build, "cosyvoice3", "builtin:cv3-tiny", {"llm": "int8_sq", "flow": "int8", "hift": "fp32"})


def test_unpacked_bundle_alone_reproduces_the_builds_audio(build: dict[str, Any], tmp_path: Path) -> None:
    check_unpacked_bundle_reproduces_the_build(build, tmp_path, 24000)


def test_tritonserver_serves_the_cpu_repository_with_the_same_audio(build: dict[str, Any], tmp_path: Path) -> None:
    check_tritonserver_serves_the_same_audio(build, tmp_path, "cosyvoice3",
                                             "Hello there, this is CosyVoice3 served by Triton.")
