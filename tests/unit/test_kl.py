"""KL controllers: adaptive (Ziegler et al. 2019) and schedules."""

from __future__ import annotations

import math

import pytest

import grpo_core


def test_adaptive_moves_towards_target_within_the_clip():
    c = grpo_core.create("kl", "adaptive", {"init_coef": 0.1, "target": 0.02, "horizon": 100})
    c.update(0.04, 10)  # KL/target - 1 = 1 -> clipped to 0.2
    assert c.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    before = c.value
    c.update(0.021, 10)  # err = 0.05
    assert c.value == pytest.approx(before * (1 + 0.05 * 0.1))
    seq = []
    for _ in range(20):
        c.update(0.0, 10)  # far below target: err clipped at -0.2
        seq.append(c.value)
    assert all(b < a for a, b in zip(seq, seq[1:]))
    assert seq[1] / seq[0] == pytest.approx(1 - 0.2 * 0.1)
    state = c.state_dict()
    d = grpo_core.create("kl", "adaptive")
    d.load_state_dict(state)
    assert d.value == c.value


def test_schedules():
    lin = grpo_core.create("kl", "schedule", {"start": 0.1, "end": 0.0, "steps": 4})
    vals = []
    for _ in range(6):
        lin.update(0.0, 1)
        vals.append(lin.value)
    assert vals == pytest.approx([0.075, 0.05, 0.025, 0.0, 0.0, 0.0])
    cos = grpo_core.create(
        "kl", "schedule", {"start": 0.0, "end": 1.0, "steps": 2, "shape": "cosine"}
    )
    cos.update(0, 1)
    assert cos.value == pytest.approx(0.5 * (1 - math.cos(math.pi / 2)))


def test_fixed_is_constant():
    f = grpo_core.create("kl", "fixed", {"coef": 0.04})
    f.update(100.0, 10)
    assert f.value == 0.04 and f.needs_reference()
    assert not grpo_core.create("kl", "fixed", {"coef": 0.0}).needs_reference()
    assert not grpo_core.create("kl", "adaptive", {"init_coef": 0.0}).needs_reference()
    assert grpo_core.create("kl", "schedule", {"start": 0.0, "end": 0.1}).needs_reference()
