"""AOTInductor engines: ``build`` compiles each ExportedProgram of a graphs dir into ``<graph>.pt2``;
``load`` opens the packages as Runners (numpy in and out, or torch tensors on the engine's device)."""

from __future__ import annotations

import os
import platform
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosycompile.errors import BackendUnavailable, UserError
from cosycompile.core.files import link_or_copy
from cosycompile.core.memory import page_out_file_mappings
from cosycompile.core.targets import Target
from cosycompile.runtime.graphs_dir import copy_assets, read_graphs_dir
from cosycompile.runtime.loading import read_passport
from cosycompile.runtime.torch_ops import library_in, load_library
from cosycompile.runtime.torch_programs import load_program, quiet

# torch.backends.cpu.get_cpu_capability() values, weakest first: a package compiled for one runs
# on CPUs with that capability or a later one in this list.
CPU_CAPABILITIES = ("DEFAULT", "ZVECTOR", "VSX", "SVE256", "NEON", "AVX2", "AVX512")


def _device(target: Target) -> str:
    return "cuda" if target.kind == "gpu" else "cpu"


def build(src: Path, options: Any, target: Target, out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Compile every program of ``src`` with AOTInductor into ``out``; returns the passport's backend fields."""
    gd = read_graphs_dir(src)
    not_programs = [n for n, g in gd.graphs.items() if g.get("format") != "torch.export"]
    if not_programs:
        raise BackendUnavailable(f"{src}: graphs {', '.join(not_programs)} are not torch.export programs; backend "
                                 "'torch' compiles the stage's program export")
    if cache_dir is not None:
        # Inductor's kernel cache only saves compile time: results do not depend on it.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_dir

    work = Path(inductor_dir())
    device = _device(target)
    eng = copy_assets(gd, out)
    library = library_in(src)
    if library is not None:  # the programs call cosycompile's operators: the packages will too
        link_or_copy(library, out / library.name)
    configs = {"freezing": options.freezing, "max_autotune": options.max_autotune}
    passes = inductor_passes(options, device)
    beside = weights_beside(options, device)
    for name, graph in gd.graphs.items():
        program = None  # the previous program's weights go before the next one's are read
        program = load_program(gd.graph_path(name))
        if device == "cuda":
            from torch.export.passes import move_to_device_pass

            # An indexed device: with a bare "cuda" the moved program's tensor-metadata asserts expect
            # "cuda" and the fake tensors Inductor traces with are "cuda:0" (torch 2.11: AssertionError).
            program = move_to_device_pass(program, f"cuda:{torch.cuda.current_device()}")
        package = out / f"{name}.pt2"
        check_space(program_bytes(program), out, work, name)
        # Inductor freezes only with autograd off (torch 2.13, compile_fx._compile_fx_main): with it on,
        # `freezing` would be recorded and silently not done.
        with quiet(), torch.no_grad():
            torch._inductor.aoti_compile_and_package(program, package_path=str(package),
                                                     inductor_configs={**configs, **passes, **_constants_config(beside)})
        remove_build_dir(package, work)
        if beside:
            save_weights(program, package, out / f"{name}{WEIGHTS_SUFFIX}")
        eng.graphs[name] = {**graph, "file": package.name, "format": "aoti"}
    eng.info = dict(gd.info)
    eng.write()
    program = None
    fields: dict[str, Any] = {
        "backend_version": torch.__version__,
        "device": device,
        "precision": gd.info.get("precision", "fp32"),
        "inductor": {**configs, "passes": [p.uuid() for p in passes.values()]},
        "build_host": {"machine": platform.machine()},
    }
    if library is not None:
        fields["torch_ops"] = library.name  # the operator library the packages call
    if device == "cpu":
        fields["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    else:
        cc = torch.cuda.get_device_capability()
        fields["build_host"].update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, sm=f"sm{cc[0]}{cc[1]}")
    return fields


WEIGHTS_SUFFIX = ".weights.pt"
# The record inside a package that names its weights file: the package itself says it has none inside,
# so a runner never runs one whose weights are missing (its constants would be unset memory).
WEIGHTS_RECORD = "extra/cosycompile_weights"


def weights_beside(options: Any, device: str) -> bool:
    """Whether a package's weights go in a file beside it rather than linked into its shared object.

    Linked in, the compile holds the program's weights twice more (a serialized blob, then the library
    read back into the package), which made compiling the 0.5B FP32 LLM the build's largest step; and a
    loaded package copies them from its mapped library onto the heap. Beside it, the compile writes each
    weight once and the runner copies them from the file (``load_weights``). Frozen programs keep them
    inside: freezing folds the weights into new constants that only the compiled code knows. CPU only,
    since a CUDA package's weights would have to be copied to the device anyway and that path has not
    been measured."""
    return device == "cpu" and not options.freezing


def _constants_config(beside: bool) -> dict[str, Any]:
    return {"aot_inductor.package_constants_in_so": False} if beside else {}


def save_weights(program: Any, package: Path, dst: Path) -> None:
    """Write the tensors ``package`` reads as constants, by name, from ``program`` into ``dst``
    (beside the package), and name that file inside the package."""
    model = torch._inductor.aoti_load_package(str(package))  # no weights inside: a small library
    tensors = {**program.state_dict, **program.constants}
    names = model.get_constant_fqns()
    missing = [n for n in names if n not in tensors]
    if missing:
        raise BackendUnavailable(f"{package}: the compiled package reads constants its program does not name "
                                 f"({', '.join(missing[:3])}); build it with `freezing: true`")
    tmp = dst.with_name(dst.name + ".part")
    torch.save({n: tensors[n] for n in names}, tmp)
    tmp.replace(dst)
    with zipfile.ZipFile(package, "a") as z:
        z.writestr(f"{_package_root(z)}/{WEIGHTS_RECORD}", dst.name)


def _package_root(z: zipfile.ZipFile) -> str:
    return z.namelist()[0].split("/", 1)[0]


def weights_file(package: Path) -> Path | None:
    """The weights file a package reads its constants from, or None when they are linked inside it."""
    with zipfile.ZipFile(package) as z:
        record = f"{_package_root(z)}/{WEIGHTS_RECORD}"
        return package.parent / z.read(record).decode() if record in z.namelist() else None


def inductor_passes(options: Any, device: str) -> dict[str, Any]:
    """Inductor config entries that add cosycompile's graph passes: on a CPU, with freezing (whose
    weight prepacking they exist for), 1-D convolutions as 2-D ones."""
    if device != "cpu" or not options.freezing:
        return {}
    from cosycompile.backends.torch.conv_layout import Conv1dAs2d

    return {"joint_custom_pre_pass": Conv1dAs2d()}


# Disk an AOTInductor build needs beside its output: the shared object it links the weights into
# (under Inductor's cache dir), then the package that copies it. Measured on a 100 MB program:
# 206 MB at the peak, 2.04 times the weights, all on one disk.
SPACE_MARGIN = 256 << 20


def program_bytes(program: Any) -> int:
    """Bytes of the tensors a torch.export program carries (weights, buffers, constants)."""
    tensors = {**program.state_dict, **program.constants}
    return sum(t.numel() * t.element_size() for t in tensors.values() if isinstance(t, torch.Tensor))


def check_space(weights: int, out: Path, work: Path, name: str) -> None:
    """Refuse, with one line, a build the disks cannot hold: a full disk inside the packager aborts the
    whole process from C++ (``basic_ios::clear: iostream error``, then SIGABRT), past any handler."""
    work.mkdir(parents=True, exist_ok=True)
    need: dict[int, int] = {}  # bytes by disk: the two copies add up where both dirs share one
    where: dict[int, Path] = {}
    for path in (work, out):
        disk = os.stat(path).st_dev
        where.setdefault(disk, path)
        need[disk] = need.get(disk, 0) + weights + SPACE_MARGIN
    for disk, path in where.items():
        free = shutil.disk_usage(path).free
        if free < need[disk]:
            raise UserError(f"{path}: {free / 1e9:.2f} GB free, and compiling '{name}' with AOTInductor needs about "
                            f"{need[disk] / 1e9:.2f} GB there (its {weights / 1e9:.2f} GB of weights, linked, then packaged); "
                            "free space (`cosycompile cache gc`) or use --artifacts on a larger disk")


def remove_build_dir(package: Path, work: Path) -> None:
    """Remove the dir under Inductor's cache where AOTInductor built ``package``: its shared object has
    the weights linked in, the package holds a copy, and left there each build's would stay for good
    (7 GB after a day of benchmarks). Found by the wrapper's name inside the package, so a build
    running beside this one keeps its own dir."""
    for name in package_libraries(package):
        for so in work.glob(f"*/{name}"):
            shutil.rmtree(so.parent, ignore_errors=True)


def package_libraries(package: Path) -> set[str]:
    """Base names of the model libraries (``*.wrapper.so``) inside an AOTInductor package."""
    with zipfile.ZipFile(package) as z:
        return {Path(n).name for n in z.namelist() if n.endswith(".wrapper.so")}


# Weights are copied into a package in pieces of about this size, each piece's pages of the mapped
# file handed back before the next: loading then needs one copy of the weights, not two.
WEIGHTS_PIECE = 128 << 20


def load_weights(model: Any, path: Path) -> None:
    """Copy a package's constants from its weights file into the memory the package owns.

    The file is mapped and copied in pieces, its pages dropped after each (``MADV_PAGEOUT``), so the
    load peaks near one copy of the weights. The package must own the copy: constants it only points
    at (``user_managed``) are kept alive by the loaded library after the model is dropped, which held a
    0.5B FP32 LLM's 2.8 GB until the build process exited.
    """
    if not path.is_file():
        raise BackendUnavailable(f"{path}: missing; the package beside it keeps its weights there (copy the whole "
                                 "engine dir)")
    tensors = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    names = model.get_constant_fqns()
    missing = [n for n in names if n not in tensors]
    if missing:
        raise BackendUnavailable(f"{path}: lacks weights its package reads ({', '.join(missing[:3])}); rebuild the engine")
    piece: dict[str, Any] = {}
    size = 0
    for i, name in enumerate(names):
        piece[name] = tensors[name]
        size += tensors[name].numel() * tensors[name].element_size()
        if size >= WEIGHTS_PIECE or i == len(names) - 1:
            model.load_constants(piece, check_full_update=False, user_managed=False)
            page_out_file_mappings({path.name})
            piece, size = {}, 0


class AotiRunner:
    """A Runner over one AOTInductor package."""

    def __init__(self, path: Path, input_names: list[str], output_names: list[str], device: str,
                 dims: dict[str, Any] | None = None) -> None:
        self.input_names, self.output_names, self.device = input_names, output_names, device
        self.dims = dims or {}  # the graph spec's dynamic dims: {name: {min, opt, max}}
        self._model = torch._inductor.aoti_load_package(str(path))
        weights = weights_file(path)
        if weights is not None:
            load_weights(self._model, weights)
        else:
            # A package with its weights inside (a frozen one) copied them out of its extracted .so onto
            # the heap; the mapped copy would otherwise stay resident (torch keeps the library open even
            # after the model is dropped). A package whose weights are beside it maps only code.
            page_out_file_mappings(package_libraries(path))

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        host = any(isinstance(feeds[n], np.ndarray) for n in self.input_names)
        args = []
        for n in self.input_names:
            v = feeds[n]
            t = torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
            args.append(t.to(self.device) if t.device.type != self.device else t)
        with torch.inference_mode():
            outs = self._model(*args)
        if isinstance(outs, torch.Tensor):
            outs = (outs,)
        if host:
            outs = tuple(o.float().cpu().numpy() if o.is_floating_point() else o.cpu().numpy() for o in outs)
        return dict(zip(self.output_names, outs))


class StaticStepRunner(AotiRunner):
    """The runner of an ``llm_step_static`` package: a Runner, and the source of decoders that keep
    the cache on the device (``LLMRuntime.decoding`` takes one from any runner with ``decoder()``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._decoders: Any = None

    def decoder(self) -> Any:
        """This thread's :class:`~cosycompile.backends.torch.static_decode.StaticCacheDecoder` over this
        package, replayed as a CUDA graph on a GPU; the same one on every call, so that utterances of
        similar length replay one capture."""
        from cosycompile.backends.torch.static_decode import DecoderPerThread, StaticCacheDecoder

        if self._decoders is None:
            slots = self.dims.get("slots", {}).get("max")
            self._decoders = DecoderPerThread(lambda: StaticCacheDecoder(self._model, self.device, max_slots=slots))
        return self._decoders.get()


def load(engine_dir: Path, threads: int) -> dict[str, AotiRunner]:
    """Runners for every package of an engine dir; refuses packages this machine cannot run."""
    passport = read_passport(engine_dir)
    device = passport.get("device", "cpu")
    if device == "cpu":
        built, here = passport.get("cpu_capability", "DEFAULT"), torch.backends.cpu.get_cpu_capability()
        rank = {c: i for i, c in enumerate(CPU_CAPABILITIES)}
        if built != here and rank.get(built, len(rank)) > rank.get(here, -1):
            raise BackendUnavailable(f"{engine_dir}: compiled for {built} CPUs and this CPU is {here}; rebuild the "
                                     "engine on this machine")
        torch.set_num_threads(threads)
    elif not torch.cuda.is_available():
        raise BackendUnavailable(f"{engine_dir}: a CUDA package and this PyTorch sees no CUDA device")
    from cosycompile.stages.llm import LLM_STEP_STATIC

    library = library_in(engine_dir)
    if library is not None:
        load_library(library)  # before any package: they call its operators
    gd = read_graphs_dir(engine_dir)
    # Only the static-cache program decodes with a cache of its own; llm_step's runner must not offer to.
    return {name: (StaticStepRunner if name == LLM_STEP_STATIC.name else AotiRunner)(
                gd.graph_path(name), g["inputs"], g["outputs"], device, (g.get("spec") or {}).get("dims"))
            for name, g in gd.graphs.items()}
