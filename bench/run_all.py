"""`make bench`: every benchmark of the project, each measuring its ratios within one run.

Runs bench/machine_timeline.py for 3 minutes (the share and spells of the VM's two states), then
bench/quantized_speed.py for the INT8 (static and dynamic flow) and INT4 CPU recipes on
builtin:random-0.5b (interleaved FP32/quantized pairs, 60 s windows), bench/flow_sensitivity.py (simulated INT8
per layer group of the flow estimator), bench/cfm_steps.py (mel SNR of fewer CFM steps against 10),
bench/torch_backend.py (AOTInductor vs ONNX
Runtime FP32 packages, interleaved), bench/llm_decode.py (the LLM decode step's torch packages vs the
FP32 eager step, with the bandwidth floor), bench/flow_profile.py (where a cpu-fast flow-estimator
call spends its time, by operator), bench/reference_reuse.py (validation time of a second recipe on
the same model), bench/end_to_end.py (offline RTF and first chunk against the FP32 reference in the
same run, for the INT8 recipes, cpu-fast and cpu-fast-cfm5) and bench/noop_rebuild.py, then the tests marked model05b
(0.5B shapes, which `make test` leaves out), and prints their tables;
record a run as a new file of docs/bench-log/ (docs/bench-log/README.md) with the command and the machine.

Each run's result files are kept under artifacts/bench/runs/<stamp>/ with every script's wall time
(run_all.json), written as each command ends: a run killed part way keeps what it finished, and
``--resume artifacts/bench/runs/<stamp>`` runs only the commands that folder lacks (or that failed)
into the same folder. At the end, its ratios are printed against the previous run's
(bench/compare_runs.py). A second run reuses the engines the first one built (the scripts' artifacts
dirs persist), so it mostly measures. ``--only WORD[,WORD]`` runs the commands that contain one of the words.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from builtin_models import machine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from cosycompile.core.atomic import write_atomic  # noqa: E402


# Stands for the fresh artifacts dir of reference_reuse.py until a run makes one, so that a command's
# label is the same in every run (``--only`` and ``--resume`` match labels).
FRESH = "<fresh dir>"


def commands() -> list[list[str]]:
    """Every benchmark command of a run, in order."""
    py, bench = sys.executable, REPO / "bench"
    # First, how the VM's state runs today: the share of each state moves the overall ratios.
    cmds = [[py, str(bench / "machine_timeline.py"), "--minutes", "3"]]
    cmds += [[py, str(bench / "quantized_speed.py"), "--recipe", str(REPO / "recipes" / f"{r}.yaml")]
             for r in ("cpu-int8", "cpu-int8-dynamic", "cpu-int4")]
    cmds += [[py, str(bench / s)] for s in ("flow_sensitivity.py", "cfm_steps.py", "torch_backend.py", "llm_decode.py",
                                            "flow_profile.py")]
    # A fresh artifacts dir: the first build must compute the reference for the ratio to mean anything.
    cmds.append([py, str(bench / "reference_reuse.py"), "--artifacts", FRESH])
    cmds += [[py, str(bench / "end_to_end.py"), "--recipe", str(REPO / "recipes" / f"{r}.yaml")]
             for r in ("cpu-int8", "cpu-int8-dynamic", "cpu-fast", "cpu-fast-cfm5")]
    # CosyVoice3 on its 0.5B shapes: its FP32 engines, INT8 and the fast recipe against its own reference.
    cmds += [[py, str(bench / "end_to_end.py"), "--recipe", str(REPO / "recipes" / f"{r}.yaml"),
              "--model", "builtin:cv3-random-0.5b"] for r in ("cv3-cpu-fp32", "cv3-cpu-int8", "cv3-cpu-fast")]
    cmds.append([py, str(bench / "noop_rebuild.py")])
    # The tests of the 0.5B shapes, which CI leaves out (tests/conftest.py).
    cmds.append([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "model05b", str(REPO / "tests")])
    return cmds


def label(cmd: list[str]) -> str:
    """A command without the interpreter and the repo's paths: ``end_to_end.py --recipe cpu-fast.yaml``."""
    return " ".join(Path(c).name if c.startswith(str(REPO)) else c for c in cmd[1:])


def pending(cmds: list[list[str]], scripts: list[dict], words: list[str]) -> list[list[str]]:
    """The commands, in order, that contain one of ``words`` (all if none) and that ``scripts`` (a
    run's record) does not show as finished with exit 0."""
    done = {s["cmd"] for s in scripts if s.get("rc") == 0}
    return [c for c in cmds if (not words or any(w in label(c) for w in words)) and label(c) not in done]


def record(folder: Path, results: Path, since: float, state: dict) -> None:
    """Copy into ``folder`` the result files written since ``since`` and write ``state`` (the run's
    machine, ``--only`` words, scripts so far, seconds, finished) as its run_all.json."""
    for f in results.glob("*.json"):
        if f.stat().st_mtime >= since:
            write_atomic(folder / f.name, f.read_bytes())
    write_atomic(folder / "run_all.json", json.dumps(state, indent=1).encode())


def run(todo: list[list[str]], folder: Path, results: Path, scripts: list[dict], seconds_before: float = 0.0,
        only: list[str] | None = None) -> int:
    """Run ``todo`` in order, recording each command's wall time, exit status and result files in
    ``folder`` as it ends (``scripts``: what an earlier, resumed part of the run recorded; ``only``:
    the run's ``--only`` words, kept for ``--resume``). A command holding ``FRESH`` gets an empty
    temporary dir, removed when it ends. Returns the OR of the exit statuses."""
    folder.mkdir(parents=True, exist_ok=True)
    started, rc, host = time.time(), 0, machine()

    def state(finished: bool) -> dict:
        return {"machine": host, "only": only or [], "scripts": scripts,
                "seconds": round(seconds_before + time.time() - started), "finished": finished}

    for cmd in todo:
        # reference_reuse's cache holds a second copy of the 0.5B engines (about 10 GB): it goes as soon
        # as the command ends, not after the end-to-end builds that follow have filled the disk beside it.
        fresh_dir = tempfile.TemporaryDirectory(prefix="reference-reuse-") if FRESH in cmd else contextlib.nullcontext("")
        with fresh_dir as fresh:
            argv = [fresh if c == FRESH else c for c in cmd]
            print("$", " ".join(argv), flush=True)
            t0, since = time.perf_counter(), time.time()
            code = subprocess.call(argv)
        scripts = [s for s in scripts if s["cmd"] != label(cmd)]
        scripts.append({"cmd": label(cmd), "seconds": round(time.perf_counter() - t0, 1), "rc": code})
        print(f"  ({scripts[-1]['seconds']:.0f} s, exit {code})", flush=True)
        rc |= code
        record(folder, results, since, state(finished=False))
    record(folder, results, time.time(), state(finished=True))
    return rc


def stop_on_sigterm() -> None:
    """Make SIGTERM (a session's end, a CI job cancelled) stop a run the way Ctrl-C does: the
    running command is killed, and the fresh dir of reference_reuse (about 10 GB) is removed
    instead of being left in the temp dir."""
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated; run only the commands whose label contains one, "
                                               "e.g. 'torch_backend,end_to_end.py --recipe cpu-fast.yaml'")
    ap.add_argument("--resume", type=Path, metavar="RUN_DIR",
                    help="a run's folder (artifacts/bench/runs/<stamp>): run, into that folder, the commands of "
                         "that run (its --only, unless given again) that it has not finished with exit 0")
    args = ap.parse_args()
    words = [w for w in args.only.split(",") if w]
    results = REPO / "artifacts" / "bench"
    runs = results / "runs"
    scripts: list[dict] = []
    seconds_before = 0.0
    if args.resume:
        folder = args.resume.resolve()
        try:
            state = json.loads((folder / "run_all.json").read_text())
            scripts, seconds_before = list(state["scripts"]), float(state.get("seconds", 0))
            words = words or list(state.get("only", []))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"run_all: --resume {args.resume}: not a run folder with a readable run_all.json ({e})",
                  file=sys.stderr)
            return 2
    else:
        folder = runs / time.strftime("%Y%m%d-%H%M%S")
    todo = pending(commands(), scripts, words)
    if not todo:
        why = f"every command {'asked for ' if words else ''}finished in {folder}" if args.resume else \
            f"no benchmark command contains any of {words}"
        print(f"run_all: nothing to run: {why}", file=sys.stderr)
        return 2
    print(f"run folder: {folder} (if this run stops early: make bench RESUME={folder})", flush=True)
    stop_on_sigterm()
    try:
        rc = run(todo, folder, results, scripts, seconds_before, words)
    except KeyboardInterrupt:
        # What finished is on disk already; the interrupted command runs again on resume.
        print(f"\nrun_all: stopped; to go on: make bench RESUME={folder}", file=sys.stderr)
        return 130
    state = json.loads((folder / "run_all.json").read_text())
    print(f"\nrun kept in {folder} ({state['seconds'] / 60:.0f} min)")
    previous = sorted(p for p in runs.iterdir() if p.is_dir() and p.name < folder.name) if runs.is_dir() else []
    if previous:
        print(f"against the previous run ({previous[-1].name}):", flush=True)
        subprocess.call([sys.executable, str(REPO / "bench" / "compare_runs.py"), str(previous[-1]), str(folder)])
    return rc


if __name__ == "__main__":
    sys.exit(main())
