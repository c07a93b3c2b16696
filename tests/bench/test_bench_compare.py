"""bench/compare_runs.py, the check behind issue 11's "make bench run twice agrees within 10 %"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO

SCRIPT = REPO / "bench" / "compare_runs.py"


def _run(folder: Path, e2e: float, llm_rows: list[tuple[str, int, float]], reuse: float) -> Path:
    folder.mkdir(parents=True)
    (folder / "end_to_end-cpu-fast.json").write_text(json.dumps(
        {"speed": {"end_to_end": {"speedup": e2e, "spread": [1.0, 9.0]}}, "quality": {"flow": {"speedup_vs_fp32": 1.4}}}))
    (folder / "llm_decode-cpu.json").write_text(json.dumps(
        {"rows": [{"format": f, "loop": "growing cache", "batch": b, "speedup_vs_eager_fp32": v} for f, b, v in llm_rows]}))
    (folder / "reference_reuse.json").write_text(json.dumps({"second_over_first": reuse}))
    (folder / "run_all.json").write_text(json.dumps({"scripts": [{"seconds": 5.0, "speedup": 99.0}]}))
    return folder


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True)


def test_runs_within_tolerance_agree(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 3.44, [("int8", 1, 4.0), ("bf16", 1, 2.0)], 0.236)
    # Rows listed in another order are matched by format/loop/batch, not position.
    b = _run(tmp_path / "b", 3.60, [("bf16", 1, 2.1), ("int8", 1, 4.1)], 0.240)
    res = _compare(a, b)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| end_to_end-cpu-fast: speed.end_to_end.speedup | 3.44x | 3.60x | 4.7 % | ok |" in res.stdout
    assert "llm_decode-cpu: rows[bf16/growing cache/1].speedup_vs_eager_fp32 | 2.00x | 2.10x | 5.0 %" in res.stdout
    # run_all.json's timings are not a ratio of the benchmarks.
    assert "run_all" not in res.stdout and "5 ratios in both runs, 0 differ" in res.stdout


def test_a_ratio_off_by_more_than_ten_percent_fails(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 3.44, [("int8", 1, 4.0)], 0.236)
    b = _run(tmp_path / "b", 3.44, [("int8", 1, 4.5)], 0.236)
    res = _compare(a, b)
    assert res.returncode == 1
    assert "| 12.5 % | OVER |" in res.stdout and "1 differ by more than 10 %" in res.stdout


def test_per_state_ratios_are_counted_apart(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 3.44, [("int8", 1, 4.0)], 0.236)
    b = _run(tmp_path / "b", 3.90, [("int8", 1, 4.0)], 0.236)
    for folder, win in ((a, 3.6), (b, 3.7)):
        f = folder / "end_to_end-cpu-fast.json"
        body = json.loads(f.read_text())
        body["speed"]["end_to_end"]["by_state"] = {"threads_win": {"pairs": 3, "speedup": win}}
        f.write_text(json.dumps(body))
    res = _compare(a, b)
    assert res.returncode == 1  # the overall median still moved 13 %
    assert "speed.end_to_end.by_state.threads_win.speedup | 3.60x | 3.70x | 2.8 % | ok |" in res.stdout
    assert "overall: 4 in both, 1 over" in res.stdout and "per machine state: 1 in both, 0 over" in res.stdout


def test_pairs_that_straddled_a_switch_are_shown_but_not_judged(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 3.44, [("int8", 1, 4.0)], 0.236)
    b = _run(tmp_path / "b", 3.44, [("int8", 1, 4.0)], 0.236)
    for folder, changed in ((a, 3.0), (b, 4.0)):
        f = folder / "end_to_end-cpu-fast.json"
        body = json.loads(f.read_text())
        body["speed"]["end_to_end"]["by_state"] = {"threads_win": {"pairs": 2, "speedup": 3.5},
                                                   "state_changed": {"pairs": 1, "speedup": changed}}
        f.write_text(json.dumps(body))
    res = _compare(a, b)
    assert "by_state.state_changed.speedup | 3.00x | 4.00x | 33.3 % | OVER |" in res.stdout
    assert "pairs that straddled a switch: 1 in both, 1 over" in res.stdout
    assert "per machine state: 1 in both, 0 over" in res.stdout
    assert res.returncode == 0


def test_missing_run_folder_is_a_one_line_error(tmp_path: Path) -> None:
    res = _compare(tmp_path / "nope", tmp_path / "nope2")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "is not a folder" in res.stderr


def test_each_runs_machine_timeline_is_shown(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 3.44, [("int8", 1, 4.0)], 0.236)
    b = _run(tmp_path / "b", 3.44, [("int8", 1, 4.0)], 0.236)
    summary = {"probes": 300, "seconds": 180.0, "switches": 12,
               "threads_win": {"share": 0.25, "spell_s": {"median": 6.0}},
               "threads_lose": {"share": 0.75, "spell_s": {"median": 9.4}}}
    (a / "machine_timeline.json").write_text(json.dumps({"summary": summary}))
    res = _compare(a, b)
    assert res.returncode == 0
    assert ("run A's machine: threads win 25 % of the time (median spell 6 s), threads lose 75 % of the time "
            "(median spell 9 s), 12 switches in 180 s") in res.stdout
    assert "run B's machine" not in res.stdout  # no timeline in that run


def _stamp_machine(folder: Path, line: str) -> None:
    for f in folder.glob("*.json"):
        body = json.loads(f.read_text())
        if isinstance(body, dict):
            f.write_text(json.dumps({**body, "machine": line}))


def test_runs_from_different_machines_are_refused_unless_asked(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 3.44, [("int8", 1, 4.0)], 0.236)
    b = _run(tmp_path / "b", 3.44, [("int8", 1, 4.0)], 0.236)
    _stamp_machine(a, "AMD EPYC (family 26, model 2), 2 vCPU")
    _stamp_machine(b, "Intel Xeon (family 6, model 207), 2 vCPU")
    res = _compare(a, b)
    assert res.returncode == 2 and res.stdout == ""
    assert "different machines" in res.stderr and "model 207" in res.stderr and len(res.stderr.splitlines()) == 1
    forced = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), "--other-machine"], capture_output=True, text=True)
    assert forced.returncode == 0 and "made on different machines" in forced.stdout
    # One machine whose scripts word their line differently (one file adds its thread count) still compares.
    _stamp_machine(b, "AMD EPYC (family 26, model 2), 2 vCPU")
    (b / "llm_decode-cpu.json").write_text(json.dumps({**json.loads((b / "llm_decode-cpu.json").read_text()),
                                                       "machine": "AMD EPYC (family 26, model 2), 2 vCPU, 2 threads"}))
    same = _compare(a, b)
    assert same.returncode == 0 and "different machines" not in same.stdout + same.stderr
