"""The torch backend: AOTInductor packages from torch.export programs, built for real on this CPU
from the tiny model, checked against the PyTorch FP32 reference by the normal build; the BF16 cast;
refusals (recipe errors, a GPU target on a machine without CUDA, a package for a newer CPU).

`make test` compiles the LLM stage alone (one package, about a minute); the whole of
recipes/cpu-torch.yaml (four packages, HiFT's the largest) and its INT8/BF16 variant are the
``extended`` tier's (`make test-extended`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import REPO, run_cli, until_outputs, write_recipe
from seed_store import seeded

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def torch_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(artifacts, recipe, bundle) of recipes/cpu-torch.yaml on builtin:tiny, run as a user runs it."""
    tmp = tmp_path_factory.mktemp("torch")
    art = tmp / "art"
    recipe = write_recipe(tmp / "torch.yaml", {
        "extends": str(REPO / "recipes" / "cpu-torch.yaml"), "name": "torch-test",
        "validation": {"max_items": 2, "sampling": {"mode": "greedy", "seed": 0, "max_tokens": 120},
                       "speed": {"runs": 1, "throughput": []}},
    })
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q", timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Warning" not in res.stderr, res.stderr[-3000:]  # PyTorch's notes on its own internals stay out
    bundle = Path(next(ln for ln in res.stdout.splitlines() if ln.startswith("bundle: ")).split(": ", 1)[1])
    return art, recipe, bundle


@pytest.fixture(scope="module")
def llm_build(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> tuple[Path, dict[str, Path]]:
    """(artifacts, ``--until check`` outputs) of recipes/cpu-torch.yaml's LLM stage alone on builtin:tiny,
    over the session's seed (its model and reference are cached there)."""
    tmp = tmp_path_factory.mktemp("torch-llm")
    art = seeded(seed, tmp / "art")
    recipe = write_recipe(tmp / "torch-llm.yaml", {
        "extends": str(REPO / "recipes" / "cpu-torch.yaml"), "name": "torch-llm",
        "stages": {"flow": {"enabled": False}, "hift": {"enabled": False}},
        "validation": {"max_items": 1, "speed": {"runs": 1, "throughput": []}},
    })
    out: dict[str, Path] = {}
    for until in ("engine", "check"):  # `--until` names the outputs of the steps it stops at
        res = run_cli("build", str(recipe), "--artifacts", str(art), "--until", until, "-q", timeout=1200)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "Warning" not in res.stderr, res.stderr[-3000:]  # PyTorch's notes on its own internals stay out
        out.update(until_outputs(res.stdout))
    return art, out


def test_the_llm_step_compiles_and_matches_the_reference(llm_build: tuple[Path, dict[str, Path]]) -> None:
    _, out = llm_build
    metrics = json.loads((out["llm.check"] / "check.json").read_text())["metrics"]
    # An FP32 package agrees with eager PyTorch to float32 rounding (the same network, other kernels).
    assert metrics["max_abs_logit_error"] < 1e-4 and metrics["greedy_identical_ratio"] == 1.0, metrics
    engine = out["llm.engine"]
    passport = json.loads((engine / "engine.json").read_text())
    assert passport["backend"] == "torch" and passport["device"] == "cpu" and passport["precision"] == "fp32"
    assert passport["cpu_capability"] and passport["inductor"]["freezing"] is False  # the option's default
    graphs = json.loads((engine / "graphs.json").read_text())["graphs"]
    assert set(graphs) == {"llm_step"}  # a CPU target carries the static-cache step only when asked
    assert graphs["llm_step"]["format"] == "aoti" and (engine / graphs["llm_step"]["file"]).suffix == ".pt2"
    assert not list(engine.rglob("*.onnx"))


def test_an_int8_llm_on_the_projects_operator_carries_it_in_its_engine(tmp_path: Path, seed: Path) -> None:
    """``kernel: cosycompile`` with ``static_cache`` (as recipes/cpu-torch-int8.yaml): the quantize step
    compiles the operator library into its output, the engine dir links it beside both packages and
    names it in the passport, the build's check passes, and a copy of the engine dir alone runs in a
    fresh process (as on another server of the same CPU class), where the static-cache decoder, its
    cache grown past a block, gives the growing-cache step's logits."""
    import subprocess
    import sys

    from cosycompile.runtime.torch_ops import library_in

    recipe = write_recipe(tmp_path / "llm-own-op.yaml", {
        "extends": str(REPO / "recipes" / "cpu-torch.yaml"), "name": "torch-llm-own-op",
        "stages": {"flow": {"enabled": False}, "hift": {"enabled": False},
                   "llm": {"quantize": {"format": "int8", "kernel": "cosycompile"},
                           "engine": {"backend": "torch", "options": {"static_cache": True}}}},
        "validation": {"max_items": 1, "speed": {"runs": 1, "throughput": []}},
    })
    art, out = seeded(seed, tmp_path / "art"), {}
    for until in ("engine", "check"):  # `--until` names the outputs of the steps it stops at
        res = run_cli("build", str(recipe), "--artifacts", str(art), "--until", until, "-q", timeout=1200)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        out.update(until_outputs(res.stdout))
    llm = json.loads((out["llm.check"] / "check.json").read_text())["metrics"]
    assert llm["logit_cosine"] >= 0.99 and 0 < llm["max_abs_logit_error"], llm
    engine = out["llm.engine"]
    graphs = json.loads((engine / "graphs.json").read_text())["graphs"]
    assert set(graphs) == {"llm_step", "llm_step_static"}
    from cosycompile.backends.torch.build import weights_file

    assert all(weights_file(engine / g["file"]).is_file() for g in graphs.values()), graphs  # moved with the dir
    library = library_in(engine)
    assert library is not None and json.loads((engine / "engine.json").read_text())["torch_ops"] == library.name
    moved = tmp_path / "elsewhere" / "engine"
    shutil.copytree(engine, moved)
    script = ("import sys, numpy as np; from pathlib import Path; from cosycompile.backends.torch.build import load; "
              "rs = load(Path(sys.argv[1]), 2); r = rs['llm_step']; d = rs['llm_step_static'].decoder(); "
              "rng = np.random.default_rng(0); H = int(sys.argv[2]); "
              "o = r.run({'inputs_embeds': rng.standard_normal((1, 3, H), np.float32), "
              "'past_key_values': np.zeros((int(sys.argv[3]), 2, 1, int(sys.argv[4]), 0, int(sys.argv[5])), np.float32)}); "
              "cache = o['present_key_values']; d.start(cache, 40); worst = scale = 0.0\n"
              "for _ in range(40):\n"
              "    e = rng.standard_normal((1, 1, H), np.float32); o = r.run({'inputs_embeds': e, 'past_key_values': cache})\n"
              "    cache = o['present_key_values']; worst = max(worst, float(np.abs(d.step(e) - o['logits']).max()))\n"
              "    scale = max(scale, float(np.abs(o['logits']).max()))\n"
              "print(d.capacity, worst / scale)")
    info = json.loads((engine / "graphs.json").read_text())["info"]
    dims = [str(info[k]) for k in ("hidden_size", "num_layers", "kv_heads", "head_dim")]
    ran = subprocess.run([sys.executable, "-c", script, str(moved), *dims], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    capacity, relative = ran.stdout.split()[-2:]
    # 43 positions: the decoder's cache has grown by a block; INT8 rounding differs only by summation order.
    assert int(capacity) == 64 and float(relative) < 1e-3, ran.stdout


@pytest.mark.extended
def test_int8_attention_flow_compiles_and_holds_quality(tmp_path: Path, seed: Path) -> None:
    """recipes/cpu-torch-int8's flow (INT8 linears and INT8 attention products, the loop over heads
    unrolled, BF16 convolutions) compiled for real on the tiny model: the estimator package holds the quantized program
    and the flow check against the PyTorch FP32 reference passes, its error above FP32 rounding."""
    recipe = write_recipe(tmp_path / "flow-int8.yaml", {
        "extends": str(REPO / "recipes" / "cpu-torch-int8.yaml"), "name": "torch-flow-int8",
        "stages": {"llm": {"enabled": False}, "hift": {"enabled": False}},
        "validation": {"max_items": 1, "speed": {"runs": 1, "throughput": []}},
    })
    art = seeded(seed, tmp_path / "art")
    out: dict[str, Path] = {}
    for until in ("quantize", "engine", "check"):  # `--until` names the outputs of the steps it stops at
        res = run_cli("build", str(recipe), "--artifacts", str(art), "--until", until, "-q", timeout=1200)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        out.update(until_outputs(res.stdout))
    quantized = json.loads((out["flow.quantize"] / "graphs.json").read_text())
    passport = json.loads((out["flow.engine"] / "engine.json").read_text())
    assert passport["backend"] == "torch" and passport["precision"] == "int8", passport
    metrics = json.loads((out["flow.check"] / "check.json").read_text())["metrics"]
    assert 1e-4 < metrics["estimator_max_abs_error"] and metrics["cfm_mel_snr_db_min"] > 30, metrics
    assert quantized["graphs"]["flow_estimator"]["precision"] == "int8"
    meta = json.loads((out["flow.quantize"].parent / "entry.json").read_text())["meta"]["quantized"]["flow_estimator"]
    assert meta["attention"] == {"int8_attention": 3, "kept_fp32": {}}, meta  # the tiny estimator's three blocks
    assert meta["bf16_convolutions"] > 0, meta


@pytest.mark.extended
def test_every_stage_compiles_and_matches_the_reference(torch_build: tuple[Path, Path, Path]) -> None:
    _, _, bundle = torch_build
    report = json.loads((bundle / "report.json").read_text())
    assert report["gate"]["passed"], report["gate"]["findings"]
    checks = report["checks"]
    # FP32 packages agree with eager PyTorch to float32 rounding (the same network, other kernels).
    assert checks["llm"]["metrics"]["max_abs_logit_error"] < 1e-4
    assert checks["llm"]["metrics"]["greedy_identical_ratio"] == 1.0
    assert checks["flow"]["metrics"]["estimator_max_abs_error"] < 1e-4
    assert checks["hift"]["metrics"]["waveform_snr_db_min"] > 40
    assert checks["pipeline"]["metrics"]["tokens_identical_ratio"] == 1.0
    for stage in ("llm", "flow", "hift"):
        passport = json.loads((bundle / "engines" / stage / "engine.json").read_text())
        assert passport["backend"] == "torch" and passport["device"] == "cpu" and passport["precision"] == "fp32"
        # cpu-torch.yaml freezes the flow alone.
        assert passport["cpu_capability"] and passport["inductor"]["freezing"] is (stage == "flow")
        graphs = json.loads((bundle / "engines" / stage / "graphs.json").read_text())["graphs"]
        assert {g["format"] for g in graphs.values()} == {"aoti"}
        if stage == "llm":  # the static-cache step is for GPU targets only
            assert set(graphs) == {"llm_step"}
        assert all((bundle / "engines" / stage / g["file"]).suffix == ".pt2" for g in graphs.values())
    assert not list((bundle / "engines").rglob("*.onnx"))  # no ONNX in the engines


@pytest.mark.extended
def test_gpu_llm_export_decodes_over_the_static_cache(torch_build: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """A GPU target's LLM programs carry the static-cache step (a CPU target's do not: the CPU engines
    above hold llm_step only); compiled for this CPU, the runtime decodes through it with the logits
    and greedy tokens of the growing-cache step (the FP32 build's package: the same built-in weights,
    so only the static step is compiled here). Only the CUDA graph is left to ``make test-gpu``."""
    import numpy as np

    from cosycompile.backends.torch import Options
    from cosycompile.backends.torch.build import AotiRunner, StaticStepRunner, build
    from cosycompile.core.targets import TARGETS
    from cosycompile.runtime.graphs_dir import read_graphs_dir
    from cosycompile.runtime.loading import load_assets
    from cosycompile.families.cosyvoice2.runtimes import LLMRuntime
    from cosycompile.runtime.pipeline import Prompt, Sampling

    recipe = write_recipe(tmp_path / "h100.yaml", {
        "name": "h100-torch-llm", "target": "h100",
        "stages": {"llm": {"engine": {"backend": "torch"}}, "flow": {"enabled": False}, "hift": {"enabled": False}},
    })
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "export", "-q", timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    programs = until_outputs(res.stdout)["llm.export"]
    assert set(read_graphs_dir(programs).graphs) == {"llm_step", "llm_step_static"}
    static_program = tmp_path / "static-program"
    shutil.copytree(programs, static_program)
    listing = json.loads((static_program / "graphs.json").read_text())
    listing["graphs"] = {"llm_step_static": listing["graphs"]["llm_step_static"]}
    (static_program / "graphs.json").write_text(json.dumps(listing))
    engine = tmp_path / "engine"
    engine.mkdir()
    build(static_program, Options(), TARGETS["cpu"], engine)
    for f in ("llm_step.pt2", "llm_step.weights.pt"):  # a package and the weights file it names
        shutil.copy2(torch_build[2] / "engines" / "llm" / f, engine / f)
    gd = read_graphs_dir(engine)
    growing_graph = read_graphs_dir(torch_build[2] / "engines" / "llm").graphs["llm_step"]
    assert growing_graph["spec"] == read_graphs_dir(programs).graphs["llm_step"]["spec"]  # the same step, other target
    graphs = {"llm_step": growing_graph, **gd.graphs}
    runners = {n: (StaticStepRunner if n == "llm_step_static" else AotiRunner)(
                   engine / g["file"], g["inputs"], g["outputs"], "cpu", g["spec"]["dims"])
               for n, g in graphs.items()}
    rt = LLMRuntime.from_runners(runners, load_assets(engine), gd.info)
    assert rt.kept is runners["llm_step_static"] and rt.kept.dims["slots"]["max"] == 4096
    assert not hasattr(runners["llm_step"], "decoder")  # a growing-cache program keeps no cache of its own
    text = np.arange(5, 17)
    _, cache = rt.step(rt.prefix(text, Prompt.empty()), rt.empty_cache())
    static_next = rt.decoding(cache, 16)
    static_only, rt.kept = rt.kept, None
    growing_next = rt.decoding(cache, 16)
    for tok in np.random.default_rng(0).integers(0, rt.speech_token_size, 16):
        emb = rt.speech_embedding[tok][None, None].astype(np.float32)
        a, b = static_next(emb), growing_next(emb)
        assert a.shape == b.shape == (1, 1, rt.speech_token_size + 3)
        assert float(np.abs(a - b).max()) < 1e-4
    greedy = Sampling(mode="greedy", seed=0, max_tokens=40)
    growing = rt.generate(text, Prompt.empty(), greedy)
    rt.kept = static_only
    assert len(growing) > 0 and np.array_equal(rt.generate(text, Prompt.empty(), greedy), growing)


@pytest.mark.extended
def test_second_build_is_all_cached(torch_build: tuple[Path, Path, Path]) -> None:
    art, recipe, _ = torch_build
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 0 and "ran: nothing (all cached)" in res.stdout, res.stdout + res.stderr


@pytest.mark.extended
def test_int8_llm_and_bf16_flow_compile_and_hold_quality(torch_build: tuple[Path, Path, Path]) -> None:
    """recipes/cpu-torch-int8 with the flow cast to BF16 (cpu-amx's flow) and HiFT FP32 on the tiny model: torch_dynamic's
    INT8 LLM program and torch_autocast's BF16 flow programs compile to packages that pass the stage checks
    against the PyTorch FP32 reference, timed against the FP32 packages. One build holds both quantizers'
    compiles (the flow's INT8 program is checked in tests/quantize/test_torch_dynamic.py; its package is
    built by bench/torch_backend.py)."""
    art, recipe, bundle = torch_build
    mixed = write_recipe(recipe.parent / "int8-bf16.yaml", {
        "extends": str(REPO / "recipes" / "cpu-torch-int8.yaml"), "name": "torch-int8-bf16",
        "stages": {"flow": {"quantize": {"format": "bf16"}}, "hift": {"quantize": {"format": "fp32"}}},
        "validation": {"max_items": 2, "sampling": {"mode": "greedy", "seed": 0, "max_tokens": 120},
                       "speed": {"runs": 1, "throughput": []}},
    }, base=False)
    res = run_cli("build", str(mixed), "--artifacts", str(art), "--until", "check", "-q", timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran = res.stdout.split("ran:", 1)[1].split("\n", 1)[0]
    assert "llm.quantize" in ran and "flow.quantize" in ran and "calibrate" not in ran
    # The FP32 flow packages to time against, and the HiFT, came from the FP32 build's cache; the LLM's
    # FP32 engine is new, since this recipe's LLM carries the static-cache step and cpu-torch's does not.
    assert "flow.engine.fp32" not in ran and "hift." not in ran and "llm.engine.fp32" in ran
    out = until_outputs(res.stdout)
    llm = json.loads((out["llm.check"] / "check.json").read_text())["metrics"]
    flow = json.loads((out["flow.check"] / "check.json").read_text())["metrics"]
    assert llm["logit_cosine"] >= 0.99 and 0 < llm["max_abs_logit_error"], llm
    # BF16: the estimator's error grows from FP32 rounding to BF16's; the mel after the 10-step CFM stays close.
    fp32 = json.loads((bundle / "report.json").read_text())["checks"]["flow"]["metrics"]
    assert flow["estimator_max_abs_error"] > 100 * fp32["estimator_max_abs_error"], (flow, fp32)
    assert flow["cfm_mel_snr_db_min"] > 20, flow
    assert llm["speedup_vs_fp32"] > 0 and flow["speedup_vs_fp32"] > 0
    precisions = sorted(json.loads(p.read_text()).get("precision") for p in (art / "cache" / "objects").rglob("engine.json")
                        if json.loads(p.read_text()).get("precision") in ("int8", "bf16"))
    assert precisions == ["bf16", "int8"]


@pytest.mark.parametrize(("stage", "quantize", "backend", "says"), [
    ("flow", {"format": "int4"}, "torch", "backend 'torch' compiles fp32, bf16, fp16, int8, fp8 programs, not 'int4'"),
    ("flow", {"format": "int8", "quantizer": "ort_dynamic"}, "torch",
     "quantizer 'ort_dynamic' writes ops only onnxruntime runs; backend 'torch' cannot run them"),
    ("hift", {"format": "fp16", "quantizer": "modelopt_autocast"}, "torch",
     "backend 'torch' compiles torch programs, which quantizer 'modelopt_autocast' does not write; use torch_autocast"),
    ("flow", {"format": "bf16", "quantizer": "torch_autocast"}, "onnxruntime",
     "quantizer 'torch_autocast' writes ops only torch runs; backend 'onnxruntime' cannot run them"),
])
def test_recipe_errors(tmp_path: Path, stage: str, quantize: dict, backend: str, says: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", {
        "name": "bad", "stages": {stage: {"engine": {"backend": backend}, "quantize": quantize}}})
    res = run_cli("plan", str(recipe), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_static_cache_is_an_llm_option(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", {
        "extends": str(REPO / "recipes" / "cpu-torch.yaml"), "name": "bad",
        "stages": {"flow": {"engine": {"backend": "torch", "options": {"static_cache": True}}}}})
    res = run_cli("plan", str(recipe), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "stages.flow.engine.options.static_cache': only the llm stage decodes over a KV cache" in res.stderr


def test_gpu_target_without_cuda_is_left_for_a_gpu_machine(tmp_path: Path, seed: Path) -> None:
    """On a machine whose PyTorch sees no CUDA device, a CUDA package is a split build: the program
    is exported here, the engine is left (exit 3) with the reason. (The model comes from the seed.)"""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the engine would be built")
    art = seeded(seed, tmp_path / "art")
    recipe = write_recipe(tmp_path / "gpu.yaml", {
        "name": "torch-h100", "target": "h100",
        "stages": {"llm": {"enabled": False}, "flow": {"enabled": False}, "hift": {"engine": {"backend": "torch"}}},
    })
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "ran: hift.export" in res.stdout
    assert "hift.engine: cannot run on this machine: backend 'torch': this PyTorch" in res.stdout
    assert "sees no CUDA device" in res.stdout


def test_package_for_a_newer_cpu_is_refused(llm_build: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    from cosycompile.errors import BackendUnavailable
    from cosycompile.runtime.loading import stage_runtime

    engine = shutil.copytree(llm_build[1]["llm.engine"], tmp_path / "llm")
    passport = json.loads((engine / "engine.json").read_text())
    passport["cpu_capability"] = "AVX1024"  # a vector ISA this CPU does not have
    (engine / "engine.json").write_text(json.dumps(passport))
    with pytest.raises(BackendUnavailable, match=r"compiled for AVX1024 CPUs and this CPU is \w+; rebuild"):
        stage_runtime("llm", engine, 1)


def test_program_export_holds_past_the_traced_size(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The HiFT program runs at 4x its block size and equals eager PyTorch; the flow encoder's tokens
    dim, which the exporter cannot prove from 1, is exported from 2 and the spec says so. Each graph
    is exported once: the modules name the dims that hold only from 2, so no attempt fails first."""
    import torch

    exports: list[str] = []
    real_export = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda mod, *a, **k: exports.append(type(mod).__name__)
                        or real_export(mod, *a, **k))

    from cosycompile.families.cosyvoice2.loader import load_models
    from cosycompile.stages import get_stage
    from cosycompile.stages.common import export_program

    models = load_models(tiny_model_dir, ("hift", "flow"))
    modules, _, info = get_stage("hift").hook("modules")(models)
    spec = get_stage("hift").graph("hift")
    program, raised = export_program(modules["hift"], spec, info)
    assert raised == {"frames": 2}
    torch.manual_seed(0)
    frames = 256
    mel = torch.randn(1, info["mel_bins"], frames) - 4
    args = (mel, torch.rand(1, info["harmonics"]), torch.randn(1, frames * info["samples_per_frame"], info["harmonics"]))
    with torch.no_grad():
        want, got = modules["hift"](*args), program.module()(*args)
    for w, g in zip(want, got):
        assert torch.allclose(w, g, atol=1e-4), float((w - g).abs().max())
    fmods, _, finfo = get_stage("flow").hook("modules")(models)
    _, raised = export_program(fmods["flow_encoder"], get_stage("flow").graph("flow_encoder"), finfo)
    assert raised == {"tokens": 2}
    assert exports == ["HiFTNetStep", "FlowEncoderStep"]


@pytest.mark.gpu
def test_cuda_package_matches_the_cpu_reference(tmp_path: Path) -> None:
    """On a CUDA machine (``make test-gpu``): the HiFT and flow packages for this GPU pass their checks."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from cosycompile.core.targets import TARGETS

    sm = tuple(torch.cuda.get_device_capability())
    target = next((t.name for t in TARGETS.values() if t.sm == sm and t.kind == "gpu"), None)
    if target is None:
        pytest.skip(f"no target in cosycompile's table for sm{sm[0]}{sm[1]}")
    recipe = write_recipe(tmp_path / "cuda.yaml", {
        "name": "torch-cuda", "target": target,
        "stages": {"llm": {"enabled": False}, "flow": {"engine": {"backend": "torch"}},
                   "hift": {"engine": {"backend": "torch"}}},
    })
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "check", "-q", timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = until_outputs(res.stdout)
    flow = json.loads((out["flow.check"] / "check.json").read_text())["metrics"]
    hift = json.loads((out["hift.check"] / "check.json").read_text())["metrics"]
    assert flow["estimator_max_abs_error"] < 1e-2 and flow["cfm_mel_snr_db_min"] > 30
    assert hift["waveform_snr_db_min"] > 30


def test_format_picks_the_quantizer_the_backend_runs(tmp_path: Path) -> None:
    """fp16 without a quantizer named: torch_autocast for the torch backend, ModelOpt's ONNX autocast
    for TensorRT (the same format, two kinds of graphs)."""
    from cosycompile.recipe.schema import load_recipe

    torch_fp16 = write_recipe(tmp_path / "t.yaml", {
        "name": "t", "stages": {"hift": {"engine": {"backend": "torch"}, "quantize": {"format": "fp16"}}}})
    assert load_recipe(torch_fp16).typed("hift")["quantizer"].name == "torch_autocast"
    trt_fp16 = write_recipe(tmp_path / "r.yaml", {
        "extends": str(REPO / "recipes" / "rtx4090-fp16.yaml"), "name": "r"}, base=False)
    assert load_recipe(trt_fp16).typed("flow")["quantizer"].name == "modelopt_autocast"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_cuda_quantized_linears_pass_their_checks(tmp_path: Path, fmt: str) -> None:
    """On a CUDA machine (``make test-gpu``): torch_dynamic's INT8 (rows padded for cuBLASLt) and FP8
    programs compile for this GPU and hold the LLM's logits and the flow's mel."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from cosycompile.core.targets import targets_with_sm

    sm = tuple(torch.cuda.get_device_capability())
    if fmt == "fp8" and sm < (8, 9):
        pytest.skip(f"FP8 GEMMs need sm89+, this GPU is sm{sm[0]}{sm[1]}")
    target = next((t.name for t in sorted(targets_with_sm(sm), key=lambda t: t.rtx_class)), None)
    if target is None:
        pytest.skip(f"no target in cosycompile's table for sm{sm[0]}{sm[1]}")
    recipe = write_recipe(tmp_path / "cuda.yaml", {
        "name": f"torch-cuda-{fmt}", "target": target,
        "stages": {"hift": {"enabled": False},
                   "llm": {"engine": {"backend": "torch"}, "quantize": {"format": fmt}},
                   "flow": {"engine": {"backend": "torch"}, "quantize": {"format": fmt}}},
    })
    res = run_cli("build", str(recipe), "--artifacts", str(tmp_path / "art"), "--until", "check", "-q", timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = until_outputs(res.stdout)
    llm = json.loads((out["llm.check"] / "check.json").read_text())["metrics"]
    flow = json.loads((out["flow.check"] / "check.json").read_text())["metrics"]
    assert llm["logit_cosine"] >= 0.99 and flow["cfm_mel_snr_db_min"] >= 30, (llm, flow)


def test_builds_leave_no_weights_in_inductors_cache(llm_build: tuple[Path, dict[str, Path]]) -> None:
    """Each package's shared object (weights linked in) is removed from Inductor's cache once the package
    holds it; the kernel caches stay."""
    art, _ = llm_build
    work = art / "cache" / "shared" / "inductor"
    assert work.is_dir() and any(work.iterdir())
    assert not list(work.glob("*/*.wrapper.so"))


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 700 MB filesystem (tmpfs), where this machine lets the tests mount one."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_build_the_disk_cannot_hold_is_refused_before_it_starts(small_disk: Path, tmp_path: Path) -> None:
    """A full disk inside the packager aborts the process from C++; the build checks the space first."""
    from cosycompile.backends.torch.build import SPACE_MARGIN, check_space
    from cosycompile.errors import UserError

    out, work = small_disk / "engine", small_disk / "inductor"
    out.mkdir()
    check_space(10 << 20, out, work, "llm_step")  # 2 x (10 MB + margin) fits in 700 MB
    with pytest.raises(UserError, match=r"disk.*GB free, and compiling 'llm_step' with AOTInductor needs about"):
        check_space(200 << 20, out, work, "llm_step")  # 2 x (200 MB + margin) does not
    # On separate disks each holds one copy: the same program fits.
    check_space(200 << 20, out, tmp_path / "inductor", "llm_step")
    assert 2 * ((200 << 20) + SPACE_MARGIN) > 700 << 20 > (200 << 20) + SPACE_MARGIN


def test_only_the_packages_own_build_dir_is_removed(tmp_path: Path) -> None:
    """Found by the wrapper named inside the package: a build running beside this one keeps its dir."""
    import zipfile

    from cosycompile.backends.torch.build import remove_build_dir

    work = tmp_path / "inductor"
    for d, name in (("cmine", "cabc.wrapper.so"), ("cother", "cdef.wrapper.so")):
        (work / d).mkdir(parents=True)
        (work / d / name).write_bytes(b"x" * 64)
    package = tmp_path / "llm_step.pt2"
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("llm_step/data/aotinductor/model/cabc.wrapper.so", b"x" * 64)
    remove_build_dir(package, work)
    assert not (work / "cmine").exists() and (work / "cother" / "cdef.wrapper.so").exists()



def _resident_kb(names: set[str]) -> int:
    """Resident KiB of this process's file mappings with these base names."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            inside = len(head) >= 6 and Path(head[5]).name in names
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_a_loaded_package_keeps_one_resident_copy_of_its_weights(tmp_path: Path) -> None:
    """A package with its weights linked in (a frozen one) is copied out of its .so on load; the runner
    pages the mapped copy out, and gives the same outputs as the same package loaded with its mapping
    left resident."""
    import numpy as np
    import torch

    from cosycompile.backends.torch.build import AotiRunner, package_libraries

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 1024)).eval()
    x = torch.randn(4, 1024)
    path = tmp_path / "mlp.pt2"
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(torch.export.export(net, (x,)), package_path=str(path))
    names = package_libraries(path)
    assert names and all(n.endswith(".wrapper.so") for n in names)

    runner = AotiRunner(path, ["x"], ["y"], "cpu")
    paged = _resident_kb(names)
    plain = torch._inductor.aoti_load_package(str(path))  # no page-out: its mapping keeps what loading read
    unpaged = _resident_kb(names) - paged
    assert unpaged > 4 * max(paged, 1024), (paged, unpaged)  # 16 MB of weights read through the mapping
    ours = runner.run({"x": x.numpy()})["y"]
    with torch.inference_mode():
        assert np.array_equal(ours, plain(x).numpy())


def test_an_unfrozen_package_reads_its_weights_from_a_file_beside_it(llm_build: tuple[Path, dict[str, Path]],
                                                                     tmp_path: Path) -> None:
    """An unfrozen CPU package carries no weights in its .so: they are saved once beside it, in the file
    the package names, and the runner copies them in. Without that file, or with one that lacks a
    weight, the runner refuses with one line rather than run unset constants."""
    import numpy as np
    import torch

    from cosycompile.backends.torch.build import AotiRunner, weights_file
    from cosycompile.errors import BackendUnavailable
    from cosycompile.runtime.graphs_dir import read_graphs_dir

    gd = read_graphs_dir(llm_build[1]["llm.engine"])
    g, path = gd.graphs["llm_step"], gd.graph_path("llm_step")
    weights = weights_file(path)
    assert weights is not None and weights.parent == path.parent
    saved = torch.load(weights, weights_only=True)
    assert sum(t.numel() * t.element_size() for t in saved.values()) > 2 * path.stat().st_size, path.stat()
    runner = AotiRunner(path, g["inputs"], g["outputs"], "cpu")
    assert _resident_kb({weights.name}) == 0  # copied in, its mapping closed
    sizes = {"batch": 1, "seq": 3, "past": 0}
    rng = np.random.default_rng(0)
    feeds = {i["name"]: rng.standard_normal([d if isinstance(d, int) else sizes[d] for d in i["shape"]]).astype(np.float32)
             for i in g["spec"]["inputs"]}
    assert all(np.isfinite(v).all() for v in runner.run(feeds).values())

    alone = tmp_path / path.name
    shutil.copy2(path, alone)
    with pytest.raises(BackendUnavailable, match="missing; the package beside it keeps its weights there"):
        AotiRunner(alone, g["inputs"], g["outputs"], "cpu")
    torch.save(dict(list(saved.items())[1:]), tmp_path / weights.name)
    with pytest.raises(BackendUnavailable, match="lacks weights its package reads"):
        AotiRunner(alone, g["inputs"], g["outputs"], "cpu")


def test_a_dropped_package_gives_back_the_weights_it_read_from_beside_it(tmp_path: Path) -> None:
    """A package whose weights came from the file beside it computes what the module does, and once it is
    dropped the process holds its weights no more: the copy is the package's own, which it frees."""
    import torch

    from cosycompile.backends.torch.build import AotiRunner, _constants_config, save_weights
    from cosycompile.core.memory import release_free_memory

    def anon_kb() -> int:
        return next(int(ln.split()[1]) for ln in Path("/proc/self/status").read_text().splitlines()
                    if ln.startswith("RssAnon:"))

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1024, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 1024)).eval()
    x = torch.randn(4, 1024)
    program = torch.export.export(net, (x,))
    path = tmp_path / "mlp.pt2"
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=_constants_config(True))
    save_weights(program, path, tmp_path / "mlp.weights.pt")
    weights_mb = (tmp_path / "mlp.weights.pt").stat().st_size / 1e6
    assert weights_mb > 60 and path.stat().st_size < 0.1 * weights_mb * 1e6
    with torch.inference_mode():
        expected = net(x).numpy()
    release_free_memory()
    before = anon_kb()
    runner = AotiRunner(path, ["x"], ["y"], "cpu")
    assert abs(runner.run({"x": x.numpy()})["y"] - expected).max() < 1e-4
    held = anon_kb() - before
    del runner
    release_free_memory()
    left = anon_kb() - before
    assert held > 0.8 * weights_mb * 1000 and left < 0.2 * held, (held, left)
