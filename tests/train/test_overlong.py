"""Overlong handling: DAPO's soft overlong punishment against hand values, and truncated
completions left out of the loss (mask_truncated_completions) in a real tiny run."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import make_config
from safetensors.torch import load_file

from grpo_core import config
from grpo_core.config.sections import RewardOverlongSection
from grpo_core.reward.call import Rewards, overlong_penalty, with_overlong
from grpo_core.rollout import Rollout
from grpo_core.trainer import train


def test_overlong_penalty_by_hand():
    # L_max 10, L_cache 4: free up to 6 tokens, then -1/4 per token, -1 at 10 and past it
    lengths = torch.tensor([3, 6, 7, 8, 9, 10, 12])
    assert overlong_penalty(lengths, 10, 4).tolist() == [0, 0, -0.25, -0.5, -0.75, -1, -1]
    assert overlong_penalty(lengths, 10, 4, factor=0.5).tolist() == [
        0,
        0,
        -0.125,
        -0.25,
        -0.375,
        -0.5,
        -0.5,
    ]


def test_with_overlong_adds_the_penalty_and_logs_it():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    ro = Rollout(
        torch.zeros(1, 1, dtype=torch.long),
        torch.ones(1, 1),
        mask,
        mask,
        torch.zeros(3, 4),
        torch.tensor([False, False, True]),
        torch.zeros(3).long(),
    )
    scored = Rewards(torch.tensor([1.0, 0.0, float("nan")]))
    assert with_overlong(scored, ro, None, 4) is scored
    out = with_overlong(scored, ro, RewardOverlongSection(buffer=2, max_tokens=None, factor=1.0), 4)
    # lengths 2, 3, 4 with L_max 4 (the budget), L_cache 2: 0, -0.5, -1; a missing reward
    # stays missing
    assert out.rewards[:2].tolist() == [1.0, -0.5] and out.rewards[2].isnan()
    assert out.dimensions["overlong"] == [0.0, -0.5, -1.0]


def _run(tiny_model, addition_data, tmp_path, name, **objective):
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / name),
            reward={
                "name": "format",
                "options": {"tags": [], "patterns": ["[0-9]"]},
                "overlong": {"buffer": 1},
            },
            objective={"name": "grpo", **objective},
            sampling={"group_size": 4, "max_new_tokens": 2},
            optimizer={"lr": 1e-2},
            train={"steps": 2, "prompts_per_step": 2, "micro_batch_groups": 2, "seed": 0},
        )
    )
    train(cfg)
    rows = [json.loads(x) for x in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    return rows, load_file(os.path.join(cfg["output"]["dir"], "final", "model.safetensors"))


def test_truncated_completions_leave_the_loss(tiny_model, addition_data, tmp_path):
    # the untrained tiny model never stops within 2 tokens: every completion is truncated,
    # is 2 tokens long and so gets the whole overlong penalty (-1 at L_max = 2)
    rows, after = _run(
        tiny_model, addition_data, tmp_path, "masked", mask_truncated_completions=True
    )
    assert all(r["truncated_frac"] == 1.0 and r["reward/overlong"] == -1.0 for r in rows)
    assert all(r["loss"] == 0.0 and r["grad_norm"] == 0.0 for r in rows)
    before = load_file(os.path.join(tiny_model, "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was learnt
    rows, after = _run(tiny_model, addition_data, tmp_path, "kept")
    assert any(r["grad_norm"] > 0 for r in rows)
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("bad", [{"buffer": 0}, {"max_tokens": 8}])
def test_overlong_options_are_checked(tiny_model, addition_data, tmp_path, bad):
    with pytest.raises(config.ConfigError):
        config.validate(
            make_config(
                tiny_model,
                addition_data,
                str(tmp_path / "x"),
                reward={"name": "math", "overlong": bad},
            )
        )
