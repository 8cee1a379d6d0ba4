"""The health monitor on real short trainings of the tiny model, one per pitfall of GRPO
training: the warning fires (with its advice) where the pitfall happens, and a healthy run
stays quiet."""

from __future__ import annotations

import json
import os
import statistics
import types
import zlib

import pytest
import torch
from helpers import make_config

from grpo_core import config
from grpo_core.hookspecs import Baseline, hookimpl
from grpo_core.observe.health import DEFAULTS, HACKING
from grpo_core.observe.pitfalls import halves
from grpo_core.registry import registry
from grpo_core.trainer import train

DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}


def register(kind: str, name: str, factory) -> None:
    module = types.ModuleType(f"health_{name}")
    setattr(module, kind, hookimpl(lambda register: register(name, factory), specname=kind))
    registry().add(module, f"test-health-{name}")


def run(tiny_model, data, tmp_path, steps=8, window=4, **sections):
    base = {
        "reward": DIGIT,
        "sampling": {"group_size": 4, "max_new_tokens": 4},
        "train": {"steps": steps, "prompts_per_step": 4, "seed": 2},
        "health": {"window": window},
    }
    for key, value in sections.items():
        base[key] = (
            {**base[key], **value}
            if isinstance(base.get(key), dict) and isinstance(value, dict) and key != "reward"
            else value
        )
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


def test_a_reward_that_is_zero_everywhere_is_caught_within_one_window(
    tiny_model, addition_data, tmp_path
):
    summary, rows, fired = run(
        tiny_model,
        addition_data,
        tmp_path,
        reward={"name": "format", "options": {"tags": ["x"]}},
        kl={"name": "fixed", "options": {"coef": 0.04}},
    )
    assert all(r["reward"] == 0 and r["solved_frac"] == 0 for r in rows)
    assert first(fired, "every completion got the same reward (0)") == 3
    assert first(fired, "check that the reward can be earned") == 3
    assert first(fired, "KL stayed below") is None  # the wrong advice for this run
    assert summary["health"][0].startswith("no_signal from step 3")


def test_equal_rewards_everywhere_from_the_start(tiny_model, addition_data, tmp_path):
    register("reward", "health_const", lambda: lambda p, c, **k: [0.5] * len(c))
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
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{b}=", "answer": "impossible"}) + "\n"
            for a in range(10)
            for b in range(10)
        )
    )
    weighted = {
        "name": "weighted",
        "options": {
            "components": [
                {
                    "name": "format",
                    "as": "teens",
                    "options": {"tags": [], "patterns": ["^1[0-9]$"]},
                    "weight": 0.5,
                },
                {"name": "math", "options": {"strict": True}, "weight": 1.0},
            ]
        },
    }
    _, rows, fired = run(
        warm_model,
        str(data),
        tmp_path,
        steps=16,
        reward=weighted,
        optimizer={"lr": 2e-3},
        sampling={"group_size": 8},
    )
    teens = [r["reward/teens"] for r in rows]
    assert sum(teens[-4:]) / 4 - sum(teens[:4]) / 4 > 0.1
    assert all(r["reward/math"] == 0 for r in rows)
    assert first(fired, "reward/teens rose") is not None
    assert first(fired, "gate teens on math") is not None


def test_entropy_collapse_before_the_task_is_solved(tiny_model, addition_data, tmp_path):
    _, rows, fired = run(
        tiny_model,
        addition_data,
        tmp_path,
        steps=10,
        objective={"name": "grpo", "entropy_coef": -2.0},
        optimizer={"lr": 5e-2},
    )
    assert rows[-1]["entropy"] < 0.05 and rows[-1]["solved_frac"] < 0.5
    assert first(fired, "entropy fell") is not None


def test_kl_running_away(tiny_model, addition_data, tmp_path):
    _, rows, fired = run(
        tiny_model,
        addition_data,
        tmp_path,
        steps=10,
        kl={"name": "fixed", "options": {"coef": 1e-4}},
        objective={"name": "grpo", "entropy_coef": -2.0},
        optimizer={"lr": 5e-2},
    )
    assert max(r["kl"] for r in rows) > 1
    assert first(fired, "the policy is running away from the reference") is not None


def test_an_adaptive_kl_controller_that_cannot_reach_its_target(
    warm_model, addition_data, tmp_path
):
    _, rows, fired = run(
        warm_model,
        addition_data,
        tmp_path,
        steps=12,
        window=6,
        kl={"name": "adaptive", "options": {"init_coef": 0.5, "target": 0.05, "horizon": 20}},
        optimizer={"lr": 3e-3},
        sampling={"group_size": 8},
    )
    assert rows[-1]["kl_coef"] > 4 * rows[0]["kl_coef"]
    assert sum(r["kl"] for r in rows[1:]) / 11 > 0.05  # above its target all along
    assert first(fired, "the controller cannot reach its target") is not None


def test_peak_memory_near_the_limit(tiny_model, addition_data, tmp_path):
    _, rows, fired = run(
        tiny_model, addition_data, tmp_path, steps=2, health={"memory_limit_mb": 50}
    )
    assert rows[0]["memory_frac"] > 1 and rows[0]["peak_memory_mb"] > 50
    assert first(fired, "of the 50 MiB available") == 0


def test_non_finite_updates(tiny_model, addition_data, tmp_path):
    class Inf(Baseline):
        def advantages(self, rewards, greedy_rewards=None):
            return torch.full_like(rewards, float("inf"))

    register("baseline", "health_inf", Inf)
    _, _, fired = run(
        tiny_model,
        addition_data,
        tmp_path,
        steps=2,
        baseline={"name": "health_inf"},
        train={"max_nonfinite_steps": 5},
    )
    assert first(fired, "non-finite values: loss, skipped updates") == 0


@pytest.mark.parametrize("objective", ["grpo", "cispo"])
def test_a_healthy_run_stays_quiet(warm_model, addition_data, tmp_path, objective):
    answers_in_the_teens = {"name": "format", "options": {"tags": [], "patterns": ["^1[0-9]$"]}}
    summary, rows, fired = run(
        warm_model,
        addition_data,
        tmp_path,
        steps=12,
        reward=answers_in_the_teens,
        objective={"name": objective},
        kl={"name": "fixed", "options": {"coef": 0.04}},
        optimizer={"lr": 1e-4},
        sampling={"group_size": 8},
    )
    assert fired == {} and summary["health"] == [], fired
    assert all(r["zero_std_frac"] < 1 for r in rows) and rows[-1]["kl"] > 0


# --- the article's pitfalls on the demo's model (grpo demo), 8 prompts x 8 per step ---------


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    """The demo's model and data (its warm start included), built once for this module."""
    from grpo_core.cli.demo import prepare

    out = str(tmp_path_factory.mktemp("demo"))
    prepare(out)
    return out


def demo_run(demo: str, tmp_path, steps: int, window: int, **sections):
    """The demo's own config (lr, KL 0, reward), made small: 8 prompts x G=8, its lr held
    constant (the cosine schedule over a few steps would be a different run each time)."""
    from grpo_core.cli.demo import demo_config

    cfg = demo_config(demo, steps, "grpo")
    cfg["optimizer"]["lr_schedule"] = "constant"
    cfg["train"].update(prompts_per_step=8, micro_batch_groups=8)
    cfg["sampling"]["group_size"] = 8
    cfg["runtime"]["threads"] = 1
    cfg["output"].update(dir=str(tmp_path / "run"), progress=False, samples_every=0)
    cfg["health"]["window"] = window
    for key, value in sections.items():
        cfg[key] = (
            {**cfg[key], **value} if isinstance(cfg.get(key), dict) and key != "reward" else value
        )
    summary = train(config.validate(cfg))
    rows = [json.loads(x) for x in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    return summary, rows, [(r["step"], w) for r in rows for w in r.get("health") or []]


def said(warnings: list, text: str) -> list[int]:
    """The steps at which a warning containing ``text`` was shown."""
    return [s for s, w in warnings if text in w]


def test_the_demo_run_stays_quiet(demo, tmp_path):
    """No false alarm on the demo's own run. Which 30-step trajectory it takes depends on the
    machine's arithmetic (float32 sums in another order sample other tokens): on one machine
    its groups keep their signal throughout, on another two-thirds of them are flat for a
    window. So every warning must be one its own window justifies, and nothing else."""
    summary, rows, warnings = demo_run(demo, tmp_path, steps=30, window=10)
    assert "kl" not in rows[0] and "kl_last" not in rows[0]  # KL 0: no reference, no KL
    for step, text in warnings:
        assert "groups have identical, unsolved rewards" in text, text
        window = rows[step - 9 : step + 1]
        r0, r1 = halves([r["reward"] for r in window])
        flat = [r["zero_std_frac"] - r["solved_frac"] for r in window]
        assert statistics.fmean(flat) > DEFAULTS["zero_std_frac"], (step, flat)
        assert r1 - r0 <= DEFAULTS["reward_flat"], (step, r0, r1)
    assert all(h.startswith("zero_std") for h in summary["health"])
    assert bool(summary["health"]) == bool(warnings)


def test_a_farmed_part_of_the_reward_at_correctness_expense(demo, tmp_path):
    farmed = {
        "name": "weighted",
        "options": {
            "components": [
                {
                    "name": "format",
                    "as": "farm",
                    "options": {"tags": [], "patterns": ["^0"]},
                    "weight": 1.0,
                },
                {"name": "math", "options": {"strict": True}, "weight": 0.5},
            ]
        },
    }
    _, rows, warnings = demo_run(demo, tmp_path, steps=10, window=8, reward=farmed)
    assert rows[-1]["reward/farm"] > rows[0]["reward/farm"] + 0.2
    # once, as soon as a window (8 steps) shows the total rising by 0.1 while math falls by
    # 0.05 to under half. Whether and when math falls that far in 10 steps moves with the
    # machine's arithmetic (it did by step 8-9 where this test was written; on an AVX2 EPYC
    # math went 0.125 -> 0.08 -> 0.05 and the window never showed it), so the expected step
    # is read off the run's own metrics; the finding itself: test_health.py
    shown = []
    for end in range(8, len(rows) + 1):
        r0, r1 = halves([r["reward"] for r in rows[end - 8 : end]])
        d0, d1 = halves([r["reward/math"] for r in rows[end - 8 : end]])
        if r1 - r0 > DEFAULTS["hack_rise"] and d0 - d1 > DEFAULTS["hack_fall"] and d1 < 0.5 * d0:
            shown.append(end - 1)
    fell = said(warnings, "while reward/math fell")
    assert fell == shown[:1], (fell, shown)
    assert (
        said(
            warnings,
            "make farm require math (the component's `requires`), or raise math's weight (now 0.5)",
        )
        == fell
    )


def test_one_part_at_its_best_while_the_gated_one_never_scores(demo, tmp_path):
    data = tmp_path / "d.jsonl"  # golds no completion can match: math stays at 0
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{b}=", "answer": "impossible"}) + "\n"
            for a in range(10)
            for b in range(10)
        )
    )
    gated = {
        "name": "weighted",
        "options": {
            "components": [
                {
                    "name": "format",
                    "as": "digits",
                    "options": {"tags": [], "patterns": ["[0-9]"]},
                    "weight": 0.5,
                },
                {"name": "math", "options": {"strict": True}, "requires": ["digits"]},
            ]
        },
    }
    _, rows, warnings = demo_run(
        demo,
        tmp_path,
        steps=4,
        window=4,
        reward=gated,
        data={"path": str(data)},
        sampling={"max_new_tokens": 2},
    )
    assert all(r["reward/math"] == 0 and r["reward/digits"] > 0.95 for r in rows)
    assert said(
        warnings,
        "reward/digits is at its best (1 of 1) for 4 steps while "
        "reward/math (gated on digits) stayed at 0",
    ) == [3]
    assert said(warnings, "a larger sampling.max_new_tokens will not help") == [3]
    assert not said(warnings, "raise max_new_tokens")


def test_length_rising_with_a_reward_that_pays_for_it(demo, tmp_path):
    _, rows, warnings = demo_run(
        demo,
        tmp_path,
        steps=8,
        window=8,
        reward={"name": "length", "options": {"target": 8}},
        sampling={"max_new_tokens": 10},
    )
    assert rows[-1]["completion_len"] > 2 * rows[0]["completion_len"]
    assert said(warnings, "completion length rose") == [7]
    assert said(
        warnings, "while the reward is being gamed (length_hacking): fix the reward first"
    ) == [7]
    assert not said(warnings, "raise max_new_tokens")


def test_a_reward_that_pays_length_is_found_at_any_window_and_stays_the_finding(demo, tmp_path):
    """Length paid (a pull towards 8 tokens) beside math: the policy lengthens its answers
    to the budget of 10 and math falls to 0 within the first 8 steps. At the default window
    and at twice it, the same hacking findings from the same step, in force at the end, and
    never the budget, the learning rate or the temperature blamed for what follows."""
    paid = {
        "name": "weighted",
        "options": {
            "components": [
                {"name": "length", "options": {"target": 8}, "weight": 1.0},
                {"name": "math", "options": {"strict": True}, "weight": 1.0},
            ]
        },
    }
    found = {}
    for window in (10, 20):
        summary, rows, warnings = demo_run(
            demo,
            tmp_path / str(window),
            steps=20,
            window=window,
            reward=paid,
            sampling={"max_new_tokens": 10},
        )
        assert rows[-1]["completion_len"] > 2 * rows[0]["completion_len"]
        hacking = [h for h in summary["health"] if h.split()[0] in HACKING]
        assert hacking and all("in force at the end" in h for h in hacking), summary["health"]
        found[window] = sorted(h.split(" (")[0] for h in hacking)  # "<key> from step <n>"
        for wrong in ("raise max_new_tokens", "raise optimizer.lr", "raise sampling.temperature"):
            assert not said(warnings, wrong), (window, wrong)
    assert found[10] == found[20]


def test_a_kl_coefficient_that_holds_the_policy_still(demo, tmp_path):
    _, rows, warnings = demo_run(
        demo, tmp_path, steps=10, window=10, kl={"name": "fixed", "options": {"coef": 5.0}}
    )
    # the KL pulls the log-probs harder than the policy term (measured: 1.4-7.5x a step)
    ratio = sum(r["pull/kl"] for r in rows) / sum(r["pull/policy"] for r in rows)
    assert ratio > DEFAULTS["kl_dominance"]
    # held at the reference, the reward moves by sampling noise alone (a half-window of 320
    # completions at p ~ 0.12: 0.026 between halves, one standard deviation); the advice
    # comes when the window's rise is under 0.02, which such noise passes or not by the
    # machine's arithmetic
    r0, r1 = halves([r["reward"] for r in rows])
    assert abs(r1 - r0) < 0.1
    assert said(
        warnings, "the KL penalty holds the policy at the reference; lower kl.options.coef from 5"
    ) == ([9] if r1 - r0 < DEFAULTS["reward_rise"] else [])
    assert not said(warnings, "raise kl.options.coef")


def test_a_ppo_run_with_a_small_kl_is_not_told_to_lower_it(demo, tmp_path):
    """PPO whitens its advantages over the batch, so its policy term's value is ~0 (1e-7 on
    SmolLM2) beside a KL term of 0.01: the value-based check advised a coefficient 100x
    lower on every PPO run of the SmolLM2 study. The pulls say the policy term is the
    stronger one (measured: the KL's 0.01-0.04 of it)."""
    _, rows, warnings = demo_run(
        demo,
        tmp_path,
        steps=10,
        window=10,
        kl={"name": "fixed", "options": {"coef": 0.04}},
        critic={"name": "ppo"},
    )
    values = sum(r["loss/kl"] for r in rows) / sum(abs(r["loss/policy"]) for r in rows)
    assert values > 5  # what the value-based check weighed: the KL "dominated"
    ratio = sum(r["pull/kl"] for r in rows) / sum(r["pull/policy"] for r in rows)
    assert ratio < DEFAULTS["kl_dominance"]
    assert not said(warnings, "holds the policy at the reference")


#: advice that would be wrong for a run whose policy an update collapsed, or whose groups a
#: low temperature keeps flat: consequences named as causes
WRONG_AFTER_COLLAPSE = (
    "check that the reward can be earned",
    "raise max_new_tokens",
    "identical, unsolved",
    "raise sampling.temperature",
)


@pytest.mark.parametrize("lr", [0.05, 0.1, 0.5])
def test_a_learning_rate_that_collapses_the_policy_in_one_update(demo, tmp_path, lr):
    summary, rows, warnings = demo_run(demo, tmp_path, steps=8, window=4, optimizer={"lr": lr})
    # collapsed: after the overshoot the reward stays near 0 (a lucky completion or two in
    # 448 is left to the machine's arithmetic)
    assert rows[0]["reward"] > 0 and rows[0]["grad_norm"] > 0
    assert statistics.fmean(r["reward"] for r in rows[1:]) < rows[0]["reward"] / 4
    # at lr 0.1 the entropy moves less than 2x: the update's length (lr x grad norm clipped
    # at the demo's max_grad_norm 1) is the evidence
    assert said(
        warnings, f"right after one update (step 0, grad norm {rows[0]['grad_norm']:.3g}"
    ) == [2]
    assert said(warnings, f"lower optimizer.lr from {lr:g} (e.g. to {lr / 10:g})") == [2]
    for wrong in WRONG_AFTER_COLLAPSE:
        assert not said(warnings, wrong), wrong
    assert (
        [h for h in summary["health"] if h.startswith("lr_high")]
        == [h for h in summary["health"] if "in force at the end" in h]
        != []
    )


def test_flat_groups_from_a_low_temperature(demo, tmp_path):
    summary, rows, warnings = demo_run(
        demo, tmp_path, steps=8, window=4, sampling={"temperature": 0.01}
    )
    assert sum(r["zero_std_frac"] for r in rows) / len(rows) > 0.8
    assert said(
        warnings,
        "sampling.temperature is 0.01: a group's completions are near copies "
        "of one another, so their rewards are equal; raise "
        "sampling.temperature (e.g. to 1.0)",
    )
    assert not said(warnings, "check that the reward can be earned")
    # steps with grad norm 0 made no update, and the entropy at temperature 0.01 jumps by
    # itself: nothing is blamed on the learning rate
    assert not said(warnings, "lower optimizer.lr")
    assert not [h for h in summary["health"] if h.startswith("lr_high")]
    assert len(warnings) <= 4  # each said once


def test_clip_fractions_count_every_inner_iteration(demo, tmp_path):
    _, rows, _ = demo_run(
        demo,
        tmp_path,
        steps=3,
        window=10,
        train={"inner_iterations": 2},
        objective={"name": "grpo", "options": {"clip_low": 0.1, "clip_high": 0.1}},
    )
    # the first iteration's ratio is exactly 1: the clipping shows in the second
    assert all(r["clip_low_frac_last"] + r["clip_high_frac_last"] > 0 for r in rows)
    assert all(r["clip_low_frac"] == pytest.approx(r["clip_low_frac_last"] / 2) for r in rows)
    assert "kl" not in rows[0] and "kl_last" not in rows[0]
