# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pagewarden-installed

.PHONY: run test bench clean-venv

run: $(STAMP)
	$(PY) main.py

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/kv_alloc.py
	$(PY) bench/engine_vs_hf.py

# A CUDA machine gets the regular torch; a CPU-only one the CPU build (torch==2.13.0,
# which this workplace's machines take from a local file instead of a multi-GB CUDA wheel).
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install --quiet torch; \
	else \
		$(PY) -m pip install --quiet torch==2.13.0; \
	fi
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
