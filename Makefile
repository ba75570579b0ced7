# Everything a fresh machine needs: `make demo` and `make test` create the venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint docs docs-serve clean

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("marbled needs Python 3.11+" if sys.version_info < (3, 11) else 0)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The test tier trains real TensorFlow and PyTorch jobs on the CPU; torch 2.13.0 is the
	# CPU wheel kept on these machines (a looser pin would fetch a multi-GB CUDA build).
	$(BIN)/pip install --quiet -e '.[broker,test,docs,bench,tensorflow-cpu,plot]' 'torch==2.13.0'
	touch $@

venv: $(BIN)/.installed

## demo: paper job set 1 on 6 emulated GPUs, the MARBLE way and the LSF way, side by side
demo: venv
	$(BIN)/marble demo

## test: lint, then the whole test suite (what .ci/run calls); TIER=core runs one tier
test: venv lint
	$(BIN)/pytest -q $(if $(TIER),-m "$(TIER)")

lint: venv
	$(BIN)/ruff check .

## docs: build the documentation site into site/ (strict: a warning fails); docs-serve: live
docs: venv
	$(BIN)/mkdocs build --strict

docs-serve: venv
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
