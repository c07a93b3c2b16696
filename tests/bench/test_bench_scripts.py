"""The benchmark scripts that need no long build run for real on builtin:tiny: their JSON holds
what the benchmark log (docs/bench-log/) quotes (timings, pairs, floor, quality) and FP32 agrees with itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from hostile_harness import CachedBuild
from seed_store import seeded


def _bf16_probe() -> tuple[str, ...]:
    """The BF16 matmul probe's name where the CPU runs BF16 natively, the only place the probes take it
    (bench/builtin_models.py); torch is imported when a test asks, not when pytest collects this file."""
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    try:
        from builtin_models import native_bf16
    finally:
        sys.path.remove(str(REPO / "bench"))
    return ("matmul_bf16_1_thread_ms",) if native_bf16(torch) else ()


def _bench(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench" / script), *args], capture_output=True, text=True,
                          timeout=900, cwd=REPO)


def test_decode_bound_times_both_loops_against_the_floor(tmp_path: Path) -> None:
    res = _bench("decode_bound.py", "--device", "cpu", "--preset", "tiny", "--tokens", "4", "--pairs", "1",
                 "--batches", "1,2", "--artifacts", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "bench" / "decode_bound-cpu.json").read_text())
    rows = {(r["dtype"], r["loop"], r["batch"]): r for r in out["rows"]}
    assert set(rows) == {(d, loop, b) for d in ("fp32", "bf16") for loop in ("growing cache", "static cache")
                         for b in (1, 2)}
    assert all(r["ms_per_token"] > 0 and r["pairs"] == 1 and r["floor_ms_per_token"] > 0 for r in rows.values())
    # BF16 reads half the weight bytes; FP32 is the reference itself.
    assert rows[("bf16", "growing cache", 1)]["weight_bytes"] * 2 == rows[("fp32", "growing cache", 1)]["weight_bytes"]
    assert rows[("fp32", "static cache", 1)]["logit_cosine"] > 0.99999
    assert 0.99 < rows[("bf16", "static cache", 1)]["logit_cosine"] < 1.0
    assert "| bf16 | static cache | 2 |" in res.stdout


def test_pipeline_speed_reports_speed_with_the_quality_of_the_same_engines(tmp_path: Path, seed: Path) -> None:
    art = seeded(seed, tmp_path / "art")
    res = _bench("pipeline_speed.py", "--recipe", str(REPO / "recipes" / "cpu-fp32.yaml"), "--model", "builtin:tiny",
                 "--tokens", "30", "--pairs", "1", "--cases", "hift,end_to_end,first_chunk",
                 "--artifacts", str(art))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((art / "bench" / "pipeline_speed-cpu-fp32.json").read_text())
    assert set(out["speed"]) == {"hift", "end_to_end", "first_chunk"}
    # The median is one of the per-pair ratios kept beside it (one pair here).
    assert all(s["ratios"] == [s["speedup"]] for s in out["speed"].values())
    assert out["rtf_built"] == out["speed"]["end_to_end"]["built_s"] / out["audio_seconds"] > 0
    q = out["quality"]
    # FP32 ONNX Runtime engines decode the reference's tokens and keep its mel and waveform.
    assert q["tokens_identical"] and q["tokens_built"] == q["tokens_reference"] == 30
    assert q["flow_mel_snr_db_on_reference_tokens"] > 60 and q["hift_waveform_snr_db_on_reference_mel"] > 60
    assert {e["backend"] for e in out["engines"].values()} == {"onnxruntime"}


@pytest.mark.extended
def test_gpu_inductor_runs_its_phases_on_a_cpu(tmp_path: Path) -> None:
    """The lease script's code paths, without CUDA graphs: eager and compiled static steps, INT8 linears,
    Inductor's tuned kernels as a ``format=`` phase entry, and the pipeline with its quality, in one JSON."""
    res = _bench("gpu_inductor.py", "--device", "cpu", "--model", "builtin:tiny", "--tokens", "4", "--pairs", "1",
                 "--speech-tokens", "30", "--phases", "decode,pipeline,formats,format=bf16-tuned", "--formats", "int8",
                 "--artifacts", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "bench" / "gpu_inductor-cpu.json").read_text())
    rows = {r["format"].split(" ")[0] + "/" + r["loop"]: r for r in out["decode"]}
    assert set(rows) == {"bf16/static cache (eager, no compile)", "bf16/static cache, compiled",
                         "int8/static cache, compiled", "bf16-tuned/static cache, compiled"}
    assert all(r["ms_per_token"] > 0 and r["pairs"] == 1 and r["compile_seconds"] >= 0 for r in rows.values())
    compiled, tuned = rows["bf16/static cache, compiled"], rows["bf16-tuned/static cache, compiled"]
    # Tuning changes launch configurations, not arithmetic: the same logits. INT8 reads fewer bytes.
    assert abs(tuned["logit_cosine"] - compiled["logit_cosine"]) < 1e-3 and compiled["logit_cosine"] > 0.99
    assert compiled["weight_bytes"] == tuned["weight_bytes"] > rows["int8/static cache, compiled"]["weight_bytes"]
    # Each batch-1 row says what one step launched; the eager step runs many more ops than the compiled one.
    eager = rows["bf16/static cache (eager, no compile)"]["profile"]
    assert eager["events"] == "cpu" and eager["kernels"] > compiled["profile"]["kernels"] > 0
    assert eager["kernel_ms"] > 0 and len(eager["top"]) == 5
    p = out["pipeline"]
    assert p["tokens"] == 30 and set(p["speed"]) == {"first_chunk", "end_to_end", "flow", "hift"}
    assert p["rtf_built"] == p["speed"]["end_to_end"]["built_s"] / p["audio_seconds"]
    # BF16 flow under autocast stays close to FP32; HiFT runs in FP32.
    assert p["quality"]["flow_mel_snr_db_on_reference_tokens"] > 20
    assert p["quality"]["hift_waveform_snr_db_on_reference_mel"] > 60


def test_first_chunk_takes_the_chunk_apart_on_both_sides(tmp_path: Path, seed: Path) -> None:
    res = _bench("studies/first_chunk.py", "--recipe", str(REPO / "recipes" / "cpu-fp32.yaml"), "--model", "builtin:tiny",
                 "--rounds", "3", "--min-seconds", "0", "--artifacts", str(seeded(seed, tmp_path / "art")),
                 "--results", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "first_chunk-cpu-fp32.json").read_text())
    assert out["rounds"] == 3 and out["chunk_tokens"] == 28
    probes = out["probes"]
    assert set(probes) == {"copy_gb_per_s", "matmul_1_thread_ms", "matmul_2_threads_ms", "small_op_1_thread_us",
                           "small_op_2_threads_us", "threads_lose", "built_flow_1_thread_ms", "threads_lose_around_sides",
                           *_bf16_probe()}
    assert all(len(v) == 3 and min(v) > 0 for k, v in probes.items() if not k.startswith("threads_lose"))
    assert len(probes["threads_lose_around_sides"]) == 2 * 3 + 1  # before each side, and after the last round
    # The state of a round is whether two threads lost to one on the small op; the rounds of the two
    # states and those that straddled a switch are all the rounds.
    lose = [a > b for a, b in zip(probes["small_op_2_threads_us"], probes["small_op_1_thread_us"])]
    assert probes["threads_lose"] == [float(x) for x in lose]
    assert sum(s["pairs"] for s in out["parts"]["flow"]["by_state"].values()) == 3
    # FP32 engines decode the reference's tokens.
    assert out["tokens_identical_to_reference"]
    parts = out["parts"]
    assert set(parts) == {"prefill", "llm", "flow", "hift", "chunk"}
    for side in ("reference", "built"):
        t = out["times"][side]
        assert all(len(v) == 3 and min(v) > 0 for v in t.values())
    # The chunk is llm + flow + hift of the same round (not a sum of medians, not a timing comparison:
    # on builtin:tiny under load, 27 more tiny steps can take less than the noise).
    b = out["times"]["built"]
    sums = sorted(b["llm"][i] + b["flow"][i] + b["hift"][i] for i in range(3))
    assert abs(parts["chunk"]["built_s"] - sums[1]) < 1e-12 and abs(parts["chunk"]["built_max_s"] - sums[2]) < 1e-12
    # The chunk is llm + flow + hift, round by round, so their shares of its variance add up to 1.
    shares = [parts[p]["share_of_chunk_variance"] for p in ("llm", "flow", "hift")]
    assert abs(sum(shares) - 1) < 1e-9
    assert parts["chunk"]["built_s"] > max(parts[p]["built_s"] for p in ("llm", "flow", "hift"))
    assert "| flow |" in res.stdout


def test_machine_timeline_probes_for_a_while_and_measures_spells(tmp_path: Path) -> None:
    # 6 s: under a concurrent build a probe took over a second, and 3 s held only two of them.
    res = _bench("machine_timeline.py", "--minutes", "0.1", "--interval", "0.2", "--results", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "machine_timeline.json").read_text())
    samples, summary = out["samples"], out["summary"]
    assert summary["probes"] == len(samples) >= 3
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples) and samples[-1]["t"] < 6 + 5
    # Every probe falls in one state, and the spells of both states cover the whole span.
    shares = [summary[s]["share"] for s in ("threads_win", "threads_lose") if s in summary]
    assert abs(sum(shares) - 1.0) < 1e-9
    assert "probes over" in res.stdout and "| threads_" in res.stdout


def test_machine_timeline_spells_are_runs_of_one_state() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from machine_timeline import spells
    finally:
        sys.path.remove(str(REPO / "bench"))
    # win from 0 to 2 (next spell's first probe), lose 2 to 5, win 5 to its own last probe at 6.
    assert spells([0, 1, 2, 3, 5, 6], [0, 0, 1, 1, 0, 0]) == {"threads_win": [2, 1], "threads_lose": [3]}
    assert spells([0, 1], [1, 1]) == {"threads_win": [], "threads_lose": [1]}


@pytest.mark.extended
def test_llm_decode_rows_carry_their_probes(tmp_path: Path) -> None:
    res = _bench("llm_decode.py", "--model", "builtin:tiny", "--device", "cpu", "--formats", "fp32", "--batches", "1",
                 "--tokens", "4", "--pairs", "2", "--min-seconds", "0", "--artifacts", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "bench" / "llm_decode-cpu.json").read_text())
    row = out["rows"][0]
    assert row["format"] == "fp32" and row["pairs"] == 2 and row["logit_cosine"] > 0.99999
    # The floor divides the bytes a step reads (weights and KV cache) by the faster of the two streams.
    assert min(out["copy_gb_per_s"], out["read_gb_per_s"]) > 0.1
    assert row["bytes_per_token"] > row["weight_bytes"] > 0
    best_gb_per_s = max(out["copy_gb_per_s"], out["read_gb_per_s"])
    assert abs(row["floor_ms_per_token"] * best_gb_per_s * 1e6 / row["bytes_per_token"] - 1) < 1e-9
    # The medians of the probes taken around the row's runs, the BF16 matmul among them.
    medians = row["probe_medians"]
    assert {"copy_gb_per_s", "matmul_1_thread_ms", "threads_lose", *_bf16_probe()} <= set(medians)
    assert set(_bf16_probe()) == {k for k in medians if "bf16" in k}
    assert all(medians[k] > 0 for k in ("matmul_1_thread_ms", *_bf16_probe()))
    assert sum(s["pairs"] for s in row["by_state"].values()) == 2
    assert "probes (median): copy_gb_per_s" in res.stdout


def test_triton_stream_times_the_first_chunk_through_the_real_server(followup: CachedBuild, tmp_path: Path) -> None:
    """bench/triton_stream.py on the session's built bundle, one round: every arm answered, the stream in
    chunks before the offline answer's whole audio, and the cached speaker's stream equal to the prompt's."""
    (bundle,) = (followup.art / "builds").glob("followup-*")
    res = _bench("triton_stream.py", "--bundle", str(bundle), "--rounds", "1", "--results", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / f"triton_stream-{bundle.name}.json").read_text())
    arms = out["arms"]
    assert set(arms) == {"stream_prompt", "stream_speaker", "offline_prompt"}
    assert arms["stream_prompt"]["chunks"] >= 3 and arms["offline_prompt"]["chunks"] == 1
    assert all(a["first_s"] <= a["total_s"] for a in arms.values())
    assert arms["stream_prompt"]["audio_s"] == arms["offline_prompt"]["audio_s"] > 5
    assert out["quality"] == {"speaker_vs_prompt_max_abs": 0.0, "stream_samples_equal_offline_length": True}
    assert "| stream_speaker |" in res.stdout
    assert not list(bundle.glob("speakers*")), "the benchmark added its speaker to the build's own bundle"


@pytest.mark.vllm
def test_vllm_decode_times_both_sides_with_their_tokens(tmp_path: Path) -> None:
    """bench/vllm_decode.py against the real vLLM of ``make test-vllm``: both sides timed per pair, and
    vLLM (through the shipped plug-in) decodes the engine's tokens."""
    import os

    python = os.environ.get("COSYCOMPILE_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    res = _bench("vllm_decode.py", "--tokens", "12", "--pairs", "1", "--vllm-python", python,
                 "--artifacts", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "bench" / "vllm_decode-tiny.json").read_text())
    (pair,) = out["pairs"]
    assert pair["ort_tokens"] == pair["vllm_tokens"] == 12 and out["identical_tokens"] == 12
    assert out["ort_ms_per_token"] > 0 and out["vllm_ms_per_token"] > 0
    assert "| builtin:tiny |" in res.stdout


@pytest.mark.vllm
def test_vllm_decode_int8_follows_its_quantized_reference(tmp_path: Path) -> None:
    """--int8: vLLM on the int8_dyn checkpoint beside cpu-int8's engine; vLLM's tokens are those of the
    checkpoint's quantized reference (the two INT8 engines need not agree with each other)."""
    import os

    python = os.environ.get("COSYCOMPILE_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    res = _bench("vllm_decode.py", "--int8", "--tokens", "12", "--pairs", "1", "--vllm-python", python,
                 "--artifacts", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "bench" / "vllm_decode-tiny-int8.json").read_text())
    (pair,) = out["pairs"]
    assert out["int8"] and pair["vllm_tokens"] == pair["quantized_reference_tokens"] == 12
    assert pair["identical_prefix_vs_quantized_reference"] == 12
    assert "equal the int8_dyn quantized reference's for the first 12 of 12" in res.stdout


@pytest.mark.parametrize("stream", [False, True])
def test_pipeline_profile_splits_graph_time_from_the_rest(followup: CachedBuild, tmp_path: Path, stream: bool) -> None:
    """bench/pipeline_profile.py on the session's built bundle: the engines' ONNX Runtime calls are the
    graph time, and none of them is listed among the functions outside the graphs."""
    (bundle,) = (followup.art / "builds").glob("followup-*")
    res = _bench("pipeline_profile.py", "--bundle", str(bundle), "--tokens", "30", "--runs", "1", "--top", "40",
                 "--results", str(tmp_path), *(["--stream"] if stream else []))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / f"pipeline_profile-{bundle.name}.json").read_text())
    assert out["mode"] == ("stream" if stream else "offline") and out["audio_seconds"] > 0
    assert 0 < out["graph_s"] < out["seconds_per_synthesis"] and 0 < out["other_share"] < 1
    assert len(out["top"]) == 40 and not [r for r in out["top"] if "onnxruntime_pybind11_state.run>" in r["function"]]
    assert sum(r["own_s"] for r in out["top"]) <= out["other_s"] + 1e-6
    assert "| function (outside the graphs) |" in res.stdout


@pytest.mark.extended  # compiles the operators of a second revision
@pytest.mark.parametrize("workload", ["decode", "attention"])
def test_torch_ops_ab_times_the_working_tree_against_a_revision(tmp_path: Path, workload: str) -> None:
    """Against HEAD both sides are the same operators wherever the working tree leaves them as committed:
    then the outputs are bit-identical; every case is timed in the pairs asked for."""
    res = _bench("studies/torch_ops_ab.py", "--base", "HEAD", "--workload", workload, "--frames", "40", "--pairs", "1",
                 "--min-seconds", "0", "--artifacts", str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = json.loads((tmp_path / "bench" / "torch_ops_ab.json").read_text())["rows"]
    assert len(rows) == (1 if workload == "decode" else 2)
    assert all(r["pairs"] == 1 and r["base_ms"] > 0 and r["head_ms"] > 0 for r in rows)
    diff = ["git", "diff", "--quiet", "HEAD", "--", "cosycompile/runtime/torch_ops"]
    if subprocess.run(diff, cwd=REPO).returncode == 0:
        assert all(r["bit_identical"] for r in rows), rows
    if workload == "decode":
        assert rows[0]["head_gb_per_s"] > 0.1


@pytest.mark.extended  # compiles the tiny LLM's two INT8 packages twice
def test_torch_weights_ab_compiles_both_ways_and_times_their_steps(tmp_path: Path, seed: Path) -> None:
    """The study compiles one programs dir with the weights linked in and beside the packages, and
    times the two engines' decode steps in pairs; beside, the packages are small and a weights file
    holds what they read."""
    from helpers import run_cli, until_outputs, write_recipe

    recipe = write_recipe(tmp_path / "r.yaml", {"extends": str(REPO / "recipes" / "cpu-torch-int8.yaml"),
                                                "name": "weights-ab", "stages": {"flow": {"enabled": False},
                                                                                 "hift": {"enabled": False}}})
    art = seeded(seed, tmp_path / "art")
    res = run_cli("build", str(recipe), "--artifacts", str(art), "--until", "quantize", "-q", timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    programs = until_outputs(res.stdout)["llm.quantize"]
    sides = {}
    for side in ("inside", "beside"):
        res = _bench("studies/torch_weights_ab.py", "compile", str(programs), str(tmp_path / side),
                     *(["--inside"] if side == "inside" else []))
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        sides[side] = json.loads(res.stdout[res.stdout.index("{"):])
        assert sides[side]["peak_rss_mib"] > 0 and sides[side]["seconds"] > 0
    assert "llm_step.weights.pt" in sides["beside"]["files_mib"] and "llm_step.weights.pt" not in sides["inside"]["files_mib"]
    size = {side: (tmp_path / side / "llm_step.pt2").stat().st_size for side in sides}
    # What left the package is the weights file: the compiled code itself is the same size either way.
    assert size["inside"] - size["beside"] > 0.8 * (tmp_path / "beside" / "llm_step.weights.pt").stat().st_size, size
    res = _bench("studies/torch_weights_ab.py", "step", str(tmp_path / "inside"), str(tmp_path / "beside"),
                 "--pairs", "1", "--steps", "2")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads(res.stdout[res.stdout.index("{\n"):])
    assert len(out["pairs"]) == 1 and out["pairs"][0]["a_ms"] > 0 and out["pairs"][0]["b_ms"] > 0
    assert [load["load_seconds"] >= 0 for load in out["loads"]] == [True, True]
