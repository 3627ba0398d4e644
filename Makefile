# Two entry points (see README): `make demo` and `make test`. Both build or refresh the
# local virtual environment first. torch comes from the machine's CPU wheel: naming the
# exact version keeps pip from fetching the multi-gigabyte CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-loopback test-kernels lint venv browser docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dpfl demo

lint: $(STAMP)
	$(BIN)/ruff check src tests $(wildcard benchmarks/*.py) docs/api_reference.py
	$(BIN)/ruff format --check src tests $(wildcard benchmarks/*.py) docs/api_reference.py
	$(BIN)/mypy

# The report's rendering test drives Debian's Chromium; install it where we may (CI runs
# as root). Elsewhere that test skips and says why.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } || \
		echo "chromium not installed: the report rendering test will be skipped"

# Two workers, a test file to each at a time (module fixtures are built once). The whole
# deployments between processes and the sweeps on a local Ray cluster (marker `loopback`,
# about eleven minutes, mostly waiting on Flower and Ray) run on their own in
# test-loopback, which CI runs after test.
test: lint browser
	$(BIN)/pytest -n 2 --dist loadfile -m "not loopback"

test-loopback: $(STAMP)
	$(BIN)/pytest -m loopback

# The golden and two-halves tests again under each family of CPU kernels torch has and
# this CPU runs (docs/reproductions/README.md, "Bits and tolerances"): their results
# must not depend on the kernels (about ten minutes on two cores; CI runs it after test).
KERNEL_TESTS := tests/experiments/test_recipe_golden.py tests/federation/test_golden.py \
	tests/federation/test_two_halves.py tests/experiments/test_run_keys.py \
	tests/local/test_cnn_clipped_sum.py
CAPABILITIES := default $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo avx2) \
	$(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx512bw /proc/cpuinfo && \
		grep -qw avx512dq /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && echo avx512)

test-kernels: $(STAMP)
	set -e; for capability in $(CAPABILITIES); do \
		echo "== ATEN_CPU_CAPABILITY=$$capability"; \
		ATEN_CPU_CAPABILITY=$$capability $(BIN)/pytest -n 2 --dist load -q $(KERNEL_TESTS); \
	done

# The API reference of the public Python surface (the names `import dpfl` offers, the
# privacy layer, the algorithms and their settings, the DP statistics), rendered by pdoc
# into build/api/ (open build/api/index.html; docs/api_reference.py). The test run renders
# the same pages and checks the dpfl names their docstrings cite (tests/test_api_reference.py).
docs: $(STAMP)
	$(BIN)/python docs/api_reference.py build/api

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/api
