# Two commands for a newcomer: `make demo` and `make test`. Both set up and build first.
SHELL := /bin/bash
BUILD ?= build
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc)

.PHONY: setup build build-demo test test-long demo demo-builtin bench fuzz clean wheel test-wheel gpu-check-bundle

setup:
	@scripts/setup

# Configure (torch's CMake config comes from the wheel in .venv; ccache when there is one), then build.
# `build` is everything with the tests; `build-demo` only the binaries a run needs, without the tests, so a first
# `make demo` neither installs the test tools nor compiles the test suites. Either reuses what the other built.
CCACHE := $(shell command -v ccache 2>/dev/null)
configure = if [[ ! -f $(BUILD)/build.ninja ]] || ! grep -q '^DFLASH_TESTS:BOOL=$(1)$$' $(BUILD)/CMakeCache.txt; then \
	  cmake -S . -B $(BUILD) -G Ninja -DDFLASH_TESTS=$(1) $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE)) \
	    -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch;print(torch.utils.cmake_prefix_path)')" >/dev/null; \
	fi
RUN_BINARIES := dflash-launch dflash-guardian dflash-worker dflash-builtin dflash-cachelock dflash-cachelock-run

build: setup
	@$(call configure,ON)
	@cmake --build $(BUILD) -j $(JOBS)

# A build dir made by `make build` keeps its tests on (no reconfigure): the demo then builds just its binaries.
build-demo:
	@scripts/setup --demo
	@if [[ ! -f $(BUILD)/build.ninja ]]; then $(call configure,OFF); fi
	@cmake --build $(BUILD) -j $(JOBS) --target $(RUN_BINARIES)

# The Python tests on four pytest-xdist workers on two cores: a third of the tests' time is waiting (signals,
# timeouts, sleeping payloads), which more workers fill with another test's CPU; tests/conftest.py spreads the
# tests that mostly wait through the run (WAIT_BOUND), one worker's worth beside three busy ones. --maxschedchunk 1:
# a worker gets its next test when it is ready for it; xdist's default hands each worker its first 39 tests at once,
# so the slowest, collected first (tests/conftest.py), all went to one worker (docs/design.md, "Test time").
# `PYTEST_ARGS=-n0` runs them one after another.
PYTEST_ARGS ?= -n 4 --maxschedchunk 1
# The gtest cases mostly wait (real processes, signals, deadlines: ~20 CPU-s in ~50 s of test time), so ctest runs
# four per core: 26 -> 10 s here.
CTEST_JOBS ?= $(shell echo $$(($(JOBS) * 4)))
# The repo's own Python byte-compiled first: where PYTHONDONTWRITEBYTECODE is set, every process (hundreds in the
# suite) would compile dflash_launch and each xdist worker the test modules again (quick when done: mtimes).
test: build
	@$(PY) -m compileall -q -j 0 python tests examples >/dev/null
	ctest --test-dir $(BUILD) --output-on-failure -j $(CTEST_JOBS)
	PATH="$(CURDIR)/$(BUILD)/bin:$$PATH" $(VENV)/bin/python -m pytest -q --durations=15 $(PYTEST_ARGS) tests

# The long variants `make test` skips (tests/conftest.py, LONG_TESTS): the shipped examples and the 8-GPU job's CPU
# twin end to end, about 2 minutes here. Run them before a release, or after a change to examples/ or configs/.
test-long: build
	DFLASH_LONG_TESTS=1 PATH="$(CURDIR)/$(BUILD)/bin:$$PATH" $(VENV)/bin/python -m pytest -q -m long $(PYTEST_ARGS) tests

# The embedded default pipeline, end to end: 5 builtin LibTorch targets -> spool in /dev/shm -> 3 Python
# reference drafters (torch.compile, gated); then the report and runs/<run_id>/loss.png.
# `make demo-builtin`: the same with the builtin C++ drafters. DEMO=<config> runs another config.
DEMO ?= configs/demo.toml
demo: build-demo
	@run_id=$$(basename $(DEMO) .toml)-$$(date +%Y%m%d-%H%M%S); \
	export PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PYTHONPATH="$(CURDIR)/python$${PYTHONPATH:+:$$PYTHONPATH}"; \
	$(BUILD)/bin/dflash-launch run $(DEMO) --run-id $$run_id; rc=$$?; \
	$(PY) -m dflash_launch.tools.demo_report runs/$$run_id || rc=$${rc/#0/1}; \
	exit $$rc

demo-builtin:
	@$(MAKE) --no-print-directory demo DEMO=configs/demo-builtin.toml

# Every benchmark, each against its named peer in the same run; results into docs/benchmarks.md.
# Run it on a quiet machine (it takes ~15 minutes here; the compile section alone ~5).
bench: build
	@cmake --build $(BUILD) -j $(JOBS) --target benches
	python3 bench/cachelock/run_bench.py --python $(PY) --n 1000
	python3 bench/supervisor/run_bench.py --out docs/benchmarks.md
	$(PY) bench/first_contact/run_bench.py --out docs/benchmarks.md
	$(PY) bench/compile/run_bench.py --out docs/benchmarks.md
	$(PY) bench/compile/exact_bench.py --out docs/benchmarks.md
	$(PY) bench/compile/follower_split.py --out docs/benchmarks.md
	$(PY) bench/cluster_gate/run_bench.py --out docs/benchmarks.md
	$(PY) bench/cluster_gate/run_bench.py --out docs/benchmarks.md --vec-isa-ok
	$(PY) bench/ddp/run_bench.py --out docs/benchmarks.md
	$(PY) bench/ddp/run_bench.py --out docs/benchmarks.md --model drafter --layers 4
	$(PY) bench/ctl/restart_compiled_bench.py --out docs/benchmarks.md
	$(PY) bench/multinode/node_failure_bench.py --reps 3 --payload-s 20 --out docs/benchmarks.md
	$(PY) bench/multinode/scale_bench.py --swarm 1000 --out docs/benchmarks.md
	$(BUILD)/bin/spool_bench --mb 1 --frames 2000 --repeat 5
	$(PY) bench/spool/world_bench.py --frames 600 --repeat 5 --out docs/benchmarks.md
	python3 bench/metrics/run_bench.py --out docs/benchmarks.md

fuzz: setup
	scripts/fuzz

# The pip wheel (docs/wheel.md): dflash-launch, dflash-worker, dflash-cachelock and the dflash_launch package with
# configs/ and examples/, built by scikit-build-core from this CMake project (no LibTorch, no gtest), repaired by
# auditwheel -> dist/. It needs only the build dependencies (scripts/setup --wheel-only: the C++ libraries from apt,
# the build tools in .venv-wheel; no torch, no test tools). No index at build time: build isolation is off.
# --version's "tested with torch" names the torch of .venv (the one `make test` ran with), "unknown" without one.
WHEEL_VENV := .venv-wheel
wheel:
	@scripts/setup --wheel-only
	@rm -rf $(BUILD)-wheel/raw dist/dflash_launch-*.whl
	@commit=$$(git rev-parse --short=12 HEAD)$$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty); \
	torch=$$($(PY) -c 'import torch;print(torch.__version__)' 2>/dev/null || true); \
	$(WHEEL_VENV)/bin/pip wheel --no-build-isolation --no-deps --no-index -q -w $(BUILD)-wheel/raw . \
	  -C cmake.define.DFLASH_GIT_COMMIT=$$commit -C cmake.define.DFLASH_TESTED_TORCH=$${torch:-unknown} \
	  $(if $(CCACHE),-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE))
	@PATH="$(CURDIR)/$(WHEEL_VENV)/bin:$$PATH" $(WHEEL_VENV)/bin/auditwheel repair --plat auto -w dist $(BUILD)-wheel/raw/dflash_launch-*.whl
	@ls -l dist/dflash_launch-*.whl

# Install the wheel into a fresh venv with --no-index and run from the installed copy only (tests/test_wheel.py,
# skipped by `make test`). Called by .ci/run after `make test` (the wheel's build is a second full compile).
test-wheel: gpu-check-bundle
	DFLASH_WHEEL=$$(ls dist/dflash_launch-*.whl) DFLASH_GPU_BUNDLE=dist/dflash-gpu-check.tar.gz \
	  $(PY) -m pytest -q tests/test_wheel.py

# What someone with a CUDA machine runs (docs/gpu.md): the wheel + scripts/gpu-check + the 8-GPU config (check (e))
# in one small tarball.
gpu-check-bundle: wheel
	@rm -rf dist/dflash-gpu-check && mkdir -p dist/dflash-gpu-check
	@cp dist/dflash_launch-*.whl scripts/gpu-check configs/dflash-8gpu.toml dist/dflash-gpu-check/
	@tar -C dist -czf dist/dflash-gpu-check.tar.gz dflash-gpu-check
	@ls -l dist/dflash-gpu-check.tar.gz

clean:
	rm -rf $(BUILD) $(BUILD)-wheel dist
