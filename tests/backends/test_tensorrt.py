"""The TensorRT backend: real TensorRT-RTX engines built on this CPU machine from the tiny model's own
exports, and fake ``tensorrt`` 10.x / 11.x modules that drive the version branches of api.py and
build.py (real TensorRT needs NVIDIA's package index and a GPU)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosycompile.errors import BackendUnavailable, RecipeError
from cosycompile.recipe.schema import load_recipe
from cosycompile.core.targets import TARGETS

from helpers import REPO, run_cli, until_outputs, write_recipe
from seed_store import seeded

HAVE_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
HAVE_FP16_QUANTIZER = importlib.util.find_spec("cosycompile.quantize.modelopt_autocast") is not None
needs_rtx = pytest.mark.skipif(not HAVE_RTX, reason="TensorRT-RTX (tensorrt_rtx, pip install 'cosycompile[rtx]') "
                                                    "is not installed")


# ------------------------------------------------------------------------------------ real engines


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> Path:
    """One artifacts dir for the real builds, so that the FP32 and INT8 builds share model and exports
    (and, from the session's seed, the CPU builds' exports and calibration)."""
    return seeded(seed, tmp_path_factory.mktemp("trt") / "art")


def _build(recipe: Path, art: Path) -> dict[str, Path]:
    res = run_cli("build", str(recipe), "--artifacts", str(art), "--until", "engine", "-q")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    return until_outputs(res.stdout)


def _assert_engine(engine_dir: Path, precisions: dict[str, str], dims: dict[str, dict[str, list[int]]] | None = None) -> dict:
    """Plans are real engines, and the passport says what built them, for what, with which profiles."""
    import tensorrt_rtx

    passport = json.loads((engine_dir / "engine.json").read_text())
    graphs = json.loads((engine_dir / "graphs.json").read_text())["graphs"]
    assert set(graphs) == set(precisions)
    for name, g in graphs.items():
        plan = engine_dir / g["file"]
        assert g["file"] == f"{name}.plan" and plan.stat().st_size > 10_000, (name, plan.stat().st_size)
        assert passport["files"][g["file"]]
    assert passport["backend"] == "tensorrt" and passport["flavour"] == "rtx"
    assert passport["backend_version"] == tensorrt_rtx.__version__
    assert passport["builder"] == f"TensorRT-RTX {tensorrt_rtx.__version__}"
    assert passport["compute_capability"] == "sm89" and passport["compute_capabilities"] == ["sm89"]
    assert passport["gpu_names"] == ["NVIDIA GeForce RTX 4090"]
    assert passport["build_gpu"] is None and passport["strongly_typed"] is True
    assert passport["precisions"] == precisions
    assert passport["timing_cache"] is None  # TensorRT-RTX ignores timing caches
    for name, spec in passport["graphs"].items():
        used = {p for t in spec["inputs"] for e in t["shape"] if isinstance(e, str) for p in e.split("*")}
        want = {d: dict(zip(("min", "opt", "max"), dims[d])) if dims and d in dims else v
                for d, v in spec["dims"].items() if d in used}  # output-only dims (LLM 'total') have no profile
        assert want
        assert passport["profile_dims"][name] == want
        for t in spec["inputs"]:
            shapes = passport["profiles"][name][t["name"]]
            assert set(shapes) == {"min", "opt", "max"}
            for point, shape in shapes.items():
                expect = [s if isinstance(s, int) else _size(s, {d: v[point] for d, v in want.items()}, graphs_info(engine_dir))
                          for s in t["shape"]]
                assert shape == expect, (name, t["name"], point)
    return passport


def graphs_info(engine_dir: Path) -> dict[str, Any]:
    return json.loads((engine_dir / "graphs.json").read_text())["info"]


def _size(entry: str, sizes: dict[str, int], info: dict[str, Any]) -> int:
    total = 1
    for part in entry.split("*"):
        total *= sizes[part] if part in sizes else int(info[part])
    return total


def _rtx4090(tmp_path: Path, name: str, stages: dict[str, Any]) -> Path:
    """recipes/rtx4090-fp16.yaml with a 2-item calibration run (the tests' time budget) and ``stages`` merged in."""
    return write_recipe(tmp_path / f"{name}.yaml", {
        "extends": str(REPO / "recipes" / "rtx4090-fp16.yaml"), "name": name,
        "calibration": {"set": str(REPO / "calib_data" / "calib"), "max_items": 2}, "stages": stages,
    }, base=False)


@pytest.mark.slow
@needs_rtx
def test_fp32_engines_for_every_stage_build_on_this_cpu_machine(art: Path, tmp_path: Path) -> None:
    fp32 = {"quantize": {"format": "fp32"}}
    out = _build(_rtx4090(tmp_path, "rtx4090-fp32-test", {"flow": fp32, "hift": fp32}), art)
    assert set(out) == {"llm.engine", "flow.engine", "hift.engine"}
    _assert_engine(out["llm.engine"], {"llm_step": "fp32"})
    flow = _assert_engine(out["flow.engine"], {"flow_encoder": "fp32", "flow_estimator": "fp32"})
    hift = _assert_engine(out["hift.engine"], {"hift": "fp32"})
    # CosyVoice's own estimator profile (4 / 500 / 3000 frames at batch 2), from the graph spec.
    assert flow["profiles"]["flow_estimator"]["x"] == {"min": [2, 80, 4], "opt": [2, 80, 500], "max": [2, 80, 3000]}
    # A product dim: HiFT's noise has frames * samples_per_frame samples.
    info = graphs_info(out["hift.engine"])
    assert hift["profiles"]["hift"]["noise"]["max"] == [1, 3000 * info["samples_per_frame"], info["harmonics"]]
    # Assets travel with the engines (linked, not re-exported).
    assert (out["flow.engine"] / "rand_noise.npy").is_file()


@pytest.mark.slow
@needs_rtx
def test_int8_qdq_flow_and_hift_build_with_profile_override(art: Path, tmp_path: Path) -> None:
    out = _build(_rtx4090(tmp_path, "rtx4090-int8-test", {
        "llm": {"enabled": False},
        "flow": {"quantize": {"format": "int8"},
                 "engine": {"backend": "tensorrt", "options": {"profiles": {"frames": [4, 64, 512]}}}},
        "hift": {"quantize": {"format": "int8"}},
    }), art)
    flow = _assert_engine(out["flow.engine"], {"flow_encoder": "fp32", "flow_estimator": "int8"},
                          dims={"frames": [4, 64, 512]})
    assert flow["profiles"]["flow_estimator"]["x"]["max"] == [2, 80, 512]
    assert flow["options"]["profiles"] == {"frames": [4, 64, 512]}
    _assert_engine(out["hift.engine"], {"hift": "int8"})


@pytest.mark.slow
@needs_rtx
@pytest.mark.skipif(not HAVE_FP16_QUANTIZER, reason="the FP16 quantizer (cosycompile.quantize.modelopt_autocast) is not "
                                                    "installed; without it quantize: {format: fp16} is a recipe error")
def test_rtx4090_fp16_recipe_builds_every_engine_on_this_cpu_machine(art: Path, tmp_path: Path) -> None:
    out = _build(_rtx4090(tmp_path, "rtx4090-fp16", {}), art)
    _assert_engine(out["llm.engine"], {"llm_step": "fp32"})
    _assert_engine(out["flow.engine"], {"flow_encoder": "fp32", "flow_estimator": "fp16"})
    _assert_engine(out["hift.engine"], {"hift": "fp16"})


# ------------------------------------------------------------------------------------ recipe rules

def _recipe(tmp_path: Path, target: str, options: dict[str, Any]) -> Path:
    return write_recipe(tmp_path / "r.yaml", {
        "name": "trt", "target": target,
        "stages": {"llm": {"enabled": False}, "hift": {"enabled": False},
                   "flow": {"engine": {"backend": "tensorrt", "options": options}}},
    })


def test_rtx_flavour_for_h100_is_a_recipe_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as e:
        load_recipe(_recipe(tmp_path, "h100", {"flavour": "rtx"}))
    msg = str(e.value)
    assert "stages.flow.engine.options.flavour" in msg and "sm90" in msg and "r.yaml:" in msg, msg
    # auto picks TensorRT for a data-center target, and the next validation sees no stale target.
    r = load_recipe(_recipe(tmp_path, "h100", {}))
    assert r.typed("flow")["options"].flavour == "auto"
    from cosycompile.backends.tensorrt import Options, resolve_flavour

    assert resolve_flavour("auto", TARGETS["h100"]) == "tensorrt"
    assert Options(flavour="rtx").flavour == "rtx"


def test_builder_fp16_with_rtx_is_a_recipe_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as e:
        load_recipe(_recipe(tmp_path, "rtx4090", {"flavour": "rtx", "builder_fp16": True}))
    assert "stages.flow.engine.options.builder_fp16" in str(e.value), str(e.value)
    load_recipe(_recipe(tmp_path, "l20", {"flavour": "tensorrt", "builder_fp16": True}))  # TensorRT 10's flag
    # TensorRT-RTX engines run only on the release that built them.
    with pytest.raises(RecipeError, match="stages.flow.engine.options.version_compatible"):
        load_recipe(_recipe(tmp_path, "rtx3090", {"flavour": "rtx", "version_compatible": True}))
    if HAVE_RTX:  # auto resolves to TensorRT-RTX for an RTX card when it is installed
        with pytest.raises(RecipeError, match="stages.flow.engine.options.version_compatible"):
            load_recipe(_recipe(tmp_path, "rtx4090", {"version_compatible": True}))
    load_recipe(_recipe(tmp_path, "l20", {"version_compatible": True}))


def test_bad_profiles_and_unknown_options_are_recipe_errors(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="profiles"):
        load_recipe(_recipe(tmp_path, "l20", {"profiles": {"frames": [500, 4, 3000]}}))
    with pytest.raises(RecipeError, match="max_batch"):
        load_recipe(_recipe(tmp_path, "l20", {"max_batch": 2}))


def test_repo_gpu_recipes_load() -> None:
    names = ["l20-int8", "l20-int4-awq", "h100-fp8"] + (["rtx4090-fp16"] if HAVE_FP16_QUANTIZER else [])
    for name in names:
        r = load_recipe(REPO / "recipes" / f"{name}.yaml")
        for stage in ("flow", "hift"):
            assert r.typed(stage)["backend"].name == "tensorrt"
    if HAVE_FP16_QUANTIZER:
        r = load_recipe(REPO / "recipes" / "rtx4090-fp16.yaml")
        assert r.target == "rtx4090" and r.typed("llm")["backend"].name == "tensorrt"
        assert r.typed("flow")["quantize"].format == "fp16" and r.typed("hift")["quantize"].format == "fp16"


def test_formats_the_backend_and_the_targets_refuse() -> None:
    from cosycompile.backends.tensorrt import check_format

    assert check_format("llm", "int4_awq", None, 18)[0] == "format"  # MatMulNBits: ONNX Runtime only
    assert "trtllm" in check_format("llm", "fp8", None, 18)[1]
    assert check_format("llm", "int8_sq", None, 18) is None  # ModelOpt Q/DQ
    for fmt in ("fp32", "fp16", "int8", "fp8", "int4"):
        assert check_format("flow", fmt, None, 18) is None
    assert "fp8" in TARGETS["l20"].formats and "fp8" not in TARGETS["a100"].formats
    assert "8.9" in TARGETS["t4"].format_problem("fp8") and TARGETS["h100"].format_problem("fp8") is None
    assert "nvfp4" in TARGETS["b200"].formats and TARGETS["b200"].sm == (10, 0)
    assert TARGETS["rtx4090"].rtx_class and not TARGETS["l20"].rtx_class
    assert TARGETS["l40s"].sm_tag == "sm89" and TARGETS["cpu"].formats == ()


def test_build_and_run_problems_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cosycompile.backends.tensorrt as trt_backend

    if not trt_backend.PROC_GPUS.exists():
        assert "no NVIDIA GPU" in trt_backend.run_problem(TARGETS["rtx4090"])
    if HAVE_RTX and importlib.util.find_spec("tensorrt") is None:
        assert trt_backend.build_problem(TARGETS["rtx4090"]) is None  # TensorRT-RTX compiles sm89 without a GPU
        assert "sm90" in trt_backend.build_problem(TARGETS["h100"])
        # With the engine's options only the builder its flavour picks counts: auto is TensorRT for a
        # data-center sm89 target (the L20), so TensorRT-RTX alone leaves that engine to another machine.
        Opts = trt_backend.Options
        assert trt_backend.build_problem(TARGETS["rtx4090"], Opts()) is None
        assert "flavour rtx would" in trt_backend.build_problem(TARGETS["l20"], Opts())
        assert trt_backend.build_problem(TARGETS["l20"], Opts(flavour="rtx")) is None
        assert "TensorRT is not installed" in trt_backend.build_problem(TARGETS["rtx4090"], Opts(flavour="tensorrt"))
    # A machine with an L40S: sm89 engines run (if a runtime is installed); sm90 ones do not.
    gpu = tmp_path / "gpus" / "0000:01:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text("Model: \t\t NVIDIA L40S\nIRQ:   \t\t 42\n")
    monkeypatch.setattr(trt_backend, "PROC_GPUS", tmp_path / "gpus")
    assert trt_backend.gpu_models() == ["NVIDIA L40S"]
    assert trt_backend.sm_of_model("NVIDIA L40S") == (8, 9) and trt_backend.sm_of_model("NVIDIA L4") == (8, 9)
    assert trt_backend.sm_of_model("NVIDIA A100-SXM4-80GB") == (8, 0)
    assert "sm90" in trt_backend.run_problem(TARGETS["h100"])
    if HAVE_RTX:
        assert trt_backend.run_problem(TARGETS["l20"]) is None


# ------------------------------------------------------------------------------------ fake TensorRT

def fake_tensorrt(version: str) -> types.ModuleType:
    """A stand-in for ``import tensorrt`` of the given version: only names TensorRT itself declares.

    Citations are to NVIDIA/TensorRT at tags v10.16 (TensorRT 10.16) and v11.1 (TensorRT 11.1):
    ``pyCore.cpp`` = python/src/infer/pyCore.cpp, ``pyGraph.cpp`` = python/src/infer/pyGraph.cpp,
    ``pyOnnx.cpp`` = python/src/parsers/pyOnnx.cpp, ``NvInfer.h`` = include/NvInfer.h.
    Classes use ``__slots__`` so that setting an attribute TensorRT does not have fails.
    """
    import onnx

    major = int(version.split(".")[0])
    m = types.ModuleType("tensorrt")
    m.__version__ = version  # python/packaging/bindings_wheel/tensorrt/__init__.py: __version__ (v10.16, v11.1)
    m.calls = []  # test bookkeeping: (call, args) in order
    m.memory = {}  # test bookkeeping: device address -> tensor (what the fake device allocated)

    class Severity(IntEnum):  # include/NvInferRuntime.h ILogger::Severity kINTERNAL_ERROR..kVERBOSE (v10.16, v11.1)
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    class ILogger:  # pyCore.cpp: py::class_<ILogger, PyLogger> "ILogger", py::init<>(), "log" (v10.16, v11.1)
        def __init__(self) -> None:
            pass

    ILogger.Severity = Severity  # pyCore.cpp: py::enum_<ILogger::Severity>(baseLoggerBinding, "Severity")

    if major >= 11:
        class NetworkDefinitionCreationFlag(IntEnum):  # NvInfer.h v11.1: only kSTRONGLY_TYPED = 0 (deprecated, ignored)
            STRONGLY_TYPED = 0

        class BuilderFlag(IntEnum):  # NvInfer.h v11.1: kFP16/kINT8 removed; kVERSION_COMPATIBLE = 12
            VERSION_COMPATIBLE = 12
    else:
        class NetworkDefinitionCreationFlag(IntEnum):  # NvInfer.h v10.16: kEXPLICIT_BATCH = 0, kSTRONGLY_TYPED = 1
            EXPLICIT_BATCH = 0
            STRONGLY_TYPED = 1

        class BuilderFlag(IntEnum):  # NvInfer.h v10.16: kFP16 = 0, kINT8 = 1, kVERSION_COMPATIBLE = 13
            FP16 = 0
            INT8 = 1
            VERSION_COMPATIBLE = 13

    class MemoryPoolType(IntEnum):  # NvInfer.h MemoryPoolType::kWORKSPACE = 0 (v10.16, v11.1)
        WORKSPACE = 0

    class HardwareCompatibilityLevel(IntEnum):  # NvInfer.h kNONE 0, kAMPERE_PLUS 1, kSAME_COMPUTE_CAPABILITY 2
        NONE = 0
        AMPERE_PLUS = 1
        SAME_COMPUTE_CAPABILITY = 2

    class TensorIOMode(IntEnum):  # include/NvInferRuntimeBase.h TensorIOMode kNONE 0, kINPUT 1, kOUTPUT 2
        NONE = 0
        INPUT = 1
        OUTPUT = 2

    class DataType(IntEnum):  # include/NvInferRuntimeBase.h DataType; pyFoundationalTypes.cpp "FLOAT", "HALF", ...
        FLOAT = 0
        HALF = 1
        INT8 = 2
        INT32 = 3
        BOOL = 4
        UINT8 = 5
        BF16 = 7
        INT64 = 8

    onnx_dtypes = {onnx.TensorProto.FLOAT: DataType.FLOAT, onnx.TensorProto.FLOAT16: DataType.HALF,
                   onnx.TensorProto.INT64: DataType.INT64}

    class ITensor:  # pyGraph.cpp: ITensor "name", "shape", "dtype" properties
        __slots__ = ("name", "shape", "dtype")

        def __init__(self, name: str, shape: tuple[int, ...], dtype: DataType) -> None:
            self.name, self.shape, self.dtype = name, shape, dtype

    class INetworkDefinition:  # pyGraph.cpp: "num_inputs", "get_input" (and outputs) of INetworkDefinition
        __slots__ = ("flags", "_inputs", "_outputs")

        def __init__(self, flags: int) -> None:
            self.flags, self._inputs, self._outputs = flags, [], []

        @property
        def num_inputs(self) -> int:
            return len(self._inputs)

        def get_input(self, index: int) -> ITensor:
            return self._inputs[index]

    class ParserError:  # pyOnnx.cpp: ParserError "code", "desc", "node", "node_name", "node_operator"
        __slots__ = ("_node", "_name", "_op")

        def __init__(self, node: int, name: str, op: str) -> None:
            self._node, self._name, self._op = node, name, op

        def node(self) -> int:
            return self._node

        def node_name(self) -> str:
            return self._name

        def node_operator(self) -> str:
            return self._op

        def desc(self) -> str:
            return "Plugin not found, are the plugin name, version, and namespace correct?"

    class OnnxParser:  # pyOnnx.cpp: OnnxParser(network, logger), "parse_from_file", "num_errors", "get_error"
        __slots__ = ("network", "errors")

        def __init__(self, network: INetworkDefinition, logger: Any) -> None:
            self.network, self.errors = network, []

        def parse_from_file(self, path: str) -> bool:
            model = onnx.load(path)
            m.calls.append(("parse_from_file", Path(path).name))
            for i, node in enumerate(model.graph.node):
                if node.op_type == "FooBar":  # stands for any op TensorRT has no importer for
                    self.errors.append(ParserError(i, node.name, node.op_type))
                    return False

            def tensor(v: Any) -> ITensor:
                dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)
                return ITensor(v.name, dims, onnx_dtypes[v.type.tensor_type.elem_type])

            self.network._inputs = [tensor(v) for v in model.graph.input]
            self.network._outputs = [tensor(v) for v in model.graph.output]
            return True

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, index: int) -> ParserError:
            return self.errors[index]

    class ITimingCache:  # pyCore.cpp: ITimingCache "serialize"
        __slots__ = ("blob",)

        def __init__(self, blob: bytes) -> None:
            self.blob = blob

        def serialize(self) -> bytes:
            return self.blob

    class IOptimizationProfile:  # pyCore.cpp: IOptimizationProfile "set_shape"(input, min, opt, max)
        __slots__ = ("shapes",)

        def __init__(self) -> None:
            self.shapes = {}

        def set_shape(self, input: str, min: tuple, opt: tuple, max: tuple) -> None:
            m.calls.append(("set_shape", input, tuple(min), tuple(opt), tuple(max)))
            self.shapes[input] = (tuple(min), tuple(opt), tuple(max))

    class IBuilderConfig:  # pyCore.cpp: IBuilderConfig
        # "builder_optimization_level", "hardware_compatibility_level" properties; the rest is bookkeeping
        __slots__ = ("builder_optimization_level", "hardware_compatibility_level", "_cache", "_profiles")

        def __init__(self) -> None:
            self.builder_optimization_level = 3
            self.hardware_compatibility_level = HardwareCompatibilityLevel.NONE
            self._cache, self._profiles = None, []

        def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:  # "set_memory_pool_limit"
            m.calls.append(("set_memory_pool_limit", pool.name, pool_size))

        def set_flag(self, flag: BuilderFlag) -> None:  # "set_flag"
            m.calls.append(("set_flag", flag.name))

        def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache:  # "create_timing_cache"
            m.calls.append(("create_timing_cache", bytes(serialized_timing_cache)))
            return ITimingCache(bytes(serialized_timing_cache))

        def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:  # "set_timing_cache"
            m.calls.append(("set_timing_cache", ignore_mismatch))
            self._cache = cache
            return True

        def get_timing_cache(self) -> ITimingCache:  # "get_timing_cache"
            return self._cache

        def add_optimization_profile(self, profile: IOptimizationProfile) -> int:  # "add_optimization_profile"
            self._profiles.append(profile)
            return len(self._profiles) - 1

    class Builder:  # pyCore.cpp: Builder(logger), "create_network"(flags), "create_builder_config",
        # "create_optimization_profile", "build_serialized_network"(network, config)
        __slots__ = ()

        def __init__(self, logger: Any) -> None:
            assert isinstance(logger, ILogger)

        def create_network(self, flags: int = 0) -> INetworkDefinition:
            m.calls.append(("create_network", flags))
            return INetworkDefinition(flags)

        def create_builder_config(self) -> IBuilderConfig:
            return IBuilderConfig()

        def create_optimization_profile(self) -> IOptimizationProfile:
            return IOptimizationProfile()

        def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> bytes:
            m.calls.append(("build_serialized_network", config.builder_optimization_level,
                            config.hardware_compatibility_level.name))
            if config._cache is not None:  # tuning adds entries to the timing cache
                config._cache = ITimingCache(config._cache.blob + b"[tactics]")
            io = [{"name": t.name, "mode": "INPUT", "dtype": t.dtype.name} for t in network._inputs]
            io += [{"name": t.name, "mode": "OUTPUT", "dtype": t.dtype.name} for t in network._outputs]
            # A plan is opaque bytes (IHostMemory, buffer protocol); this one records what the engine needs.
            return b"FAKEPLAN" + json.dumps({"io": io, "flags": network.flags}).encode() + b" " * 20_000

    class IExecutionContext:  # pyCore.cpp: "set_input_shape", "get_tensor_shape", "set_tensor_address",
        # "execute_async_v3"(stream_handle)
        __slots__ = ("shapes", "addresses")

        def __init__(self) -> None:
            self.shapes, self.addresses = {}, {}

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            return self.shapes["x"]  # the fake graph: y = 2 * x

        def set_tensor_address(self, name: str, memory: int) -> bool:
            self.addresses[name] = memory
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            m.calls.append(("execute_async_v3", stream_handle))
            x, y = m.memory[self.addresses["x"]], m.memory[self.addresses["y"]]
            y.copy_(2 * x)
            return True

    class ICudaEngine:  # pyCore.cpp: "num_io_tensors", "get_tensor_name", "get_tensor_mode", "get_tensor_dtype",
        # "create_execution_context"
        __slots__ = ("io",)

        def __init__(self, io: list[dict[str, str]]) -> None:
            self.io = io

        @property
        def num_io_tensors(self) -> int:
            return len(self.io)

        def get_tensor_name(self, index: int) -> str:
            return self.io[index]["name"]

        def get_tensor_mode(self, name: str) -> TensorIOMode:
            return TensorIOMode[next(t["mode"] for t in self.io if t["name"] == name)]

        def get_tensor_dtype(self, name: str) -> DataType:
            return DataType[next(t["dtype"] for t in self.io if t["name"] == name)]

        def create_execution_context(self) -> IExecutionContext:
            return IExecutionContext()

    class Runtime:  # pyCore.cpp: Runtime(logger), "deserialize_cuda_engine", "engine_host_code_allowed"
        __slots__ = ("engine_host_code_allowed",)

        def __init__(self, logger: Any) -> None:
            self.engine_host_code_allowed = False

        def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
            if not serialized_engine.startswith(b"FAKEPLAN"):
                return None
            return ICudaEngine(json.loads(serialized_engine[len(b"FAKEPLAN"):].strip())["io"])

    for obj in (ILogger, NetworkDefinitionCreationFlag, BuilderFlag, MemoryPoolType, HardwareCompatibilityLevel,
                TensorIOMode, DataType, OnnxParser, Builder, Runtime):
        setattr(m, obj.__name__, obj)
    return m


class FakeDevice:
    """The CUDA side of a Runner on host memory: torch CPU tensors stand in for device tensors and
    their data pointers for device addresses (what the fake engine reads and writes)."""

    def __init__(self, memory: dict[int, Any]) -> None:
        import torch

        self.torch, self.memory, self.streams = torch, memory, 0

    def _register(self, t: Any) -> Any:
        self.memory[t.data_ptr()] = t
        return t

    def dtype(self, name: str) -> Any:
        return getattr(self.torch, name)

    def stream(self) -> Any:
        self.streams += 1
        return self.streams

    def stream_handle(self, stream: Any) -> int:
        return int(stream)

    def is_device_array(self, x: Any) -> bool:
        return isinstance(x, self.torch.Tensor)

    def to_device(self, x: Any, dtype: Any) -> Any:
        t = x if isinstance(x, self.torch.Tensor) else self.torch.from_numpy(np.ascontiguousarray(x))
        return self._register(t.to(dtype=dtype).contiguous().clone())

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._register(self.torch.empty(shape, dtype=dtype))

    def before(self, stream: Any) -> None:
        pass

    def synchronize(self, stream: Any) -> None:
        pass

    def to_host(self, t: Any) -> np.ndarray:
        return t.numpy()


SAMPLES_PER_FRAME = 10


def _graphs_dir(root: Path, precision: str = "fp32", bad_node: bool = False) -> Path:
    """A one-graph 'flow' graphs dir: y = 2 * x, with a second input whose length is a product dim."""
    import onnx
    from onnx import TensorProto, helper

    root.mkdir(parents=True)
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"], name="/scale/Mul")]
    if bad_node:
        nodes.insert(0, helper.make_node("FooBar", ["x"], ["z"], name="/odd/FooBar", domain="com.example"))
    graph = helper.make_graph(
        nodes, "est",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, "frames"]),
         helper.make_tensor_value_info("noise", TensorProto.FLOAT, [1, "frames_x_samples_per_frame", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, "frames"])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(root / "est.onnx"))
    spec = {"inputs": [{"name": "x", "dtype": "float32", "shape": [2, 4, "frames"]},
                       {"name": "noise", "dtype": "float32", "shape": [1, "frames*samples_per_frame", 3]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [2, 4, "frames"]}],
            "dims": {"frames": {"min": 4, "opt": 50, "max": 300}}, "tolerance": 1e-3, "calib_crop_dim": "frames"}
    graph_entry = {"file": "est.onnx", "inputs": ["x", "noise"], "outputs": ["y"], "spec": spec}
    if precision != "fp32":
        graph_entry["precision"] = precision
    (root / "graphs.json").write_text(json.dumps({
        "stage": "flow", "graphs": {"est": graph_entry}, "assets": {},
        "info": {"precision": precision, "samples_per_frame": SAMPLES_PER_FRAME}}))
    return root


@pytest.fixture
def trt10(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    return _install(monkeypatch, "10.16.1.11")


@pytest.fixture
def trt11(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    return _install(monkeypatch, "11.1.0.5")


def _install(monkeypatch: pytest.MonkeyPatch, version: str) -> types.ModuleType:
    from cosycompile.backends.tensorrt import build as trt_build

    fake = fake_tensorrt(version)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    # TensorRT builds on the GPU it builds for: this stands in for an L20 (sm89) in the machine.
    monkeypatch.setattr(trt_build, "_build_gpu", lambda: ("NVIDIA L20", (8, 9)))
    return fake


def _options(**kw: Any) -> Any:
    from cosycompile.backends.tensorrt import Options

    return Options(**{"flavour": "tensorrt", **kw})


def _calls(fake: types.ModuleType, name: str) -> list[tuple]:
    return [c for c in fake.calls if c[0] == name]


def test_trt10_typed_graph_is_strongly_typed_with_spec_profiles_and_flags(trt10: types.ModuleType, tmp_path: Path) -> None:
    from cosycompile.backends.tensorrt.build import build

    src = _graphs_dir(tmp_path / "src", precision="int8")
    opts = _options(workspace_gib=2, builder_optimization_level=5, hardware_compatibility="same_compute_capability",
                    version_compatible=True)
    fields = build(src, opts, TARGETS["l20"], tmp_path / "out")
    assert _calls(trt10, "create_network") == [("create_network", 1 << 1)]  # 1 << int(STRONGLY_TYPED), STRONGLY_TYPED = 1
    assert ("set_flag", "FP16") not in trt10.calls and ("set_flag", "VERSION_COMPATIBLE") in trt10.calls
    assert ("set_memory_pool_limit", "WORKSPACE", 2 << 30) in trt10.calls
    assert _calls(trt10, "build_serialized_network") == [("build_serialized_network", 5, "SAME_COMPUTE_CAPABILITY")]
    # One profile from the spec's dims; the product dim multiplies frames by the model constant.
    assert _calls(trt10, "set_shape") == [
        ("set_shape", "x", (2, 4, 4), (2, 4, 50), (2, 4, 300)),
        ("set_shape", "noise", (1, 4 * SAMPLES_PER_FRAME, 3), (1, 50 * SAMPLES_PER_FRAME, 3), (1, 300 * SAMPLES_PER_FRAME, 3)),
    ]
    assert fields["flavour"] == "tensorrt" and fields["backend_version"] == "10.16.1.11"
    assert fields["compute_capabilities"] == ["sm89"] and fields["build_gpu"]["compute_capability"] == "sm89"
    assert set(fields["gpu_names"]) == {"NVIDIA L4", "NVIDIA L20", "NVIDIA L40S", "NVIDIA GeForce RTX 4090"}
    assert fields["precisions"] == {"est": "int8"} and fields["strongly_typed"] is True
    assert fields["profiles"]["est"]["x"] == {"min": [2, 4, 4], "opt": [2, 4, 50], "max": [2, 4, 300]}
    assert fields["timing_cache"] is None and not _calls(trt10, "create_timing_cache")  # no cache_dir given
    gd = json.loads((tmp_path / "out" / "graphs.json").read_text())
    assert gd["graphs"]["est"]["file"] == "est.plan" and (tmp_path / "out" / "est.plan").stat().st_size > 10_000


def test_trt10_builder_fp16_is_weakly_typed_with_the_fp16_flag(trt10: types.ModuleType, tmp_path: Path) -> None:
    from cosycompile.backends.tensorrt.build import build

    fields = build(_graphs_dir(tmp_path / "src"), _options(builder_fp16=True), TARGETS["l20"], tmp_path / "out")
    assert _calls(trt10, "create_network") == [("create_network", 0)]
    assert ("set_flag", "FP16") in trt10.calls
    assert fields["strongly_typed"] is False and fields["builder_fp16"] is True


def test_trt11_has_no_explicit_batch_nor_precision_flags(trt11: types.ModuleType, tmp_path: Path) -> None:
    from cosycompile.backends.tensorrt.build import build

    assert not hasattr(trt11.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH")
    assert not hasattr(trt11.BuilderFlag, "FP16")
    fields = build(_graphs_dir(tmp_path / "src", precision="int8"), _options(version_compatible=True),
                   TARGETS["l20"], tmp_path / "out")
    assert _calls(trt11, "create_network") == [("create_network", 0)]  # strongly typed always
    assert [c for c in _calls(trt11, "set_flag")] == [("set_flag", "VERSION_COMPATIBLE")]
    assert fields["backend_version"] == "11.1.0.5" and fields["strongly_typed"] is True
    with pytest.raises(RecipeError, match="builder_fp16"):
        build(_graphs_dir(tmp_path / "src2"), _options(builder_fp16=True), TARGETS["l20"], tmp_path / "out2")


def test_timing_cache_round_trip_keyed_by_flavour_version_and_sm(trt11: types.ModuleType, tmp_path: Path) -> None:
    from cosycompile.backends.tensorrt.build import build

    src = _graphs_dir(tmp_path / "src")
    cache = tmp_path / "shared"
    first = build(src, _options(), TARGETS["l20"], tmp_path / "out1", cache_dir=cache)
    assert first["timing_cache"] == "tensorrt-11.1.0.5-sm89.timing-cache"
    saved = (cache / first["timing_cache"]).read_bytes()
    assert saved == b"[tactics]" and _calls(trt11, "create_timing_cache") == [("create_timing_cache", b"")]
    assert ("set_timing_cache", False) in trt11.calls  # a cache from another GPU or version is refused, not mixed in
    trt11.calls.clear()
    second = build(src, _options(builder_optimization_level=1), TARGETS["l20"], tmp_path / "out2", cache_dir=cache)
    assert _calls(trt11, "create_timing_cache") == [("create_timing_cache", saved)]
    assert second["timing_cache_reused"] == {"est": True}
    assert (cache / first["timing_cache"]).read_bytes() == b"[tactics][tactics]"


def test_ampere_plus_and_build_gpu_checks(trt11: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosycompile.backends.tensorrt import build as trt_build

    fields = trt_build.build(_graphs_dir(tmp_path / "src"), _options(hardware_compatibility="ampere_plus"),
                             TARGETS["a100"], tmp_path / "out")
    assert fields["compute_capabilities"] == ["sm80+"] and "NVIDIA H100" in fields["gpu_names"]
    assert _calls(trt11, "build_serialized_network")[0][2] == "AMPERE_PLUS"
    monkeypatch.setattr(trt_build, "_build_gpu", lambda: ("NVIDIA H100 80GB HBM3", (9, 0)))
    with pytest.raises(BackendUnavailable, match="must be built on a sm89 GPU"):
        trt_build.build(_graphs_dir(tmp_path / "src2"), _options(), TARGETS["l20"], tmp_path / "out2")
    monkeypatch.setattr(trt_build, "_build_gpu", lambda: None)
    with pytest.raises(BackendUnavailable, match="no CUDA GPU"):
        trt_build.build(_graphs_dir(tmp_path / "src3"), _options(), TARGETS["l20"], tmp_path / "out3")


def test_parser_error_is_one_line_naming_graph_and_node(trt11: types.ModuleType, tmp_path: Path) -> None:
    from cosycompile.backends.tensorrt.build import build

    with pytest.raises(BackendUnavailable) as e:
        build(_graphs_dir(tmp_path / "src", bad_node=True), _options(), TARGETS["l20"], tmp_path / "out")
    msg = str(e.value)
    assert "\n" not in msg and "graph 'est'" in msg and "node 0 '/odd/FooBar' (FooBar)" in msg, msg


def test_build_refuses_what_tensorrt_cannot_run(trt11: types.ModuleType, tmp_path: Path) -> None:
    from cosycompile.backends.tensorrt.build import build

    with pytest.raises(RecipeError, match="stages.flow.quantize.format.*8.9"):
        build(_graphs_dir(tmp_path / "src", precision="fp8"), _options(), TARGETS["a100"], tmp_path / "out")
    with pytest.raises(RecipeError, match=r"options.profiles.tokens.*frames"):
        build(_graphs_dir(tmp_path / "src2"), _options(profiles={"tokens": [1, 2, 3]}), TARGETS["l20"], tmp_path / "o2")
    assert not trt11.calls  # refused before any TensorRT work


def test_load_runs_numpy_and_device_tensors(trt11: types.ModuleType, tmp_path: Path) -> None:
    import torch

    from cosycompile.backends.tensorrt.build import build, load

    out = tmp_path / "out"
    fields = build(_graphs_dir(tmp_path / "src"), _options(version_compatible=True), TARGETS["l20"], out)
    (out / "engine.json").write_text(json.dumps({**fields, "backend": "tensorrt"}))
    runners = load(out, threads=2, device=FakeDevice(trt11.memory))
    r = runners["est"]
    assert r.input_names == ["x", "noise"] and r.output_names == ["y"]
    x = np.arange(2 * 4 * 6, dtype=np.float32).reshape(2, 4, 6)
    noise = np.zeros((1, 6 * SAMPLES_PER_FRAME, 3), np.float32)
    y = r.run({"x": x, "noise": noise})["y"]
    assert isinstance(y, np.ndarray) and np.array_equal(y, 2 * x)
    yt = r.run({"x": torch.from_numpy(x), "noise": torch.from_numpy(noise)})["y"]
    assert isinstance(yt, torch.Tensor) and torch.equal(yt, 2 * torch.from_numpy(x))
    assert len(_calls(trt11, "execute_async_v3")) == 2
    # A plan from another builder version is refused before deserialising, unless version compatible.
    (out / "engine.json").write_text(json.dumps({**fields, "backend": "tensorrt", "backend_version": "11.0.0.1"}))
    load(out, threads=1, device=FakeDevice(trt11.memory))
    (out / "engine.json").write_text(json.dumps({**fields, "backend": "tensorrt", "backend_version": "10.16.1.11"}))
    with pytest.raises(BackendUnavailable, match="rebuild here"):
        load(out, threads=1, device=FakeDevice(trt11.memory))


@needs_rtx
def test_rtx_build_of_a_small_graph_and_its_refusals(tmp_path: Path) -> None:
    """The real TensorRT-RTX path on a hand-made graph (fast): AOT for sm86, and for every Ampere+ CC."""
    from cosycompile.backends.tensorrt.build import build

    fields = build(_graphs_dir(tmp_path / "src"), _options(flavour="rtx"), TARGETS["rtx3090"], tmp_path / "out")
    assert fields["flavour"] == "rtx" and fields["compute_capabilities"] == ["sm86"]
    assert (tmp_path / "out" / "est.plan").stat().st_size > 1_000
    fields = build(_graphs_dir(tmp_path / "src2"), _options(flavour="rtx", hardware_compatibility="ampere_plus"),
                   TARGETS["rtx4090"], tmp_path / "out2")
    assert {"sm80", "sm86", "sm89", "sm120"} <= set(fields["compute_capabilities"])
    with pytest.raises(BackendUnavailable) as e:
        build(_graphs_dir(tmp_path / "src3", bad_node=True), _options(flavour="rtx"), TARGETS["rtx4090"], tmp_path / "o3")
    assert "graph 'est'" in str(e.value) and "'/odd/FooBar' (FooBar)" in str(e.value)
    # Options made without a target cannot resolve auto; build refuses what TensorRT-RTX lacks.
    with pytest.raises(RecipeError, match="builder_fp16"):
        build(_graphs_dir(tmp_path / "src4"), _options(flavour="auto", builder_fp16=True), TARGETS["rtx4090"],
              tmp_path / "o4")
    with pytest.raises(RecipeError, match="version_compatible"):
        build(_graphs_dir(tmp_path / "src5"), _options(flavour="auto", version_compatible=True), TARGETS["rtx4090"],
              tmp_path / "o5")


def test_a_build_that_asks_for_more_than_the_workspace_says_what_to_set() -> None:
    from cosycompile.backends.tensorrt.build import workspace_hint

    # The error line TensorRT-RTX 1.7.1 printed for the 0.5B LLM's decode step with a 4 GiB limit.
    errors = ["[localCheckMacros.cpp::getErrorStr::132] Error Code 2: OutOfMemory (Requested size was 5749825296 bytes.)"]
    assert workspace_hint(errors, 4.0) == ("(it asked for 5.4 GiB, more than engine.options.workspace_gib: 4; "
                                           "set it to at least 6 for this stage)")
    assert workspace_hint(errors, 8.0) is None  # within the limit: not the workspace's fault
    assert workspace_hint(["Error Code 4: Internal Error (no implementation)"], 4.0) is None
    assert _options().workspace_gib * 2**30 > 5749825296  # the default fits that build
