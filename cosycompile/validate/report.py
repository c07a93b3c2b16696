"""Render ``report.json`` as Markdown a person can read in a minute (plain text stays readable)."""

from __future__ import annotations

from typing import Any

from cosycompile.runtime.host import host_line

REPORT_SCHEMA = 1


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) == float("inf"):
            return "inf" if v > 0 else "-inf"
        if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e5):
            return f"{v:.2e}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells[1:]]
    return out


_STATE_NOTE = ("Rows marked \"threads win\" / \"threads lose\" hold only the pairs for which a probe before, "
               "between and after the pair's two runs saw the intra-op threads beat, or lose to, one thread on "
               "a small op (validation.speed.machine_state): small VMs switch between these states within "
               "seconds and each state's ratio reproduces where the overall median may not. \"state changed\" "
               "rows hold the pairs that straddled a switch; their ratio belongs to neither state.")


def _state(name: str) -> str:
    from cosycompile.validate.machine_state import CHANGED

    return "state changed during the pair" if name == CHANGED else name.replace("_", " ")


def render_markdown(report: dict[str, Any], title: str = "") -> str:
    """The report as Markdown: verdict, per-stage checks, end-to-end quality, speed."""
    checks = report.get("checks", {})
    gate = report.get("gate", {})
    verdict = "PASS" if gate.get("passed", True) else "FAIL"
    lines = [f"# {title or 'cosycompile build report'}", "", f"**Verdict: {verdict}** (recipe thresholds)", ""]
    for f in gate.get("findings", []):
        lines.append(f"- {f['metric']}: {f['value']} {f['rule']} {f['limit']} fails ({f['shortfall']})")
    if gate.get("findings"):
        lines.append("")
    stages = report.get("stages", {})
    if stages:
        lines += ["## Stages", ""]
        failed = {f["metric"].split(".")[0] for f in gate.get("findings", [])}
        lines += _table(["stage", "backend", "precision", "thresholds"],
                        [[s, st.get("backend"), st.get("precision", "fp32"), "FAIL" if s in failed else "pass"]
                         for s, st in stages.items()])
        lines.append("")
        smokes = {s: st["smoke"] for s, st in stages.items() if st.get("smoke")}
        if smokes:
            lines += ["## Smoke decodes of the built engines (by their own servers, at build time)", ""]
            lines += _table(["stage", "field", "value"], [[s, k, v] for s, smoke in smokes.items()
                                                           for k, v in sorted(smoke.items())]) + [""]
    lines += ["## Stage checks against the PyTorch FP32 reference", ""]
    rows = []
    for s, c in checks.items():
        for k, v in sorted(c.get("metrics", {}).items()):
            if k.endswith("_by_state") and isinstance(v, dict):
                rows += [[s, f"{k[:-len('_by_state')]}, {_state(state)} ({st['pairs']} pairs)", st["speedup"]]
                         for state, st in v.items()]
            elif not isinstance(v, dict):
                rows.append([s, k, v])
    lines += _table(["stage", "metric", "value"], rows) + [""]
    speed = report.get("speed", {})
    if speed:
        lines += [f"## Speed (same run, {report.get('threads', '?')} threads, median of {speed.get('runs')} "
                  f"after {speed.get('warmup')} warm-up; first eval item, {speed.get('audio_seconds', 0):.2f} s audio)", ""]
        srows = []
        for k, v in speed.items():
            if isinstance(v, dict) and "reference_s" in v:
                srows.append([k, v["reference_s"] * 1000, v["built_s"] * 1000, v["speedup"], v.get("pairs")])
                srows += [[f"{k}, {_state(state)}", st["reference_s"] * 1000, st["built_s"] * 1000, st["speedup"],
                           st["pairs"]] for state, st in v.get("by_state", {}).items()]
        lines += _table(["part", "reference ms", "built ms", "speed-up (x)", "pairs"], srows)
        if any(isinstance(v, dict) and v.get("by_state") for v in speed.values()) or any(
                k.endswith("_by_state") for c in checks.values() for k in c.get("metrics", {})):
            lines += ["", _STATE_NOTE]
        if "host" in speed:
            # Absolute times and RTF depend on the CPU far more than on its label (one recipe's RTF
            # differed widely across three 2-vCPU "EPYC"/"Xeon" VMs: docs/bench-log/2026-11-25-cpu-fast-zen5.md),
            # so the report names it.
            lines += ["", f"Measured on: {host_line(speed['host'])}."]
        e2e = speed.get("end_to_end", {})
        if e2e:
            lines += ["", f"Real-time factor: reference {_fmt(e2e.get('rtf_reference'))}, "
                          f"built {_fmt(e2e.get('rtf_built'))}."]
        tp = speed.get("throughput", {})
        if tp:
            lines += ["Throughput of the build (audio s per wall s): "
                      + ", ".join(f"concurrency {c}: {_fmt(v['audio_s_per_s'])}" for c, v in tp.items()) + "."]
        if "peak_rss_mb" in speed:
            lines += [f"Peak host memory (RSS) of the pipeline check: {speed['peak_rss_mb']:,.0f} MiB."]
        peaks = {n: v["peak_rss_mb"] for n, v in report.get("build_steps", {}).items() if v.get("peak_rss_mb")}
        if peaks:
            top = max(peaks, key=peaks.__getitem__)
            lines += [f"The step during which the build process held the most memory: {top}, {peaks[top]:,.0f} MiB "
                      "(the process's peak RSS while each step ran, when it was built; processes a step starts are "
                      "not counted)."]
        llm = speed.get("llm", {})
        if "per_token_built_ms" in llm:
            lines += [f"LLM per token: reference {_fmt(llm['per_token_reference_ms'])} ms, "
                      f"built {_fmt(llm['per_token_built_ms'])} ms."]
        lines.append("")
    items = report.get("items", [])
    if items:
        lines += ["## Eval items", ""]
        lines += _table(["id", "tokens ref/built", "identical", "mel SNR dB", "wav SNR dB", "log-mel L1", "dur ratio"],
                        [[r["id"], f"{r['tokens_ref']}/{r['tokens_built']}", r["tokens_identical"],
                          r.get("mel_snr_db"), r.get("waveform_snr_db"), r.get("log_mel_l1"), r.get("duration_ratio")]
                         for r in items])
        lines.append("")
    steps = report.get("build_steps", {})
    if steps:
        lines += ["## Build steps", ""]
        lines += _table(["step", "key", "seconds (when built)", "peak RSS MiB (when built)", "built on"],
                        [[n, v.get("key", "")[:12], v.get("seconds"),
                          None if v.get("peak_rss_mb") is None else round(v["peak_rss_mb"]), v.get("node")]
                         for n, v in steps.items()])
        lines.append("")
    if report.get("audio"):
        lines += ["Audio (reference and built, side by side): " + ", ".join(f"audio/{a}" for a in report["audio"]), ""]
    return "\n".join(lines)


def render_bundle(bundle: Any, baselines: dict[str, dict[str, Any]] | None = None) -> list[Any]:
    """Re-render report.md and quality_speed.svg of a bundle from its report.json."""
    import json
    from pathlib import Path

    from cosycompile.core.atomic import write_atomic
    from cosycompile.validate.quality_plot import quality_speed_svg

    bundle = Path(bundle)
    report = json.loads((bundle / "report.json").read_text())
    title = ""
    manifest = bundle / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        title = f"{m.get('recipe')} ({m.get('model')}, target {m.get('target')})"
        report = dict(report, build_steps=m.get("steps", {}))
    # Bundle files may be hard links into the cache: write new files and rename over, never in place.
    write_atomic(bundle / "report.md", render_markdown(report, title).encode())
    write_atomic(bundle / "quality_speed.svg", quality_speed_svg(report, baselines=baselines).encode())
    return [bundle / "report.md", bundle / "quality_speed.svg"]
