"""Objective plugins against values computed by hand and against the papers' formulas."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from grpo_core_plugins.objectives import clipped_ratio, clipped_weight, sequence_ratio
from helpers import ROOT, make_config, run_grpo
from safetensors.torch import load_file

import grpo_core
from grpo_core import config
from grpo_core.loss.losses import Normaliser, aggregate, objective_loss
from grpo_core.trainer import train

F64 = torch.float64


def leaf(rows):
    return torch.tensor(rows, dtype=F64, requires_grad=True)


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # tokens: ratio e^2 with A = -1 (unbounded: loss e^2), ratio 2 with A = -1 (below 3|A|),
    # ratio e^2 with A = +1 (clip-high binds; dual clip never applies to A > 0)
    logp = leaf([[2.0], [math.log(2.0)], [2.0]])
    adv = torch.tensor([-1.0, -1.0, 1.0], dtype=F64)
    term = clipped_ratio(
        logp, torch.zeros(3, 1, dtype=F64), adv, torch.ones(3, 1), 0.2, 0.2, dual_clip=3.0
    )
    assert term.loss[:, 0].tolist() == pytest.approx([3.0, 2.0, -1.2])
    assert term.counts["clip_dual"][:, 0].tolist() == [True, False, False]
    term.loss.sum().backward()
    # bounded token: no gradient; ratio-2 token: d(-r A)/d logp = -A r = 2; clipped: 0
    assert logp.grad[:, 0].tolist() == pytest.approx([0.0, 2.0, 0.0])
    plain = clipped_ratio(logp.detach(), torch.zeros(3, 1, dtype=F64), adv, torch.ones(3, 1))
    assert plain.loss[0, 0].item() == pytest.approx(math.exp(2.0))


def test_log_ratio_clamp_bounds_the_ratio():
    logp, old = torch.tensor([[30.0]], dtype=F64), torch.zeros(1, 1, dtype=F64)
    adv = torch.tensor([-1.0], dtype=F64)
    clamped = clipped_ratio(logp, old, adv, torch.ones(1, 1), log_ratio_clamp=20.0)
    free = clipped_ratio(logp, old, adv, torch.ones(1, 1), log_ratio_clamp=None)
    assert clamped.loss.item() == pytest.approx(math.exp(20.0))
    assert free.loss.item() == pytest.approx(math.exp(30.0))


LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]]
OLD = [[-1.0002, -0.4999, -2.0001], [-0.3, -1.2005, 0.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)


def gspo_by_hand(logp, old, adv, lo, hi):
    """The sequence-level GSPO objective (Zheng et al. 2025, eq. 5), one sequence at a time:
    -(1/G) sum_i min(s_i A_i, clip(s_i, 1 - lo, 1 + hi) A_i), s_i = exp(mean_t log-ratio)."""
    total = 0.0
    for i in range(2):
        n = int(MASK[i].sum())
        s = torch.exp(sum(logp[i, t] - old[i, t] for t in range(n)) / n)
        a = float(adv[i])
        total = total - torch.minimum(s * a, s.clamp(1 - lo, 1 + hi) * a)
    return total / 2


@pytest.mark.parametrize("adv", [[1.0, -0.5], [-1.0, 2.0]])
@pytest.mark.parametrize("bounds", [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_token_form_equals_the_sequence_objective(adv, bounds):
    lo, hi = bounds
    adv = torch.tensor(adv, dtype=F64)
    a, b = leaf(LOGP), leaf(LOGP)
    old = torch.tensor(OLD, dtype=F64)
    term = sequence_ratio(a, old, adv, MASK, lo, hi)
    loss = aggregate(term.loss, MASK, "seq_mean_token_mean", Normaliser.of(MASK, 3))
    expected = gspo_by_hand(b, old, adv, lo, hi)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    loss.backward()
    expected.backward()
    # float64, the same formula written two ways: ~1e-15 relative per op, 1e-10 leaves room
    torch.testing.assert_close(a.grad * MASK, b.grad * MASK, rtol=1e-10, atol=1e-14)
    # every token of a sequence carries the same ratio: seq 0 ratio e^(mean(0.0002, -0.0001,
    # 0.0001)) = e^(0.0002/3) inside (1 - 3e-4, 1 + 4e-4), seq 1 e^(0.0005/2) likewise
    seq = [math.exp(0.0002 / 3), math.exp(0.0005 / 2)]
    for i in range(2):
        n = int(MASK[i].sum())
        values = (-term.loss[i, :n] / adv[i]).tolist()
        assert values == pytest.approx([seq[i]] * n, rel=1e-9)


def test_gspo_clips_whole_sequences():
    logp = leaf([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]])
    old = torch.tensor([[-1.1, -1.1, -1.1], [-1.0, -1.0, 0.0]], dtype=F64)  # seq 0: r = e^0.1
    term = sequence_ratio(logp, old, torch.tensor([1.0, 1.0], dtype=F64), MASK)
    assert term.counts["clip_high"][0].tolist() == [True, True, True]
    assert not term.counts["clip_high"][1].any()
    (term.loss * MASK).sum().backward()
    assert logp.grad[0].abs().sum() == 0 and logp.grad[1, :2].abs().sum() > 0


def test_cispo_weights_are_clipped_but_every_token_keeps_its_gradient():
    # ratios e^0.5 (above 1 + 0.28), 1.1 (inside), 0.5 (below; no lower bound by default)
    logp = leaf([[0.5, math.log(1.1), math.log(0.5)]])
    adv = torch.tensor([2.0], dtype=F64)
    term = clipped_weight(logp, torch.zeros(1, 3, dtype=F64), adv, torch.ones(1, 3))
    w = [1.28, 1.1, 0.5]
    assert term.loss[0].tolist() == pytest.approx([-2.0 * x for x in w])
    term.loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-2.0 * x for x in w])  # -w A per token
    assert term.counts["clip_high"][0].tolist() == [True, False, False]
    bounded = clipped_weight(
        logp.detach(), torch.zeros(1, 3, dtype=F64), adv, torch.ones(1, 3), clip_low=0.2
    )
    assert bounded.loss[0, 2].item() == pytest.approx(-2.0 * 0.8)
    assert bounded.counts["clip_low"][0].tolist() == [False, False, True]
    # where PPO's clip drops the token (r > 1 + eps, A > 0), CISPO still pushes it
    ppo = leaf([[0.5]])
    clipped_ratio(ppo, torch.zeros(1, 1, dtype=F64), adv, torch.ones(1, 1)).loss.sum().backward()
    assert ppo.grad.item() == 0.0 and logp.grad[0, 0].item() != 0.0


@pytest.mark.parametrize(
    "aggregation,w",
    [
        ("token_mean", [1 / 5, 1 / 5]),
        ("seq_mean_token_mean", [1 / 6, 1 / 4]),
        ("seq_mean_token_sum_norm", [1 / 6, 1 / 6]),
    ],
)
def test_each_terms_pull_on_the_log_probs_by_hand(aggregation, w):
    """At logp = old (ratio 1, nothing clipped) the policy term's gradient in logp_t is
    -A_t w_t and k3's is coef (1 - exp(ref - logp)) w_t, w_t the aggregation's weight of
    token t: token_mean 1/5 each; seq_mean_token_mean 1/(2*3) on row 0 and 1/(2*2) on row 1;
    seq_mean_token_sum_norm 1/(2 sequences * 3, the budget).
    The pulls are the L1 norms of those gradients, whatever the terms' values (here the
    policy term's value is small: advantages 1 and -0.5 over 3 and 2 tokens)."""
    logp = leaf(LOGP)
    adv = torch.tensor([1.0, -0.5], dtype=F64)
    ref = logp.detach() + 0.25 * MASK
    term = clipped_ratio(logp, logp.detach(), adv, MASK)
    _, stats = objective_loss(
        term,
        MASK,
        aggregation,
        Normaliser.of(MASK, 3),
        logp=logp,
        ref_logp=ref,
        kl_coef=0.1,
    )
    assert stats["pull/policy"] == pytest.approx(3 * w[0] * 1.0 + 2 * w[1] * 0.5, rel=1e-12)
    assert stats["pull/kl"] == pytest.approx(
        0.1 * (math.exp(0.25) - 1) * (3 * w[0] + 2 * w[1]), rel=1e-12
    )
    assert logp.grad is None  # measured without touching the training gradient


def test_objective_loss_logs_each_term_and_they_add_up():
    logp, old = leaf(LOGP), torch.tensor(OLD, dtype=F64)
    ref = logp.detach() + 0.25 * MASK
    ent = torch.full((2, 3), 0.7, dtype=F64)
    term = clipped_ratio(logp, old, torch.tensor([1.0, -0.5], dtype=F64), MASK)
    norm = Normaliser.of(MASK, 3)
    loss, stats = objective_loss(
        term,
        MASK,
        "token_mean",
        norm,
        logp=logp,
        ref_logp=ref,
        kl_coef=0.1,
        entropy=ent,
        entropy_coef=0.01,
    )
    k3 = math.exp(0.25) - 0.25 - 1
    assert stats["loss/kl"] == pytest.approx(0.1 * k3)
    assert stats["loss/entropy"] == pytest.approx(-0.01 * 0.7)
    assert stats["loss/policy"] + stats["loss/kl"] + stats["loss/entropy"] == pytest.approx(
        loss.item(), rel=1e-12
    )
    assert stats["tokens"] == 5 and stats["kl"] == pytest.approx(5 * k3)


def test_objectives_are_plugins_with_their_paper_defaults():
    gspo = grpo_core.create("objective", "gspo")
    assert gspo.aggregation == "seq_mean_token_mean"
    assert gspo.options == {"clip_low": 3e-4, "clip_high": 4e-4, "log_ratio_clamp": 20.0}
    assert grpo_core.create("objective", "cispo").options["clip_low"] is None
    assert grpo_core.create("objective", "grpo").aggregation == "token_mean"


@pytest.mark.parametrize(
    "objective",
    [{"name": "grpo", "options": {"dual_clip": 3.0}}, {"name": "gspo"}, {"name": "cispo"}],
)
def test_every_objective_trains(tiny_model, addition_data, tmp_path, objective):
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            objective=objective,
            reward={"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
            sampling={"group_size": 8, "max_new_tokens": 6},
            optimizer={"lr": 1e-2},
            train={"steps": 2, "prompts_per_step": 4, "inner_iterations": 2},
        )
    )
    summary = train(cfg)
    rows = [json.loads(x) for x in open(os.path.join(cfg["output"]["dir"], "metrics.jsonl"))]
    assert summary["steps"] == 2
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    before = load_file(os.path.join(tiny_model, "model.safetensors"))
    after = load_file(os.path.join(cfg["output"]["dir"], "final", "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(r["loss"] == pytest.approx(r["loss/policy"]) for r in rows)  # no KL, no entropy
    if objective["name"] == "grpo":
        assert "clip_dual_frac" in rows[0]


@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo"])
def test_plugins_check_passes_for_each_objective(name):
    out = run_grpo("plugins", "check", "objective", name, cwd=ROOT)
    assert out.returncode == 0 and "0 failed" in out.stdout, out.stdout + out.stderr


def test_dual_clip_tie_keeps_the_whole_gradient():
    # ratio exactly c = 1.5 with A < 0: the unclipped loss equals the bound c |A|. We take the
    # dual clip to bind only strictly above c, so the token keeps the whole gradient -A r
    # (verl's torch.min splits it: half). exp(log 1.5) == 1.5 exactly in float64.
    logp = leaf([[math.log(1.5)]])
    assert torch.exp(logp.detach()).item() == 1.5
    term = clipped_ratio(
        logp,
        torch.zeros(1, 1, dtype=F64),
        torch.tensor([-1.0], dtype=F64),
        torch.ones(1, 1),
        0.2,
        0.2,
        dual_clip=1.5,
    )
    assert term.loss.item() == 1.5 and not term.counts["clip_dual"].any()
    term.loss.sum().backward()
    assert logp.grad.item() == 1.5


def test_gspo_clamp_keeps_the_gradient_at_and_past_the_bound():
    # sequence log-ratios 20 (the bound) and 25 (past it), A = -1: the value is clamped to
    # e^20 but the token keeps the gradient s * |A| * grad log pi (verl: clamp at +10, no
    # gradient above it); below, -20 and -25 with A = +1 give -e^-20 (verl: no lower clamp)
    logp = leaf([[20.0], [25.0], [-20.0], [-25.0]])
    adv = torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=F64)
    term = sequence_ratio(logp, torch.zeros(4, 1, dtype=F64), adv, torch.ones(4, 1))
    e20 = math.exp(20.0)
    assert term.loss[:, 0].tolist() == pytest.approx([e20, e20, -1 / e20, -1 / e20], rel=1e-12)
    term.loss.sum().backward()
    assert logp.grad[:, 0].tolist() == pytest.approx([e20, e20, -1 / e20, -1 / e20], rel=1e-12)


@pytest.mark.parametrize("fn", [clipped_ratio, sequence_ratio, clipped_weight])
def test_per_token_advantages_equal_per_sequence_ones_when_constant(fn):
    # a critic's [B, T] advantages; the same value on every token gives the [B] result, and
    # a token's own advantage is the one it is weighted by
    logp, old = torch.tensor(LOGP, dtype=F64), torch.tensor(OLD, dtype=F64)
    adv = torch.tensor([1.0, -0.5], dtype=F64)
    per_seq = fn(logp, old, adv, MASK)
    per_tok = fn(logp, old, adv[:, None].expand(2, 3), MASK)
    torch.testing.assert_close(per_tok.loss, per_seq.loss)
    varied = fn(logp, old, torch.tensor([[1.0, 2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64), MASK)
    assert varied.loss[0, 2] == 0 and varied.loss[1, 1] == 0
    assert varied.loss[0, 1].item() == pytest.approx(2 * per_seq.loss[0, 1].item())


def test_every_built_in_objective_declares_per_token_advantages():
    assert all(grpo_core.create("objective", n).token_advantages for n in ("grpo", "gspo", "cispo"))
