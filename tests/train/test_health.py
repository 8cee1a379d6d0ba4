"""The health monitor on synthetic metric streams: each signature, and quiet when healthy."""

from __future__ import annotations

import math

import pytest

from grpo_core.observe.health import HealthMonitor, _moved
from grpo_core.observe.metrics import update_metrics
from grpo_core.observe.pitfalls import suggest


def healthy(step: int) -> dict:
    return {
        "step": step,
        "reward": 0.2 + 0.01 * step,
        "zero_std_frac": 0.1,
        "solved_frac": 0.05,
        "kl": 0.01 + 0.0001 * step,
        "kl_coef": 0.04,
        "entropy": 1.2 - 0.002 * step,
        "grad_norm": 1.0 + 0.05 * (step % 3),
        "completion_len": 100 + step * 0.1,
        "truncated_frac": 0.02,
        "loss": 0.01,
        "skipped_updates": 0,
    }


def stream(n: int = 30, **changes) -> list[str]:
    """Run ``n`` steps where each key in ``changes`` is a function of the step."""
    mon, out = HealthMonitor(window=10), []
    for s in range(n):
        r = healthy(s)
        for k, f in changes.items():
            r[k] = f(s)
        out += mon.observe(r)
    return out


def test_quiet_on_a_healthy_run():
    assert stream(60) == []


def fired(warnings: list[str], text: str) -> bool:
    return any(text in w for w in warnings)


def test_zero_std_groups():
    w = stream(reward=lambda s: 0.2, zero_std_frac=lambda s: 0.8)
    assert fired(w, "identical, unsolved rewards") and fired(w, "sampling.temperature")


def test_solved_groups_are_not_a_problem():
    w = stream(
        reward=lambda s: 0.95,
        zero_std_frac=lambda s: 0.9,
        solved_frac=lambda s: 0.85,
        entropy=lambda s: 0.01,
    )
    assert not fired(w, "identical") and not fired(w, "entropy fell")


def test_kl_too_small():
    w = stream(kl=lambda s: 0.0002)
    assert fired(w, "KL stayed below 0.001") and fired(w, "lower kl.options.coef")


def test_kl_exploding_and_growing():
    assert fired(stream(kl=lambda s: 12.0), "KL is 12")
    w = stream(kl=lambda s: 0.005 * 1.25**s)
    # at step 19, steps 10-14 against 15-19: 1.25^5 = 3.05x, from
    # 0.005 * 1.25^10 * mean(1.25^0..4) = 0.005 * 9.3132 * 1.64141 = 0.0764
    assert w[0].startswith("KL grew 3.1x (0.0764 -> 0.233) in 10 steps")


def test_kl_rising_from_zero_is_not_growth():
    # every run starts at KL 0; growth is judged only after a window, from a measurable base
    assert not fired(stream(12, kl=lambda s: 0.3 * (1 - 0.5**s)), "KL grew")
    assert not fired(stream(40, kl=lambda s: min(0.004 * s, 0.3)), "KL grew")


def test_kl_advice_takes_the_coefficient_into_account():
    mon = HealthMonitor(window=10, settings={"lr": 0.05, "kl_option": "kl.options.coef"})
    large = mon.observe({**healthy(0), "kl": 3.0, "kl_coef": 5.0})
    assert large == [
        "KL is 3: the policy is running away from the reference; the KL "
        "coefficient is already 5, so lower optimizer.lr from 0.05 (e.g. to 0.01) "
        "rather than raising it"
    ]
    small = HealthMonitor(window=10, settings={"lr": 1e-3, "kl_option": "kl.options.coef"})
    w = small.observe({**healthy(0), "kl": 3.0, "kl_coef": 0.04})
    assert w == [
        "KL is 3: the policy is running away from the reference; raise "
        "kl.options.coef from 0.04 (e.g. to 0.1) or lower optimizer.lr from 0.001 "
        "(e.g. to 0.0003)"
    ]


def test_entropy_collapse():
    w = stream(entropy=lambda s: max(1.2 - 0.1 * s, 0.01))
    assert fired(w, "entropy fell") and fired(w, "clip_high")


def test_grad_norm_spike():
    w = stream(grad_norm=lambda s: 50.0 if s == 20 else 1.0)
    assert fired(w, "grad norm 50 is over 10x")


def test_reward_flat():
    w = stream(reward=lambda s: 0.4)
    assert fired(w, "reward has not moved")


def test_length_running_away():
    w = stream(completion_len=lambda s: 100 * 1.1**s, truncated_frac=lambda s: 0.4)
    assert fired(w, "reward hacking by length")


def test_nan():
    w = stream(loss=lambda s: math.nan if s == 5 else 0.1)
    assert fired(w, "non-finite values: loss")


def test_a_warning_repeats_only_when_its_figure_moves():
    mon = HealthMonitor(window=5)
    out = []
    for s in range(200):  # the same figure all along: said once
        out += mon.observe({**healthy(s), "kl": 50.0 + 0.1 * (s % 2)})
    assert sum("KL is 50" in w for w in out) == 1
    assert mon.summary()[0].startswith("kl_high from step 0 (200 steps)")
    for s in range(200, 203):  # moved by more than half: said again, once
        out += mon.observe({**healthy(s), "kl": 80.0})
    assert [w[:8] for w in out] == ["KL is 50", "KL is 80"]
    quick = HealthMonitor(window=5)
    shown = [quick.observe({**healthy(s), "kl": 2.0 * 2**s}) for s in range(8)]
    assert [bool(w) for w in shown] == [True] + [False] * 4 + [True] + [False] * 2  # a window


def test_moved():
    assert not _moved(0.4, 0.59, 0.5) and _moved(0.4, 0.61, 0.5) and _moved(0.4, 0.19, 0.5)
    assert _moved(0.0, 0.1, 0.5) and not _moved(0.0, 0.0, 0.5)


def test_kl_term_dominating_with_a_flat_reward():
    mon = HealthMonitor(window=10, settings={"kl_option": "kl.options.coef"})
    out = []
    for s in range(10):  # the KL pulls the log-probs 2.5x as hard as the policy term
        out += mon.observe(
            {
                **healthy(s),
                "reward": 0.16 + 0.01 * (s % 2),
                "kl_coef": 5.0,
                "pull/kl": 0.5,
                "pull/policy": 0.2,
            }
        )
    assert out == [
        "the KL term pulls the log-probs 2.5x as hard as the policy term (gradient norms "
        "0.5 vs 0.2) and the reward stayed flat (0.164 -> 0.166) for 10 steps: the KL penalty "
        "holds the policy at the reference; lower kl.options.coef from 5 (e.g. to 0.2)"
    ]  # 5 x 0.1 / 2.5: the KL's pull brought to a tenth of the policy's
    rising = stream(
        kl_coef=lambda s: 5.0, **{"pull/kl": lambda s: 0.5, "pull/policy": lambda s: 0.2}
    )
    assert not fired(rising, "KL term")  # the healthy stream's reward rises 0.05 a window


def test_a_policy_term_near_zero_in_value_is_not_held_by_a_small_kl():
    """PPO's whitened advantages: the policy term's value ~1e-7 beside a KL term of 0.015
    (the SmolLM2 PPO runs' records, where the value-based check said "lower the coefficient
    100x"), but the policy pulls the log-probs 40x as hard as the KL: no advice."""
    w = stream(
        10,
        reward=lambda s: 0.65,
        kl_coef=lambda s: 0.04,
        **{
            "loss/policy": lambda s: 1e-7 * (-1) ** s,
            "loss/kl": lambda s: 0.015,
            "pull/policy": lambda s: 0.6,
            "pull/kl": lambda s: 0.015,
        },
    )
    assert not fired(w, "KL term") and not fired(w, "holds the policy")


def test_a_part_of_the_reward_falling_while_the_total_rises():
    settings = {
        "components": {
            "farm": {"weight": 1.0, "requires": [], "max": 1.0},
            "math": {"weight": 0.5, "requires": [], "max": 1.0},
        }
    }
    mon, out = HealthMonitor(window=4, settings=settings), []
    for s, (farm, math_) in enumerate([(0, 0.2), (0, 0.2), (0.5, 0.1), (0.9, 0.0)]):
        out += mon.observe(
            {**healthy(s), "reward": farm + 0.5 * math_, "reward/farm": farm, "reward/math": math_}
        )
    assert out == [
        "the reward rose 0.1 -> 0.725 in 4 steps while reward/math fell 0.2 -> "
        "0.05: the policy earns the other parts of the reward at math's expense "
        "(reward hacking); make farm require math (the component's `requires`), or "
        "raise math's weight (now 0.5)"
    ]


def test_one_part_saturated_while_a_gated_one_stays_at_zero():
    settings = {
        "components": {
            "digits": {"weight": 0.5, "requires": [], "max": 1.0},
            "math": {"weight": 1.0, "requires": ["digits"], "max": 1.0},
        }
    }
    mon, out = HealthMonitor(window=4, settings=settings), []
    for s in range(4):
        out += mon.observe(
            {
                **healthy(s),
                "reward": 0.5,
                "reward/digits": 1.0,
                "reward/math": 0.0,
                "truncated_frac": 0.8,
            }
        )
    assert [w for w in out if w.startswith("reward/digits")] == [
        (
            "reward/digits is at its best (1 of 1) for 4 steps while reward/math "
            "(gated on digits) stayed at 0: the policy has learned digits alone "
            "(reward hacking), and digits no longer tells completions apart; lower "
            "digits's weight (now 0.5) or make it require math, and check that math "
            "can be earned at all; a larger sampling.max_new_tokens will not help"
        )
    ]
    assert fired(
        out,
        "80% of completions hit sampling.max_new_tokens while the reward is "
        "being gamed (saturated): fix the reward first",
    )
    assert not fired(out, "raise max_new_tokens")


def test_length_rising_with_the_reward():
    w = stream(
        completion_len=lambda s: 100 * 1.1**s,
        reward=lambda s: 0.1 + 0.05 * s,
        truncated_frac=lambda s: 0.0,
    )
    # judged on 8 steps at the window of 10 (health.hack_steps), as soon as there are 8:
    # steps 0-3 against 4-7: 100 * mean(1.1^0..3) = 116 -> 170 tokens, reward 0.175 -> 0.375
    assert w[0] == (
        "completion length rose 116 -> 170 tokens in 8 steps with the reward (0.175 "
        "-> 0.375): the reward may be paying for length (reward hacking); read "
        "samples.txt, and add a length penalty (reward `length`) or use "
        "objective.aggregation: seq_mean_token_sum_norm"
    )


def test_one_update_that_collapses_the_reward():
    mon, out = HealthMonitor(window=6, settings={"lr": 0.05}), []
    for s in range(8):
        r = {
            **healthy(s),
            "reward": 0.3 if s < 3 else 0.0,
            "entropy": 1.0 if s < 3 else 4.0,
            "zero_std_frac": 0.2 if s < 3 else 1.0,
            "truncated_frac": 0.0 if s < 3 else 1.0,
        }
        out += mon.observe(r)
    assert out == [
        # a step of lr x grad norm: 0.05 x 1.1 (no clipping configured)
        "the reward fell 0.3 -> 0 right after one update (step 2, grad norm 1.1, a step of 0.055) "
        "that changed the entropy 1 -> 4: the learning rate is too high and the "
        "update overshot; lower optimizer.lr from 0.05 (e.g. to 0.005)"
    ]
    # the data and the token budget are not blamed for what followed
    assert set(mon.counts) == {"lr_high"}


def test_a_low_temperature_is_named_as_the_cause_of_flat_groups():
    mon, out = HealthMonitor(window=4, settings={"temperature": 0.01}), []
    for s in range(8):
        out += mon.observe(
            {
                **healthy(s),
                "reward": 0.0,
                "zero_std_frac": 1.0,
                "solved_frac": 0.0,
                "entropy": 1e-5 * (s + 1),
            }
        )
    assert fired(
        out,
        "every completion got the same reward (0) for 4 steps, so every advantage "
        "is 0 and nothing is learned: sampling.temperature is 0.01: a group's "
        "completions are near copies of one another, so their rewards are equal; "
        "raise sampling.temperature (e.g. to 1.0)",
    )
    assert not fired(out, "check that the reward can be earned")
    assert sum("entropy is" in w for w in out) == 1  # the temperature's figure does not move


def test_kl_oscillating():
    w = stream(40, kl=lambda s: 0.05 if s % 2 else 0.4)
    assert fired(w, "KL swings up and down (0.05 to 0.4)")
    assert not fired(stream(40, kl=lambda s: 0.05 + 0.001 * (s % 2)), "swings")  # small ripple


def test_loss_oscillating_with_growing_swings():
    w = stream(40, loss=lambda s: (-1) ** s * 0.01 * 1.3**s)
    assert fired(w, "the loss flips sign with growing swings")
    assert not fired(stream(40, loss=lambda s: (-1) ** s * 0.01), "flips sign")


def test_update_metrics_average_every_inner_iteration():
    first = {
        "tokens": 10.0,
        "kl": 0.0,
        "entropy": 20.0,
        "loss/policy": -0.1,
        "loss/kl": 0.0,
        "count/clip_low": 0.0,
        "count/clip_high": 0.0,
    }
    second = {
        "tokens": 10.0,
        "kl": 2.0,
        "entropy": 16.0,
        "loss/policy": -0.3,
        "loss/kl": 0.02,
        "count/clip_low": 1.0,
        "count/clip_high": 3.0,
    }
    m = update_metrics([first, second])
    assert m["clip_high_frac"] == 0.15 and m["clip_high_frac_last"] == 0.3  # (0 + 0.3) / 2
    assert m["clip_low_frac"] == 0.05 and m["kl"] == 0.1 and m["kl_last"] == 0.2
    assert m["entropy"] == 1.8 and m["loss/policy"] == -0.2 and m["loss/kl"] == 0.01
    assert m["loss"] == pytest.approx(-0.19) and m["loss_last"] == pytest.approx(-0.28)
    alone = update_metrics([{k: v for k, v in first.items() if "kl" not in k}])
    assert "kl" not in alone and "kl_last" not in alone  # no reference: no KL, not a KL of 0
    assert set(alone) == {
        "entropy",
        "loss",
        "loss/policy",
        "clip_low_frac",
        "clip_high_frac",
        "clip_region_frac",
    }
    # TRL's clip_ratio/region_mean: either bound, (0 + 0) / 10 then (1 + 3) / 10
    assert m["clip_region_frac"] == pytest.approx(0.2) and m["clip_region_frac_last"] == 0.4


def test_suggest():
    assert suggest(5.0, 1 / 25) == "0.2" and suggest(0.05, 0.1) == "0.005"
    assert suggest(0.0015, 0.3) == "0.0004" and suggest(0.04, 3) == "0.1"


def test_no_kl_verdict_without_a_policy_gradient():
    # every group flat: the policy term is 0 and the KL term cannot be compared with it
    w = stream(
        reward=lambda s: 0.0,
        zero_std_frac=lambda s: 1.0,
        solved_frac=lambda s: 0.0,
        **{"pull/kl": lambda s: 0.001, "pull/policy": lambda s: 0.0},
    )
    assert fired(w, "every completion got the same reward") and not fired(w, "KL term")


@pytest.mark.parametrize("rise", [0.0, 0.05])
def test_a_kl_term_that_holds_the_policy_still(rise):
    """The KL pulling 3x as hard as the policy term: advice to lower the coefficient while
    the reward stays flat (rising under 0.02 over the window), none once it rises."""
    w = stream(
        10,
        **{
            "pull/kl": lambda s: 0.3,
            "pull/policy": lambda s: 0.1,
            "kl_coef": lambda s: 5.0,
            "reward": lambda s: 0.12 + (rise if s >= 5 else 0.0),
        },
    )
    advice = [x for x in w if "holds the policy at the reference" in x]
    if rise:
        assert advice == []
    else:
        assert len(advice) == 1 and "pulls the log-probs 3x as hard" in advice[0], w


def collapse_stream(grad_norm, entropy, reward, settings, window=6, n=8):
    """Steps 0-2 healthy at reward 0.3, then ``reward``; each key a function of the step."""
    mon, out = HealthMonitor(window=window, settings=settings), []
    for s in range(n):
        r = {**healthy(s), "grad_norm": grad_norm(s), "entropy": entropy(s)}
        r["reward"] = 0.3 if s < 3 else reward(s)
        out += mon.observe(r)
    return mon, out


def test_a_collapse_is_never_blamed_on_an_update_that_did_not_happen():
    # grad norm 0 at step 2 (every group flat: no update), entropy and reward both collapse
    mon, out = collapse_stream(
        lambda s: 0.0 if s == 2 else 1.0,
        lambda s: 1.0 if s < 3 else 0.1,
        lambda s: 0.0,
        {"lr": 0.05},
    )
    assert "lr_high" not in mon.counts, out


def test_a_large_update_that_collapses_the_reward_without_moving_the_entropy_much():
    # lr 0.1, grad norm 2 clipped at 1: a step of 0.1 (>= update_large); the entropy moves
    # 1.4x only (under entropy_jump), as at lr 0.1 on the demo's model
    mon, out = collapse_stream(
        lambda s: 2.0,
        lambda s: 1.0 if s < 3 else 1.4,
        lambda s: 0.0,
        {"lr": 0.1, "max_grad_norm": 1.0},
    )
    assert fired(
        out, "the reward fell 0.3 -> 0 right after one update (step 2, grad norm 2, a step of 0.1)"
    )
    # the same collapse after a small update (lr 1e-3: a step of 0.001) is not the lr's doing
    mon, out = collapse_stream(
        lambda s: 2.0,
        lambda s: 1.0 if s < 3 else 1.4,
        lambda s: 0.0,
        {"lr": 1e-3, "max_grad_norm": 1.0},
    )
    assert "lr_high" not in mon.counts, out


def test_an_entropy_jump_no_larger_than_the_runs_own_noise_is_not_evidence():
    # small steps (lr 1e-3); the entropy jumps 10x at step 2->3 after an update, but also 20x
    # between steps 0 and 1 with no update in between (a low temperature's noisy estimate)
    ent = {0: 0.02, 1: 0.001, 2: 0.05}
    mon, out = collapse_stream(
        lambda s: 0.0 if s == 0 else 1.0, lambda s: ent.get(s, 0.005), lambda s: 0.0, {"lr": 1e-3}
    )
    assert "lr_high" not in mon.counts, out


def test_a_collapse_stays_the_finding_until_the_reward_recovers():
    # the collapse at step 3 leaves the window of 4 by step 8; the finding stays in force,
    # shown once, and what follows (flat groups, truncation) is still not blamed on the data
    mon, out = HealthMonitor(window=4, settings={"lr": 0.05}), []
    for s in range(14):
        r = {**healthy(s), "reward": 0.3 if s < 3 else 0.0, "entropy": 1.0 if s < 3 else 4.0}
        if s >= 3:
            r.update(zero_std_frac=1.0, truncated_frac=1.0)
        out += mon.observe(r)
    assert sum("learning rate is too high" in w for w in out) == 1
    assert set(mon.counts) == {"lr_high"} and mon.counts["lr_high"] == 14 - 4
    assert mon.summary()[0].startswith("lr_high from step 4 (10 steps, in force at the end)")
    # the evidence reverses: the reward back at its level before the collapse, judged on the
    # mean of the last 2 steps (half the span of 4): at step 15
    for s in range(14, 18):
        mon.observe({**healthy(s), "reward": 0.3, "entropy": 4.0})
    assert "lr_high" not in mon.latched
    assert mon.summary()[0].startswith("lr_high from step 4 (11 steps, until step 15)")


def hacked(window: int, n: int = 30) -> tuple[HealthMonitor, list[str]]:
    """A length-paying part rising from step 2 while math falls to 0 by step 4, then both
    flat for the rest of the run, most completions cut at the budget."""
    settings = {
        "components": {k: {"weight": 1.0, "requires": [], "max": 1.0} for k in ("len", "math")}
    }
    mon, out = HealthMonitor(window=window, settings=settings), []
    for s in range(n):
        paid, right = min(1.0, 0.1 + 0.3 * max(0, s - 1)), max(0.0, 0.4 - 0.15 * s)
        r = {**healthy(s), "reward/len": paid, "reward/math": right, "reward": paid + right}
        r["truncated_frac"] = 0.9
        out += [(s, w) for w in mon.observe(r)]
    return mon, out


def test_hacking_is_found_at_any_window_and_stays_the_finding():
    verdicts = {}
    for window in (10, 20):
        mon, out = hacked(window)
        verdicts[window] = [(s, w) for s, w in out if "reward hacking" in w]
        assert verdicts[window], window
        # once found, truncation is never advised as a budget problem, nor a higher lr
        assert not [w for _, w in out if "raise max_new_tokens" in w or "raise optimizer.lr" in w]
        assert any(
            line.startswith("reward_hacking") and "in force at the end" in line
            for line in mon.summary()
        ), mon.summary()
    assert verdicts[10] == verdicts[20]
