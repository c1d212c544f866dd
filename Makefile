# `make demo` and `make test` set everything up on a fresh machine: a virtual environment in .venv with the CPU
# build of torch (installed first, so nothing pulls a multi-GB CUDA build), then sinebert under constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

.PHONY: install test test-fast demo bench cram clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e ".[train,test]"
	touch $(STAMP)

# Test files are shared among pytest-xdist workers, one per two cores (tests/conftest.py), at least two: most of an
# end-to-end test is one process importing torch, which leaves the other core idle.
PYTEST := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -n auto --dist loadfile

test: $(STAMP)
	$(PYTEST)

# The unit tests alone (no end-to-end runs of the scripts), for development: 5 to 6 minutes on 2 AVX2-only cores.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

# DEMO=smoke (1-2 minutes) or DEMO=long (a longer, better run); the default takes 16 to 28 minutes on 2 CPU cores.
demo: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m recipes.demo $(if $(DEMO),--mode $(DEMO)) $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/speed.py

# The fixed "CPU cram" budget end to end (1 to 1.5 hours on 2 CPU cores; CRAM_ARGS=--quick for a 1-2 minute
# smoke test): writes benchmarks/results/cram.{json,md}. The recipe is configs/cram/*.yaml.
CRAM_ARGS ?=
cram: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m recipes.cram $(CRAM_ARGS)

clean:
	rm -rf runs .pytest_cache
