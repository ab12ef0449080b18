# The two commands a fresh machine needs:
#   make demo   - set up, then run the whole DAG (tiny preset) on the bundled sample, on CPU
#   make test   - set up, then run the default test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export DS_ACCELERATOR := cpu
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test lint
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

demo: setup
	$(PY) -m flows.demo $(ARGS)

test: setup
	$(VENV)/bin/pytest $(ARGS)

lint: setup
	$(VENV)/bin/ruff check common pipelines model finetune training flows tests benchmarks
