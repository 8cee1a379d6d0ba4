"""What tests share besides fixtures: the repo's paths, a small complete config, the real
``grpo`` entry point in a subprocess, and the shared real data (skipped with a reason where a
clone lacks ../shared). Imported as ``helpers`` (pytest's ``pythonpath`` holds tests/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


def make_config(model_path: str, data_path: str, out: str, **sections) -> dict:
    """A small but complete config dict; ``sections`` are merged into its sections."""
    cfg = {
        "model": {"name_or_path": model_path},
        "data": {"path": data_path, "columns": ["answer"]},
        "sampling": {"group_size": 4, "max_new_tokens": 4},
        "train": {"steps": 3, "prompts_per_step": 4, "micro_batch_groups": 2, "seed": 0},
        "optimizer": {"lr": 1e-3},
        "runtime": {"device": "cpu"},
        "reward": {"name": "math"},
        "output": {"dir": out, "progress": False, "samples_every": 1},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def write_config(path, cfg: dict) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return str(path)


def run_grpo(*args, env=None, timeout=600, cwd=None) -> subprocess.CompletedProcess:
    """Run the real ``grpo`` entry point in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


def gsm8k_or_stand_in(tmp_path) -> list[str]:
    """``--set`` overrides for an example config that reads ../shared/data/gsm8k: none where
    the real data is there, else a two-row stand-in with the same fields, so the config's
    validation (schema, plugins, columns) is still tested in a clone without ../shared."""
    if os.path.exists(os.path.join(SHARED, "gsm8k")):
        return []
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
            for i in range(2)
        )
    )
    return ["--set", f"data.path={path}", "--set", f"eval.data={path}"]


def needs_shared(sub: str) -> str:
    path = os.path.join(SHARED, sub)
    if not os.path.exists(path):
        pytest.skip(f"{path} not present (real data lives in ../shared/data beside the repo)")
    return path
