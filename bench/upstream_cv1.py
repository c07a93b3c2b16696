"""Benchmark: upstream FunAudioLLM/CosyVoice's own PyTorch inference of CosyVoice-300M on this CPU.

"What a user runs today": the LLM -> flow -> HiFT networks of a CosyVoice-300M model dir, built and
run by upstream's own code, FP32, eager PyTorch, so that docs/benchmarks.md can put it next to
cosycompile's builds of the same shapes.

Upstream: FunAudioLLM/CosyVoice at commit ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40 (its flow decoder
imports Matcha-TTS, shivammehta25/Matcha-TTS at dd9105b34bf2be2230f4aa1e4769fb586a3c824e, upstream's
``third_party/Matcha-TTS`` submodule). ``--upstream`` / ``--matcha`` take a source tree or a git dir
(default: the bare mirrors under /work/.mirror); from a git dir the needed folders of the commit are
exported to a temporary folder.

What runs, step for step as upstream's ``cosyvoice/cli/cosyvoice.py::CosyVoice`` and
``cosyvoice/cli/model.py::CosyVoiceModel`` do it, minus the front end:

1. ``configs = hyperpyyaml.load_hyperpyyaml(open(<model>/cosyvoice.yaml))`` builds upstream's
   ``TransformerLM``, ``MaskedDiffWithXvec`` and ``HiFTGenerator``; ``class_utils.get_model_type``
   must say ``CosyVoiceModel``; ``model = CosyVoiceModel(configs['llm'], configs['flow'],
   configs['hift'], fp16=False)``; ``model.load(llm.pt, flow.pt, hift.pt)`` (strict, then eval).
2. The SFT input ``CosyVoiceFrontEnd.frontend_sft`` would give: ``text`` = ``--text-tokens`` random ids
   in the LM's text vocabulary (int32, [1, n]), ``text_len``, ``llm_embedding`` = ``flow_embedding`` =
   the first speaker of spk2info.pt (or a random [1, 192] with ``--speaker random``); no prompt speech.
3. ``for out in model.tts(**model_input, stream=False)``: upstream's own method. It starts
   ``llm_job`` in a thread (``llm.inference`` with upstream's ``ras_sampling`` from the yaml, seeded
   with upstream's ``set_all_random_seed`` before each run), joins it, then ``token2wav(finalize=True)``
   = ``flow.inference`` (10 Euler steps, CFG batch of 2) and ``hift.inference`` on the mel.
   The one change: the random-weight LM would stop whenever it samples eos, so the instance's
   ``llm.sampling_ids`` is wrapped to force exactly ``--tokens`` speech tokens: before that many it
   calls upstream's ``sampling_ids`` with ``ignore_eos=True`` (upstream's own eos mask, as it does
   below ``min_len``); at that many it still runs upstream's sampling on that step's logits (a real
   utterance samples eos there, so that step's LM forward and sampling are paid) and returns eos,
   which ends upstream's loop. Upstream caps the length at 20 x the text tokens; ``--tokens`` must fit.
4. ``stream=True`` the same way: the time to the first yielded chunk is the "first chunk" latency
   (measured, not computed). For the 300M model upstream's first hop is ``token_min_hop_len`` = 100
   tokens + ``token_overlap_len`` = 20, so the first chunk is 120 tokens through flow and HiFT
   (``finalize=False``: the last 34 mel frames are held back for the cross-fade); ``tts`` polls the
   token list every 0.1 s, and the LM thread keeps decoding while flow and HiFT run, on the same
   cores, all as upstream does. For comparison, also reported: the sequential figure = the LM time to
   120 tokens (non-stream run) + ``token2wav(first 120 tokens, finalize=False)`` run alone.

Per-stage times come from wrappers on the instance's ``llm_job``, ``flow.inference`` and
``hift.inference`` (two ``perf_counter`` calls each) and the token times from the sampling wrapper;
end to end is the wall time of draining ``model.tts``. RTF = wall / audio seconds.

Stubbed (imported at module level by upstream, never run on this path; nothing installed for them):
``cosyvoice.utils.file_utils`` (imports torchaudio for the front end's audio loading; ``llm.py`` takes
only ``logging`` from it, ``model.py`` only names its TensorRT/vLLM exporters), ``cosyvoice.utils.onnx``
(the ONNX speech tokenizer and speaker embedder of online feature extraction), ``whisper.tokenizer``
(the yaml's ``get_tokenizer`` is a ``!name:`` tag, which hyperpyyaml resolves by import; it is the front
end's text tokenizer), ``conformer`` (Matcha's ``ConformerWrapper`` subclasses its block; this decoder
never builds it) and ``matcha.utils.pylogger`` (imports lightning). Everything else is upstream's real
module, including ``cosyvoice.utils.class_utils`` and ``cosyvoice.cli.model``, and the real
``transformers`` (``llm.py`` imports ``Qwen2ForCausalLM``, unused by ``TransformerLM``).
Extra packages, venv only (not project dependencies): ``hyperpyyaml`` (``pip install hyperpyyaml``),
``diffusers==0.29.0`` and ``einops`` (Matcha's transformer block and the decoder's rearranges).
Upstream's ``torch.cuda.amp.autocast(False)`` FutureWarning is silenced.

Usage (from the repository root)::

    .venv/bin/cosycompile init-model builtin:cv1-random-300m --out /tmp/cv1-300m
    .venv/bin/python bench/upstream_cv1.py --model /tmp/cv1-300m [--tokens 250] [--text-tokens 30]
        [--runs 3] [--warmup 1] [--threads 2] [--no-stream] [--speaker spk2info|random]

Writes artifacts/bench/upstream_cv1.json (``--out``). Takes minutes: the 300M LM decodes one token at
a time on ``--threads`` threads, and each timed run is done once without and once with streaming.

Noise: eager PyTorch's OpenMP threads spin at every barrier, so on cores shared with other busy
processes each small op can wait a time slice and runs get several times slower, unevenly
(docs/bench-log/2026-11-28-idle-spinning.md). The JSON keeps the load average before and after, each
run's ``cpu_per_wall`` (CPU seconds of the process per wall second: near ``--threads`` when it had the
cores) and the OpenMP environment; ``OMP_WAIT_POLICY=PASSIVE`` in front of the command trades some
speed on a quiet machine for robustness on a busy one. Upstream's stream mode runs the LM thread and
flow/HiFT in one process at once, so its threads contend with each other even on a quiet machine.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from upstream_source import source_tree

REPO = Path(__file__).resolve().parents[1]
COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"
MATCHA_COMMIT = "dd9105b34bf2be2230f4aa1e4769fb586a3c824e"
UPSTREAM_MIRROR = Path("/work/.mirror/FunAudioLLM+CosyVoice/repo")
MATCHA_MIRROR = Path("/work/.mirror/shivammehta25+Matcha-TTS/repo")
MATCHA_FOLDERS = ["matcha/__init__.py", "matcha/models/__init__.py", "matcha/models/components"]


# -- upstream on sys.path -------------------------------------------------------------------------
def module(name: str, **attrs: object) -> types.ModuleType:
    """Register a stand-in module ``name`` holding ``attrs`` (and hang it on its parent, if registered)."""
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    # A spec, so that importlib.util.find_spec (which diffusers and transformers call) does not raise.
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package="__path__" in attrs)
    sys.modules[name] = m
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, m)
    return m


def install_stubs() -> None:
    """Modules upstream imports at module level for the front end, TensorRT/vLLM or training, never run here."""

    def not_here(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("front end / TensorRT / vLLM code is not part of this benchmark")

    class ConformerBlock(torch.nn.Module):
        """Stands in for the ``conformer`` package's block: Matcha subclasses it, this decoder never builds it."""

    # file_utils imports torchaudio (audio I/O for the front end); of it the LM reads only ``logging``
    # and model.py only names its TensorRT/vLLM exporters. Stubbing it rather than torchaudio keeps the
    # real transformers/diffusers imports working (they probe torchaudio with find_spec).
    module("cosyvoice.utils.file_utils", logging=logging, convert_onnx_to_trt=not_here,
           export_cosyvoice2_vllm=not_here, load_wav=not_here)
    # utils.onnx: the ONNX speech tokenizer / speaker embedder of online feature extraction (off by default).
    module("cosyvoice.utils.onnx", SpeechTokenExtractor=None, EmbeddingExtractor=None, online_feature=False,
           onnx_path=None, embedding_extractor=None)
    module("whisper", __path__=[])
    module("whisper.tokenizer", get_tokenizer=not_here)
    module("conformer", ConformerBlock=ConformerBlock)
    import matcha  # noqa: F401  (the real package, so that matcha.utils hangs on it)

    module("matcha.utils", __path__=[])
    module("matcha.utils.pylogger", get_pylogger=logging.getLogger)


# -- instrumentation ------------------------------------------------------------------------------
class Timed:
    """Wraps a callable and keeps the ``perf_counter`` span of each call."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.spans: list[tuple[float, float]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.spans.append((t0, time.perf_counter()))


class ForcedLength:
    """Stands in for the LM's ``sampling_ids``: exactly ``n`` speech tokens from upstream's sampling.

    Before ``n`` tokens, upstream's ``sampling_ids`` with ``ignore_eos=True`` (eos logit at -inf, then
    the yaml's ras_sampling); at ``n``, upstream's sampling still runs on that step's scores (a real
    utterance pays for the step that samples eos) and eos is returned, which ends upstream's loop.
    Keeps the tokens and the time each was sampled.
    """

    def __init__(self, lm: torch.nn.Module, n: int) -> None:
        self.inner = lm.sampling_ids  # the bound method of upstream's class
        self.eos = int(lm.eos_token)
        self.n = n
        self.tokens: list[int] = []
        self.stamps: list[float] = []

    def reset(self) -> None:
        """Forget the previous run's tokens and times."""
        self.tokens, self.stamps = [], []

    def __call__(self, weighted_scores: torch.Tensor, decoded_tokens: list[int], sampling: int,
                 ignore_eos: bool = True) -> int:
        if len(decoded_tokens) >= self.n:
            self.inner(weighted_scores, decoded_tokens, sampling, ignore_eos=False)
            return self.eos
        top = self.inner(weighted_scores, decoded_tokens, sampling, ignore_eos=True)
        self.tokens.append(int(top))
        self.stamps.append(time.perf_counter())
        return top


class Probes:
    """The wrappers put on one ``CosyVoiceModel`` instance (instance attributes shadow the methods)."""

    def __init__(self, model: Any, n_tokens: int) -> None:
        self.llm_job = Timed(model.llm_job)
        self.flow = Timed(model.flow.inference)
        self.hift = Timed(model.hift.inference)
        self.sampling = ForcedLength(model.llm, n_tokens)
        model.llm_job = self.llm_job
        model.flow.inference = self.flow
        model.hift.inference = self.hift
        model.llm.sampling_ids = self.sampling

    def reset(self) -> None:
        """Forget the previous run's spans, tokens and times."""
        for t in (self.llm_job, self.flow, self.hift):
            t.spans = []
        self.sampling.reset()


# -- loading --------------------------------------------------------------------------------------
def load_upstream(model_dir: Path) -> Any:
    """Upstream's ``CosyVoice.__init__`` without the front end, snapshot download, JIT or TensorRT."""
    from hyperpyyaml import load_hyperpyyaml

    from cosyvoice.cli.model import CosyVoiceModel
    from cosyvoice.utils.class_utils import get_model_type

    with open(model_dir / "cosyvoice.yaml") as f:
        configs = load_hyperpyyaml(f)
    assert get_model_type(configs) == CosyVoiceModel, f"{model_dir} is not a CosyVoice-300M model dir"
    model = CosyVoiceModel(configs["llm"], configs["flow"], configs["hift"], False)
    model.load(str(model_dir / "llm.pt"), str(model_dir / "flow.pt"), str(model_dir / "hift.pt"))
    model.sample_rate = int(configs["sample_rate"])
    del configs
    return model


def model_input(model: Any, model_dir: Path, n_text: int, speaker: str, seed: int) -> tuple[dict[str, Any], str]:
    """What ``frontend_sft`` returns (text ids int32 [1, n], their length, the speaker embedding twice)."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.llm.text_embedding.num_embeddings
    text = torch.randint(0, vocab, (1, n_text), generator=g, dtype=torch.int64).to(torch.int32)
    if speaker == "spk2info":
        spk2info = torch.load(model_dir / "spk2info.pt", map_location="cpu", weights_only=True)
        name = next(iter(spk2info))
        embedding, source = spk2info[name]["embedding"].float(), f"spk2info.pt: {name}"
    else:
        embedding, source = torch.randn(1, model.llm.spk_embed_affine_layer.in_features, generator=g), "random"
    return {"text": text, "text_len": torch.tensor([n_text], dtype=torch.int32), "llm_embedding": embedding,
            "flow_embedding": embedding}, source


# -- runs -----------------------------------------------------------------------------------------
def offline_run(model: Any, probes: Probes, inputs: dict[str, Any], seed: int, hop: int) -> dict[str, Any]:
    """One ``model.tts(stream=False)``: per-stage and end-to-end ms, audio seconds."""
    from cosyvoice.utils.common import set_all_random_seed

    set_all_random_seed(seed)
    probes.reset()
    samples = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for out in model.tts(**inputs, stream=False):
        samples += out["tts_speech"].shape[1]
    c1, t1 = time.process_time(), time.perf_counter()
    (l0, l1), = probes.llm_job.spans
    (f0, f1), = probes.flow.spans
    (h0, h1), = probes.hift.spans
    st = probes.sampling.stamps
    audio_s = samples / model.sample_rate
    return {"e2e_ms": 1e3 * (t1 - t0), "llm_ms": 1e3 * (l1 - l0), "flow_ms": 1e3 * (f1 - f0), "hift_ms": 1e3 * (h1 - h0),
            "other_ms": 1e3 * ((t1 - t0) - (l1 - l0) - (f1 - f0) - (h1 - h0)),
            "llm_first_token_ms": 1e3 * (st[0] - l0),
            "llm_decode_ms_per_token": 1e3 * (st[-1] - st[0]) / max(1, len(st) - 1),
            f"llm_to_{hop}_tokens_ms": 1e3 * (st[min(hop, len(st)) - 1] - l0),
            "audio_s": audio_s, "rtf": (t1 - t0) / audio_s, "tokens": len(st),
            # CPU seconds of all our threads per wall second: about --threads when they had the cores to
            # themselves, less when the shared machine's other work took them (the run is then slow).
            "cpu_per_wall": (c1 - c0) / (t1 - t0), "_tokens": list(probes.sampling.tokens)}


def stream_run(model: Any, probes: Probes, inputs: dict[str, Any], seed: int, hop: int) -> dict[str, Any]:
    """One ``model.tts(stream=True)``: time to the first yielded chunk (and what it was made of), all chunks."""
    from cosyvoice.utils.common import set_all_random_seed

    set_all_random_seed(seed)
    probes.reset()
    chunks: list[tuple[float, int]] = []
    c0, t0 = time.process_time(), time.perf_counter()
    for out in model.tts(**inputs, stream=True):
        chunks.append((time.perf_counter(), out["tts_speech"].shape[1]))
    c1, t1 = time.process_time(), time.perf_counter()
    st = probes.sampling.stamps
    f0, f1 = probes.flow.spans[0]
    h0, h1 = probes.hift.spans[0]
    first = chunks[0][0]
    total_samples = sum(n for _, n in chunks)
    return {"first_chunk_ms": 1e3 * (first - t0), "first_chunk_audio_s": chunks[0][1] / model.sample_rate,
            f"llm_to_{hop}_tokens_ms": 1e3 * (st[min(hop, len(st)) - 1] - t0),
            # from the hop-th token to the chunk's flow start: the 0.1 s polling of tts
            "poll_wait_ms": 1e3 * (f0 - st[min(hop, len(st)) - 1]),
            "first_flow_ms": 1e3 * (f1 - f0), "first_hift_ms": 1e3 * (h1 - h0),
            "stream_total_ms": 1e3 * (t1 - t0), "chunks": len(chunks), "audio_s": total_samples / model.sample_rate,
            "cpu_per_wall": (c1 - c0) / (t1 - t0)}


def chunk_alone(model: Any, probes: Probes, tokens: list[int], embedding: torch.Tensor, seed: int) -> dict[str, float]:
    """Upstream's ``token2wav`` on the first hop's tokens with a fresh session, as ``tts(stream=True)``
    calls it for the first chunk (``finalize=False``), but with no LM thread running beside it."""
    from cosyvoice.utils.common import set_all_random_seed

    set_all_random_seed(seed)  # the same CFM start noise every run
    uid = "bench-first-chunk"
    model.hift_cache_dict[uid] = None
    model.mel_overlap_dict[uid] = torch.zeros(1, 80, 0)
    model.flow_cache_dict[uid] = torch.zeros(1, 80, 0, 2)
    probes.reset()
    t0 = time.perf_counter()
    model.token2wav(token=torch.tensor(tokens).unsqueeze(dim=0), prompt_token=torch.zeros(1, 0, dtype=torch.int32),
                    prompt_feat=torch.zeros(1, 0, 80), embedding=embedding, uuid=uid, finalize=False)
    t1 = time.perf_counter()
    for d in (model.hift_cache_dict, model.mel_overlap_dict, model.flow_cache_dict):
        d.pop(uid)
    (f0, f1), = probes.flow.spans
    (h0, h1), = probes.hift.spans
    return {"token2wav_ms": 1e3 * (t1 - t0), "flow_ms": 1e3 * (f1 - f0), "hift_ms": 1e3 * (h1 - h0)}


# -- report ---------------------------------------------------------------------------------------
def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, min and max of every numeric field over the runs."""
    keys = [k for k, v in runs[0].items() if not k.startswith("_") and isinstance(v, (int, float))]
    return {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs)} for k in keys}


def machine(threads: int) -> dict[str, Any]:
    """CPU model, logical CPUs (and those this process may use), ISA flags of note, load average."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model_name = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                      platform.processor() or "unknown")
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return {"cpu": model_name, "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "threads": threads, "torch_threads": torch.get_num_threads(),
            "isa": [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags],
            "loadavg_start": list(os.getloadavg()), "python": platform.python_version(), "platform": platform.platform(),
            # OpenMP's wait policy decides how much a busy shared machine slows eager PyTorch
            # (docs/bench-log/2026-11-28-idle-spinning.md); it must be set before torch is imported.
            "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS",
                                                   "MKL_NUM_THREADS")}}


def print_table(title: str, stats: dict[str, dict[str, float]]) -> None:
    """One block of the printed report: a row per metric, its median, min and max over the runs."""
    print(f"\n{title}")
    print(f"  {'metric':<28}{'median':>12}{'min':>12}{'max':>12}")
    for k, s in stats.items():
        fractional = k in ("rtf", "audio_s", "first_chunk_audio_s", "cpu_per_wall") or k.endswith("per_token")
        fmt = "{:>12.3f}" if fractional else "{:>12.0f}"
        print(f"  {k:<28}" + "".join(fmt.format(s[x]) for x in ("median", "min", "max")))


def command_line() -> str:
    """The command as typed from the repository root (paths under it made relative)."""
    def rel(p: str) -> str:
        """``p`` relative to the repository root if it is an existing path under it."""
        try:
            return str(Path(p).resolve().relative_to(REPO)) if Path(p).exists() else p
        except ValueError:
            return p

    exe = sys.executable if not sys.executable.startswith(str(REPO)) else str(Path(sys.executable).relative_to(REPO))
    return shlex.join([exe, rel(sys.argv[0]), *sys.argv[1:]])


def main() -> int:
    """Load upstream's model, time the offline and streaming runs, print the tables, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="CosyVoice-300M model dir (cosyvoice.yaml, llm.pt, ...)")
    ap.add_argument("--upstream", type=Path, default=UPSTREAM_MIRROR, help="CosyVoice source tree or git dir")
    ap.add_argument("--matcha", type=Path, default=MATCHA_MIRROR, help="Matcha-TTS source tree or git dir")
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("--matcha-commit", default=MATCHA_COMMIT)
    ap.add_argument("--tokens", type=int, default=250, help="speech tokens per utterance (250 = 5 s at 50 Hz)")
    ap.add_argument("--text-tokens", type=int, default=30, help="text tokens per utterance")
    ap.add_argument("--speaker", choices=["spk2info", "random"], default="spk2info")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (of each mode)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-stream", action="store_true", help="skip the streaming runs (first-chunk latency)")
    ap.add_argument("--out", type=Path, default=REPO / "artifacts" / "bench" / "upstream_cv1.json")
    args = ap.parse_args()
    # Upstream's LM stops at 20 tokens per text token (max_token_text_ratio); forcing more never ends.
    if not 1 <= args.tokens <= 20 * args.text_tokens:
        ap.error(f"--tokens must be within 1..{20 * args.text_tokens} (20 x --text-tokens, upstream's cap)")
    torch.set_num_threads(args.threads)
    host = machine(args.threads)

    # Kept for the whole run (removed at exit): upstream's modules are imported from it.
    tmp = tempfile.TemporaryDirectory(prefix="upstream_cv1-")
    tree, rev = source_tree(args.upstream.resolve(), args.commit, ["cosyvoice"], Path(tmp.name) / "cosyvoice")
    mtree, mrev = source_tree(args.matcha.resolve(), args.matcha_commit, MATCHA_FOLDERS, Path(tmp.name) / "matcha")
    sys.path[:0] = [str(tree), str(mtree)]
    install_stubs()
    # Upstream calls torch.cuda.amp.autocast(False) on every llm_job/token2wav; its deprecation
    # warning would repeat on every run.
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\.autocast.*", category=FutureWarning)
    t_load = time.perf_counter()
    model = load_upstream(args.model.resolve())
    load_s = time.perf_counter() - t_load

    hop = model.token_min_hop_len + model.token_overlap_len
    probes = Probes(model, args.tokens)
    inputs, speaker = model_input(model, args.model, args.text_tokens, args.speaker, args.seed)
    print(f"upstream CosyVoice {rev[:12]} (Matcha {mrev[:12]}), torch {torch.__version__}, {args.threads} threads, "
          f"{host['cpu']}; loaded {args.model} in {load_s:.1f} s; {args.text_tokens} text tokens -> "
          f"{args.tokens} speech tokens, speaker {speaker}", flush=True)

    for i in range(args.warmup):
        w = offline_run(model, probes, inputs, args.seed, hop)
        print(f"warm-up {i + 1}: {w['e2e_ms']:.0f} ms for {w['audio_s']:.2f} s audio", flush=True)
    offline: list[dict[str, Any]] = []
    sequential: list[dict[str, Any]] = []
    for i in range(args.runs):
        r = offline_run(model, probes, inputs, args.seed, hop)
        assert r["tokens"] == args.tokens, (r["tokens"], args.tokens)
        offline.append(r)
        msg = f"run {i + 1}: e2e {r['e2e_ms']:.0f} ms, llm {r['llm_ms']:.0f}, flow {r['flow_ms']:.0f}, " \
              f"hift {r['hift_ms']:.0f}, RTF {r['rtf']:.3f}"
        if not args.no_stream and args.tokens >= hop:
            c = chunk_alone(model, probes, r["_tokens"][:hop], inputs["flow_embedding"], args.seed)
            c["first_chunk_sequential_ms"] = r[f"llm_to_{hop}_tokens_ms"] + c["token2wav_ms"]
            sequential.append(c)
            msg += f"; first hop alone: token2wav {c['token2wav_ms']:.0f} ms"
        print(msg, flush=True)

    streamed: list[dict[str, Any]] = []
    if not args.no_stream:
        for i in range(args.warmup):
            w = stream_run(model, probes, inputs, args.seed, hop)
            print(f"stream warm-up {i + 1}: first chunk {w['first_chunk_ms']:.0f} ms", flush=True)
        for i in range(args.runs):
            s = stream_run(model, probes, inputs, args.seed, hop)
            streamed.append(s)
            print(f"stream run {i + 1}: first chunk {s['first_chunk_ms']:.0f} ms ({s['first_chunk_audio_s']:.2f} s "
                  f"audio), {s['chunks']} chunks in {s['stream_total_ms']:.0f} ms", flush=True)

    results: dict[str, Any] = {"offline": summary(offline)}
    print_table(f"offline (tts stream=False), {args.tokens} tokens, {args.runs} runs", results["offline"])
    if streamed:
        results["stream"] = summary(streamed)
        print_table(f"stream (tts stream=True): first chunk = {hop} tokens, measured", results["stream"])
    if sequential:
        results["first_chunk_sequential"] = summary(sequential)
        print_table(f"first chunk computed: LLM to {hop} tokens + token2wav of them alone", results["first_chunk_sequential"])

    host["loadavg_end"] = list(os.getloadavg())
    record = {
        "command": command_line(), "machine": host, "torch": torch.__version__,
        "upstream": {"repository": "FunAudioLLM/CosyVoice", "commit": rev, "matcha": "shivammehta25/Matcha-TTS",
                     "matcha_commit": mrev},
        "model": {"dir": str(args.model.resolve()),
                  "builtin": json.loads((args.model / "builtin.json").read_text())
                  if (args.model / "builtin.json").exists() else None},
        "settings": {"tokens": args.tokens, "text_tokens": args.text_tokens, "speaker": speaker, "runs": args.runs,
                     "warmup": args.warmup, "threads": args.threads, "seed": args.seed, "dtype": "float32",
                     "sample_rate": model.sample_rate, "first_hop_tokens": hop,
                     "stream": "measured: time to the first chunk yielded by CosyVoiceModel.tts(stream=True)"},
        "load_s": load_s, "results": results,
        "runs": {"offline": [{k: v for k, v in r.items() if not k.startswith("_")} for r in offline],
                 "stream": streamed, "first_chunk_sequential": sequential},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
