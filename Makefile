# cosycompile developer entry points. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast test-gpu bench bench-gpu lint clean

install: $(STAMP)

# torch is pinned by constraints.txt: an unpinned resolve pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt -e '.[quant,eval,rtx,dev,triton]'
	# tritonserver 2.51 for CPU tests of the Triton repositories; only its server binary, libraries and
	# python backend are used, so its Python dependencies (numpy<2) are not installed.
	$(PIP) install -q --no-deps nvidia-pytriton==0.7.0
	# resemblyzer asks for webrtcvad, whose sdist breaks on import with current setuptools;
	# webrtcvad-wheels provides the same module as a binary wheel.
	$(PIP) install -q --no-deps --force-reinstall webrtcvad-wheels
	touch $(STAMP)

demo: install
	$(VENV)/bin/cosycompile build recipes/cpu-int8.yaml

test: install
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: install
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider

# On a machine with a CUDA GPU and a CUDA build of PyTorch: the tests that need one.
test-gpu: install
	$(PY) -m pytest -q -m gpu -p no:cacheprovider

bench: install
	$(PY) bench/run_all.py

# On a machine with a CUDA GPU: the LLM decode step's packages on that GPU (fp32 eager, bf16, int8, fp8).
bench-gpu: install
	$(PY) bench/llm_decode.py --device cuda

lint: install
	$(VENV)/bin/ruff check cosycompile tests bench

clean:
	rm -rf artifacts
