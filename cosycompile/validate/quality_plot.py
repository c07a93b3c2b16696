"""quality_speed.svg: per stage, the quality of a build against its speed-up over the FP32 reference.

Written as SVG text by hand: a bundle gets its figure without a plotting library, whose imports,
fonts and layout every build used to pay for four small panels
(docs/bench-log/2026-11-30-test-suite-imports-exports-and-workers.md).
"""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape

# (panel title, quality metric, its axis label, the reference's value when it is a fixed best, speed metric)
PANELS = (
    ("LLM", "llm.top1_agreement", "teacher-forced top-1 agreement", 1.0, "speed.llm"),
    ("flow", "flow.mel_snr_db", "mel SNR after 10 CFM steps (dB)", None, "speed.flow"),
    ("HiFT", "hift.waveform_snr_db", "waveform SNR (dB)", None, "speed.hift"),
    ("end to end", "pipeline.log_mel_l1", "log-mel L1 (lower is better)", 0.0, "speed.end_to_end"),
)
# SNRs of a near-exact engine run to 100+ dB; the axis stops here so that real differences show.
SNR_CAP = 100.0
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")

_W, _H = 330, 300  # one panel
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 14, 34, 46  # plot area margins inside a panel


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2, 2.5 or 5 times a power of ten), the first at or
    below ``lo`` and the last at or above ``hi``, with a twentieth of the span to spare on each side."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo < 1e-9 * max(abs(lo), abs(hi), 1.0):
        lo, hi = lo - max(abs(lo) * 0.1, 0.5), hi + max(abs(hi) * 0.1, 0.5)
    spare = (hi - lo) / 20
    lo, hi = lo - spare, hi + spare
    raw = (hi - lo) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)
    ticks = [math.floor(lo / step) * step]
    while ticks[-1] < hi:
        ticks.append(ticks[0] + len(ticks) * step)
    return [round(t, 12) for t in ticks]


def _label(v: float) -> str:
    return f"{v:g}"


def _panel(x0: float, title: str, qlabel: str, points: list[tuple[str, float, float, str, str]],
           legend: bool) -> list[str]:
    """One panel's SVG elements; ``points``: (name, speed-up, quality, marker, color)."""
    xs = [p[1] for p in points]
    ys = [p[2] for p in points]
    xt, yt = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    left, right, top, bottom = x0 + _LEFT, x0 + _W - _RIGHT, _TOP, _H - _BOTTOM

    def px(v: float) -> float:
        return left + (v - xt[0]) / (xt[-1] - xt[0]) * (right - left)

    def py(v: float) -> float:
        return bottom - (v - yt[0]) / (yt[-1] - yt[0]) * (bottom - top)

    out = [f'<text x="{(left + right) / 2:.1f}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#444"/>']
    for v in xt:
        out.append(f'<line x1="{px(v):.1f}" y1="{top}" x2="{px(v):.1f}" y2="{bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{px(v):.1f}" y="{bottom + 14}" text-anchor="middle">{_label(v)}</text>')
    for v in yt:
        out.append(f'<line x1="{left}" y1="{py(v):.1f}" x2="{right}" y2="{py(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{_label(v)}</text>')
    out.append(f'<text x="{(left + right) / 2:.1f}" y="{_H - 12}" text-anchor="middle">'
               'speed-up vs reference (x, same run)</text>')
    out.append(f'<text transform="translate({x0 + 14},{(top + bottom) / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(qlabel)}</text>')
    for name, x, y, marker, color in points:
        cx, cy = px(x), py(y)
        tip = f"<title>{escape(name)}: {_label(x)}x, {_label(y)}</title>"
        if marker == "star":
            out.append(f'<text x="{cx:.1f}" y="{cy + 6:.1f}" text-anchor="middle" font-size="20">★{tip}</text>')
        elif marker == "square":
            out.append(f'<rect x="{cx - 5:.1f}" y="{cy - 5:.1f}" width="10" height="10" fill="{color}">{tip}</rect>')
        else:
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5.5" fill="{color}">{tip}</circle>')
    if legend:
        for i, (name, _, _, marker, color) in enumerate({p[0]: p for p in points}.values()):
            y = bottom - 10 - 15 * i
            mark = ("★" if marker == "star" else "■" if marker == "square" else "●")
            out.append(f'<text x="{left + 8}" y="{y}" fill="{"black" if marker == "star" else color}">{mark}</text>')
            out.append(f'<text x="{left + 22}" y="{y}">{escape(name)}</text>')
    return out


def quality_speed_svg(report: dict[str, Any], label: str = "this build",
                      baselines: dict[str, dict[str, Any]] | None = None) -> str:
    """The figure as SVG text: one panel per stage, the FP32 reference as a star at 1x, this build
    (circle) and each baseline report (squares) where the report holds both of the panel's metrics."""
    from cosycompile.validate.gate import metric_values

    series = {label: metric_values(report)}
    for name, rep in (baselines or {}).items():
        series[name] = metric_values(rep)
    body: list[str] = []
    for n, (title, q, qlabel, perfect, sp) in enumerate(PANELS):
        points = [("FP32 reference", 1.0, perfect if perfect is not None else SNR_CAP, "star", "black")]
        for i, (name, vals) in enumerate(series.items()):
            if q in vals and sp in vals and math.isfinite(vals[q]) and math.isfinite(vals[sp]):
                y = min(vals[q], SNR_CAP) if perfect is None else vals[q]
                points.append((name, vals[sp], y, "circle" if i == 0 else "square", COLORS[i % len(COLORS)]))
        axis = qlabel + (" (capped at 100)" if perfect is None else "")
        body += _panel(n * _W, title, axis, points, legend=n == 0)
    width, height = _W * len(PANELS), _H + 24
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<g transform="translate(0,24)">', *body, "</g>",
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="15">'
        'quality vs speed against the PyTorch FP32 reference</text>',
        "</svg>", ""])
