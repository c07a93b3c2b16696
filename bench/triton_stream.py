"""Benchmark: first-chunk latency through the real tritonserver (``cosycompile serve``), with the prompt
sent as audio and text and with the same prompt cached in the bundle as a speaker, beside the offline
request's latency.

One bundle (``--bundle``, or the tiny model's ``--recipe`` built into ``--artifacts``) is copied, the
eval set's first prompt added to the copy as speaker ``bench``, and the copy served with one instance.
Each round sends, in an order that rotates round by round: a gRPC streaming request with the prompt as
``reference_wav`` + ``reference_text``, one naming ``speaker``, and an HTTP offline request with the
prompt files. Reported: the median first-chunk and total latency of each arm, the median of per-round
ratios (prompt files / speaker, first chunk) with their range, the chunks per request, and the quality
of the same responses: the speaker's stream against the prompt's (the same prompt features, so equal
samples are expected) and the stream's length against the offline audio's.

Usage: python bench/triton_stream.py [--recipe recipes/cpu-fp32.yaml] [--bundle DIR] [--rounds 5]
       [--text "..."] [--results artifacts/bench]
Writes ``<results>/triton_stream-<bundle name>.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from builtin_models import machine  # noqa: E402
from helpers import EVAL_SET, free_ports  # noqa: E402

TEXT = "Hello there, this is one sentence for the server to stream back in chunks."
ARMS = ("stream_prompt", "stream_speaker", "offline_prompt")


def _cli(*args: str | Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "cosycompile", *map(str, args)], capture_output=True, text=True,
                         timeout=timeout)
    if res.returncode != 0:
        sys.exit(f"cosycompile {args[0]} failed ({res.returncode}): {res.stderr[-2000:]}")
    return res


def _bundle(args: argparse.Namespace, work: Path) -> Path:
    """A copy of the bundle (given, or built) with the eval set's first prompt as speaker ``bench``."""
    src = args.bundle
    if src is None:
        out = _cli("build", args.recipe, "--artifacts", args.artifacts, "-q").stdout
        src = Path(next(ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("bundle: ")))
    copy = work / src.name
    shutil.copytree(src, copy, symlinks=True)
    item = _first_item()
    _cli("speakers", "add", copy, "--name", "bench", "--prompt-wav", EVAL_SET / item["prompt_wav"],
         "--prompt-text", item["prompt_text"])
    return copy


def _first_item() -> dict[str, Any]:
    return json.loads((EVAL_SET / "manifest.jsonl").read_text().splitlines()[0])


class Server:
    """``cosycompile serve`` on loopback ports, ready; stopped with SIGTERM at the end."""

    def __init__(self, bundle: Path, work: Path, threads: int | None) -> None:
        http, grpc = free_ports(2)
        self.http, self.grpc = f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"
        extra = ["--threads", str(threads)] if threads else []
        self.proc = subprocess.Popen([sys.executable, "-m", "cosycompile", "serve", str(bundle), "--http-port", str(http),
                                      "--grpc-port", str(grpc), "--instances", "1", "--log", str(work / "server.log"),
                                      *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(self.proc.stdout or []), daemon=True).start()
        deadline = time.monotonic() + 300
        while not any(ln.startswith("serving ") for ln in lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"cosycompile serve did not come up: {(work / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def _inputs(module: Any, text: str, arm: str) -> list[Any]:
    """The request's inputs: the text, and the prompt as files (16 kHz audio + its text) or by speaker name."""
    from cosycompile.runtime.dataset import read_wav
    from cosycompile.runtime.dsp import resample

    def utf8(name: str, value: str) -> Any:
        data = np.frombuffer(value.encode(), np.uint8)[None]
        inp = module.InferInput(name, list(data.shape), "UINT8")
        inp.set_data_from_numpy(data)
        return inp

    inputs = [utf8("target_text_utf8", text)]
    if arm == "stream_speaker":
        return inputs + [utf8("speaker_utf8", "bench")]
    item = _first_item()
    samples, sr = read_wav(EVAL_SET / item["prompt_wav"])
    wav = resample(samples, sr, 16000).astype(np.float32)[None]
    ref = module.InferInput("reference_wav", list(wav.shape), "FP32")
    ref.set_data_from_numpy(wav)
    return inputs + [ref, utf8("reference_text_utf8", item["prompt_text"])]


def _stream(server: Server, text: str, arm: str) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    g = grpcclient.InferenceServerClient(server.grpc)
    g.start_stream(callback=lambda result, error: results.put((result, error)))
    chunks: list[np.ndarray] = []
    first = None
    try:
        t0 = time.perf_counter()
        g.async_stream_infer(_family(server), _inputs(grpcclient, text, arm), enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=600)
            if error is not None:
                sys.exit(f"{arm}: {error}")
            if result.get_response().parameters["triton_final_response"].bool_param:
                total = time.perf_counter() - t0
                break
            first = first if first is not None else time.perf_counter() - t0
            chunks.append(result.as_numpy("waveform")[0])
    finally:
        g.stop_stream()
        g.close()
    return {"first_s": first, "total_s": total, "chunks": len(chunks), "wav": np.concatenate(chunks)}


def _offline(server: Server, text: str) -> dict[str, Any]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http, connection_timeout=600, network_timeout=600)
    t0 = time.perf_counter()
    wav = client.infer(_family(server) + "_offline", _inputs(httpclient, text, "offline_prompt")).as_numpy("waveform")[0]
    total = time.perf_counter() - t0
    client.close()  # an open connection holds tritonserver's exit for its whole exit timeout (30 s)
    return {"first_s": total, "total_s": total, "chunks": 1, "wav": wav}


_FAMILY: dict[str, str] = {}


def _family(server: Server) -> str:
    """The served models' name: the bundle's model family (from the server's model index)."""
    if server.http not in _FAMILY:
        import tritonclient.http as httpclient

        index = httpclient.InferenceServerClient(server.http)
        names = [m["name"] for m in index.get_model_repository_index()]
        index.close()
        _FAMILY[server.http] = next(n for n in names if not n.endswith("_offline"))
    return _FAMILY[server.http]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "cpu-fp32.yaml")
    ap.add_argument("--bundle", type=Path, default=None, help="a built CPU bundle (else --recipe is built)")
    ap.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads of the served instance")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--results", type=Path, default=REPO / "artifacts" / "bench")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="triton-stream-") as tmp:
        work = Path(tmp)
        bundle = _bundle(args, work)
        rate = json.loads((bundle / "engines" / "hift" / "graphs.json").read_text())["info"]["sample_rate"]
        server = Server(bundle, work, args.threads)
        try:
            runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
            _stream(server, args.text, "stream_prompt")  # warm-up: the instance's first request loads lazily
            for r in range(args.rounds):
                for arm in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:
                    runs[arm].append(_offline(server, args.text) if arm == "offline_prompt"
                                     else _stream(server, args.text, arm))
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{a} {runs[a][-1]['first_s']:.3f} s" for a in ARMS), file=sys.stderr, flush=True)
        finally:
            server.stop()
        log_tail = (work / "server.log").read_text()[-400:] if (work / "server.log").exists() else ""

    ratios = [p["first_s"] / s["first_s"] for p, s in zip(runs["stream_prompt"], runs["stream_speaker"])]
    a, b = runs["stream_prompt"][-1]["wav"], runs["stream_speaker"][-1]["wav"]
    offline = runs["offline_prompt"][-1]["wav"]
    summary = {
        "machine": machine(), "bundle": bundle.name, "text": args.text, "rounds": args.rounds,
        "arms": {arm: {"first_s": statistics.median(x["first_s"] for x in xs),
                       "total_s": statistics.median(x["total_s"] for x in xs),
                       "chunks": xs[-1]["chunks"], "audio_s": len(xs[-1]["wav"]) / rate}
                 for arm, xs in runs.items()},
        "first_chunk_prompt_over_speaker": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "quality": {"speaker_vs_prompt_max_abs": float(np.abs(a - b).max()) if a.shape == b.shape else None,
                    "stream_samples_equal_offline_length": a.shape == offline.shape},
        "server_log_tail": log_tail,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"triton_stream-{bundle.name}.json").write_text(json.dumps(summary, indent=1))
    print("| arm | first chunk (median) | whole request | chunks | audio |\n|---|---|---|---|---|")
    for arm, s in summary["arms"].items():
        print(f"| {arm} | {s['first_s'] * 1000:.0f} ms | {s['total_s'] * 1000:.0f} ms | {s['chunks']} | {s['audio_s']:.2f} s |")
    r = summary["first_chunk_prompt_over_speaker"]
    print(f"\nfirst chunk, prompt files / cached speaker: {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}) over "
          f"{args.rounds} rounds; speaker vs prompt stream max |diff| {summary['quality']['speaker_vs_prompt_max_abs']}")


if __name__ == "__main__":
    main()
