# ltxbench — common tasks. PYTHON may point at a venv's interpreter (CI does).
PYTHON ?= python3
ARCHS ?= 7.5;8.0;9.0

.PHONY: install test test-gpu demo lint build-check clean

install:
	$(PYTHON) -m pip install -e ".[dev,plot]"

# CPU test suite (what CI runs). The build tests compile every CUDA source for $(ARCHS).
test:
	TORCH_CUDA_ARCH_LIST="$(ARCHS)" $(PYTHON) -m pytest -q

# On a GPU machine: the kernel tests against the references (arch detected from the GPU).
test-gpu:
	$(PYTHON) -m pytest -q -m gpu tests

# The main job on the embedded tiny default: a 9-frame LTX-Video mp4 + result JSON in seconds on a CPU.
demo: install
	$(PYTHON) -m ltxbench env
	$(PYTHON) -m ltxbench generate --model ltx-tiny --weights random --device cpu --num-frames 9 \
		--height 64 --width 96 --steps 4 --prompt "a red fox running through fresh snow" \
		--output results/runs/demo.mp4 --force

lint:
	$(PYTHON) -m ruff check ltxbench tests

build-check:
	TORCH_CUDA_ARCH_LIST="$(ARCHS)" LTXBENCH_VERBOSE_BUILD=1 $(PYTHON) -c "import ltxbench.ops._build as b; print(b.load())"

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache
