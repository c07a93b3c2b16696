"""Print a `make bench` run as the "current tables" of docs/benchmarks.md.

`bench/run_all.py` keeps each run's result files under ``artifacts/bench/runs/<stamp>/`` with its
``run_all.json`` (the machine line, each command with its wall time and exit status). This reads
such a folder and prints Markdown:

- a header line: the run's stamp and date, the machine (CPU line) and thread count, then the run's
  commands with their wall time and exit status;
- the end-to-end table, one row per ``end_to_end-<recipe>.json``: RTF of the reference and of the
  build, the end-to-end speed-up (median of interleaved pairs, spread, pairs), each stage's speed-up
  inside the pipeline, the LLM's ms/token, the first chunk, the quality of the same engines
  (LLM logit cosine, flow mel SNR, HiFT waveform SNR), the gate and the peak RSS (of the step
  that needed the most);
- the other ratios, from the files of quantized_speed.py (``<recipe>.json``), torch_backend.py,
  llm_decode.py, reference_reuse.py and noop_rebuild.py: the ratio, its median (spread, pairs) and
  the quality of the same engine.

A file the run lacks leaves out its rows, a column no file holds is left out, and a value one file
lacks prints as "—": the tables say what the run measured and nothing else.

Usage: python bench/print_tables.py [RUN_DIR]                 (default: the newest run under artifacts/bench/runs)
       python bench/print_tables.py RUN_DIR --doc docs/benchmarks.md --slug SLUG
With ``--doc FILE --slug SLUG`` the tables replace what lies between the line that starts with
``<!-- tables: SLUG`` and the next ``<!-- end tables -->`` line of FILE (both marker lines kept, the
rest of FILE byte for byte as it was), written atomically; a line on stderr says so.
Exit status 2, with a one-line message, when the folder is not there or holds no result this prints,
a result file is over 4 MiB or not valid JSON (the message names it), or FILE lacks the markers.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from cosycompile.core.atomic import write_atomic  # noqa: E402
from cosycompile.core.bounded_read import read_json, read_text  # noqa: E402
from cosycompile.errors import UserError  # noqa: E402

RUNS = REPO / "artifacts" / "bench" / "runs"
# A result file is a few kB (an end-to-end one about 5 kB); anything near this cap is not one, and
# reading it whole would only spend memory.
MAX_FILE_BYTES = 4 << 20
DASH = "—"
# The number of CFM steps of CosyVoice's flow: a recipe that solves with fewer says so next to its
# mel SNR, which then measures the fewer steps against the reference's.
DEFAULT_CFM_STEPS = 10
STAMP = re.compile(r"^(\d{4})(\d{2})(\d{2})-(\d{2})(\d{2})(\d{2})$")
END_MARKER = "<!-- end tables -->"

Json = dict[str, Any]


class TablesError(Exception):
    """What stops the tables: the one line the command prints before it exits with status 2."""


# --- reading values that may be absent -------------------------------------------------------------

def dig(node: Any, *keys: str) -> Any:
    """``node[k1][k2]...``, or None where a level is absent or not a JSON object: a result file
    from an older script may lack a key, and that is a "—", not a crash."""
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (absent, a string, a bool, NaN or infinite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def fixed(value: Any, digits: int, suffix: str = "") -> str:
    """``value`` with ``digits`` decimals and ``suffix``, or "—"."""
    x = number(value)
    return DASH if x is None else f"{x:.{digits}f}{suffix}"


def times(value: Any) -> str:
    """A ratio as ``1.79x``, or "—"."""
    return fixed(value, 2, "x")


def count(n: int, noun: str) -> str:
    """``1 pair``, ``3 pairs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def spread_pairs(spread: Any, pairs: Any) -> str:
    """``(min-max, pairs)`` of a median of pairs; the parts the file lacks are left out."""
    parts = []
    if isinstance(spread, list) and len(spread) == 2 and all(number(s) is not None for s in spread):
        parts.append(f"{spread[0]:.2f}-{spread[1]:.2f}")
    if isinstance(pairs, int) and not isinstance(pairs, bool):
        parts.append(count(pairs, "pair"))
    return f" ({', '.join(parts)})" if parts else ""


def median_cell(ratio: Any, spread: Any, pairs: Any) -> str:
    """A ratio with its spread and pairs, e.g. ``1.35x (1.08-1.95, 15 pairs)``; "—" without a ratio."""
    return DASH if number(ratio) is None else times(ratio) + spread_pairs(spread, pairs)


def code(text: Any) -> str:
    return f"`{text}`" if text not in (None, "") else DASH


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Markdown table lines; a "|" inside a cell would split it, so it is escaped."""
    def line(cells: Iterable[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]


def distinct(values: Iterable[Any]) -> list[Any]:
    """The values in first-seen order, each once, Nones left out."""
    out: list[Any] = []
    for v in values:
        if v is not None and v not in out:
            out.append(v)
    return out


# --- reading the run ---------------------------------------------------------------------------------

def load_run(run_dir: Path) -> tuple[Json, dict[str, Json]]:
    """The run's ``run_all.json`` (empty for a folder made by hand) and its result files by name.

    Every ``*.json`` is read, bounded: quantized_speed.py names its file after the recipe, so a file
    is known by what it holds, not by its name alone.
    """
    if not run_dir.is_dir():
        raise TablesError(f"{run_dir}: not a run folder")
    state: Json = {}
    results: dict[str, Json] = {}
    for path in sorted(run_dir.glob("*.json")):
        try:
            data = read_json(path, MAX_FILE_BYTES, "a bench result file")
        except UserError as e:
            raise TablesError(str(e)) from None
        if not isinstance(data, dict):
            raise TablesError(f"{path}: not a JSON object, so not a bench result file")
        if path.name == "run_all.json":
            state = data
        else:
            results[path.name] = data
    return state, results


def is_quantized_speed(data: Json) -> bool:
    """quantized_speed.py's file: flow and LLM each timed as quantized against FP32 engines."""
    return any(isinstance(dig(data, s), dict) and any(k.startswith("quant_engine_ms") for k in data[s])
               for s in ("flow", "llm"))


def run_order(state: Json, name: str) -> int:
    """Where the command that wrote result file ``name`` (``end_to_end-<recipe>.json`` or
    quantized_speed's ``<recipe>.json``) ran in the run, unknown ones last: rows follow the run, as
    the commands in the header do."""
    stem = name.removesuffix(".json")
    script, recipe = ("end_to_end.py", stem[len("end_to_end-"):]) if stem.startswith("end_to_end-") else \
        ("quantized_speed.py", stem)
    # A label names a recipe of the repo by its file name and any other by its path.
    wrote = re.compile(rf"--recipe (\S*/)?{re.escape(recipe)}\.yaml(\s|$)")
    scripts = state.get("scripts") if isinstance(state.get("scripts"), list) else []
    for i, s in enumerate(scripts):
        label = str(dig(s, "cmd") or "")
        if label.startswith(script) and wrote.search(label):
            return i
    return len(scripts)


# --- the header ---------------------------------------------------------------------------------------

def when(run_dir: Path) -> str:
    """The run's stamp (its folder's name, ``run_all.py``'s local start time) and the date it stands for."""
    m = STAMP.match(run_dir.name)
    if not m:
        return f"`{run_dir.name}`"
    y, mo, d, h, mi, _ = m.groups()
    return f"`{run_dir.name}` ({y}-{mo}-{d} {h}:{mi})"


def header(run_dir: Path, state: Json, results: dict[str, Json]) -> list[str]:
    # run_all.json's machine line is the one every script writes too; a folder without it takes the
    # files' (llm_decode adds its thread count to its own, so the shortest is the plain CPU line).
    machines = distinct([state.get("machine")] + [d.get("machine") for d in results.values()])
    machines = [m for m in machines if isinstance(m, str)]
    machine = state.get("machine") if isinstance(state.get("machine"), str) else \
        (min(machines, key=len) if machines else "machine not recorded")
    threads = distinct(d.get("threads") for d in results.values() if isinstance(d.get("threads"), int))
    line = f"Run {when(run_dir)} on {machine}"
    if threads:
        line += f"; {', '.join(map(str, threads))} thread{'s' if threads != [1] else ''}"
    scripts = [s for s in state.get("scripts") or [] if isinstance(s, dict)]
    if scripts:
        seconds = number(state.get("seconds"))
        failed = [s for s in scripts if s.get("rc") != 0]
        line += f"; {count(len(scripts), 'command')}"
        if seconds is not None:
            line += f" in {seconds / 60:.0f} min" if seconds >= 60 else f" in {seconds:.0f} s"
        line += f", {len(failed)} failed" if failed else ", all exit 0"
        if state.get("finished") is False:
            line += ", not finished (resume it with make bench RESUME=...)"
    out = [line + (":" if scripts else "")]
    if scripts:
        out += ["", "```bash"]
        out += [f"{s.get('cmd', '?')}    # {fixed(s.get('seconds'), 0, ' s')}, exit {s.get('rc', '?')}"
                for s in scripts]
        out.append("```")
    return out


# --- the end-to-end table -----------------------------------------------------------------------------

def recipe_name(name: str, data: Json) -> str:
    recipe = data.get("recipe")
    return Path(recipe).stem if isinstance(recipe, str) and recipe else name.removesuffix(".json")[len("end_to_end-"):]


def e2e_first_chunk(d: Json) -> str | None:
    built = number(dig(d, "speed", "first_chunk", "built_s"))
    if built is None:
        return None
    ratio = number(dig(d, "speed", "first_chunk", "speedup"))
    return f"{built:.2f} s" + (f", {ratio:.2f}x" if ratio is not None else "")


def e2e_stages(d: Json) -> str | None:
    ratios = [dig(d, "speed", s, "speedup") for s in ("llm", "flow", "hift")]
    if all(number(r) is None for r in ratios):
        return None
    return " / ".join(times(r) for r in ratios)


def e2e_rtf(d: Json) -> str | None:
    ref, built = (dig(d, "speed", "end_to_end", k) for k in ("rtf_reference", "rtf_built"))
    if number(ref) is None and number(built) is None:
        return None
    return f"{fixed(ref, 2)} / {fixed(built, 2)}"


def e2e_speedup(d: Json) -> str | None:
    e2e = dig(d, "speed", "end_to_end")
    return None if number(dig(e2e, "speedup")) is None else median_cell(e2e["speedup"], e2e.get("spread"), e2e.get("pairs"))


def e2e_ms_per_token(d: Json) -> str | None:
    ms = number(dig(d, "speed", "llm", "per_token_built_ms"))
    return None if ms is None else fixed(ms, 1 if ms >= 10 else 2)


def e2e_flow_snr(d: Json) -> str | None:
    snr = number(dig(d, "quality", "flow", "cfm_mel_snr_db_min"))
    if snr is None:
        return None
    steps = dig(d, "quality", "flow", "cfm_steps")
    fewer = isinstance(steps, int) and steps != DEFAULT_CFM_STEPS
    return f"{snr:.1f} dB" + (f" ({steps} vs {DEFAULT_CFM_STEPS} CFM steps)" if fewer else "")


def e2e_gate(d: Json) -> str | None:
    passed = d.get("gate_passed")
    if not isinstance(passed, bool):
        return None
    if passed:
        return "PASS"
    metrics = distinct(dig(f, "metric") for f in d.get("findings") or [])
    return "FAIL" + (f" ({', '.join(map(str, metrics))})" if metrics else "")


def e2e_rss(d: Json) -> str | None:
    """The most memory one step of the build needed, naming the step; a run from before per-step
    peaks were recorded gives the build process's peak instead (what its report then measured)."""
    steps = {n: mb for n, v in (d.get("step_peak_rss_mb") or {}).items() if (mb := number(v)) is not None}
    if steps:
        top = max(steps, key=steps.__getitem__)
        return f"{steps[top]:,.0f} MiB ({top})"
    mb = number(dig(d, "speed", "peak_rss_mb"))
    return None if mb is None else f"{mb:,.0f} MiB"


# Each column: its heading and how a row's cell comes from an end_to_end-*.json (None: the file
# lacks it). A column that no file holds is left out, so an older run's table has no empty column.
E2E_COLUMNS: list[tuple[str, Callable[[Json], str | None]]] = [
    ("RTF reference / built", e2e_rtf),
    ("end to end (spread, pairs)", e2e_speedup),
    ("LLM / flow / HiFT in the pipeline", e2e_stages),
    ("LLM ms/token built", e2e_ms_per_token),
    ("first chunk, built", e2e_first_chunk),
    ("LLM logit cosine", lambda d: None if number(dig(d, "quality", "llm", "logit_cosine")) is None
        else fixed(dig(d, "quality", "llm", "logit_cosine"), 4)),
    ("flow mel SNR", e2e_flow_snr),
    ("HiFT waveform SNR", lambda d: None if number(dig(d, "quality", "hift", "waveform_snr_db_min")) is None
        else fixed(dig(d, "quality", "hift", "waveform_snr_db_min"), 1, " dB")),
    ("gate", e2e_gate),
    ("peak RSS", e2e_rss),
]


def end_to_end_section(files: list[tuple[str, Json]]) -> list[str]:
    if not files:
        return []
    cells = [[fn(d) for _, fn in E2E_COLUMNS] for _, d in files]
    keep = [i for i in range(len(E2E_COLUMNS)) if any(row[i] is not None for row in cells)]
    rows = [[code(recipe_name(n, d))] + [row[i] or DASH for i in keep] for (n, d), row in zip(files, cells)]
    # What every row shares (tokens, audio, pairs asked for) goes in the line above the table.
    tokens = distinct(d.get("tokens") for _, d in files)
    audio = distinct(round(a, 1) for _, d in files if (a := number(dig(d, "speed", "audio_seconds"))) is not None)
    pairs = distinct(d.get("pairs") for _, d in files)
    floor = distinct(number(d.get("min_seconds")) for _, d in files)
    what = []
    if tokens:
        what.append(f"{' / '.join(map(str, tokens))} tokens" + (f" = {' / '.join(map(str, audio))} s of audio" if audio else ""))
    if pairs:
        what.append(f"at least {' / '.join(map(str, pairs))} pair{'s' if pairs != [1] else ''}" + (
            f" and {' / '.join(f'{s:.0f}' for s in floor)} s a workload" if floor else ""))
    intro = "**End to end** (`end_to_end.py`" + "".join(f", {w}" for w in what) + \
        ", against the PyTorch FP32 reference in the same run):"
    return [intro, "", *table(["recipe"] + [E2E_COLUMNS[i][0] for i in keep], rows)]


# --- the other ratios ---------------------------------------------------------------------------------

Row = list[str]


def quantized_rows(d: Json) -> list[Row]:
    recipe = d.get("recipe", "?")
    rows = []
    flow, llm = dig(d, "flow"), dig(d, "llm")
    if isinstance(flow, dict):
        frames = f", T={d['frames']}" if isinstance(d.get("frames"), int) else ""
        quality = DASH if number(flow.get("mel_snr_db_quant_vs_torch")) is None else \
            f"mel SNR {flow['mel_snr_db_quant_vs_torch']:.1f} dB" + (
                f" (FP32 engine {flow['mel_snr_db_fp32_engine_vs_torch']:.1f} dB)"
                if number(flow.get("mel_snr_db_fp32_engine_vs_torch")) is not None else "")
        rows.append([f"`quantized_speed` `{recipe}`: flow estimator ({flow.get('precision', '?')}{frames}) "
                     "against its FP32 engine", median_cell(flow.get("speedup"), flow.get("speedup_spread"),
                                                            flow.get("pairs")), quality])
    if isinstance(llm, dict):
        cos = llm.get("logit_cosine_quant_vs_torch")
        rows.append([f"`quantized_speed` `{recipe}`: LLM decode step ({llm.get('precision', '?')}) against its "
                     "FP32 engine", median_cell(llm.get("speedup"), llm.get("speedup_spread"), llm.get("pairs")),
                     DASH if number(cos) is None else f"logit cosine {cos:.4f}"])
    return rows


def torch_backend_rows(d: Json) -> list[Row]:
    rows = []
    # The ONNX Runtime FP32 engine is what the others are timed against: its own row would be 1.00x.
    for stage, what, quality, unit in (("flow", "flow estimator", "mel_snr_db_after_cfm", "mel SNR"),
                                       ("hift", "HiFT", "waveform_snr_db", "waveform SNR")):
        for engine, r in (dig(d, stage) or {}).items():
            if engine == "onnxruntime fp32" or not isinstance(r, dict):
                continue
            q = number(r.get(quality))
            rows.append([f"`torch_backend`: {what}, {engine} against ONNX Runtime FP32",
                         median_cell(r.get("speedup"), r.get("spread"), r.get("pairs")),
                         DASH if q is None else f"{unit} {q:.1f} dB"])
            own = r.get("vs_own_fp32")
            if isinstance(own, dict):
                rows.append([f"`torch_backend`: {what}, {engine} against the torch FP32 package",
                             median_cell(own.get("speedup"), own.get("spread"), own.get("pairs")),
                             DASH if q is None else f"{unit} {q:.1f} dB"])
    return rows


def llm_decode_rows(name: str, d: Json) -> list[Row]:
    device = d.get("device") or name.removesuffix(".json").removeprefix("llm_decode-")
    rows = []
    for r in d.get("rows") or []:
        if not isinstance(r, dict):
            continue
        cos = number(r.get("logit_cosine"))
        rows.append([f"`llm_decode` ({device}): {r.get('format', '?')} package, {r.get('loop', '?')}, batch "
                     f"{r.get('batch', '?')}, against FP32 eager",
                     median_cell(r.get("speedup_vs_eager_fp32"), r.get("spread"), r.get("pairs")),
                     DASH if cos is None else f"logit cosine {cos:.4f}"])
    return rows


def reference_reuse_rows(d: Json) -> list[Row]:
    ratio = number(d.get("second_over_first"))
    # The script builds cpu-fp32 first (it computes the reference), then cpu-int8 (which reuses it).
    first, second = (number(dig(d, "builds", b, "validation_s")) for b in ("cpu-fp32", "cpu-int8"))
    detail = f" ({second:.0f} s / {first:.0f} s)" if first is not None and second is not None else ""
    return [["`reference_reuse`: second recipe's validation time over the first",
             DASH if ratio is None else f"{ratio:.3f}{detail}", DASH]]


def noop_rows(d: Json) -> list[Row]:
    rows = []
    entries = d.get("cache_entries")
    where = f", {entries:,} cache entries" if isinstance(entries, int) else ""
    runs = d.get("runs")
    for setting, r in (dig(d, "results") or {}).items():
        if not isinstance(r, dict):
            continue
        median = number(r.get("median_s"))
        lo, hi = number(r.get("min_s")), number(r.get("max_s"))
        cell = DASH if median is None else f"{median:.3f} s" + (
            f" ({lo:.3f}-{hi:.3f}" + (f", {count(runs, 'run')}" if isinstance(runs, int) else "") + ")"
            if lo is not None and hi is not None else "")
        # What a no-op must not do stands where the other rows have their quality.
        flags = [f"{k} imported: {'yes' if r[f'{k}_imported'] else 'no'}" for k in ("torch", "fsspec")
                 if isinstance(r.get(f"{k}_imported"), bool)]
        if isinstance(r.get("warnings"), list):
            flags.append(count(len(r["warnings"]), "warning"))
        rows.append([f"`noop_rebuild`: no-op rebuild, {setting}{where}", cell, ", ".join(flags) or DASH])
    return rows


def other_section(state: Json, results: dict[str, Json]) -> list[str]:
    rows: list[Row] = []
    quantized = sorted((n for n, d in results.items() if not n.startswith("end_to_end-") and is_quantized_speed(d)),
                       key=lambda n: (run_order(state, n), n))
    for n in quantized:
        rows += quantized_rows(results[n])
    if "torch_backend.json" in results:
        rows += torch_backend_rows(results["torch_backend.json"])
    for n in sorted(n for n in results if n.startswith("llm_decode-")):
        rows += llm_decode_rows(n, results[n])
    if "reference_reuse.json" in results:
        rows += reference_reuse_rows(results["reference_reuse.json"])
    if "noop_rebuild.json" in results:
        rows += noop_rows(results["noop_rebuild.json"])
    if not rows:
        return []
    return ["**Other ratios** (each a median of interleaved pairs in its own script, unless a row says otherwise):",
            "", *table(["ratio", "median (spread, pairs)", "quality"], rows)]


def render(run_dir: Path) -> str:
    """The Markdown of the run in ``run_dir``: header, end-to-end table, other ratios (a section
    the run has no file for is left out). TablesError when it holds no result this prints."""
    state, results = load_run(run_dir)
    e2e = sorted(((n, d) for n, d in results.items() if n.startswith("end_to_end-")),
                 key=lambda nd: (run_order(state, nd[0]), nd[0]))
    sections = [s for s in (end_to_end_section(e2e), other_section(state, results)) if s]
    if not sections:
        raise TablesError(f"{run_dir}: no end_to_end, quantized_speed, torch_backend, llm_decode, reference_reuse "
                          "or noop_rebuild result in it")
    out = header(run_dir, state, results)
    for s in sections:
        out += ["", *s]
    return "\n".join(out) + "\n"


# --- the doc's marker block ---------------------------------------------------------------------------

def replace_block(doc: str, slug: str, body: str) -> str:
    """``doc`` with the lines between its ``<!-- tables: SLUG`` line and the next ``<!-- end tables -->``
    line replaced by ``body`` (a blank line either side, so Markdown sees a table, not HTML); every
    other character, line endings included, stays as it was. TablesError unless there is exactly
    one such block: filling the wrong one of two would go unnoticed."""
    lines = doc.splitlines(keepends=True)
    start = re.compile(rf"^<!-- tables: {re.escape(slug)}(\s|-->|$)")
    starts = [i for i, ln in enumerate(lines) if start.match(ln)]
    if len(starts) != 1:
        raise TablesError(f"{'no' if not starts else len(starts)} '<!-- tables: {slug}' marker line"
                          f"{'s' if starts else ''} (one is needed, with '{END_MARKER}' after it)")
    end = next((j for j in range(starts[0] + 1, len(lines)) if lines[j].strip() == END_MARKER), None)
    if end is None:
        raise TablesError(f"no '{END_MARKER}' line after '<!-- tables: {slug}'")
    # The start line may lack a line ending only if it is the last line, which leaves no room for an end.
    return "".join(lines[:starts[0] + 1]) + "\n" + body.rstrip("\n") + "\n\n" + "".join(lines[end:])


def newest_run() -> Path:
    found = sorted(p for p in RUNS.glob("*") if p.is_dir()) if RUNS.is_dir() else []
    if not found:
        raise TablesError(f"no run under {RUNS}; run `make bench`, or name a run folder")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", type=Path, metavar="RUN_DIR",
                    help="a run's folder (artifacts/bench/runs/<stamp>); default: the newest one")
    ap.add_argument("--doc", type=Path, metavar="FILE", help="write the tables into FILE's marker block")
    ap.add_argument("--slug", help="the block's name: the word after '<!-- tables:' (with --doc)")
    args = ap.parse_args(argv)
    if (args.doc is None) != (args.slug is None):
        ap.error("--doc and --slug go together")
    try:
        text = render(args.run_dir or newest_run())
        if args.doc is None:
            sys.stdout.write(text)
            return 0
        try:
            doc = read_text(args.doc, MAX_FILE_BYTES, "a Markdown document")
        except FileNotFoundError:
            raise TablesError(f"{args.doc}: missing") from None
        except (OSError, ValueError) as e:  # BoundError and UnicodeDecodeError are ValueErrors
            raise TablesError(f"{args.doc}: {e}") from None
        try:
            new = replace_block(doc, args.slug, text)
        except TablesError as e:
            raise TablesError(f"{args.doc}: {e}") from None
        write_atomic(args.doc, new.encode("utf-8"))
        print(f"print_tables: wrote the tables of {args.run_dir or 'the newest run'} into {args.doc} "
              f"(block '{args.slug}')", file=sys.stderr)
        return 0
    except TablesError as e:
        print(f"print_tables: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
