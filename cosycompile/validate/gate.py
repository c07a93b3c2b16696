"""The quality-versus-speed gate: fixed thresholds from the recipe, and regressions against a baseline.

Every gated figure is a named metric with a direction. Speed is gated as a speed-up against the
reference measured in the same run, never as seconds, so a baseline taken on one machine still
means something on another.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosycompile.errors import UserError

# name -> (path into report.json, higher is better, kind)
METRICS: dict[str, tuple[tuple[str, ...], bool, str]] = {
    "llm.max_abs_logit_error": (("checks", "llm", "metrics", "max_abs_logit_error"), False, "quality"),
    "llm.top1_agreement": (("checks", "llm", "metrics", "top1_agreement"), True, "quality"),
    "llm.logit_cosine": (("checks", "llm", "metrics", "logit_cosine"), True, "quality"),
    "llm.kl": (("checks", "llm", "metrics", "kl"), False, "quality"),
    "flow.estimator_max_abs_error": (("checks", "flow", "metrics", "estimator_max_abs_error"), False, "quality"),
    "flow.mel_snr_db": (("checks", "flow", "metrics", "cfm_mel_snr_db_min"), True, "quality"),
    "hift.waveform_snr_db": (("checks", "hift", "metrics", "waveform_snr_db_min"), True, "quality"),
    "hift.log_mel_l1": (("checks", "hift", "metrics", "log_mel_l1_mean"), False, "quality"),
    "pipeline.tokens_identical_ratio": (("checks", "pipeline", "metrics", "tokens_identical_ratio"), True, "quality"),
    "pipeline.mel_snr_db": (("checks", "pipeline", "metrics", "mel_snr_db_min"), True, "quality"),
    "pipeline.log_mel_l1": (("checks", "pipeline", "metrics", "log_mel_l1_mean"), False, "quality"),
    "pipeline.mcd_db": (("checks", "pipeline", "metrics", "mcd_db_mean"), False, "quality"),
    "pipeline.speaker_similarity": (("checks", "pipeline", "metrics", "speaker_similarity_mean"), True, "quality"),
    "pipeline.pesq": (("checks", "pipeline", "metrics", "pesq_mean"), True, "quality"),
    "pipeline.stoi": (("checks", "pipeline", "metrics", "stoi_mean"), True, "quality"),
    "speed.llm": (("speed", "llm", "speedup"), True, "speed"),
    "speed.flow": (("speed", "flow", "speedup"), True, "speed"),
    "speed.hift": (("speed", "hift", "speedup"), True, "speed"),
    "speed.end_to_end": (("speed", "end_to_end", "speedup"), True, "speed"),
}


@dataclass
class Finding:
    metric: str
    value: float | None
    limit: float
    rule: str
    shortfall: str


def metric_values(report: dict[str, Any]) -> dict[str, float]:
    """Every named metric present in a report."""
    out = {}
    for name, (path, _, _) in METRICS.items():
        node: Any = report
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            out[name] = float(node)
    return out


def load_report(path: Path) -> dict[str, Any]:
    """A report.json, or the one inside a bundle dir; bad input is a UserError."""
    p = path / "report.json" if path.is_dir() else path
    if not p.is_file():
        raise UserError(f"{path}: no report.json (expected a bundle dir or a report.json file)")
    try:
        body = json.loads(p.read_text())
    except ValueError as exc:
        raise UserError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(body, dict) or "checks" not in body:
        raise UserError(f"{p}: not a cosycompile report (no 'checks')")
    return body


def check_thresholds(report: dict[str, Any], minimum: dict[str, float], maximum: dict[str, float]) -> list[Finding]:
    """Fixed thresholds: ``minimum[name] <= value <= maximum[name]``; a missing metric fails."""
    values = metric_values(report)
    findings = []
    for name, limit in sorted(minimum.items()):
        v = values.get(name)
        if v is None or math.isnan(v) or v < limit:
            findings.append(Finding(name, v, limit, ">=", "missing" if v is None else _short(limit - v)))
    for name, limit in sorted(maximum.items()):
        v = values.get(name)
        if v is None or math.isnan(v) or v > limit:
            findings.append(Finding(name, v, limit, "<=", "missing" if v is None else _short(v - limit)))
    for c, body in report.get("checks", {}).items():
        if not body.get("passed", True):
            findings.append(Finding(f"{c}.check", None, 0.0, "pass", "; ".join(body.get("failures", [])) or "failed"))
    return findings


def check_baseline(report: dict[str, Any], baseline: dict[str, Any], max_quality_drop: float,
                   max_slowdown: float) -> list[Finding]:
    """Regressions against a baseline: relative quality drop and relative loss of speed-up."""
    new, old = metric_values(report), metric_values(baseline)
    findings = []
    for name in sorted(set(new) & set(old)):
        _, higher, kind = METRICS[name]
        v, b = new[name], old[name]
        if kind == "speed":
            if v <= 0:
                continue
            slowdown = b / v - 1.0
            if slowdown > max_slowdown:
                findings.append(Finding(name, v, b / (1 + max_slowdown), ">=",
                                        f"{100 * slowdown:.1f}% slower than baseline ({b:.3f}x -> {v:.3f}x)"))
            continue
        scale = max(abs(b), 1e-12)
        drop = (b - v) / scale if higher else (v - b) / scale
        # Errors that are tiny in absolute terms (1e-6 -> 2e-6) are not regressions worth failing on.
        if drop > max_quality_drop and abs(v - b) > 1e-4:
            limit = b * (1 - max_quality_drop) if higher else b * (1 + max_quality_drop)
            findings.append(Finding(name, v, limit, ">=" if higher else "<=",
                                    f"{100 * drop:.1f}% worse than baseline ({b:.4g} -> {v:.4g})"))
    return findings


def _short(x: float) -> str:
    return f"short by {x:.4g}"


def findings_table(findings: list[Finding]) -> str:
    """Plain-text table of what fell short and by how much."""
    rows = [("metric", "value", "rule", "limit", "shortfall")]
    for f in findings:
        rows.append((f.metric, "-" if f.value is None else f"{f.value:.4g}", f.rule,
                     "-" if f.rule == "pass" else f"{f.limit:.4g}", f.shortfall))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
