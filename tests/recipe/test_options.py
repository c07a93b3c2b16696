"""``cosycompile recipe --options``: the reference covers every spec and every field says what it is."""

from __future__ import annotations

import json
import subprocess
import sys

from pydantic import BaseModel, Field

from cosycompile.recipe.options import fields_of, recipe_options


def test_every_recipe_key_and_plugin_option_has_a_description() -> None:
    options = recipe_options()
    missing = [f"{o.key} ({o.scope or 'recipe'})" for o in options if not o.description.strip()]
    assert not missing, f"spec fields without Field(description=...): {missing}"


def test_the_reference_reaches_every_kind_of_spec() -> None:
    from cosycompile.backends import backend_infos
    from cosycompile.quantize import quantizer_infos

    options = recipe_options()
    keys = {o.key for o in options}
    scopes = {o.scope for o in options}
    assert {"name", "model", "validation.speed.threads", "validation.gate.max_slowdown", "stages.<stage>.enabled",
            "stages.<stage>.engine.backend", "stages.flow.check.lengths", "stages.llm.check.speed_tokens"} <= keys
    assert {f"backend {b}" for b in backend_infos()} <= scopes
    assert {s.split(" (", 1)[0] for s in scopes if s.startswith("quantizer ")} == {f"quantizer {q}" for q in quantizer_infos()}
    assert "source" not in keys and "base_dir" not in keys  # filled in by the loader


def test_a_field_without_a_description_shows() -> None:
    class Spec(BaseModel):
        good: int = Field(1, description="has one")
        bad: int = 2

    assert [o.key for o in fields_of(Spec, "x.") if not o.description] == ["x.bad"]


def test_the_command_prints_the_reference() -> None:
    text = subprocess.run([sys.executable, "-m", "cosycompile", "recipe", "--options"], capture_output=True, text=True,
                          timeout=120)
    assert text.returncode == 0 and "validation.speed.threads  (int; default 2)" in text.stdout, text.stderr
    listed = subprocess.run([sys.executable, "-m", "cosycompile", "recipe", "--options", "--json"], capture_output=True,
                            text=True, timeout=120)
    assert {o["key"] for o in json.loads(listed.stdout)} == {o.key for o in recipe_options()}
    bare = subprocess.run([sys.executable, "-m", "cosycompile", "recipe"], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and "--options" in bare.stderr


def test_types_read_as_a_recipe_writer_writes_them() -> None:
    from typing import Annotated, Literal

    from pydantic import Field

    from cosycompile.recipe.options import _type_name

    assert _type_name(list[Annotated[int, Field(ge=1, le=256)]]) == "list[int (>= 1, <= 256)]"
    assert _type_name(tuple[Literal["a", "b"], ...]) == "tuple['a' | 'b', ...]"
    assert _type_name(dict[str, float | None]) == "dict[str, float | None]"
    # No type in the whole reference prints as Python's repr of its annotation.
    from cosycompile.recipe.options import recipe_options

    assert not [o.key for o in recipe_options() if "FieldInfo" in o.type or "Annotated" in o.type or "typing" in o.type]
