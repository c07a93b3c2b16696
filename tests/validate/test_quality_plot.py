"""quality_speed.svg: round ticks that cover the data, and each series' point drawn where its values say."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from cosycompile.validate.quality_plot import PANELS, SNR_CAP, nice_ticks, quality_speed_svg

NS = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize(("lo", "hi"), [(1.0, 3.2), (0.999, 1.0), (1.0, 1.0), (0.0, 0.017), (97.3, 100.0),
                                        (-5.0, 250.0), (2e-7, 3e-5), (float("nan"), 1.0)])
def test_ticks_are_round_and_cover_the_range(lo: float, hi: float) -> None:
    ticks = nice_ticks(lo, hi)
    if math.isfinite(lo):
        assert ticks[0] < lo and ticks[-1] > hi
    assert 3 <= len(ticks) <= 8
    steps = {round(b - a, 15) for a, b in zip(ticks, ticks[1:])}
    assert len({f"{s:.6g}" for s in steps}) == 1
    mantissa = float(f"{steps.pop():.6e}".split("e")[0])
    assert mantissa in (1.0, 2.0, 2.5, 5.0)


def _report(top1: float, mel_snr: float, wav_snr: float, l1: float, speedups: tuple[float, ...]) -> dict:
    def stage(**m: float) -> dict:
        return {"metrics": m}

    return {"checks": {"llm": stage(top1_agreement=top1), "flow": stage(cfm_mel_snr_db_min=mel_snr),
                       "hift": stage(waveform_snr_db_min=wav_snr), "pipeline": stage(log_mel_l1_mean=l1)},
            "speed": {k: {"speedup": v} for k, v in zip(("llm", "flow", "hift", "end_to_end"), speedups)}}


def _points(svg: str) -> list[list[tuple[str, float, float]]]:
    """Per panel (left to right): (tooltip, x, y) of every circle and square."""
    root = ET.fromstring(svg)
    frames = [r for r in root.iter(f"{NS}rect") if r.get("stroke") == "#444"]
    out: list[list[tuple[str, float, float]]] = [[] for _ in frames]
    for el in root.iter():
        if el.tag in (f"{NS}circle", f"{NS}rect") and el.find(f"{NS}title") is not None:
            x = float(el.get("cx") or float(el.get("x")) + 5)
            y = float(el.get("cy") or float(el.get("y")) + 5)
            panel = next(i for i, f in enumerate(frames) if float(f.get("x")) <= x <= float(f.get("x")) + float(f.get("width")))
            frame = frames[panel]
            assert float(frame.get("y")) <= y <= float(frame.get("y")) + float(frame.get("height"))
            out[panel].append((el.find(f"{NS}title").text, x, y))
    return out


def test_each_series_is_a_point_in_each_panel_where_its_metrics_are() -> None:
    build = _report(0.98, 140.0, 35.0, 0.2, (3.0, 1.3, 1.5, 1.6))
    baseline = _report(1.0, 60.0, 30.0, 0.4, (2.0, 1.1, 1.0, 1.2))
    del baseline["speed"]["hift"]  # no speed, no point
    svg = quality_speed_svg(build, label="int8 <new>", baselines={"fp32 & old": baseline})
    panels = _points(svg)
    assert len(panels) == len(PANELS) == 4
    assert [len(p) for p in panels] == [2, 2, 1, 2]
    assert panels[0][0][0] == "int8 <new>: 3x, 0.98"  # names are escaped in the file, read back as written
    assert panels[1][0][0].endswith(f": 1.3x, {SNR_CAP:g}")  # 140 dB is drawn at the cap
    # Higher speed-up is further right, higher quality further up (SVG's y grows downwards).
    (_, bx, by), (_, ox, oy) = panels[0]
    assert bx > ox and by > oy
    assert re.search(r"fp32 &amp; old", svg)


def test_a_report_without_metrics_still_draws_the_reference() -> None:
    svg = quality_speed_svg({"checks": {}, "speed": {"llm": {"speedup": float("nan")}}})
    assert all(p == [] for p in _points(svg))
    assert svg.count("★") == 4 + 1  # a star per panel, and one in the legend
