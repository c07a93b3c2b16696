"""Regenerate, or check, calib_data/{calib,eval}: espeak-ng prompt audio, manifests and INFO.json.

    python calib_data/make_sets.py           # regenerate both sets from texts.py, then check them
    python calib_data/make_sets.py --check   # only check the committed files (no espeak-ng needed)

The outputs are committed, so nobody needs to run this to use the sets. Regeneration needs
espeak-ng on PATH and is deterministic: a re-run with the same espeak-ng version writes the same
bytes (the resampling and normalisation are plain numpy/scipy arithmetic with no randomness).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

ROOT = Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # keep calib_data/ free of __pycache__
sys.path.insert(0, str(ROOT))
from texts import CALIB_PROMPTS, CALIB_TEXTS, EVAL_PROMPTS, EVAL_TEXTS  # noqa: E402

SR = 16000
PEAK_DBFS = -3.0
PROMPT_SECONDS = (1.5, 4.0)
LANGS = ("en", "zh", "mixed")
MIN_ITEMS = {"calib": 64, "eval": 16}
SETS = {"calib": (CALIB_PROMPTS, CALIB_TEXTS), "eval": (EVAL_PROMPTS, EVAL_TEXTS)}
PURPOSE = {
    "calib": "quantization calibration: run the FP32 reference on these items and record each stage's real inputs",
    "eval": "validation: compare a build's outputs with the FP32 reference on these items; never used to calibrate",
}
SIZE_LIMIT = 10 * 2**20
SIZE_TARGET = 4 * 2**20

_HAN = re.compile(r"[\u3400-\u9fff]")
_LATIN_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


# --------------------------------------------------------------------------------------------- audio
def espeak_version() -> str:
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("text-to-speech:")[1].split()[0]


def synth(voice: str, pitch: int, speed: int, text: str) -> np.ndarray:
    """espeak-ng audio as 16 kHz int16, peak-normalised to PEAK_DBFS."""
    phon = subprocess.run(["espeak-ng", "-q", "-x", "-v", voice, "--", text], capture_output=True, text=True,
                          check=True).stdout
    if "(" in phon:  # e.g. "(en)...(cmn)": espeak-ng switched language, so it would not say the text as written
        raise RuntimeError(f"espeak-ng -v {voice} switches language on {text!r}: {phon.strip()}")
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "-w", str(raw), "--", text],
                       check=True, capture_output=True)
        wav, sr = sf.read(raw, dtype="float64")
    if wav.ndim != 1:
        raise RuntimeError(f"espeak-ng wrote {wav.shape[1]} channels, expected mono")
    if sr != SR:
        g = np.gcd(SR, sr)
        wav = resample_poly(wav, SR // g, sr // g)  # 22050 -> 16000 is 320/441
    wav = wav * (10 ** (PEAK_DBFS / 20) / np.abs(wav).max())
    return np.clip(np.round(wav * 32767), -32768, 32767).astype(np.int16)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------ manifest
def prompt_lang(voice: str) -> str:
    return "zh" if voice.startswith("cmn") else "en"


def prompt_table(name: str, prompts: list) -> list[dict]:
    return [{"wav": f"prompts/{name}-prompt-{i:02d}.wav", "voice": v, "pitch": p, "speed": s, "lang": prompt_lang(v),
             "text": t} for i, (v, p, s, t) in enumerate(prompts)]


def manifest_rows(name: str, prompts: list[dict], texts: dict[str, list[str]]) -> list[dict]:
    """Items interleaved en, zh, mixed, en, ... so every head of the manifest mixes the languages.

    en items take English prompts and zh items Chinese ones, in turn; mixed items alternate
    between the two pools, so the first items of a set also cover most prompts.
    """
    pools = {lang: [p for p in prompts if p["lang"] == lang] for lang in ("en", "zh")}
    turn = {"en": 0, "zh": 0}
    pending = {lang: list(enumerate(texts[lang], 1)) for lang in LANGS}
    rows, n_mixed = [], 0
    while any(pending.values()):
        for lang in LANGS:
            if not pending[lang]:
                continue
            j, text = pending[lang].pop(0)
            if lang == "mixed":
                pool_lang = ("zh", "en")[n_mixed % 2]
                n_mixed += 1
            else:
                pool_lang = lang
            pool = pools[pool_lang]
            p = pool[turn[pool_lang] % len(pool)]
            turn[pool_lang] += 1
            rows.append({"id": f"{name}-{lang}-{j:04d}", "lang": lang, "text": text, "prompt_text": p["text"],
                         "prompt_wav": p["wav"]})
    return rows


def manifest_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def build(name: str, version: str) -> None:
    prompts_src, texts = SETS[name]
    out = ROOT / name
    (out / "prompts").mkdir(parents=True, exist_ok=True)
    prompts = prompt_table(name, prompts_src)
    keep = {p["wav"] for p in prompts}
    for stale in (out / "prompts").glob("*.wav"):
        if f"prompts/{stale.name}" not in keep:
            stale.unlink()
    for p in prompts:
        pcm = synth(p["voice"], p["pitch"], p["speed"], p["text"])
        sf.write(out / p["wav"], pcm, SR, subtype="PCM_16")
        p["seconds"] = round(len(pcm) / SR, 3)
        p["sha256"] = sha256(out / p["wav"])
    rows = manifest_rows(name, prompts, texts)
    (out / "manifest.jsonl").write_bytes(manifest_bytes(rows))
    info = {
        "set": name,
        "purpose": PURPOSE[name],
        "licence": "CC0-1.0 (texts and audio, by the cosycompile authors)",
        "generator": "calib_data/make_sets.py (texts in calib_data/texts.py)",
        "espeak_ng_version": version,
        "espeak_ng_command": "espeak-ng -v VOICE -p PITCH -s SPEED -w OUT.wav -- TEXT",
        "audio": {"sample_rate": SR, "channels": 1, "format": "WAV PCM_16", "peak_dbfs": PEAK_DBFS,
                  "resampling": "scipy.signal.resample_poly, espeak-ng rate to 16000 Hz"},
        "items": len(rows),
        "items_per_lang": {lang: sum(r["lang"] == lang for r in rows) for lang in LANGS},
        "prompts_count": len(prompts),
        "voices": sorted({p["voice"] for p in prompts}),
        "manifest_sha256": sha256(out / "manifest.jsonl"),
        "prompts": [{**p, "items": sum(r["prompt_wav"] == p["wav"] for r in rows)} for p in prompts],
        "sha256": {p["wav"]: p["sha256"] for p in prompts},
    }
    (out / "INFO.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------- check
def text_size(lang: str, text: str) -> int:
    """Words for English, characters (no spaces) for Chinese, words plus Chinese characters for mixed."""
    if lang == "en":
        return len(text.split())
    if lang == "zh":
        return len(re.sub(r"\s", "", text))
    return len(_LATIN_WORD.findall(text)) + len(_HAN.findall(text))


SIZE_RANGE = {"en": (4, 60), "zh": (8, 80), "mixed": (5, 80)}


def check() -> int:
    """Check both sets as committed; print a summary; return the number of problems."""
    problems: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    seen_ids: set[str] = set()
    per_set: dict[str, dict] = {}
    total_bytes = 0
    for name, (prompts_src, texts) in SETS.items():
        out = ROOT / name
        man = out / "manifest.jsonl"
        info = json.loads((out / "INFO.json").read_text(encoding="utf-8"))
        rows = [json.loads(line) for line in man.read_text(encoding="utf-8").splitlines() if line.strip()]
        expect = manifest_rows(name, prompt_table(name, prompts_src), texts)
        need(man.read_bytes() == manifest_bytes(expect), f"{name}: manifest.jsonl is out of date with texts.py")
        need(len(rows) >= MIN_ITEMS[name], f"{name}: {len(rows)} items < {MIN_ITEMS[name]}")
        need(info["items"] == len(rows), f"{name}: INFO.json items {info['items']} != {len(rows)}")
        need(info["manifest_sha256"] == sha256(man), f"{name}: INFO.json manifest_sha256 does not match")
        by_wav = {p["wav"]: p for p in info["prompts"]}
        wav_stats = {}
        for path in sorted((out / "prompts").iterdir()):
            rel = f"prompts/{path.name}"
            need(rel in by_wav, f"{name}: {rel} is not listed in INFO.json")
            fi = sf.info(str(path))
            pcm, sr = sf.read(str(path), dtype="int16")
            secs = len(pcm) / sr
            peak = 20 * np.log10(np.abs(pcm.astype(np.int32)).max() / 32768)
            need(sr == SR and fi.channels == 1 and fi.subtype == "PCM_16",
                 f"{name}: {rel} is {sr} Hz, {fi.channels} ch, {fi.subtype}")
            need(PROMPT_SECONDS[0] <= secs <= PROMPT_SECONDS[1], f"{name}: {rel} lasts {secs:.2f} s")
            need(abs(peak - PEAK_DBFS) < 0.2, f"{name}: {rel} peaks at {peak:.2f} dBFS")
            need(info["sha256"].get(rel) == sha256(path), f"{name}: {rel} sha256 differs from INFO.json")
            wav_stats[rel] = secs
            total_bytes += path.stat().st_size
        ids = [r["id"] for r in rows]
        need(len(ids) == len(set(ids)), f"{name}: duplicate ids")
        need(not seen_ids & set(ids), f"{name}: ids shared with another set")
        seen_ids |= set(ids)
        for r in rows:
            rid = r.get("id", "?")
            need(set(r) == {"id", "lang", "text", "prompt_text", "prompt_wav"}, f"{rid}: keys {sorted(r)}")
            need(r["lang"] in LANGS and rid.startswith(f"{name}-{r['lang']}-"), f"{rid}: bad lang/id")
            p = by_wav.get(r["prompt_wav"])
            need(p is not None and r["prompt_wav"] in wav_stats, f"{rid}: prompt_wav {r['prompt_wav']} missing")
            need(p is not None and p["text"] == r["prompt_text"], f"{rid}: prompt_text is not what the wav says")
            has_han, has_latin = bool(_HAN.search(r["text"])), bool(_LATIN_WORD.search(r["text"]))
            need({"en": has_latin and not has_han, "zh": has_han and not has_latin,
                  "mixed": has_han and has_latin}.get(r["lang"], False), f"{rid}: text does not match lang")
            lo, hi = SIZE_RANGE[r["lang"]]
            need(lo <= text_size(r["lang"], r["text"]) <= hi, f"{rid}: length {text_size(r['lang'], r['text'])}")
        need(all(any(r["lang"] == lang for r in rows[:3]) for lang in LANGS), f"{name}: first 3 items not mixed")
        for f in ("manifest.jsonl", "INFO.json"):
            total_bytes += (out / f).stat().st_size
        per_set[name] = {"rows": rows, "info": info, "secs": wav_stats}

    a, b = per_set["calib"], per_set["eval"]
    strings = {k: {r["text"] for r in v["rows"]} | {r["prompt_text"] for r in v["rows"]} for k, v in per_set.items()}
    need(not strings["calib"] & strings["eval"], f"sets share text: {sorted(strings['calib'] & strings['eval'])}")
    need(not set(a["info"]["sha256"].values()) & set(b["info"]["sha256"].values()), "sets share prompt audio")
    need(total_bytes < SIZE_LIMIT, f"total {total_bytes} bytes >= 10 MiB")

    print(f"{'set':6} {'items':>5} {'en':>4} {'zh':>4} {'mixed':>5} {'prompts':>7} {'prompt s':>11} "
          f"{'en words':>9} {'zh chars':>9} {'mixed units':>11}")
    for name, s in per_set.items():
        rows, secs = s["rows"], list(s["secs"].values())
        n = {lang: sum(r["lang"] == lang for r in rows) for lang in LANGS}
        rng = {lang: [text_size(lang, r["text"]) for r in rows if r["lang"] == lang] for lang in LANGS}
        print(f"{name:6} {len(rows):>5} {n['en']:>4} {n['zh']:>4} {n['mixed']:>5} {len(secs):>7} "
              f"{min(secs):>5.2f}-{max(secs):<5.2f} {min(rng['en']):>4}-{max(rng['en']):<4} "
              f"{min(rng['zh']):>4}-{max(rng['zh']):<4} {min(rng['mixed']):>5}-{max(rng['mixed']):<5}")
    print(f"espeak-ng {a['info']['espeak_ng_version']}; total {total_bytes} bytes ({total_bytes / 2**20:.2f} MiB)"
          + ("" if total_bytes < SIZE_TARGET else "  [over the 4 MiB target]"))
    for p in problems:
        print("PROBLEM:", p)
    print("OK: ids unique, sets disjoint, every wav 16 kHz mono PCM_16 in range" if not problems
          else f"{len(problems)} problem(s)")
    return len(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check the committed sets")
    args = ap.parse_args()
    if not args.check:
        version = espeak_version()
        for name in SETS:
            build(name, version)
    sys.exit(1 if check() else 0)


if __name__ == "__main__":
    main()
