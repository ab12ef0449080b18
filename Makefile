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

# Two test processes, a test file each at a time (fixtures built once per file): the suite's
# subprocess, Beam and single-threaded stretches leave a core idle when run one test at a time.
# --durations lists the slowest tests, to keep the suite within its time; --disable-warnings
# keeps the warnings summary from pushing that list out of a CI log's tail.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 --disable-warnings $(ARGS)

lint: setup
	$(VENV)/bin/ruff check common pipelines model finetune training flows tests benchmarks
