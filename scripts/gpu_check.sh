#!/usr/bin/env bash
# Five-minute check on a single-GPU machine with torch installed and no internet:
# GPU-marked tests, then a bf16 GRPO run of a random Qwen2.5-0.5B-shaped model (hf, and vLLM
# when importable), printing tokens/s and peak memory. Options: see --help.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec "$PY" -m grpo_core.cli.gpu_check "$@"
