"""bench/print_tables.py against a stored real run (tests/bench/data/run-tiny): every figure in the
tables is the stored files' own value, read here independently; a missing file or value drops its
rows or prints "—"; the ``--doc`` mode rewrites only its marker block.

The stored run is a real `bench/run_all.py` run on builtin:tiny: its ``run()`` (what `make bench`
calls) over quick commands, then the folder's JSON files copied here. How it was made:

    nice -n 19 .venv/bin/python tests/bench/data/make_run_tiny.py
    cp artifacts/bench/runs/<stamp>/*.json tests/bench/data/run-tiny/

The golden rendering tests/bench/data/run-tiny.md is regenerated, after a deliberate change of the
printer or of the stored run, with:

    .venv/bin/python bench/print_tables.py tests/bench/data/run-tiny > tests/bench/data/run-tiny.md
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import print_tables  # noqa: E402

SCRIPT = REPO / "bench" / "print_tables.py"
DATA = Path(__file__).resolve().parent / "data"
RUN = DATA / "run-tiny"
GOLDEN = DATA / "run-tiny.md"


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _e2e_files(run: Path = RUN) -> dict[str, dict]:
    """The stored end-to-end results by recipe name (the file name's tail)."""
    return {p.stem.removeprefix("end_to_end-"): _json(p) for p in sorted(run.glob("end_to_end-*.json"))}


def _copy(tmp_path: Path) -> Path:
    # The same folder name: the header names the run by it.
    dest = tmp_path / RUN.name
    shutil.copytree(RUN, dest)
    return dest


def _table(text: str, first_heading: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose first heading is ``first_heading``, each as heading -> cell."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_heading} |"))
    headings = [c.strip() for c in lines[start].strip("|").split(" | ")]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip().removeprefix("| ").removesuffix(" |").split(" | ")]
        assert len(cells) == len(headings), ln
        rows.append(dict(zip(headings, cells)))
    return rows


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_the_stored_run_is_a_real_run_all_folder() -> None:
    """What the other tests lean on: run_all.json of that run, and real results of two recipes and two
    other scripts (so that every section and each kind of row is exercised)."""
    state = _json(RUN / "run_all.json")
    assert state["finished"] is True and all(s["rc"] == 0 for s in state["scripts"])
    assert set(_e2e_files()) == {"cpu-fp32", "cpu-int8-dynamic"}
    assert (RUN / "noop_rebuild.json").is_file() and (RUN / "cpu-int8-dynamic.json").is_file()
    # Small enough to keep in the repo.
    assert sum(p.stat().st_size for p in RUN.iterdir()) < 100_000


def test_the_rendering_matches_the_golden_file() -> None:
    assert print_tables.render(RUN) == GOLDEN.read_text()


def test_the_header_names_the_machine_and_every_command() -> None:
    state = _json(RUN / "run_all.json")
    text = print_tables.render(RUN)
    first = text.splitlines()[0]
    assert state["machine"] in first and "; 2 threads" in first
    assert f"{len(state['scripts'])} commands" in first and "all exit 0" in first
    for s in state["scripts"]:
        assert f"{s['cmd']}    # {s['seconds']:.0f} s, exit 0\n" in text


def test_each_recipe_row_holds_its_own_figures() -> None:
    rows = {r["recipe"].strip("`"): r for r in _table(print_tables.render(RUN), "recipe")}
    files = _e2e_files()
    assert set(rows) == set(files)
    for recipe, d in files.items():
        row, sp, q = rows[recipe], d["speed"], d["quality"]
        e2e = sp["end_to_end"]
        assert row["RTF reference / built"] == f"{e2e['rtf_reference']:.2f} / {e2e['rtf_built']:.2f}"
        assert row["end to end (spread, pairs)"] == (
            f"{e2e['speedup']:.2f}x ({e2e['spread'][0]:.2f}-{e2e['spread'][1]:.2f}, {e2e['pairs']} pairs)")
        assert row["LLM / flow / HiFT in the pipeline"] == " / ".join(
            f"{sp[s]['speedup']:.2f}x" for s in ("llm", "flow", "hift"))
        assert row["first chunk, built"] == f"{sp['first_chunk']['built_s']:.2f} s, {sp['first_chunk']['speedup']:.2f}x"
        ms = sp["llm"]["per_token_built_ms"]
        assert row["LLM ms/token built"] == (f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}")
        assert row["LLM logit cosine"] == f"{q['llm']['logit_cosine']:.4f}"
        assert row["flow mel SNR"] == f"{q['flow']['cfm_mel_snr_db_min']:.1f} dB"
        assert row["HiFT waveform SNR"] == f"{q['hift']['waveform_snr_db_min']:.1f} dB"
        assert row["gate"] == ("PASS" if d["gate_passed"] else "FAIL")
        assert row["peak RSS"] == f"{sp['peak_rss_mb']:,.0f} MiB"


def test_peak_rss_names_the_step_that_needed_the_most() -> None:
    newer = {"step_peak_rss_mb": {"model": 2793.4, "llm.export": 9120.6, "flow.check": None},
             "speed": {"peak_rss_mb": 880.0}}
    assert print_tables.e2e_rss(newer) == "9,121 MiB (llm.export)"
    assert print_tables.e2e_rss({"speed": {"peak_rss_mb": 880.0}}) == "880 MiB"  # a run from before per-step peaks
    assert print_tables.e2e_rss({"step_peak_rss_mb": {"model": None}}) is None


def test_the_other_ratios_are_the_files_own() -> None:
    rows = _table(print_tables.render(RUN), "ratio")
    by_name = {r["ratio"]: r for r in rows}
    q = _json(RUN / "cpu-int8-dynamic.json")
    flow = by_name[f"`quantized_speed` `cpu-int8-dynamic`: flow estimator ({q['flow']['precision']}, "
                   f"T={q['frames']}) against its FP32 engine"]
    lo, hi = q["flow"]["speedup_spread"]
    assert flow["median (spread, pairs)"] == f"{q['flow']['speedup']:.2f}x ({lo:.2f}-{hi:.2f}, {q['flow']['pairs']} pairs)"
    assert flow["quality"].startswith(f"mel SNR {q['flow']['mel_snr_db_quant_vs_torch']:.1f} dB (FP32 engine ")
    llm = by_name[f"`quantized_speed` `cpu-int8-dynamic`: LLM decode step ({q['llm']['precision']}) against its "
                  "FP32 engine"]
    assert llm["median (spread, pairs)"].startswith(f"{q['llm']['speedup']:.2f}x (")
    assert llm["quality"] == f"logit cosine {q['llm']['logit_cosine_quant_vs_torch']:.4f}"
    noop = _json(RUN / "noop_rebuild.json")
    for setting, r in noop["results"].items():
        row = by_name[f"`noop_rebuild`: no-op rebuild, {setting}, {noop['cache_entries']:,} cache entries"]
        assert row["median (spread, pairs)"] == (
            f"{r['median_s']:.3f} s ({r['min_s']:.3f}-{r['max_s']:.3f}, {noop['runs']} runs)")
        assert row["quality"].startswith(f"torch imported: {'yes' if r['torch_imported'] else 'no'}, ")
    assert len(rows) == 2 + len(noop["results"])


def test_a_missing_file_drops_only_its_rows(tmp_path: Path) -> None:
    full = print_tables.render(RUN)
    run = _copy(tmp_path)
    (run / "end_to_end-cpu-fp32.json").unlink()
    (run / "noop_rebuild.json").unlink()
    text = print_tables.render(run)
    recipes = [r["recipe"] for r in _table(text, "recipe")]
    assert recipes == ["`cpu-int8-dynamic`"]
    assert "noop_rebuild" not in "".join(r["ratio"] for r in _table(text, "ratio"))
    # The rows that stay are the same lines as in the whole run's tables.
    kept = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert kept and all(ln in full.splitlines() for ln in kept)
    # Without any end-to-end file the section goes; without any result at all, there is nothing to print.
    for p in run.glob("end_to_end-*.json"):
        p.unlink()
    assert "End to end" not in print_tables.render(run)
    (run / "cpu-int8-dynamic.json").unlink()
    with pytest.raises(print_tables.TablesError, match="no end_to_end"):
        print_tables.render(run)


def test_an_absent_value_prints_a_dash_and_an_absent_column_goes(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    path = run / "end_to_end-cpu-fp32.json"
    d = _json(path)
    del d["quality"]["hift"]
    del d["speed"]["first_chunk"]
    path.write_text(json.dumps(d))
    rows = {r["recipe"]: r for r in _table(print_tables.render(run), "recipe")}
    assert rows["`cpu-fp32`"]["HiFT waveform SNR"] == "—" and rows["`cpu-fp32`"]["first chunk, built"] == "—"
    assert rows["`cpu-int8-dynamic`"]["HiFT waveform SNR"].endswith(" dB")
    # No file holds it: the column is left out rather than filled with dashes.
    for p in run.glob("end_to_end-*.json"):
        d = _json(p)
        d["quality"].pop("hift", None)
        p.write_text(json.dumps(d))
    assert "HiFT waveform SNR" not in print_tables.render(run)


def test_the_formats_the_stored_run_lacks() -> None:
    """torch_backend, llm_decode and reference_reuse take hours on the real shapes: their rows are
    checked on files shaped as those scripts write them."""
    results = {
        "torch_backend.json": {"threads": 2, "flow": {
            "onnxruntime fp32": {"speedup": 1.0, "spread": [0.98, 1.05], "pairs": 5, "mel_snr_db_after_cfm": 130.3},
            "torch int8 (torch._int_mm)": {"speedup": 1.16, "spread": [1.1, 1.2], "pairs": 8,
                                           "mel_snr_db_after_cfm": 45.7,
                                           "vs_own_fp32": {"speedup": 1.5, "spread": [1.41, 1.62], "pairs": 6}}},
            "hift": {"torch fp32": {"speedup": 1.19, "spread": [1.04, 1.34], "pairs": 5, "waveform_snr_db": 81.1}}},
        "llm_decode-cpu.json": {"device": "cpu", "rows": [
            {"format": "int8", "loop": "growing cache", "batch": 8, "speedup_vs_eager_fp32": 4.14,
             "spread": [4.0, 4.2], "pairs": 4, "logit_cosine": 0.99913}]},
        "reference_reuse.json": {"second_over_first": 0.2431, "builds": {"cpu-fp32": {"validation_s": 190.2},
                                                                          "cpu-int8": {"validation_s": 46.3}}},
    }
    rows = {r["ratio"]: r for r in _table("\n".join(print_tables.other_section({}, results)), "ratio")}
    assert rows == {
        "`torch_backend`: flow estimator, torch int8 (torch._int_mm) against ONNX Runtime FP32": {
            "ratio": "`torch_backend`: flow estimator, torch int8 (torch._int_mm) against ONNX Runtime FP32",
            "median (spread, pairs)": "1.16x (1.10-1.20, 8 pairs)", "quality": "mel SNR 45.7 dB"},
        "`torch_backend`: flow estimator, torch int8 (torch._int_mm) against the torch FP32 package": {
            "ratio": "`torch_backend`: flow estimator, torch int8 (torch._int_mm) against the torch FP32 package",
            "median (spread, pairs)": "1.50x (1.41-1.62, 6 pairs)", "quality": "mel SNR 45.7 dB"},
        "`torch_backend`: HiFT, torch fp32 against ONNX Runtime FP32": {
            "ratio": "`torch_backend`: HiFT, torch fp32 against ONNX Runtime FP32",
            "median (spread, pairs)": "1.19x (1.04-1.34, 5 pairs)", "quality": "waveform SNR 81.1 dB"},
        "`llm_decode` (cpu): int8 package, growing cache, batch 8, against FP32 eager": {
            "ratio": "`llm_decode` (cpu): int8 package, growing cache, batch 8, against FP32 eager",
            "median (spread, pairs)": "4.14x (4.00-4.20, 4 pairs)", "quality": "logit cosine 0.9991"},
        "`reference_reuse`: second recipe's validation time over the first": {
            "ratio": "`reference_reuse`: second recipe's validation time over the first",
            "median (spread, pairs)": "0.243 (46 s / 190 s)", "quality": "—"},
    }


DOC_BEFORE = "# Benchmarks\r\n\nSome text, with a CRLF line above.\n\n<!-- tables: xeon-2026-11 the Xeon VM -->\n"
DOC_AFTER = "<!-- end tables -->\n\nMore text.\n<!-- tables: other -->\nkept\n<!-- end tables -->\n"


def test_doc_mode_replaces_only_its_block(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_bytes((DOC_BEFORE + "old table\n| a |\n" + DOC_AFTER).encode())
    res = _run(str(RUN), "--doc", str(doc), "--slug", "xeon-2026-11")
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    new = doc.read_bytes()
    expected = (DOC_BEFORE + "\n" + print_tables.render(RUN) + "\n" + DOC_AFTER).encode()
    assert new == expected
    # A second run over the filled block gives the same file.
    assert _run(str(RUN), "--doc", str(doc), "--slug", "xeon-2026-11").returncode == 0
    assert doc.read_bytes() == expected


@pytest.mark.parametrize("text", [
    "# Benchmarks\n\nno markers at all\n",
    "<!-- tables: xeon-2026-11 -->\nno end marker\n",
    "<!-- tables: xeon-2026-11b -->\na longer slug is another block\n<!-- end tables -->\n",
    "<!-- tables: xeon-2026-11 -->\n<!-- end tables -->\n<!-- tables: xeon-2026-11 -->\n<!-- end tables -->\n",
])
def test_doc_mode_without_one_marker_block_exits_2(tmp_path: Path, text: str) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(text)
    res = _run(str(RUN), "--doc", str(doc), "--slug", "xeon-2026-11")
    assert res.returncode == 2
    assert len(res.stderr.splitlines()) == 1 and str(doc) in res.stderr and "Traceback" not in res.stderr
    assert doc.read_text() == text


def test_a_malformed_or_oversized_file_exits_2_naming_it(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    bad = run / "end_to_end-cpu-fp32.json"
    bad.write_text('{"speed": ')
    res = _run(str(run))
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and str(bad) in res.stderr and "not valid JSON" in res.stderr
    # Valid JSON but not a result file's object.
    bad.write_text("[1, 2]")
    res = _run(str(run))
    assert res.returncode == 2 and str(bad) in res.stderr and "not a JSON object" in res.stderr
    assert len(res.stderr.splitlines()) == 1
    # Whitespace is valid JSON, so only the cap refuses this one.
    bad.write_bytes(b" " * (4 << 20) + b"{}")
    res = _run(str(run))
    assert res.returncode == 2 and str(bad) in res.stderr and "limit" in res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_a_folder_that_is_not_a_run_exits_2(tmp_path: Path) -> None:
    res = _run(str(tmp_path / "none"))
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "not a run folder" in res.stderr
