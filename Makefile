# Everything a fresh machine needs: `make demo` and `make test` create the venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The test tier trains real TensorFlow and PyTorch jobs on the CPU; torch 2.13.0 is the
# CPU wheel kept on these machines (a looser pin would fetch a multi-GB CUDA build).
REQUIREMENTS := -e '.[broker,test,docs,bench,tensorflow-cpu,plot,rl]' 'torch==2.13.0'

.PHONY: venv demo test prepare lint docs docs-serve clean gpu-wheels

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("marbled needs Python 3.11+" if sys.version_info < (3, 11) else 0)'
	$(PYTHON) -m venv $(VENV)
	bash tests/install.sh $(BIN) $(REQUIREMENTS)
	touch $@

venv: $(BIN)/.installed

## demo: paper job set 1 on 6 emulated GPUs, the MARBLE way and the LSF way, side by side
demo: venv
	$(BIN)/marble demo

## test: lint, then the whole test suite (what .ci/run calls); TIER=core runs one tier.
## WORKERS pytest-xdist workers run the tests side by side (half of a test's time is spent
## waiting on processes it started: 4 on 2 cores keep both busy but for minutes of tests that
## wait for real time; 5 were 60 s sooner once, but loaded the CPU so that jobs' measured
## speeds drifted from their profiles, and tests that read a job's GPU counts failed 2 runs
## in 5 as learning acted on them; now that the suite computes more, 5 are no sooner: 766 s
## of CI against 701-736 s with 4, 2026-12-06); the packaging tier (one
## wheel and venv), each half of the Slurm tier (commands, pyslurm) and each module with a
## module-scoped fixture run in order on one worker (tests/conftest.py). What the tiers need
## besides the venv (Debian packages, the Slurm tier's pyslurm) is made in the background
## from the start, while pip keeps one core busy (tests/prepare.sh); a test that needs it
## first waits for it.
WORKERS ?= 4
test: prepare venv lint
	# the project's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set, every broker,
	# worker and CLI process the tests start would compile marbled from source (0.2 s each)
	$(BIN)/python -m compileall -q -j 0 marbled >/dev/null
	$(BIN)/pytest -q -n $(WORKERS) --dist loadgroup --durations=25 $(if $(TIER),-m "$(TIER)")

prepare:
	mkdir -p $(VENV)
	bash tests/prepare.sh $(PYTHON) $(VENV)/pyslurm-22.5 >$(VENV)/prepare.log 2>&1 &

lint: venv
	$(BIN)/ruff check .

## docs: build the documentation site into site/ (strict: a warning fails); docs-serve: live
docs: venv
	$(BIN)/mkdocs build --strict

docs-serve: venv
	$(BIN)/mkdocs serve

## gpu-wheels: .gpuwheels/, the wheels benchmarks/gpu_check.sh installs on a GPU machine with
## no network (its Python: GPU_PYTHON_VERSION); the packages the broker needs that it lacks
GPU_PYTHON_VERSION ?= 3.12
GPU_WHEELS_PACKAGES ?= SQLAlchemy>=2.0
gpu-wheels: venv
	rm -rf .gpuwheels
	$(BIN)/pip download --quiet --only-binary=:all: --implementation cp \
	    --python-version $(GPU_PYTHON_VERSION) --platform manylinux2014_x86_64 \
	    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	    -d .gpuwheels $(foreach p,$(GPU_WHEELS_PACKAGES),'$(p)')
	du -sh .gpuwheels && ls .gpuwheels

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
