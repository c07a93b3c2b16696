"""Render ``report.json`` as Markdown a person can read in a minute (plain text stays readable)."""

from __future__ import annotations

from typing import Any

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


def render_markdown(report: dict[str, Any], title: str = "") -> str:
    """The report as Markdown: verdict, per-stage checks, end-to-end quality, speed."""
    checks = report.get("checks", {})
    verdict = "PASS" if all(c.get("passed", True) for c in checks.values()) else "FAIL"
    lines = [f"# {title or 'cosycompile build report'}", "", f"**Verdict: {verdict}**", ""]
    stages = report.get("stages", {})
    if stages:
        lines += ["## Stages", ""]
        lines += _table(["stage", "backend", "precision", "check", "failures"],
                        [[s, st.get("backend"), st.get("precision", checks.get(s, {}).get("precision", "fp32")),
                          "pass" if checks.get(s, {}).get("passed", True) else "FAIL",
                          "; ".join(checks.get(s, {}).get("failures", [])) or "-"] for s, st in stages.items()])
        lines.append("")
    lines += ["## Stage checks against the PyTorch FP32 reference", ""]
    rows = []
    for s, c in checks.items():
        for k, v in sorted(c.get("metrics", {}).items()):
            if isinstance(v, dict):
                continue
            rows.append([s, k, v])
    lines += _table(["stage", "metric", "value"], rows) + [""]
    speed = report.get("speed", {})
    if speed:
        lines += [f"## Speed (same run, {report.get('threads', '?')} threads, median of {speed.get('runs')} "
                  f"after {speed.get('warmup')} warm-up; first eval item, {speed.get('audio_seconds', 0):.2f} s audio)", ""]
        srows = [[k, v["reference_s"] * 1000, v["built_s"] * 1000, v["speedup"]]
                 for k, v in speed.items() if isinstance(v, dict)]
        lines += _table(["part", "reference ms", "built ms", "speed-up (x)"], srows)
        e2e = speed.get("end_to_end", {})
        if e2e:
            lines += ["", f"Real-time factor: reference {_fmt(e2e.get('rtf_reference'))}, "
                          f"built {_fmt(e2e.get('rtf_built'))}."]
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
    if report.get("audio"):
        lines += ["Audio (reference and built, side by side): " + ", ".join(f"audio/{a}" for a in report["audio"]), ""]
    return "\n".join(lines)
