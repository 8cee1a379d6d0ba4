#!/usr/bin/env bash
# The main job: set up, then train a tiny model with GRPO on the CPU demo task.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/grpo demo "$@"
