# Two commands for a newcomer: `make demo` and `make test`. Both set up and build first.
SHELL := /bin/bash
BUILD ?= build
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc)

.PHONY: setup build test demo bench fuzz clean

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

demo: build
	$(BUILD)/bin/dflash-launch check configs/demo.toml

bench: build
	@echo "bench: see docs/benchmarks.md"

fuzz: setup
	scripts/fuzz

clean:
	rm -rf $(BUILD)
