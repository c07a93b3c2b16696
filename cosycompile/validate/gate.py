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

MAX_REPORT_BYTES = 64 << 20  # a report is kB; its metrics per item stay under a few MB


@dataclass
class Finding:
    metric: str
    value: float | None
    limit: float
    rule: str
    shortfall: str


def metric_values(report: dict[str, Any]) -> dict[str, float]:
    """Every registered metric present in a report."""
    from cosycompile.validate.registry import registry

    out = {}
    for name, reg in registry().items():
        node: Any = report
        for p in reg.path:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            out[name] = float(node)
    return out


def load_report(path: Path) -> dict[str, Any]:
    """A report.json, or the one inside a bundle dir; bad input is a UserError."""
    from cosycompile.core.bounded_read import BoundError, read_text

    p = path / "report.json" if path.is_dir() else path
    try:
        body = json.loads(read_text(p, MAX_REPORT_BYTES, "a report"))
    except FileNotFoundError:
        raise UserError(f"{path}: no report.json (expected a bundle dir or a report.json file)") from None
    except BoundError as exc:
        raise UserError(f"{p}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{p}: not valid JSON ({str(exc)[:200] or exc.__class__.__name__})") from None
    except OSError as exc:
        raise UserError(f"{p}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
    if not isinstance(body, dict) or "checks" not in body:
        raise UserError(f"{p}: not a cosycompile report (no 'checks')")
    return body


def allowance(flag: str, value: Any) -> float:
    """A relative margin of the baseline gate (--max-quality-drop, --max-slowdown): a finite number >= 0.
    NaN would pass every comparison and infinity would switch the gate off, so both are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"gate: {flag} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise UserError(f"gate: {flag} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_thresholds(report: dict[str, Any], minimum: dict[str, float], maximum: dict[str, float]) -> list[Finding]:
    """Fixed thresholds: ``minimum[name] <= value <= maximum[name]``. A missing metric fails, unless it
    belongs to a stage the build does not have (a recipe's defaults cover every stage). A NaN value or
    limit fails: every comparison with NaN is false, so it would otherwise pass."""
    from cosycompile.validate.registry import registry

    values = metric_values(report)
    built = set(report.get("stages", {})) | {"pipeline", "speed"}
    findings = []
    for rule, limits in ((">=", minimum), ("<=", maximum)):
        for name, limit in sorted(limits.items()):
            reg = registry().get(name)
            if reg is not None and reg.group not in built:
                continue
            if isinstance(limit, bool) or not isinstance(limit, (int, float)):
                raise UserError(f"gate: threshold for '{name}' must be a number, got {limit!r}")
            v = values.get(name)
            bad = v is None or math.isnan(v) or math.isnan(limit) or (v < limit if rule == ">=" else v > limit)
            if bad:
                gap = ("missing" if v is None else "value is NaN" if math.isnan(v) else "limit is NaN"
                       if math.isnan(limit) else _short(limit - v if rule == ">=" else v - limit))
                findings.append(Finding(name, v, limit, rule, gap))
    return findings


def check_baseline(report: dict[str, Any], baseline: dict[str, Any], max_quality_drop: float,
                   max_slowdown: float) -> list[Finding]:
    """Regressions against a baseline: relative quality drop and relative loss of speed-up. A NaN on
    either side fails: no comparison can be made, and every comparison with NaN is false."""
    from cosycompile.validate.registry import registry

    max_quality_drop = allowance("--max-quality-drop", max_quality_drop)
    max_slowdown = allowance("--max-slowdown", max_slowdown)
    new, old = metric_values(report), metric_values(baseline)
    findings = []
    for name in sorted(set(new) & set(old)):
        metric = registry()[name].metric
        higher, kind = metric.higher, metric.kind
        v, b = new[name], old[name]
        if math.isnan(v) or math.isnan(b):
            findings.append(Finding(name, v, b, ">=" if higher else "<=",
                                    f"NaN in the {'report' if math.isnan(v) else 'baseline'}: cannot compare"))
            continue
        if v == b:  # also inf == inf (e.g. the SNR of identical signals), whose relative change is NaN
            continue
        if kind == "speed":
            if v <= 0:
                continue
            slowdown = b / v - 1.0
            if slowdown > max_slowdown:
                findings.append(Finding(name, v, b / (1 + max_slowdown), ">=",
                                        f"{100 * slowdown:.1f}% slower than baseline ({b:.3f}x -> {v:.3f}x)"))
            continue
        if math.isinf(b) or math.isinf(v):
            # (b - v) / |b| is inf/inf = NaN here: take its limit instead. Worse than an infinite baseline is
            # a 100% drop (inf dB SNR -> 40 dB), worse to an infinite value an unbounded one; better is none.
            worse = v < b if higher else v > b
            drop = (math.inf if math.isinf(v) else 1.0) if worse else -math.inf
        else:
            scale = max(abs(b), 1e-12)
            drop = (b - v) / scale if higher else (v - b) / scale
        # Changes below the metric's resolution (1e-6 -> 2e-6 of an error) are rounding, not regressions.
        if drop > max_quality_drop and abs(v - b) > metric.resolution:
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
