"""TRL's num_tokens (our tokens_seen: prompt and completion tokens so far, resumed runs too)
and clip_ratio/region_mean (clip_region_frac): by hand, and in a real tiny run."""

from __future__ import annotations

import json
import os

import torch
from helpers import make_config

from grpo_core import config
from grpo_core.observe.metrics import rollout_metrics
from grpo_core.observe.tracking import metric_name
from grpo_core.rollout import Rollout
from grpo_core.trainer import train


def test_step_tokens_count_each_completion_with_its_prompt():
    ro = Rollout(
        prompt_ids=torch.zeros(2, 3, dtype=torch.long),
        prompt_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),  # left-padded: 2 and 3 tokens
        completion_ids=torch.zeros(3, 3, dtype=torch.long),
        completion_mask=torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]]),
        logprobs=torch.zeros(3, 3),
        truncated=torch.tensor([False, False, True]),
        group=torch.tensor([0, 0, 1]),
    )
    rewards = torch.tensor([1.0, 0.0, 1.0])
    grid = torch.tensor([[1.0, 0.0], [1.0, float("nan")]])
    m = rollout_metrics(rewards, grid, torch.tensor([False, True]), ro, {}, 0, None, "cpu")
    # completions 2 + 1 + 3, their prompts 2 + 2 + 3
    assert m["step_tokens"] == 13


def test_a_run_counts_its_tokens_over_steps_and_a_resume(tiny_model, addition_data, tmp_path):
    out = str(tmp_path / "run")
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            out,
            output={"dir": out, "progress": False, "checkpoint_every": 1, "keep_last": 3},
        )
    )
    train(cfg)
    path = os.path.join(out, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    # 4 prompts x 4 completions: at least a token each, and a prompt of a few tokens
    assert all(r["step_tokens"] > 16 for r in rows)
    seen = [sum(r["step_tokens"] for r in rows[: i + 1]) for i in range(len(rows))]
    assert [r["tokens_seen"] for r in rows] == seen
    assert all(0 <= r["clip_region_frac"] <= 1 for r in rows)
    # a resume from step 2's checkpoint runs step 2 again and counts on from there
    train(cfg, resume=os.path.join(out, "checkpoints", "step-00000002"))
    again = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert [r["tokens_seen"] for r in again] == seen


def test_trl_names_of_the_new_metrics():
    assert metric_name("tokens_seen", "trl") == "num_tokens"
    assert metric_name("clip_region_frac", "trl_train") == "train/clip_ratio/region_mean"
