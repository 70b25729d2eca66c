# Two commands for a newcomer: `make demo` and `make test`. Both set up and build first.
SHELL := /bin/bash
BUILD ?= build
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc)

.PHONY: setup build test demo demo-builtin bench fuzz clean

setup:
	@scripts/setup

# Configure once (torch's CMake config comes from the wheel in .venv), then build.
build: setup
	@if [[ ! -f $(BUILD)/build.ninja ]]; then \
	  cmake -S . -B $(BUILD) -G Ninja -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch;print(torch.utils.cmake_prefix_path)')" >/dev/null; \
	fi
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	PATH="$(CURDIR)/$(BUILD)/bin:$$PATH" $(VENV)/bin/python -m pytest -q tests

# The embedded default pipeline, end to end: 5 builtin LibTorch targets -> spool in /dev/shm -> 3 Python
# reference drafters (torch.compile, gated); then the report and runs/<run_id>/loss.png.
# `make demo-builtin`: the same with the builtin C++ drafters. DEMO=<config> runs another config.
DEMO ?= configs/demo.toml
demo: build
	@run_id=$$(basename $(DEMO) .toml)-$$(date +%Y%m%d-%H%M%S); \
	export PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PYTHONPATH="$(CURDIR)/python$${PYTHONPATH:+:$$PYTHONPATH}"; \
	$(BUILD)/bin/dflash-launch run $(DEMO) --run-id $$run_id; rc=$$?; \
	$(PY) -m dflash_launch.demo_report runs/$$run_id || rc=$${rc/#0/1}; \
	exit $$rc

demo-builtin:
	@$(MAKE) --no-print-directory demo DEMO=configs/demo-builtin.toml

# Every benchmark, each against its named peer in the same run; results into docs/benchmarks.md.
# Run it on a quiet machine (it takes ~10 minutes here; the compile section alone ~5).
bench: build
	python3 bench/cachelock/run_bench.py --python $(PY) --n 1000
	python3 bench/supervisor/run_bench.py --out docs/benchmarks.md
	$(PY) bench/compile/run_bench.py --out docs/benchmarks.md
	$(PY) bench/ddp/run_bench.py --out docs/benchmarks.md
	$(BUILD)/bin/spool_bench --mb 1 --frames 2000 --repeat 5

fuzz: setup
	scripts/fuzz

clean:
	rm -rf $(BUILD)
