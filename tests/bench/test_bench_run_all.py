"""bench/run_all.py, `make bench`'s driver: a run is kept as each command ends, so that one killed
part way keeps what it finished and `--resume` runs only the rest. The commands here are real
subprocesses standing in for the benchmark scripts, which take hours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402

SCRIPT = REPO / "bench" / "run_all.py"


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_each_command_is_recorded_before_the_next_starts(tmp_path: Path) -> None:
    results, folder = tmp_path / "bench", tmp_path / "bench" / "runs" / "r1"
    results.mkdir()
    first = _py(f"import pathlib; pathlib.Path({str(results / 'a.json')!r}).write_text('{{\"x\": 1}}')")
    # The second command checks what a kill at this moment would leave: the first one's result
    # file and its line in run_all.json, the run not yet marked finished.
    second = _py(
        "import json, pathlib, sys\n"
        f"folder = pathlib.Path({str(folder)!r})\n"
        "state = json.loads((folder / 'run_all.json').read_text())\n"
        "assert (folder / 'a.json').read_text() == '{\"x\": 1}', 'first result not kept'\n"
        "assert [s['rc'] for s in state['scripts']] == [0] and state['finished'] is False, state\n"
        f"pathlib.Path({str(results / 'b.json')!r}).write_text('{{}}')\n"
        "sys.exit(3)\n")
    rc = run_all.run([first, second], folder, results, [], only=["some"])
    assert rc == 3
    state = json.loads((folder / "run_all.json").read_text())
    assert [s["rc"] for s in state["scripts"]] == [0, 3] and state["finished"] is True and state["only"] == ["some"]
    assert {p.name for p in folder.iterdir()} == {"a.json", "b.json", "run_all.json"}


def test_a_result_file_from_before_the_run_is_not_taken(tmp_path: Path) -> None:
    results, folder = tmp_path / "bench", tmp_path / "runs" / "r1"
    results.mkdir()
    (results / "old.json").write_text("{}")
    old = (results / "old.json").stat().st_mtime - 60
    os.utime(results / "old.json", (old, old))
    assert run_all.run([_py("pass")], folder, results, []) == 0
    assert not (folder / "old.json").exists()


def test_the_fresh_dir_exists_during_its_command_and_is_gone_after(tmp_path: Path) -> None:
    results, folder = tmp_path / "bench", tmp_path / "runs" / "r1"
    results.mkdir()
    cmd = _py("import json, os, pathlib, sys\n"
              "d = pathlib.Path(sys.argv[1])\n"
              "assert d.is_dir() and not any(d.iterdir()), d\n"
              f"pathlib.Path({str(results / 'fresh.json')!r}).write_text(json.dumps(str(d)))\n") + [run_all.FRESH]
    assert run_all.run([cmd], folder, results, []) == 0
    used = Path(json.loads((folder / "fresh.json").read_text()))
    assert used.name.startswith("reference-reuse-") and not used.exists()


def test_pending_skips_what_finished_and_reruns_what_failed() -> None:
    cmds = run_all.commands()
    labels = [run_all.label(c) for c in cmds]
    # The fresh dir is a placeholder, so reference_reuse's label is the same in every run.
    assert "reference_reuse.py --artifacts <fresh dir>" in labels and len(set(labels)) == len(labels)
    scripts = [{"cmd": labels[0], "rc": 0}, {"cmd": labels[1], "rc": 1}]
    assert [run_all.label(c) for c in run_all.pending(cmds, scripts, [])] == labels[1:]
    e2e = run_all.pending(cmds, scripts, ["end_to_end"])
    assert [run_all.label(c) for c in e2e] == [x for x in labels if "end_to_end" in x]


def test_resume_refuses_a_folder_that_is_not_a_run_and_one_with_nothing_left(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--resume", str(tmp_path / "none")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "not a run folder" in res.stderr and "Traceback" not in res.stderr
    done = tmp_path / "done"
    done.mkdir()
    (done / "run_all.json").write_text(json.dumps(
        {"scripts": [{"cmd": run_all.label(c), "seconds": 1.0, "rc": 0} for c in run_all.commands()], "seconds": 15}))
    res = subprocess.run([sys.executable, str(SCRIPT), "--resume", str(done)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "nothing to run: every command finished" in res.stderr


def test_resume_keeps_the_runs_only_words(tmp_path: Path) -> None:
    # A run of `make bench ONLY=noop_rebuild` that finished its one command: resuming it must not
    # start the rest of `make bench` (hours), only what that run asked for.
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_all.json").write_text(json.dumps(
        {"only": ["noop_rebuild"], "scripts": [{"cmd": "noop_rebuild.py", "seconds": 50.0, "rc": 0}], "seconds": 50}))
    res = subprocess.run([sys.executable, str(SCRIPT), "--resume", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "nothing to run: every command asked for finished" in res.stderr, res.stderr


def test_sigterm_stops_the_run_and_removes_the_fresh_dir(tmp_path: Path) -> None:
    results, folder = tmp_path / "bench", tmp_path / "runs" / "r1"
    results.mkdir()
    seen = tmp_path / "fresh-path"
    # The command notes its fresh dir, fills it a little and waits to be stopped.
    child = ("import pathlib, sys, time\n"
             f"pathlib.Path({str(seen)!r}).write_text(sys.argv[1])\n"
             "(pathlib.Path(sys.argv[1]) / 'engine.bin').write_bytes(b'0' * 4096)\n"
             "time.sleep(60)\n")
    driver = ("import sys\n"
              f"sys.path.insert(0, {str(REPO / 'bench')!r})\n"
              "import run_all, pathlib\n"
              "run_all.stop_on_sigterm()\n"
              "try:\n"
              f"    run_all.run([[sys.executable, '-c', {child!r}, run_all.FRESH]], pathlib.Path({str(folder)!r}), "
              f"pathlib.Path({str(results)!r}), [])\n"
              "except KeyboardInterrupt:\n"
              "    sys.exit(130)\n")
    proc = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.time() + 60
    while not seen.exists() and time.time() < deadline:
        time.sleep(0.1)
    fresh = Path(seen.read_text())
    assert fresh.is_dir()
    proc.terminate()
    assert proc.wait(timeout=30) == 130
    assert not fresh.exists()


def test_the_05b_tests_run_in_the_bench_and_not_in_make_test() -> None:
    """``make test`` deselects the ``model05b`` tests (tests/conftest.py); ``make bench`` runs exactly those."""
    cmd = next(c for c in run_all.commands() if "model05b" in c)
    assert cmd[1:3] == ["-m", "pytest"]

    def collected(*args: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                              str(REPO / "tests" / "stages" / "test_hf_rewrite.py")],
                             capture_output=True, text=True, timeout=300, cwd=REPO).stdout
        return {line.split("::", 1)[1] for line in out.splitlines() if "::" in line}

    default, only = collected(), collected("-m", "model05b")
    assert only == {"test_random_05b_logits_and_greedy"}
    assert default and not default & only
