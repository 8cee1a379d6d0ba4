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
from grpo_core.samplers import sizes
from grpo_core.trainer import train


def test_allocation_by_hand():
    # weights 1 / (std + mean std 0.25): 4, 4/3, 2, 2 (sum 28/3) -> quotas of 8: 24/7, 8/7,
    # 12/7, 12/7; floors 3, 1, 1, 1, the two left to the largest remainders (5/7, 5/7): the
    # flat group gets the most
    assert allocate(torch.tensor([0.0, 0.5, 0.25, 0.25]), 8).tolist() == [3, 1, 2, 2]
    # weights 1/0.3, 1/0.4, 1/0.5 = 10/3, 5/2, 2 (sum 47/6) -> quotas of 5: 100/47, 75/47,
    # 60/47 = 2.13, 1.60, 1.28; floors 2, 1, 1, the one left to the largest remainder (0.60)
    assert allocate(torch.tensor([0.1, 0.2, 0.3]), 5).tolist() == [2, 2, 1]
    # no group disagrees: shared equally, the remainder to the earlier prompts
    assert allocate(torch.zeros(3), 4).tolist() == [2, 1, 1]


def test_allocation_within_a_token_budget():
    # 6 completions' worth of tokens at the mean length 20: 120 tokens. Weights 6, 6, 3/2
    # (std 0, 0, 0.5; mean std 1/6) -> 160/3, 160/3, 40/3 tokens -> 5.33, 1.33, 1.33
    # completions of 10, 40, 10 tokens; floors 5, 1, 1 cost 100; the 20 left: prompt 0's
    # remainder first (10), prompt 1's does not fit (40), prompt 2's (10)
    n = allocate(torch.tensor([0.0, 0.0, 0.5]), 6, torch.tensor([10.0, 40.0, 10.0]))
    assert n.tolist() == [6, 1, 2]
    assert float((n * torch.tensor([10.0, 40.0, 10.0])).sum()) <= 120


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


def test_groups_get_their_own_sizes_within_the_budget(
    tiny_model, addition_data, tmp_path, monkeypatch
):
    calls = []  # what the sampler asked the allocation, and what it got

    def spy(std, budget, lengths=None):
        n = allocate(std, budget, lengths)
        calls.append((budget, lengths.clone(), n.clone()))
        return n

    monkeypatch.setattr(sizes, "allocate", spy)
    out = tmp_path / "run"
    train(run_cfg(tiny_model, addition_data, out, adaptive_first=2))
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    samples = [json.loads(x) for x in open(os.path.join(out, "samples.jsonl"))]
    sizes_seen = Counter((s["step"], s["group"]) for s in samples)
    assert len(calls) == len(rows) == 2
    for step, (r, (budget, lengths, n)) in enumerate(zip(rows, calls)):
        # P (G - G0) = 4 x 2 more completions' worth of tokens at the first samples' lengths
        assert budget == 8 and lengths.shape == (4,) and bool((lengths >= 1).all())
        assert float((n * lengths).sum()) <= budget * float(lengths.mean()) + 1e-9
        assert r["extra_completions"] == int(n.sum()) and r["samples"] == 8 + int(n.sum())
        # each group samples.jsonl shows (the first few) holds its first 2 and its share
        shown = [p for p in range(4) if (step, p) in sizes_seen]
        assert shown and all(sizes_seen[(step, p)] == 2 + int(n[p]) for p in shown)
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
