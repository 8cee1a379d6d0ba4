#!/usr/bin/env bash
# Set up, then run the test suite (GPU-marked tests skip without CUDA, with the reason): the
# one-process tests, two at a time (pytest-xdist; most of them wait on subprocesses), then
# the multi-process ones (torchrun, gloo: each already uses two processes) one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -gt 0 ]; then  # a chosen subset
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -n 2 -m "not multiprocess"
echo "--- multi-process tests (torchrun, 2 CPU processes) ---"
exec .venv/bin/python -m pytest -q -m multiprocess
