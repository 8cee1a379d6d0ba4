"""Std-driven group sizes: the allocation rule against hand values, and a real tiny run that
spends exactly the fixed-G budget with groups of their own sizes."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch
from helpers import make_config

from grpo_core import config
from grpo_core.errors import UserError
from grpo_core.loss.groups import allocate
from grpo_core.trainer import train


def test_allocation_by_hand():
    # shares 0, 1/2, 1/4, 1/4 of 8
    assert allocate(torch.tensor([0.0, 0.5, 0.25, 0.25]), 8).tolist() == [0, 4, 2, 2]
    # quotas 5/6, 5/3, 5/2: floors 0, 1, 2, the two left go to the largest remainders
    # (5/6 and 2/3), so 1, 2, 2
    assert allocate(torch.tensor([0.1, 0.2, 0.3]), 5).tolist() == [1, 2, 2]
    # no group disagrees: shared equally, the remainder to the earlier prompts
    assert allocate(torch.zeros(3), 4).tolist() == [2, 1, 1]


def run_cfg(model, data, out, **groups):
    return config.validate(
        make_config(
            model,
            data,
            str(out),
            reward={"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
            groups=groups,
            sampling={"group_size": 4, "max_new_tokens": 6},
            train={"steps": 2, "prompts_per_step": 4, "micro_batch_groups": 2, "seed": 3},
            optimizer={"lr": 1e-2},
            runtime={"device": "cpu", "threads": 1},
            output={"dir": str(out), "progress": False, "samples_every": 1, "tensorboard": "off"},
        )
    )


def test_groups_get_their_own_sizes_within_the_budget(tiny_model, addition_data, tmp_path):
    out = tmp_path / "run"
    train(run_cfg(tiny_model, addition_data, out, adaptive_first=2))
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    assert all(r["samples"] == 16 and r["extra_completions"] == 8 for r in rows)  # P x G
    samples = [json.loads(x) for x in open(os.path.join(out, "samples.jsonl"))]
    sizes = Counter((s["step"], s["group"]) for s in samples)
    assert all(n >= 2 for n in sizes.values())
    for s in samples:  # GRPO's advantages within each group of its own size
        group = [x["reward"] for x in samples if (x["step"], x["group"]) == (s["step"], s["group"])]
        t = torch.tensor(group)
        want = 0.0 if t.std() == 0 else float((s["reward"] - t.mean()) / (t.std() + 1e-6))
        assert s["advantage"] == pytest.approx(want, abs=1e-5)


def test_refused_beside_dynamic_sampling_and_at_full_size(tiny_model, addition_data, tmp_path):
    with pytest.raises(UserError, match="adaptive_first: 4 leaves no completions"):
        train(run_cfg(tiny_model, addition_data, tmp_path / "a", adaptive_first=4))
    with pytest.raises(UserError, match="groups.dynamic_sampling"):
        train(
            run_cfg(
                tiny_model, addition_data, tmp_path / "b", adaptive_first=2, dynamic_sampling=True
            )
        )
