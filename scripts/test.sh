#!/usr/bin/env bash
# Set up, then run the test suite (GPU-marked tests skip without CUDA, with the reason): the
# one-process tests, two at a time (pytest-xdist; most of them wait on subprocesses), then
# the multi-process ones (torchrun, gloo: each already uses two processes) one at a time,
# then DeepSpeed's: its extra is installed for that step (its CPU op compiles on first start).
# Every step runs even when an earlier one fails; the script ends with each step's result and
# exits non-zero naming the steps that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || { echo "FAILED: set-up (scripts/setup.sh)"; exit 1; }
if [ "$#" -gt 0 ]; then  # a chosen subset
  exec .venv/bin/python -m pytest -q "$@"
fi
results=()
failed=()

step() {  # step NAME COMMAND...: run it, record its result
  local name="$1"
  shift
  echo "--- $name ---"
  if "$@"; then
    results+=("passed: $name")
  else
    results+=("FAILED: $name (exit $?)")
    failed+=("$name")
  fi
}

deepspeed_tests() {
  .venv/bin/python -m pip install -q -e ".[deepspeed]" || return
  # installed, or this step fails here (never skipped)
  DS_ACCELERATOR=cpu .venv/bin/python -c "import deepspeed" || return
  DS_ACCELERATOR=cpu .venv/bin/python -m pytest -q -m deepspeed
}

step "one-process tests" .venv/bin/python -m pytest -q -n 2 -m "not multiprocess"
step "multi-process tests (torchrun, 2 CPU processes)" \
  .venv/bin/python -m pytest -q -m "multiprocess and not deepspeed"
step "DeepSpeed ZeRO 1-3 and its checkpoints (torchrun, 2 CPU processes)" deepspeed_tests

echo "--- results ---"
printf '%s\n' "${results[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "test.sh: ${#failed[@]} step(s) failed: $(IFS=';'; echo "${failed[*]}")"
  exit 1
fi
