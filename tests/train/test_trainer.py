"""The training loop end to end on a tiny real model."""

from __future__ import annotations

import json
import math
import os
import types

import pytest
import torch
from helpers import make_config
from safetensors.torch import load_file

from grpo_core import config
from grpo_core.hookspecs import hookimpl
from grpo_core.loss.groups import micro_batches
from grpo_core.registry import registry
from grpo_core.trainer import train

METRICS = [
    "reward",
    "reward_std",
    "reward_within_group_std",
    "zero_std_frac",
    "kl",
    "entropy",
    "loss",
    "loss/policy",
    "clip_low_frac",
    "clip_high_frac",
    "grad_norm",
    "completion_len",
    "completion_len_max",
    "truncated_frac",
    "kl_coef",
    "time/generate",
    "time/reward",
    "time/train",
    "time/step",
    "samples",
]


# an untrained model never gets a sum right; "contains a digit" varies within groups
DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}


def constant_plugin():
    module = types.ModuleType("constant_reward_for_tests")

    @hookimpl
    def reward(register):
        register(
            "constant",
            lambda value=1.0: lambda p, c, **k: [value] * len(c),
            schema={"type": "object", "properties": {"value": {"type": "number", "default": 1.0}}},
        )

    module.reward = reward
    registry().add(module, "test-constant")


def weights(run_dir):
    return load_file(os.path.join(run_dir, "final", "model.safetensors"))


def run(tiny_model, addition_data, tmp_path, **sections):
    cfg = config.validate(make_config(tiny_model, addition_data, str(tmp_path / "run"), **sections))
    return cfg, train(cfg)


def test_three_steps_change_weights_and_write_metrics(tiny_model, addition_data, tmp_path):
    cfg, summary = run(
        tiny_model,
        addition_data,
        tmp_path,
        kl={"name": "fixed", "options": {"coef": 0.05}},
        reward=DIGIT,
        sampling={"group_size": 8, "max_new_tokens": 6},
    )
    run_dir = cfg["output"]["dir"]
    before, after = load_file(os.path.join(tiny_model, "model.safetensors")), weights(run_dir)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        for m in METRICS:
            assert isinstance(r[m], (int, float)) and math.isfinite(r[m]), (m, r.get(m))
        assert r["samples"] == 4 * 8 and r["kl_coef"] == 0.05
    assert rows[-1]["kl"] > 0  # the policy moved away from the reference
    assert any(r["reward_std"] > 0 for r in rows)
    assert summary["reference_model"] is True
    assert os.path.exists(os.path.join(run_dir, "samples.jsonl"))
    assert json.load(open(os.path.join(run_dir, "config.json")))["train"]["steps"] == 3
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, "final"))
    AutoTokenizer.from_pretrained(os.path.join(run_dir, "final"))


def test_equal_rewards_give_zero_gradient_and_no_nan(tiny_model, addition_data, tmp_path):
    constant_plugin()
    cfg, summary = run(
        tiny_model,
        addition_data,
        tmp_path,
        reward={"name": "constant"},
        train={"steps": 2, "prompts_per_step": 4, "micro_batch_groups": 2},
        optimizer={"lr": 1e-2, "weight_decay": 0.0},
    )
    assert summary["reference_model"] is False  # KL coefficient 0: no reference at all
    rows = [json.loads(line) for line in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    assert all(r["grad_norm"] == 0.0 and r["zero_std_frac"] == 1.0 for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows)
    before, after = (
        load_file(os.path.join(tiny_model, "model.safetensors")),
        weights(cfg["output"]["dir"]),
    )
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_micro_batches_hold_whole_groups():
    group = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 0, 2])  # rows of a group need not be adjacent
    seen = []
    for rows in micro_batches(group, 4, 3):
        groups = set(group[rows].tolist())
        for g in groups:  # every row of each group present in this micro-batch
            assert set(torch.nonzero(group == g).squeeze(1).tolist()) <= set(rows.tolist())
        seen += rows.tolist()
    assert sorted(seen) == list(range(10))


def test_micro_batching_does_not_change_the_update(tiny_model, addition_data, tmp_path):
    results = []
    for i, mb in enumerate((1, 4)):
        cfg, _ = run(
            tiny_model,
            addition_data,
            tmp_path / str(i),
            train={"steps": 2, "prompts_per_step": 4, "micro_batch_groups": mb},
            optimizer={"lr": 1e-3},
        )
        results.append(weights(cfg["output"]["dir"]))
    # gradients summed over 1 or 4 micro-batches (summation order, ~1e-7 relative), then two
    # AdamW updates of size <= lr = 1e-3 each: ~2e-10 in a weight; atol 1e-6 leaves room for
    # elements whose gradient is near Adam's eps. Same kernel on both sides (one process).
    for k in results[0]:
        torch.testing.assert_close(results[0][k], results[1][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("baseline", ["grpo", "rloo", "remax", "dr_grpo", "mixed", "reinforce_pp"])
def test_every_baseline_trains(tiny_model, addition_data, tmp_path, baseline):
    cfg, summary = run(
        tiny_model,
        addition_data,
        tmp_path,
        baseline={"name": baseline},
        train={"steps": 2, "prompts_per_step": 4},
    )
    rows = [json.loads(line) for line in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    assert len(rows) == 2
    assert (rows[0]["time/greedy"] > 0) == (baseline == "remax")


@pytest.mark.parametrize(
    "kl",
    [
        {"name": "fixed", "options": {"coef": 0.1}},
        {"name": "adaptive", "options": {"init_coef": 0.1}},
        {"name": "schedule", "options": {"start": 0.1, "steps": 2}},
    ],
)
@pytest.mark.parametrize("placement", ["loss", "reward"])
def test_every_kl_controller_and_placement_trains(
    tiny_model, addition_data, tmp_path, kl, placement
):
    cfg, summary = run(
        tiny_model,
        addition_data,
        tmp_path,
        kl={**kl, "placement": placement},
        reward=DIGIT,
        sampling={"group_size": 8, "max_new_tokens": 6},
        train={"steps": 2, "prompts_per_step": 4},
        optimizer={"lr": 1e-2},
    )
    rows = [json.loads(line) for line in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    assert summary["reference_model"]
    assert rows[-1]["kl"] > 0 and math.isfinite(rows[-1]["kl_coef"])
    if kl["name"] == "schedule":
        assert rows[-1]["kl_coef"] == pytest.approx(0.0)


def test_dynamic_groups_drop_and_resample(tiny_model, addition_data, tmp_path):
    cfg, _ = run(
        tiny_model,
        addition_data,
        tmp_path,
        train={"steps": 2, "prompts_per_step": 4},
        groups={"drop_zero_std": True, "resample_zero_std_max": 4},
    )
    rows = [json.loads(line) for line in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    assert all(r["extra_completions"] == 4 * round(r["extra_completions"] / 4) for r in rows)
    assert sum(r["extra_completions"] for r in rows) > 0  # near-chance model: flat groups
    assert all(r["samples"] == 16 + r["extra_completions"] for r in rows)
