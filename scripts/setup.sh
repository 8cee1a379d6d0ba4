#!/usr/bin/env bash
# Create .venv and install grpo-core with its test tools. Idempotent; safe to re-run.
# Without a working NVIDIA GPU, the CPU build of torch is installed first, so pip never pulls
# the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$VPY" -m pip install -q "torch>=2.4"
  else
    # PyTorch's CPU index; few retries, so a machine without it falls back fast to a local
    # wheel (pip's find-links) or, last, to PyPI's default build
    "$VPY" -m pip install -q --retries 1 --timeout 20 torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/cpu \
      || "$VPY" -m pip install -q torch==2.13.0
  fi
fi
"$VPY" -m pip install -q -e ".[dev]"
