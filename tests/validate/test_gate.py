"""The gate: baselines (two stored reports), fixed thresholds, a degraded build failing by name,
and the report/plot/compare commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, run_cli, write_recipe
from seed_store import FOLLOWUP, seeded

DATA = Path(__file__).parents[1] / "data"


def test_slower_than_baseline_beyond_margin_fails(tmp_path: Path) -> None:
    res = run_cli("gate", str(DATA / "slower.report.json"), "--baseline", str(DATA / "baseline.report.json"),
                  "--max-slowdown", "0.25")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "gate: FAIL" in res.stdout and "speed.end_to_end" in res.stdout and "40.0% slower" in res.stdout


def test_slower_than_baseline_within_margin_passes() -> None:
    res = run_cli("gate", str(DATA / "slower.report.json"), "--baseline", str(DATA / "baseline.report.json"),
                  "--max-slowdown", "0.5")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gate: PASS" in res.stdout


def test_quality_drop_against_baseline(tmp_path: Path) -> None:
    worse = json.loads((DATA / "baseline.report.json").read_text())
    worse["checks"]["hift"]["metrics"]["waveform_snr_db_min"] = 20.0
    p = tmp_path / "worse.json"
    p.write_text(json.dumps(worse))
    res = run_cli("gate", str(p), "--baseline", str(DATA / "baseline.report.json"), "--max-slowdown", "1")
    assert res.returncode == 1 and "hift.waveform_snr_db" in res.stdout and "worse than baseline" in res.stdout


def test_gate_bad_input_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    for args in (["gate", str(tmp_path / "x.json")], ["gate", str(tmp_path / "missing")],
                 ["gate", str(DATA / "baseline.report.json"), "--max-slowdown", "-1"]):
        res = run_cli(*args)
        assert res.returncode == 2 and res.stderr.startswith("cosycompile: error:"), (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1


def test_list_metrics() -> None:
    res = run_cli("gate", "--list-metrics")
    assert res.returncode == 0 and "hift.waveform_snr_db" in res.stdout and "speed.end_to_end" in res.stdout


def test_unknown_gate_metric_in_recipe_is_rejected(tmp_path: Path) -> None:
    p = write_recipe(tmp_path / "r.yaml", f"extends: {REPO / 'recipes' / 'cpu-fp32.yaml'}\nname: r\n"
                                          "validation:\n  gate:\n    min: {hift.snr: 30}\n")
    res = run_cli("plan", str(p), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and "unknown gate metric 'hift.snr'" in res.stderr and "r.yaml:5" in res.stderr


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> dict:
    """A build whose HiFT is quantized to INT8 (HiFT does not hold up in INT8) and the matching FP32
    build, from the session's seed: the FP32 build is the seed's own (nothing runs), and the other
    runs only the HiFT's quantization and engine and the checks (the seed holds the calibration)."""
    tmp = tmp_path_factory.mktemp("degraded")
    art = seeded(seed, tmp / "art")
    good = write_recipe(tmp / "good.yaml", {**FOLLOWUP, "name": "good"}, base=False)
    bad = write_recipe(tmp / "bad.yaml", {**FOLLOWUP, "name": "bad", "calibration": {"max_items": 2},
                                          "stages": {"hift": {"quantize": {"format": "int8"}}}}, base=False)
    return {"art": art, "good": run_cli("build", str(good), "--artifacts", str(art), "-q"),
            "bad": run_cli("build", str(bad), "--artifacts", str(art), "-q")}


def test_degraded_build_fails_the_gate_naming_the_metric(degraded: dict) -> None:
    good, bad = degraded["good"], degraded["bad"]
    assert good.returncode == 0 and "gate: PASS" in good.stdout, good.stdout[-2000:] + good.stderr[-2000:]
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "gate: FAIL" in bad.stdout and "hift.waveform_snr_db" in bad.stdout and "short by" in bad.stdout


def test_report_renders_plot_and_markdown(degraded: dict) -> None:
    (bundle,) = (degraded["art"] / "builds").glob("good-*")
    svg = bundle / "quality_speed.svg"
    figure = svg.read_text()
    assert figure.startswith("<svg") and figure.count("<circle") == 4  # this build, in each stage's panel
    md = (bundle / "report.md").read_text()
    assert "| stage" in md and "Verdict: PASS" in md and "speed-up" in md
    svg.unlink()
    res = run_cli("report", str(bundle))
    assert res.returncode == 0 and svg.read_text() == figure
    wavs = sorted(p.name for p in (bundle / "audio").glob("*.wav"))
    assert any(w.endswith(".reference.wav") for w in wavs) and any(w.endswith(".built.wav") for w in wavs)


def test_compare_two_builds(degraded: dict) -> None:
    good = next((degraded["art"] / "builds").glob("good-*"))
    bad = next((degraded["art"] / "builds").glob("bad-*"))
    res = run_cli("compare", str(good), str(bad))
    assert res.returncode == 0
    row = next(line for line in res.stdout.splitlines() if line.startswith("hift.waveform_snr_db"))
    assert row.split()[-1] == "A"


def test_report_does_not_modify_the_cache(degraded: dict, tmp_path: Path) -> None:
    from cosycompile.cache.local import Store

    bundle = next((degraded["art"] / "builds").glob("good-*"))
    run_cli("report", str(bundle))
    count, bad = Store(degraded["art"]).verify_all(full=True)
    assert count > 0 and bad == []


@pytest.mark.parametrize("flag", ["--max-quality-drop", "--max-slowdown"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-0.1"])
def test_gate_refuses_margins_that_are_not_finite_and_non_negative(flag: str, value: str) -> None:
    """argparse's float takes 'nan' and 'inf'; NaN would pass a regressed build, inf switch the gate off."""
    res = run_cli("gate", str(DATA / "slower.report.json"), "--baseline", str(DATA / "baseline.report.json"),
                  f"{flag}={value}")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert res.stderr.startswith(f"cosycompile: error: gate: {flag} must be a finite number >= 0"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "gate: PASS" not in res.stdout


def _report_with(tmp_path: Path, name: str, metrics: dict[tuple[str, str], float],
                 gate: dict | None = None) -> Path:
    """A copy of the stored baseline report with some stage metrics replaced (written as JSON's NaN /
    Infinity where asked), in its own dir with a recipe.json holding ``gate`` when given."""
    body = json.loads((DATA / "baseline.report.json").read_text())
    for (stage, key), value in metrics.items():
        body["checks"][stage]["metrics"][key] = value
    d = tmp_path / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps(body))  # allow_nan: NaN is written as the literal NaN
    if gate is not None:
        (d / "recipe.json").write_text(json.dumps({"validation": {"gate": gate}}))
    return d / "report.json"


def test_nan_metric_fails_against_a_baseline(tmp_path: Path) -> None:
    """A NaN SNR was compared with `drop > limit`, which is false for NaN: the build passed."""
    nan = _report_with(tmp_path, "nan", {("hift", "waveform_snr_db_min"): float("nan")})
    assert "NaN" in nan.read_text()
    res = run_cli("gate", str(nan), "--baseline", str(DATA / "baseline.report.json"), "--max-slowdown", "1")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "hift.waveform_snr_db" in res.stdout and "NaN in the report" in res.stdout, res.stdout
    # A NaN in the baseline cannot be compared with either.
    res = run_cli("gate", str(DATA / "baseline.report.json"), "--baseline", str(nan), "--max-slowdown", "1")
    assert res.returncode == 1 and "NaN in the baseline" in res.stdout, res.stdout
    # The same for a speed-up: NaN is neither slower nor faster.
    slow = _report_with(tmp_path, "slow", {("flow", "speedup_vs_fp32"): float("nan")})
    base = _report_with(tmp_path, "base", {("flow", "speedup_vs_fp32"): 2.0})
    res = run_cli("gate", str(slow), "--baseline", str(base), "--max-slowdown", "1")
    assert res.returncode == 1 and "flow.speedup_vs_fp32" in res.stdout, res.stdout


def test_nan_metric_fails_a_fixed_threshold(tmp_path: Path) -> None:
    gate = {"min": {"hift.waveform_snr_db": 40.0}, "max": {"flow.estimator_max_abs_error": 1e-3}}
    ok = _report_with(tmp_path, "ok", {}, gate)
    assert run_cli("gate", str(ok.parent)).returncode == 0
    for name, metric in (("min", ("hift", "waveform_snr_db_min")), ("max", ("flow", "estimator_max_abs_error"))):
        bad = _report_with(tmp_path, f"nan-{name}", {metric: float("nan")}, gate)
        res = run_cli("gate", str(bad.parent))
        assert res.returncode == 1 and "value is NaN" in res.stdout, res.stdout + res.stderr


def test_nan_threshold_or_margin_in_a_bundle_recipe_is_not_a_pass(tmp_path: Path) -> None:
    """The bundle's recipe.json is read as it is: a NaN limit fails, a NaN margin is refused."""
    bad = _report_with(tmp_path, "limit", {}, {"min": {"hift.waveform_snr_db": float("nan")}})
    res = run_cli("gate", str(bad.parent))
    assert res.returncode == 1 and "limit is NaN" in res.stdout, res.stdout + res.stderr
    bad = _report_with(tmp_path, "margin", {}, {"max_quality_drop": float("nan")})
    res = run_cli("gate", str(bad.parent), "--baseline", str(DATA / "baseline.report.json"))
    assert res.returncode == 2 and "max_quality_drop must be a finite number" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    # A limit that is not a number was compared with `<` and raised a TypeError.
    bad = _report_with(tmp_path, "text", {}, {"min": {"hift.waveform_snr_db": "40"}})
    res = run_cli("gate", str(bad.parent))
    assert res.returncode == 2 and "threshold for 'hift.waveform_snr_db' must be a number" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_infinite_snr_compares_by_its_limit(tmp_path: Path) -> None:
    """Identical signals have an infinite SNR: inf vs inf is no drop (its relative change is NaN, which must
    not fail a build equal to its baseline), a finite value below an infinite baseline is a 100% drop."""
    inf = _report_with(tmp_path, "inf", {("hift", "waveform_snr_db_min"): float("inf")})
    res = run_cli("gate", str(inf), "--baseline", str(inf), "--max-slowdown", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli("gate", str(DATA / "baseline.report.json"), "--baseline", str(inf), "--max-slowdown", "1")
    assert res.returncode == 1 and "100.0% worse than baseline" in res.stdout, res.stdout
    res = run_cli("gate", str(inf), "--baseline", str(DATA / "baseline.report.json"), "--max-slowdown", "1")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(("base", "new", "fails"), [
    (0.001075, 0.001321, False),  # two FP32 builds on CPUs of other ISAs: rounding, 23 % "worse"
    (0.10, 0.13, True),  # the same 30 % drop, now above the metric's resolution
    (0.10, 0.104, False),  # above the resolution, within --max-quality-drop
])
def test_a_change_below_the_metrics_resolution_is_no_regression(base: float, new: float, fails: bool) -> None:
    """Each metric declares the smallest change a baseline comparison counts (MCD: a hundredth of a dB);
    a relative drop of a figure near its ideal is rounding below it."""
    from cosycompile.validate.gate import check_baseline
    from cosycompile.validate.registry import registry

    assert registry()["pipeline.mcd_db"].metric.resolution == 0.01
    body = json.loads((DATA / "baseline.report.json").read_text())
    old, cur = json.loads(json.dumps(body)), json.loads(json.dumps(body))
    old["checks"]["pipeline"]["metrics"]["mcd_db_mean"] = base
    cur["checks"]["pipeline"]["metrics"]["mcd_db_mean"] = new
    findings = check_baseline(cur, old, max_quality_drop=0.05, max_slowdown=1.0)
    assert [f.metric for f in findings] == (["pipeline.mcd_db"] if fails else []), findings
