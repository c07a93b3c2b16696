"""Property-based hostile input: generated recipes, eval manifests, bundle manifests, reports and cache
entries, each read by the function the CLI reads it with. Every example must end in success or in the
one-line error class the CLI turns into exit 2 (a UserError, one line), never another exception, and
within a time bound.

In CI the examples are few and derived from each test's name (``derandomize``), so a run is the same
every time; ``make fuzz`` sets ``COSYCOMPILE_FUZZ_EXAMPLES`` high and ``COSYCOMPILE_FUZZ_RANDOM=1``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import EVAL_SET, REPO

EXAMPLES = int(os.environ.get("COSYCOMPILE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("COSYCOMPILE_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much, HealthCheck.data_too_large])
MAX_SECONDS = 5.0  # per example: these are reads and checks, not builds

SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=24))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=16)

# Keys a recipe really has: a fuzzed value lands where the schema looks, not only in unknown keys.
RECIPE_PATHS = [
    ("name",), ("model",), ("target",), ("exports",), ("description",),
    ("validation", "max_items"), ("validation", "speed", "threads"), ("validation", "speed", "runs"),
    ("validation", "speed", "min_seconds"), ("validation", "speed", "throughput"), ("validation", "speed", "reference"),
    ("validation", "sampling", "seed"), ("validation", "sampling", "mode"), ("validation", "sampling", "max_tokens"),
    ("validation", "gate", "min"), ("validation", "gate", "max"), ("validation", "gate", "max_quality_drop"),
    ("calibration", "max_items"), ("calibration", "set"),
    ("stages", "llm", "quantize", "format"), ("stages", "flow", "quantize"), ("stages", "hift", "engine", "backend"),
    ("stages", "flow", "engine", "options"), ("stages", "llm", "enabled"), ("stages", "flow", "check"),
    ("stages", "flow", "runtime"), ("stages", "nope"),
]


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def _one_line_or_success(call: Callable[[], Any]) -> None:
    """Run ``call``: success, or a UserError whose message is one line (what the CLI prints as exit 2)."""
    from cosycompile.errors import UserError

    t0 = time.perf_counter()
    try:
        call()
    except UserError as exc:
        assert "\n" not in str(exc) and str(exc).strip(), repr(str(exc))
    assert time.perf_counter() - t0 < MAX_SECONDS


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(RECIPE_PATHS), VALUES), max_size=4),
       raw=st.one_of(st.none(), st.text(max_size=200)))
def test_generated_recipes_load_or_fail_in_one_line(tmp_path: Path, edits: list, raw: str | None) -> None:
    from cosycompile.recipe.schema import load_recipe

    tree: dict[str, Any] = {"extends": str(REPO / "recipes" / "cpu-int8.yaml"), "name": "fuzz",
                            "validation": {"eval_set": str(EVAL_SET)}}
    for path, value in edits:
        _set(tree, path, value)
    p = tmp_path / "fuzz.yaml"
    p.write_text(raw if raw is not None else yaml.safe_dump(tree, allow_unicode=True), encoding="utf-8")
    _one_line_or_success(lambda: load_recipe(p).typed("flow"))


ROW_KEYS = st.sampled_from(["id", "text", "lang", "prompt_text", "prompt_wav", "extra"])


@FUZZ
@given(rows=st.lists(st.one_of(st.dictionaries(ROW_KEYS, VALUES, max_size=5), VALUES), max_size=4),
       garbage=st.binary(max_size=64))
def test_generated_eval_manifests_load_or_fail_in_one_line(tmp_path: Path, rows: list, garbage: bytes) -> None:
    from cosycompile.runtime.dataset import load_dataset

    root = tmp_path / "set"
    root.mkdir(exist_ok=True)
    lines = [json.dumps(r) for r in rows]
    (root / "manifest.jsonl").write_bytes("\n".join(lines).encode() + (b"\n" + garbage if garbage else b""))
    _one_line_or_success(lambda: load_dataset(root))


@FUZZ
@given(body=VALUES, files=st.dictionaries(st.text(max_size=20), VALUES, max_size=4),
       sizes=st.one_of(st.none(), st.dictionaries(st.text(max_size=20), VALUES, max_size=4)))
def test_generated_bundle_manifests_read_or_fail_in_one_line(tmp_path: Path, body: Any, files: dict,
                                                             sizes: dict | None) -> None:
    from cosycompile.runtime.bundle import read_manifest

    doc = body if not isinstance(body, dict) else {**body, "files": files, **({"sizes": sizes} if sizes else {})}
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps(doc))
    _one_line_or_success(lambda: read_manifest(p))


METRICS = st.sampled_from(["flow.mel_snr_db", "llm.max_abs_logit_error", "hift.waveform_snr_db", "speed.rtf"])


@FUZZ
@given(report=st.one_of(VALUES, st.fixed_dictionaries({"checks": st.dictionaries(
           st.sampled_from(["llm", "flow", "hift", "pipeline"]), VALUES, max_size=4)})),
       baseline=VALUES, limits=st.dictionaries(METRICS, st.floats(allow_nan=True), max_size=3))
def test_generated_reports_gate_or_fail_in_one_line(tmp_path: Path, report: Any, baseline: Any, limits: dict) -> None:
    from cosycompile.validate.gate import check_baseline, check_thresholds, load_report

    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "base.json").write_text(json.dumps(baseline))

    def gate() -> None:
        rep, base = load_report(tmp_path / "report.json"), load_report(tmp_path / "base.json")
        check_thresholds(rep, limits, {})
        check_baseline(rep, base, 0.05, 0.25)

    _one_line_or_success(gate)


@FUZZ
@given(body=st.one_of(VALUES, st.fixed_dictionaries({"version": st.just(1), "key": st.just("ab" * 32),
                                                     "files": VALUES})))
def test_generated_cache_entries_read_or_are_broken(tmp_path: Path, body: Any) -> None:
    """Not a UserError here: a malformed entry is a CorruptEntry, which the cache tools report and remove."""
    from cosycompile.cache.local import CorruptEntry, read_entry

    entry = tmp_path / ("ab" * 32) / "entry.json"
    entry.parent.mkdir(exist_ok=True)
    entry.write_text(json.dumps(body))
    try:
        meta = read_entry(entry)
    except CorruptEntry:
        return
    assert isinstance(meta["files"], dict)

