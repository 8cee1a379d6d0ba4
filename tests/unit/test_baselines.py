"""Each advantage estimator against hand-computed values, edge cases and properties."""

from __future__ import annotations

import math

import pytest
import torch
from grpo_core_plugins.baselines import (
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    remax_advantages,
    rloo_advantages,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_core

R = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 4.0, 6.0, 8.0]])


def test_grpo_by_hand_sample_and_population_std():
    # group 0: mean 0.5, sample std sqrt(1/3), population std 0.5
    s = math.sqrt(1 / 3)
    adv = grpo_advantages(R, eps=0.0)
    assert adv[0].tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])
    # group 1: mean 5, sample std sqrt(20/3)
    s1 = math.sqrt(20 / 3)
    assert adv[1].tolist() == pytest.approx([-3 / s1, -1 / s1, 1 / s1, 3 / s1])
    pop = grpo_advantages(R, eps=0.0, std="population")
    assert pop[0].tolist() == pytest.approx([1, -1, -1, 1])
    eps = grpo_advantages(R, eps=0.1, std="population")
    assert eps[0, 0].item() == pytest.approx(0.5 / 0.6)


def test_rloo_by_hand():
    adv = rloo_advantages(R)
    assert adv[0].tolist() == pytest.approx([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3])
    assert adv[1].tolist() == pytest.approx([2 - 6, 4 - 16 / 3, 6 - 14 / 3, 8 - 4])


def test_remax_dr_grpo_reinforce_pp_by_hand():
    greedy = torch.tensor([1.0, 5.0])
    assert remax_advantages(R, greedy).tolist() == [[0, -1, -1, 0], [-3, -1, 1, 3]]
    assert dr_grpo_advantages(R).tolist() == [[0.5, -0.5, -0.5, 0.5], [-3, -1, 1, 3]]
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5, -3, -1, 1, 3])
    expected = (centred - centred.mean()) / (centred.std() + 1e-6)
    assert reinforce_pp_advantages(R).flatten().tolist() == pytest.approx(expected.tolist())


def test_mixed_baseline_by_hand():
    mixed = grpo_core.create("baseline", "mixed", {"prior_weight": 2.0, "decay": 0.5})
    first = mixed.advantages(torch.tensor([[1.0, 0.0], [3.0, 5.0]]))
    assert first.tolist() == [[1.0, -1.0], [-2.0, 2.0]]  # no EMA yet: pure leave-one-out
    assert mixed.ema == pytest.approx(2.25)
    # G = 2: w = 1 / (1 + 2) = 1/3; b_i = w * other + (2/3) * 2.25
    second = mixed.advantages(torch.tensor([[4.0, 1.0]]))
    assert second[0].tolist() == pytest.approx([4 - (1 / 3 + 1.5), 1 - (4 / 3 + 1.5)])
    assert mixed.ema == pytest.approx(0.5 * 2.25 + 0.5 * 2.5)
    single = mixed.advantages(torch.tensor([[3.0]]))  # a group of one uses the running mean
    assert single.item() == pytest.approx(3 - mixed.state_dict()["ema"] * 0 - 2.375)


@pytest.mark.parametrize(
    "fn", [grpo_advantages, rloo_advantages, dr_grpo_advantages, reinforce_pp_advantages]
)
def test_edge_cases(fn):
    assert fn(torch.tensor([[3.0]])).tolist() == [[0.0]]  # group of one
    assert fn(torch.tensor([[2.0, 2.0, 2.0]])).tolist() == [[0.0, 0.0, 0.0]]  # all equal
    missing = fn(torch.tensor([[1.0, float("nan"), 0.0], [5.0, 1.0, 3.0]]))
    assert missing[0, 1] == 0 and torch.isfinite(missing).all()
    if fn is not reinforce_pp_advantages:  # batch whitening mixes groups on purpose
        # the missing reward is simply left out: same as the group without it
        without = fn(torch.tensor([[1.0, 0.0]]))[0]
        assert missing[0, [0, 2]].tolist() == pytest.approx(without.tolist())
    for scale in (1e30, 1e-30):
        big = fn(torch.tensor([[1.0, -1.0, 0.5]]) * scale)
        assert torch.isfinite(big).all() and big.abs().sum() > 0


def test_grpo_huge_magnitudes_keep_their_advantages():
    adv = grpo_advantages(torch.tensor([[3e38, -3e38]]), std="population")
    assert adv[0].tolist() == pytest.approx([1.0, -1.0], rel=1e-5)


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)
grids = st.integers(1, 5).flatmap(
    lambda p: st.integers(1, 6).flatmap(
        lambda g: st.lists(
            st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0])), min_size=g, max_size=g),
            min_size=p,
            max_size=p,
        )
    )
)


@settings(max_examples=150, deadline=None)
@given(grids, st.floats(0.1, 100), st.floats(-100, 100))
def test_properties(rows, scale, shift):
    r = torch.tensor(rows, dtype=torch.float64)
    for fn in (grpo_advantages, rloo_advantages, dr_grpo_advantages, reinforce_pp_advantages):
        assert torch.isfinite(fn(r)).all()
    g = grpo_advantages(r)
    assert g.sum(-1).abs().max() <= 1e-6 * max(1.0, g.abs().max().item())
    lo = rloo_advantages(r)
    assert lo.sum(-1).abs().max() <= 1e-6 * max(1.0, r.abs().max().item())
    G = r.shape[1]
    if G > 1:
        expected = G / (G - 1) * (r - r.mean(-1, keepdim=True))
        torch.testing.assert_close(lo, expected, rtol=1e-6, atol=1e-6 * max(1, r.abs().max()))
    # invariance is exact with eps = 0 (eps > 0 breaks it by about eps / std, by design)
    spread = (r.amax(-1) - r.amin(-1)) > 1e-3 * r.abs().amax(-1).clamp(min=1)
    exact = grpo_advantages(r, eps=0.0)
    moved = grpo_advantages(r * scale + shift, eps=0.0)
    torch.testing.assert_close(moved[spread], exact[spread], rtol=1e-4, atol=1e-4)
