"""The health monitor on real short trainings of the tiny model, one per pitfall of GRPO
training: the warning fires (with its advice) where the pitfall happens, and a healthy run
stays quiet."""

from __future__ import annotations

import json
import os
import types
import zlib

import pytest
import torch
from helpers import make_config

from grpo_core import config
from grpo_core.hookspecs import Baseline, hookimpl
from grpo_core.registry import registry
from grpo_core.trainer import train

DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}


def register(kind: str, name: str, factory) -> None:
    module = types.ModuleType(f"health_{name}")
    setattr(module, kind, hookimpl(lambda register: register(name, factory), specname=kind))
    registry().add(module, f"test-health-{name}")


def run(tiny_model, data, tmp_path, steps=8, window=4, **sections):
    base = {"reward": DIGIT, "sampling": {"group_size": 4, "max_new_tokens": 4},
            "train": {"steps": steps, "prompts_per_step": 4, "seed": 2},
            "health": {"window": window}}
    for key, value in sections.items():
        base[key] = {**base[key], **value} if isinstance(base.get(key), dict) and \
            isinstance(value, dict) and key != "reward" else value
    cfg = config.validate(make_config(tiny_model, data, str(tmp_path / "run"), **base))
    summary = train(cfg)
    rows = [json.loads(x) for x in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    fired = {}
    for r in rows:
        for w in r.get("health") or []:
            fired.setdefault(w, r["step"])
    return summary, rows, fired


def first(fired: dict, text: str) -> int | None:
    steps = [s for w, s in fired.items() if text in w]
    return min(steps) if steps else None


def test_a_reward_that_is_zero_everywhere_is_caught_within_one_window(tiny_model, addition_data,
                                                                      tmp_path):
    summary, rows, fired = run(tiny_model, addition_data, tmp_path,
                               reward={"name": "format", "options": {"tags": ["x"]}},
                               kl={"name": "fixed", "options": {"coef": 0.04}})
    assert all(r["reward"] == 0 and r["solved_frac"] == 0 for r in rows)
    assert first(fired, "every completion got the same reward (0)") == 3
    assert first(fired, "check that the reward can be earned") == 3
    assert first(fired, "KL stayed below") is None  # the wrong advice for this run
    assert summary["health"][0].startswith("no_signal from step 3")


def test_equal_rewards_everywhere_from_the_start(tiny_model, addition_data, tmp_path):
    register("reward", "health_const", lambda: (lambda p, c, **k: [0.5] * len(c)))
    _, _, fired = run(tiny_model, addition_data, tmp_path, reward={"name": "health_const"})
    assert first(fired, "every completion got the same reward (0.5)") == 3


def test_rewards_that_differ_only_by_noise(tiny_model, addition_data, tmp_path):
    def noisy(p, c, **k):  # a reward model's rounding noise around one value
        return [1.0 + 1e-7 * (zlib.crc32(x.encode()) % 7) for x in c]

    register("reward", "health_noise", lambda: noisy)
    _, rows, fired = run(tiny_model, addition_data, tmp_path, reward={"name": "health_noise"})
    assert max(r["tiny_std_frac"] for r in rows) > 0.5
    assert first(fired, "differ only by noise") is not None
    assert first(fired, "dr_grpo, rloo") is not None


def test_completions_cut_at_the_token_budget(tiny_model, addition_data, tmp_path):
    _, rows, fired = run(tiny_model, addition_data, tmp_path, sampling={"max_new_tokens": 1})
    assert min(r["truncated_frac"] for r in rows) > 0.5
    assert first(fired, "hit sampling.max_new_tokens") == 3


def test_format_rising_while_correctness_stays_flat(warm_model, tmp_path):
    data = tmp_path / "d.jsonl"  # golds no completion can match: correctness stays at 0
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": "impossible"}) + "\n"
                            for a in range(10) for b in range(10)))
    weighted = {"name": "weighted", "options": {"components": [
        {"name": "format", "as": "teens", "options": {"tags": [], "patterns": ["^1[0-9]$"]},
         "weight": 0.5},
        {"name": "math", "options": {"strict": True}, "weight": 1.0}]}}
    _, rows, fired = run(warm_model, str(data), tmp_path, steps=16, reward=weighted,
                         optimizer={"lr": 2e-3}, sampling={"group_size": 8})
    teens = [r["reward/teens"] for r in rows]
    assert sum(teens[-4:]) / 4 - sum(teens[:4]) / 4 > 0.1
    assert all(r["reward/math"] == 0 for r in rows)
    assert first(fired, "reward/teens rose") is not None
    assert first(fired, "gate teens on math") is not None


def test_entropy_collapse_before_the_task_is_solved(tiny_model, addition_data, tmp_path):
    _, rows, fired = run(tiny_model, addition_data, tmp_path, steps=10,
                         objective={"name": "grpo", "entropy_coef": -2.0},
                         optimizer={"lr": 5e-2})
    assert rows[-1]["entropy"] < 0.05 and rows[-1]["solved_frac"] < 0.5
    assert first(fired, "entropy fell") is not None


def test_kl_running_away(tiny_model, addition_data, tmp_path):
    _, rows, fired = run(tiny_model, addition_data, tmp_path, steps=10,
                         kl={"name": "fixed", "options": {"coef": 1e-4}},
                         objective={"name": "grpo", "entropy_coef": -2.0},
                         optimizer={"lr": 5e-2})
    assert max(r["kl"] for r in rows) > 1
    assert first(fired, "the policy is running away from the reference") is not None


def test_an_adaptive_kl_controller_that_cannot_reach_its_target(warm_model, addition_data,
                                                                tmp_path):
    _, rows, fired = run(warm_model, addition_data, tmp_path, steps=12, window=6,
                         kl={"name": "adaptive", "options": {"init_coef": 0.5, "target": 0.05,
                                                             "horizon": 20}},
                         optimizer={"lr": 3e-3}, sampling={"group_size": 8})
    assert rows[-1]["kl_coef"] > 4 * rows[0]["kl_coef"]
    assert sum(r["kl"] for r in rows[1:]) / 11 > 0.05  # above its target all along
    assert first(fired, "the controller cannot reach its target") is not None


def test_peak_memory_near_the_limit(tiny_model, addition_data, tmp_path):
    _, rows, fired = run(tiny_model, addition_data, tmp_path, steps=2,
                         health={"memory_limit_mb": 50})
    assert rows[0]["memory_frac"] > 1 and rows[0]["peak_memory_mb"] > 50
    assert first(fired, "of the 50 MiB available") == 0


def test_non_finite_updates(tiny_model, addition_data, tmp_path):
    class Inf(Baseline):
        def advantages(self, rewards, greedy_rewards=None):
            return torch.full_like(rewards, float("inf"))

    register("baseline", "health_inf", Inf)
    _, _, fired = run(tiny_model, addition_data, tmp_path, steps=2,
                      baseline={"name": "health_inf"}, train={"max_nonfinite_steps": 5})
    assert first(fired, "non-finite values: loss, skipped updates") == 0


@pytest.mark.parametrize("objective", ["grpo", "cispo"])
def test_a_healthy_run_stays_quiet(warm_model, addition_data, tmp_path, objective):
    answers_in_the_teens = {"name": "format", "options": {"tags": [], "patterns": ["^1[0-9]$"]}}
    summary, rows, fired = run(warm_model, addition_data, tmp_path, steps=12,
                               reward=answers_in_the_teens, objective={"name": objective},
                               kl={"name": "fixed", "options": {"coef": 0.04}},
                               optimizer={"lr": 1e-4}, sampling={"group_size": 8})
    assert fired == {} and summary["health"] == [], fired
    assert all(r["zero_std_frac"] < 1 for r in rows) and rows[-1]["kl"] > 0
