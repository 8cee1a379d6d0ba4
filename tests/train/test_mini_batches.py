"""Several optimizer updates per rollout (train.mini_batches, TRL's steps_per_generation):
the cut into runs of whole groups, the number of updates a real tiny run takes, and the
one-line refusal of a count that does not divide the step's prompts."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import make_config

from grpo_core import config, preflight
from grpo_core.errors import ConfigError
from grpo_core.loss.groups import mini_batches
from grpo_core.trainer import train


def test_mini_batches_are_runs_of_whole_groups():
    group = torch.tensor([0, 3, 1, 1, 2, 0, 3, 2])  # rows of a group need not be adjacent
    cut = mini_batches(group, 4, 2, 1)
    assert [[rows.tolist() for rows in mini] for mini in cut] == [
        [[0, 5], [2, 3]],  # groups 0 and 1, a micro-batch each
        [[4, 7], [1, 6]],  # groups 2 and 3
    ]
    assert [[rows.tolist() for rows in mini] for mini in mini_batches(group, 4, 1, 4)] == [
        [[0, 1, 2, 3, 4, 5, 6, 7]]
    ]


def _lr_after_first_step(tiny_model, addition_data, out, mini: int, iterations: int) -> float:
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(out),
            train={
                "steps": 2,
                "prompts_per_step": 4,
                "micro_batch_groups": 1,
                "mini_batches": mini,
                "inner_iterations": iterations,
            },
            optimizer={"lr": 1e-3, "warmup_steps": 8},
        )
    )
    train(cfg)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return json.loads(f.readline())["lr"]


@pytest.mark.parametrize(("mini", "iterations"), [(1, 1), (2, 1), (4, 2)])
def test_each_mini_batch_is_one_optimizer_update(
    tiny_model, addition_data, tmp_path, mini, iterations
):
    # linear warm-up over 8 updates: after the first step's mini x iterations updates the
    # learning rate is 1e-3 x updates / 8
    lr = _lr_after_first_step(tiny_model, addition_data, tmp_path, mini, iterations)
    assert lr == pytest.approx(1e-3 * mini * iterations / 8)


def test_a_count_that_does_not_divide_the_prompts_is_refused(tiny_model, addition_data, tmp_path):
    cfg = config.validate(
        make_config(tiny_model, addition_data, str(tmp_path), train={"mini_batches": 3})
    )
    with pytest.raises(ConfigError) as err:
        preflight.check(cfg)
    assert "train.mini_batches: 3 does not divide train.prompts_per_step (4)" in str(err.value)
