"""The GRPO loss against values computed by hand, and the chunked log-prob against naive."""

from __future__ import annotations

import math

import pytest
import torch
from grpo_core_plugins.objectives import clipped_ratio

from grpo_core.loss.losses import (
    KL_PLACEMENTS,
    Normaliser,
    aggregate,
    kl_penalty,
    objective_loss,
)
from grpo_core.model.logprobs import token_logprobs

# 2 prompts x 3 completions, T = 3; lengths 3, 2, 1 | 2, 3, 1
MASK = torch.tensor(
    [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float64
)
LOGP = torch.tensor(
    [
        [-1.0, -0.5, -2.0],
        [-0.3, -1.2, 0],
        [-0.7, 0, 0],
        [-2.0, -0.1, 0],
        [-0.4, -0.9, -1.5],
        [-1.1, 0, 0],
    ],
    dtype=torch.float64,
)
OLD = LOGP + torch.tensor(
    [[0.0, 0.5, -0.1], [0.1, 0.0, 0], [-0.3, 0, 0], [0.0, 0.0, 0], [0.2, -0.2, 0.0], [0.0, 0, 0]],
    dtype=torch.float64,
)
REF = LOGP + 0.25 * MASK
ADV = torch.tensor([1.0, -0.5, -0.5, 0.8, -1.2, 0.4], dtype=torch.float64)


def policy_loss(
    logp,
    old,
    adv,
    mask,
    clip_low=0.2,
    clip_high=0.2,
    ref_logp=None,
    kl_coef=0.0,
    aggregation="token_mean",
    norm=None,
):
    """The GRPO objective (token-level clipped ratio) with the trainer's KL and aggregation."""
    term = clipped_ratio(logp, old, adv, mask, clip_low, clip_high)
    return objective_loss(
        term,
        mask,
        aggregation,
        norm or Normaliser.of(mask, mask.shape[1]),
        logp=logp,
        ref_logp=ref_logp,
        kl_coef=kl_coef,
    )


def hand_per_token(kl_coef: float):
    """Per-token losses written out with Python floats, one token at a time."""
    out = []
    for i in range(6):
        row = []
        for t in range(3):
            if not MASK[i, t]:
                row.append(0.0)
                continue
            r = math.exp(LOGP[i, t] - OLD[i, t])
            a = float(ADV[i])
            clipped = min(max(r, 0.8), 1.2)
            loss = -min(r * a, clipped * a)
            d = float(REF[i, t] - LOGP[i, t])  # log(pi_ref / pi)
            loss += kl_coef * (math.exp(d) - d - 1)
            row.append(loss)
        out.append(row)
    return out


def hand_aggregate(rows, mode):
    lengths = [int(MASK[i].sum()) for i in range(6)]
    if mode == "token_mean":
        return sum(map(sum, rows)) / sum(lengths)
    if mode == "seq_mean_token_mean":
        return sum(sum(r) / n for r, n in zip(rows, lengths)) / 6
    return sum(map(sum, rows)) / (6 * 3)  # Dr. GRPO: sequences x max_len


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_loss_matches_hand_computation(mode, kl_coef):
    loss, stats = policy_loss(
        LOGP,
        OLD,
        ADV,
        MASK,
        clip_low=0.2,
        clip_high=0.2,
        ref_logp=REF if kl_coef else None,
        kl_coef=kl_coef,
        aggregation=mode,
        norm=Normaliser.of(MASK, 3),
    )
    expected = hand_aggregate(hand_per_token(kl_coef), mode)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    if kl_coef:
        k3 = math.exp(0.25) - 0.25 - 1
        assert stats["kl"] == pytest.approx(k3 * MASK.sum().item())


def test_clip_fractions_count_binding_clips():
    # ratio e^0.5 > 1.2 with A > 0 clips high; ratio e^-0.5 < 0.8 with A < 0 clips low
    logp = torch.tensor([[0.5], [-0.5], [0.5]])
    _, s = policy_loss(logp, torch.zeros(3, 1), torch.tensor([1.0, -1.0, -1.0]), torch.ones(3, 1))
    assert s["count/clip_high"] == 1 and s["count/clip_low"] == 1


def test_an_objectives_own_counts_are_logged_whatever_their_names():
    """A third-party objective's counts reach the metrics as ``<name>_frac``, also when a
    count shares a name with a statistic of the loss (``kl``, ``tokens``), which it must
    not overwrite."""
    from grpo_core.hookspecs import PolicyTerm
    from grpo_core.observe.metrics import update_metrics

    mask = torch.ones(2, 2)
    counts = {"masked": torch.tensor([[1.0, 0.0], [1.0, 1.0]]), "kl": torch.ones(2, 2)}
    term = PolicyTerm(torch.zeros(2, 2, requires_grad=True), counts)
    logp = torch.zeros(2, 2)
    _, stats = objective_loss(
        term, mask, "token_mean", Normaliser.of(mask, 2), logp=logp, ref_logp=logp, kl_coef=0.1
    )
    assert stats["tokens"] == 4 and stats["kl"] == 0  # the reference's KL, not the count
    m = update_metrics([stats])
    assert m["masked_frac"] == 0.75 and m["kl_frac"] == 1.0 and m["kl"] == 0.0


def test_separate_clip_ranges():
    logp = torch.tensor([[math.log(1.25)]])
    loss_lo, _ = policy_loss(
        logp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), clip_low=0.2, clip_high=0.28
    )
    assert loss_lo.item() == pytest.approx(-1.25)  # inside the DAPO clip-higher range
    loss_hi, _ = policy_loss(
        logp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), clip_low=0.2, clip_high=0.2
    )
    assert loss_hi.item() == pytest.approx(-1.2)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k4")


def test_kl_placements_by_hand():
    """In the reward: each completion's reward less coef x its summed k1 over its mask, no KL
    in the loss; in the loss: rewards as scored, the coefficient to the loss."""
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the second: two tokens
    rewards = torch.tensor([1.0, 0.0])
    shaped = KL_PLACEMENTS["reward"].rewards(rewards, logp, ref, mask, 0.1)
    # k1 sums: 0.5 - 1.0 + 0.0 = -0.5; 0.5 + 0.5 = 1.0 (the masked -9 left out)
    assert shaped.tolist() == pytest.approx([1.0 + 0.05, 0.0 - 0.1])
    assert KL_PLACEMENTS["reward"].rewards(rewards, logp, None, mask, 0.1) is rewards
    assert KL_PLACEMENTS["reward"].loss_coef(0.1) == 0.0
    assert KL_PLACEMENTS["loss"].rewards(rewards, logp, ref, mask, 0.1) is rewards
    assert KL_PLACEMENTS["loss"].loss_coef(0.1) == 0.1


def test_microbatch_losses_sum_to_full_batch_loss():
    norm = Normaliser.of(MASK, 3)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        full = aggregate(LOGP, MASK, mode, norm)
        parts = aggregate(LOGP[:3], MASK[:3], mode, norm) + aggregate(
            LOGP[3:], MASK[3:], mode, norm
        )
        assert parts.item() == pytest.approx(full.item(), rel=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprob_and_entropy_match_naive_with_gradients(temperature):
    torch.manual_seed(0)
    h = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (37,))
    g1, g2 = torch.randn(37, dtype=torch.float64), torch.randn(37, dtype=torch.float64)
    lp, ent = token_logprobs(h, w, t, temperature, chunk=8)
    (lp * g1 + ent * g2).sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    logsm = torch.log_softmax(h @ w.T / temperature, -1)
    lp2 = logsm.gather(1, t[:, None]).squeeze(1)
    ent2 = -(logsm.exp() * logsm).sum(-1)
    (lp2 * g1 + ent2 * g2).sum().backward()
    # float64 (eps 2.2e-16): chunked vs whole log-softmax differ only in summation order, ~1e-15
    # relative in values and ~1e-13 in gradients summed over ~50 positions; the bounds leave 100x
    torch.testing.assert_close(lp, lp2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ent2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gh, h.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw, w.grad, rtol=1e-10, atol=1e-12)


def test_equal_advantages_zero_give_zero_gradient():
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, OLD, torch.zeros(6, dtype=torch.float64), MASK)
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_frozen_head_takes_the_logprob_gradient_from_the_forward(entropy_grad):
    """With a frozen head (LoRA) the forward computes d logp / dh, so the backward needs no
    logits for it; the entropy's gradient, if any, still recomputes them. Both match naive."""
    torch.manual_seed(1)
    h = torch.randn(29, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64)
    t = torch.randint(0, 50, (29,))
    g1, g2 = torch.randn(29, dtype=torch.float64), torch.randn(29, dtype=torch.float64)
    lp, ent = token_logprobs(h, w, t, 0.7, chunk=8)
    assert lp.grad_fn.saved_tensors[5] is not None  # d logp / dh, [N, H], from the forward
    (lp * g1 + (ent * g2 if entropy_grad else 0)).sum().backward()
    got, h.grad = h.grad.clone(), None
    logsm = torch.log_softmax(h @ w.T / 0.7, -1)
    naive_ent = -(logsm.exp() * logsm).sum(-1)
    (
        logsm.gather(1, t[:, None]).squeeze(1) * g1 + (naive_ent * g2 if entropy_grad else 0)
    ).sum().backward()
    torch.testing.assert_close(got, h.grad, rtol=1e-10, atol=1e-12)  # float64, as above
    w.requires_grad_(True)
    assert token_logprobs(h, w, t, 0.7, chunk=8)[0].grad_fn.saved_tensors[5] is None
    with torch.no_grad():  # no gradient wanted: nothing extra computed or kept
        assert token_logprobs(h, w.detach(), t)[0].grad_fn is None


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunk_sizes_agree(chunk):
    torch.manual_seed(2)
    h = torch.randn(23, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 30, (23,))
    lp, ent = token_logprobs(h, w, t, 1.3, chunk=chunk)
    (lp.sum() - ent.sum()).backward()
    got = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    logsm = torch.log_softmax(h @ w.T / 1.3, -1)
    lp2, ent2 = logsm.gather(1, t[:, None]).squeeze(1), -(logsm.exp() * logsm).sum(-1)
    (lp2.sum() - ent2.sum()).backward()
    # float64, bounds as in the test above
    torch.testing.assert_close(lp, lp2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ent2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, (h.grad, w.grad), rtol=1e-10, atol=1e-12)
