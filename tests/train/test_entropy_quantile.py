"""objective.top_entropy_quantile in a real tiny run: it trains, and a small share gives a
different update than every token (the formula: tests/unit/test_entropy_mask.py)."""

from __future__ import annotations

import json
import math
import os

import torch
from helpers import make_config
from safetensors.torch import load_file

from grpo_core import config
from grpo_core.trainer import train


def _final(tiny_model, addition_data, out, quantile: float) -> dict:
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(out),
            reward={"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
            sampling={"group_size": 4, "max_new_tokens": 6},
            train={"steps": 1, "prompts_per_step": 4, "seed": 3},
            objective={"name": "grpo", "top_entropy_quantile": quantile},
            optimizer={"lr": 1e-2},
        )
    )
    train(cfg)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        record = json.loads(f.readline())
    assert math.isfinite(record["loss"]) and record["zero_std_frac"] < 1  # a learning signal
    return load_file(os.path.join(out, "final", "model.safetensors"))


def test_a_small_share_changes_the_update(tiny_model, addition_data, tmp_path):
    every = _final(tiny_model, addition_data, tmp_path / "all", 1.0)
    few = _final(tiny_model, addition_data, tmp_path / "few", 0.2)
    assert any(not torch.equal(every[k], few[k]) for k in every)
