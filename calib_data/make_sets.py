"""Regenerate calib_data/{calib,eval}: prompt audio with espeak-ng and the manifests.

Usage: python calib_data/make_sets.py   (needs espeak-ng on PATH; the outputs are committed,
so nobody needs to run this to use the sets). Deterministic for a given espeak-ng version.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

sys.path.insert(0, str(Path(__file__).resolve().parent))
from texts import CALIB_PROMPTS, CALIB_TEXTS, EVAL_PROMPTS, EVAL_TEXTS  # noqa: E402

ROOT = Path(__file__).resolve().parent
SR = 16000


def espeak_version() -> str:
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("text-to-speech:")[1].split()[0]


def synth(voice: str, pitch: int, speed: int, text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "x.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "-w", str(raw), text],
                       check=True, capture_output=True)
        wav, sr = sf.read(raw, dtype="float64")
    wav = resample_poly(wav, SR // 50, sr // 50) if sr != SR else wav  # 22050 -> 16000 is 320/441
    wav = wav / max(np.abs(wav).max(), 1e-9) * 10 ** (-3 / 20)
    return wav.astype(np.float32)


def lang_of(voice: str) -> str:
    return "zh" if voice.startswith("cmn") else "en"


def build(name: str, prompts: list, texts: dict[str, list[str]]) -> dict:
    out = ROOT / name
    (out / "prompts").mkdir(parents=True, exist_ok=True)
    prompt_rows = []
    for i, (voice, pitch, speed, text) in enumerate(prompts):
        rel = f"prompts/{name}-prompt-{i:02d}.wav"
        wav = synth(voice, pitch, speed, text)
        sf.write(out / rel, wav, SR, subtype="PCM_16")
        prompt_rows.append({"voice": voice, "pitch": pitch, "speed": speed, "text": text, "wav": rel,
                            "lang": lang_of(voice), "seconds": round(len(wav) / SR, 3)})
    by_lang = {"en": [p for p in prompt_rows if p["lang"] == "en"], "zh": [p for p in prompt_rows if p["lang"] == "zh"]}
    rows = []
    for lang, items in texts.items():
        for j, text in enumerate(items):
            pool = by_lang["zh" if lang == "zh" else "en"] if lang != "mixed" else prompt_rows
            p = pool[j % len(pool)]
            rows.append({"id": f"{name}-{lang}-{j + 1:04d}", "lang": lang, "text": text,
                         "prompt_text": p["text"], "prompt_wav": p["wav"]})
    with open(out / "manifest.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    info = {
        "set": name, "espeak_ng_version": espeak_version(), "sample_rate": SR, "items": len(rows),
        "items_per_lang": {k: len(v) for k, v in texts.items()}, "prompts": prompt_rows,
        "sha256": {p["wav"]: hashlib.sha256((out / p["wav"]).read_bytes()).hexdigest() for p in prompt_rows},
        "licence": "CC0-1.0",
    }
    (out / "INFO.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n")
    return info


def main() -> None:
    calib = build("calib", CALIB_PROMPTS, CALIB_TEXTS)
    evals = build("eval", EVAL_PROMPTS, EVAL_TEXTS)
    c_txt = {t for v in CALIB_TEXTS.values() for t in v} | {p[3] for p in CALIB_PROMPTS}
    e_txt = {t for v in EVAL_TEXTS.values() for t in v} | {p[3] for p in EVAL_PROMPTS}
    assert not c_txt & e_txt, "calibration and evaluation sets must not share text"
    for info in (calib, evals):
        secs = [p["seconds"] for p in info["prompts"]]
        print(f"{info['set']}: {info['items']} items {info['items_per_lang']}, {len(secs)} prompts "
              f"{min(secs):.1f}-{max(secs):.1f} s, espeak-ng {info['espeak_ng_version']}")


if __name__ == "__main__":
    main()
