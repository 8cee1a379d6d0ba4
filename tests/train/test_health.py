"""The health monitor on synthetic metric streams: each signature, and quiet when healthy."""

from __future__ import annotations

import math

from grpo_core.observe.health import HealthMonitor


def healthy(step: int) -> dict:
    return {"step": step, "reward": 0.2 + 0.01 * step, "zero_std_frac": 0.1, "solved_frac": 0.05,
            "kl": 0.01 + 0.0001 * step, "kl_coef": 0.04, "entropy": 1.2 - 0.002 * step,
            "grad_norm": 1.0 + 0.05 * (step % 3), "completion_len": 100 + step * 0.1,
            "truncated_frac": 0.02, "loss": 0.01, "skipped_updates": 0}


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
    w = stream(reward=lambda s: 0.95, zero_std_frac=lambda s: 0.9, solved_frac=lambda s: 0.85,
               entropy=lambda s: 0.01)
    assert not fired(w, "identical") and not fired(w, "entropy fell")


def test_kl_too_small():
    w = stream(kl=lambda s: 0.0002)
    assert fired(w, "KL stayed below 0.001") and fired(w, "lower kl.options.coef")


def test_kl_exploding_and_growing():
    assert fired(stream(kl=lambda s: 12.0), "KL is 12")
    assert fired(stream(kl=lambda s: 0.01 * 1.3 ** s), "KL grew")


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
    w = stream(completion_len=lambda s: 100 * 1.1 ** s, truncated_frac=lambda s: 0.4)
    assert fired(w, "reward hacking by length")


def test_nan():
    w = stream(loss=lambda s: math.nan if s == 5 else 0.1)
    assert fired(w, "non-finite values: loss")


def test_warnings_repeat_once_per_window_and_summarise():
    mon = HealthMonitor(window=5)
    out = []
    for s in range(20):
        out += mon.observe({**healthy(s), "kl": 50.0})
    assert sum("KL is 50" in w for w in out) == 4
    assert mon.summary()[0].startswith("kl_high from step 0 (20 steps)")


def test_kl_oscillating():
    w = stream(40, kl=lambda s: 0.05 if s % 2 else 0.4)
    assert fired(w, "KL swings up and down (0.05 to 0.4)")
    assert not fired(stream(40, kl=lambda s: 0.05 + 0.001 * (s % 2)), "swings")  # small ripple


def test_loss_oscillating_with_growing_swings():
    w = stream(40, loss=lambda s: (-1) ** s * 0.01 * 1.3 ** s)
    assert fired(w, "the loss flips sign with growing swings")
    assert not fired(stream(40, loss=lambda s: (-1) ** s * 0.01), "flips sign")
