# ltxbench — common tasks. PYTHON may point at a venv's interpreter (CI does).
PYTHON ?= python3
ARCHS ?= 7.5;8.0;9.0

.PHONY: install test test-all test-compat test-gpu demo lint build-check clean

install:
	$(PYTHON) -m pip install -e ".[dev,plot]"

# The tests import this checkout's ltxbench (and so do the processes they start), whatever is installed.
PYTEST = PYTHONPATH="$(CURDIR)" $(PYTHON) -m pytest -q

# The quick tier, CPU only: everything but the tests marked slow (multi-process ranks, the build for every arch,
# the wheel). Compiles the CUDA sources once, for QUICK_ARCHS.
QUICK_ARCHS ?= 9.0
test:
	TORCH_CUDA_ARCH_LIST="$(QUICK_ARCHS)" $(PYTEST) -m "not slow and not gpu" tests

# The whole CPU suite (what CI runs): both tiers, the CUDA sources compiled for every arch in $(ARCHS).
test-all:
	TORCH_CUDA_ARCH_LIST="$(ARCHS)" $(PYTEST) -m "not gpu" tests

# The compile-path tests again on the oldest torch release supported (pyproject.toml), in a venv of its own:
# dynamo's rules change between releases (a decorator torch 2.14 accepts broke every compiled run on 2.11).
COMPAT_TORCH ?= 2.11.0
COMPAT_VENV ?= .venv-torch-$(COMPAT_TORCH)
test-compat:
	[ -x "$(COMPAT_VENV)/bin/python" ] || python3 -m venv "$(COMPAT_VENV)"
	"$(COMPAT_VENV)/bin/python" -m pip install -q "torch==$(COMPAT_TORCH)" -e ".[dev]"
	TORCH_CUDA_ARCH_LIST="$(QUICK_ARCHS)" PYTHONPATH="$(CURDIR)" "$(COMPAT_VENV)/bin/python" -m pytest -q \
		-m "not slow and not gpu" -k compile tests

# On a GPU machine: the kernel tests against the references (arch detected from the GPU). Without a visible GPU
# it fails at once (--require-gpu, tests/conftest.py) rather than skip every test. GPU_WORKERS=4 (pytest-xdist
# installed) shares the GPU among 4 processes, a test file each: the tests are mostly host-bound (compiles, small
# models), so 95 injection/memory/bench tests took 4.6 min on an H200 instead of ~20 serially.
GPU_WORKERS ?=
test-gpu:
	$(PYTEST) -m gpu --require-gpu $(if $(GPU_WORKERS),-n $(GPU_WORKERS) --dist loadfile) tests

# The main job on the embedded tiny default: a 9-frame LTX-Video mp4 + result JSON in seconds on a CPU.
demo: install
	$(PYTHON) -m ltxbench env
	$(PYTHON) -m ltxbench generate --model ltx-tiny --weights random --device cpu --num-frames 9 \
		--height 64 --width 96 --steps 4 --prompt "a red fox running through fresh snow" \
		--output results/runs/demo.mp4 --force

lint:
	$(PYTHON) -m ruff check ltxbench tests

build-check:
	TORCH_CUDA_ARCH_LIST="$(ARCHS)" LTXBENCH_VERBOSE_BUILD=1 $(PYTHON) -c "import ltxbench.ops.build as b; print(b.load())"

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache

# On a GPU machine: re-measure, at the checkout's commit, the canonical benchmarks of results/$(GPU) that do not
# record it yet (ltxbench/results/benchmarks.py), then regenerate its README. Resumable: ONLY=a,b picks benchmarks,
# BUDGET=9 runs those that fit in 9 minutes, in order, the others left pending (exit 124: call again); DEVICES=0,1,2,3
# spreads a one-GPU folder's benchmarks over this host's GPUs (docs/measuring.md).
.PHONY: results
results:
	@[ -n "$(GPU)" ] || { echo "make $@: set GPU to the results/ folder of this machine, e.g. GPU=h100 or GPU=h200x4" >&2; \
	exit 2; }
	$(PYTHON) -m ltxbench.results.manifest run results/$(GPU) $(if $(ONLY),--only $(ONLY)) \
		$(if $(BUDGET),--budget-minutes $(BUDGET)) $(if $(DEVICES),--devices $(DEVICES))

# Regression check on a GPU machine (docs/compare.md): the pinned benchmarks, then `compare` against the baselines
# stored in results/$(GPU)/, which bench-check-baseline writes. GPU: that folder's name (h100, h200).
# BENCH_CHECK_SUMMARY=<file>: the Markdown reports are appended there too (a CI job summary).
.PHONY: bench-check bench-check-baseline
BENCH_CHECK_DIR ?= results/runs/bench-check
BENCH_CHECK_E2E = bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 --phase transformer \
	--configs optimized,compile --compile-cache cold
BENCH_CHECK_MICRO = bench micro rms_norm_modulate add_rms_norm_modulate qk_rms_norm_rope cross_attention \
	--shapes ltx --dtype bf16 --providers cuda,eager
BENCH_CHECK_NEEDS_GPU = [ -n "$(GPU)" ] || { echo "make $@: set GPU to the results/ folder of this GPU's baselines, \
	e.g. GPU=h100" >&2; exit 2; }
# Both results are written under BENCH_CHECK_DIR; a run that fails leaves none of the previous run's behind.
define BENCH_CHECK_RUN
	rm -f $(BENCH_CHECK_DIR)/e2e.json $(BENCH_CHECK_DIR)/e2e.csv $(BENCH_CHECK_DIR)/micro.json $(BENCH_CHECK_DIR)/micro.csv
	$(PYTHON) -m ltxbench $(BENCH_CHECK_E2E) --output $(BENCH_CHECK_DIR)/e2e.json
	$(PYTHON) -m ltxbench $(BENCH_CHECK_MICRO) --output $(BENCH_CHECK_DIR)/micro.json
endef

bench-check:
	@$(BENCH_CHECK_NEEDS_GPU)
	@for part in e2e micro; do [ -f results/$(GPU)/bench-check-$$part.json ] || { echo "make $@: no baseline \
	results/$(GPU)/bench-check-$$part.json; write it on this GPU with make bench-check-baseline GPU=$(GPU)" >&2; \
	exit 2; }; done
	$(BENCH_CHECK_RUN)
	@status=0; for part in e2e micro; do \
		base=results/$(GPU)/bench-check-$$part.json; new=$(BENCH_CHECK_DIR)/$$part.json; \
		$(PYTHON) -m ltxbench compare $$base $$new || { code=$$?; [ $$status -ne 0 ] || status=$$code; }; \
		if [ -n "$(BENCH_CHECK_SUMMARY)" ]; then \
			$(PYTHON) -m ltxbench compare $$base $$new --format markdown >> "$(BENCH_CHECK_SUMMARY)" 2>/dev/null; \
		fi; \
	done; exit $$status

# The baselines: the same benchmarks, moved into results/$(GPU)/ only once both have run.
bench-check-baseline:
	@$(BENCH_CHECK_NEEDS_GPU)
	$(BENCH_CHECK_RUN)
	for part in e2e micro; do for ext in json csv; do \
		mv -f $(BENCH_CHECK_DIR)/$$part.$$ext results/$(GPU)/bench-check-$$part.$$ext || exit 4; done; done
