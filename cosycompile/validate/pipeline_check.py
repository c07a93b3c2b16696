"""The end-to-end check: text -> wav on the engines vs the PyTorch FP32 reference, quality and speed.

Speed is always a ratio measured in this same run, on the same inputs, with the same thread count.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.runtime.pipeline import Pipeline, Sampling
from cosycompile.stages.common import model_dir
from cosycompile.validate.report import REPORT_SCHEMA, render_markdown
from cosycompile.validate.speed import timed

SAMPLE_RATE = 24000
AUDIO_ITEMS = 2
PERCEPTUAL_ITEMS = 2  # PESQ/STOI/speaker similarity/MCD on the first items: slow metrics, bounded cost
FIRST_CHUNK_TOKENS = 25 + 3  # CosyVoice2 streaming: first hop of 25 tokens plus 3 look-ahead tokens


def run(ctx: StepContext) -> dict[str, Any]:
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.validate import metrics as M

    p = ctx.params
    v = p["validation"]
    threads = v["speed"]["threads"]
    mdir = model_dir(ctx)
    models = load_reference(mdir, ("llm", "flow", "hift"), threads)
    ref = Pipeline(*(reference_runtime(s, models) for s in ("llm", "flow", "hift")))
    built_stages = {s: stage_runtime(s, ctx.inputs[f"{s}.engine"], p["backends"][s], threads) for s in p["stages"]}
    built = Pipeline(*(built_stages.get(s) or reference_runtime(s, models) for s in ("llm", "flow", "hift")))
    frontend = Frontend(mdir)
    sampling = Sampling(**v["sampling"])
    items = load_dataset(ctx.file_roots["eval"]).head(v["max_items"])

    rows = []
    audio_dir = ctx.out / "audio"
    audio_dir.mkdir()
    first: dict[str, Any] = {}
    for n, item in enumerate(ctx.progress(items, desc="eval items")):
        text_ids, prompt = frontend.item_inputs(item)
        r = ref.synthesize(text_ids, prompt, sampling, seed=n)
        b = built.synthesize(text_ids, prompt, sampling, seed=n)
        same = bool(np.array_equal(r.tokens, b.tokens))
        row: dict[str, Any] = {
            "id": item.id, "lang": item.lang, "tokens_ref": int(len(r.tokens)), "tokens_built": int(len(b.tokens)),
            "tokens_identical": same,
            "token_edit_distance": M.token_edit_distance(r.tokens.tolist(), b.tokens.tolist())[1],
            "duration_ratio": M.duration_ratio(r.wav, b.wav) if len(r.wav) else 1.0,
            "audio_seconds": len(r.wav) / SAMPLE_RATE,
        }
        if same and len(r.wav):
            row["mel_snr_db"] = M.mel_snr_db(r.mel, b.mel)
            row["waveform_snr_db"] = M.waveform_snr_db(r.wav, b.wav)
        if len(r.wav) and len(b.wav):
            row["log_mel_l1"] = M.log_mel_l1(r.wav, b.wav, SAMPLE_RATE)
            row["mr_stft_distance"] = M.multi_resolution_stft_distance(r.wav, b.wav)
            if n < PERCEPTUAL_ITEMS:
                row["mcd_db"] = M.mel_cepstral_distortion(r.wav, b.wav, SAMPLE_RATE)
                row["pesq"] = M.pesq_wb(r.wav, b.wav, SAMPLE_RATE)
                row["stoi"] = M.stoi(r.wav, b.wav, SAMPLE_RATE)
                row["speaker_similarity"] = M.speaker_similarity(r.wav, b.wav, SAMPLE_RATE)
        rows.append(row)
        if n < AUDIO_ITEMS:
            _write_wav(audio_dir / f"{item.id}.reference.wav", r.wav)
            _write_wav(audio_dir / f"{item.id}.built.wav", b.wav)
        if n == 0:
            first = {"text_ids": text_ids, "prompt": prompt, "tokens": r.tokens, "mel": r.mel}

    speed = _speed(ref, built, first, sampling, v["speed"], ctx)
    if first:
        speed["first_chunk"] = _first_chunk(ref, built, first, v["speed"])
        speed["throughput"] = _throughput(built, frontend, items, sampling)
    speed["peak_rss_mb"] = _peak_rss_mb()
    checks = {}
    for s in p["stages"]:
        checks[s] = json.loads((ctx.inputs[f"{s}.check"] / "check.json").read_text())
    quality = _summarise(rows)
    # End-to-end figures are judged by the recipe's gate (an FP32 build demands identical tokens,
    # a quantized one a bounded drop), so the pipeline check itself only records them.
    checks["pipeline"] = {"stage": "pipeline", "passed": True, "failures": [], "metrics": quality}
    report = {
        "schema": REPORT_SCHEMA,
        "stages": {s: {"backend": p["backends"][s], "precision": p.get("precisions", {}).get(s, "fp32")}
                   for s in p["stages"]},
        "checks": checks, "speed": speed, "items": rows, "threads": threads,
        "audio": sorted(f.name for f in audio_dir.iterdir()),
    }
    (ctx.out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=float))
    (ctx.out / "report.md").write_text(render_markdown(report))
    return {"passed": all(c["passed"] for c in checks.values())}


def _speed(ref: Pipeline, built: Pipeline, first: dict[str, Any], sampling: Sampling, spec: dict[str, Any],
           ctx: StepContext) -> dict[str, Any]:
    """Per-stage and end-to-end latency of reference and build on the first eval item."""
    if not first or not len(first["tokens"]):
        return {}
    w, n = spec["warmup"], spec["runs"]
    text_ids, prompt, tokens, mel = first["text_ids"], first["prompt"], first["tokens"], first["mel"]
    audio_s = mel.shape[1] * 480 / SAMPLE_RATE
    out: dict[str, Any] = {"audio_seconds": audio_s, "warmup": w, "runs": n}
    cases = {
        "llm": lambda p: p.llm.generate(text_ids, prompt, sampling),
        "flow": lambda p: p.flow.mel(tokens, prompt),
        "hift": lambda p: p.hift.wav(mel, 0),
        "end_to_end": lambda p: p.synthesize(text_ids, prompt, sampling),
    }
    for name, fn in ctx.progress(list(cases.items()), desc="timing"):
        r_med, r_p90 = timed(lambda: fn(ref), w, n)
        b_med, b_p90 = timed(lambda: fn(built), w, n)
        out[name] = {"reference_s": r_med, "reference_p90_s": r_p90, "built_s": b_med, "built_p90_s": b_p90,
                     "speedup": r_med / b_med if b_med > 0 else float("inf")}
    out["llm"]["per_token_built_ms"] = 1000 * out["llm"]["built_s"] / max(len(tokens), 1)
    out["llm"]["per_token_reference_ms"] = 1000 * out["llm"]["reference_s"] / max(len(tokens), 1)
    out["end_to_end"]["rtf_reference"] = out["end_to_end"]["reference_s"] / audio_s
    out["end_to_end"]["rtf_built"] = out["end_to_end"]["built_s"] / audio_s
    return out


def _first_chunk(ref: Pipeline, built: Pipeline, first: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Streaming first-chunk latency: LLM to 25+3 tokens, flow on them, HiFT on the first hop's frames."""
    text_ids, prompt = first["text_ids"], first["prompt"]
    cap = Sampling(mode="greedy", max_tokens=FIRST_CHUNK_TOKENS)

    def chunk(p: Pipeline) -> None:
        toks = p.llm.generate(text_ids, prompt, cap)
        mel = p.flow.mel(toks, prompt)[:, : 2 * 25]
        p.hift.wav(mel, 0)

    r = timed(lambda: chunk(ref), spec["warmup"], spec["runs"])[0]
    b = timed(lambda: chunk(built), spec["warmup"], spec["runs"])[0]
    return {"reference_s": r, "built_s": b, "speedup": r / b if b else 0.0, "tokens": FIRST_CHUNK_TOKENS}


def _throughput(built: Pipeline, frontend: Any, items: Any, sampling: Sampling) -> dict[str, Any]:
    """Audio seconds synthesized per wall second by the build at concurrency 1, 2 and 4."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = [frontend.item_inputs(i) for i in items]
    out = {}
    for conc in (1, 2, 4):
        jobs = [inputs[k % len(inputs)] for k in range(conc * 2)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(conc) as pool:
            wavs = list(pool.map(lambda a: built.synthesize(a[0], a[1], sampling).wav, jobs))
        wall = time.perf_counter() - t0
        audio = sum(len(w) for w in wavs) / SAMPLE_RATE
        out[str(conc)] = {"requests": len(jobs), "wall_s": wall, "audio_s_per_s": audio / wall if wall else 0.0}
    return out


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if key in r and np.isfinite(r[key])]
        return float(np.mean(vals)) if vals else None

    def minimum(key: str) -> float | None:
        vals = [r[key] for r in rows if key in r and not np.isnan(r[key])]
        return float(np.min(vals)) if vals else None

    same = sum(r["tokens_identical"] for r in rows)
    return {"items": len(rows), "tokens_identical": same, "tokens_identical_ratio": same / max(len(rows), 1),
            "mcd_db_mean": mean("mcd_db"), "pesq_mean": mean("pesq"), "stoi_mean": mean("stoi"),
            "speaker_similarity_mean": mean("speaker_similarity"), "mr_stft_distance_mean": mean("mr_stft_distance"),
            "token_edit_distance_mean": mean("token_edit_distance"), "mel_snr_db_min": minimum("mel_snr_db"),
            "waveform_snr_db_min": minimum("waveform_snr_db"), "log_mel_l1_mean": mean("log_mel_l1"),
            "duration_ratio_mean": mean("duration_ratio")}


def _write_wav(path: Path, wav: np.ndarray) -> None:
    import soundfile as sf

    sf.write(str(path), wav.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")
