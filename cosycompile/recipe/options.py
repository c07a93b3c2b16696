"""The recipe option reference (``cosycompile recipe --options``), generated from the specs'
``Field(description=...)`` and the plug-in registries, so that it cannot fall behind the code."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from cosycompile.recipe.schema import RESERVED_KEYS, Recipe, StageSpec


@dataclass(frozen=True)
class Option:
    """One recipe key: its dotted path, type, default (None: required) and description; ``scope``
    says which plug-in's spec it belongs to (empty for the recipe's own keys)."""

    key: str
    type: str
    default: str | None
    description: str
    scope: str = ""


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _type_name(annotation: Any) -> str:
    """A type as a recipe writer reads it: ``list[int (>= 1, <= 256)]``, ``str | None``, ``mapping``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        base, *meta = args
        # A constraint may sit on the Annotated itself or inside a pydantic FieldInfo's metadata.
        items = [m for x in meta for m in (getattr(x, "metadata", None) or [x])]
        bounds = [f"{op} {getattr(m, attr)}" for m in items for attr, op in _BOUNDS if getattr(m, attr, None) is not None]
        return _type_name(base) + (f" ({', '.join(bounds)})" if bounds else "")
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    if origin is not None:
        names = ['...' if a is Ellipsis else _type_name(a) for a in args]
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(names)}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str | None:
    if field.is_required():
        return None
    value = field.default_factory() if field.default is PydanticUndefined else field.default
    if isinstance(value, BaseModel):
        return "(mapping below)"
    return json.dumps(value, default=str)  # as YAML reads it: false, null, "cpu"


def fields_of(model: type[BaseModel], prefix: str, scope: str = "") -> Iterator[Option]:
    """Every key of ``model`` under ``prefix``, nested specs walked into."""
    for name, field in model.model_fields.items():
        if not prefix and name in RESERVED_KEYS:
            continue
        key = f"{prefix}{name}"
        annotation = field.annotation
        yield Option(key, _type_name(annotation), _default(field), field.description or "", scope)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from fields_of(annotation, key + ".", scope)


def recipe_options() -> list[Option]:
    """The whole reference: the recipe's keys, each stage's keys, then every plug-in's spec where a
    recipe writes it (``stages.<stage>.quantize`` per quantizer, ``.engine.options`` per backend,
    ``.check`` and ``.runtime`` per stage)."""
    from cosycompile.backends import backend_infos
    from cosycompile.quantize import NoQuantization, quantizer_infos
    from cosycompile.stages import stage_infos

    out = [o for o in fields_of(Recipe, "") if o.key != "stages"]
    stages = stage_infos()
    scope = f"stages: {', '.join(stages)}"
    out.append(Option("stages", "mapping", "{}", Recipe.model_fields["stages"].description or "", scope))
    out += fields_of(StageSpec, "stages.<stage>.", scope)
    out += fields_of(NoQuantization, "stages.<stage>.quantize.", "format fp32 (no quantizer)")
    for name, q in quantizer_infos().items():
        out += fields_of(q.spec, "stages.<stage>.quantize.", f"quantizer {name} (formats {', '.join(q.formats)})")
    for name, b in backend_infos().items():
        out += fields_of(b.options, "stages.<stage>.engine.options.", f"backend {name}")
    for name, s in stages.items():
        out += fields_of(s.check_spec, f"stages.{name}.check.", f"stage {name}")
        if s.runtime_spec is not None:
            out += fields_of(s.runtime_spec, f"stages.{name}.runtime.", f"stage {name}")
    return out


def render(options: list[Option]) -> str:
    """The reference as text: one line per key, grouped under the spec that defines it."""
    lines: list[str] = []
    scope = None
    for o in options:
        if o.scope != scope:
            scope = o.scope
            lines.append(f"\n# {scope}" if scope else "# recipe")
        default = "required" if o.default is None else f"default {o.default}"
        lines.append(f"{o.key}  ({o.type}; {default})\n    {o.description}")
    return "\n".join(lines) + "\n"
