"""objective.top_entropy_quantile (TRL's top_entropy_quantile): which tokens keep the policy
term, against hand-computed quantiles, and what that does to the loss."""

from __future__ import annotations

import pytest
import torch

from grpo_core.hookspecs import PolicyTerm
from grpo_core.loss.losses import Normaliser, high_entropy_mask, objective_loss

ENTROPY = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 5.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # 5.0s are padding


def test_the_quantile_by_hand():
    # masked entropies sorted: 0.1 0.2 0.3 0.5 0.7 0.9. quantile 0.5: the 0.5 quantile sits at
    # position 0.5 x 5 = 2.5, between 0.3 and 0.5: 0.4, so 0.5, 0.9 and 0.7 stay
    assert high_entropy_mask(ENTROPY, MASK, 0.5).tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    # quantile 1/3: the 2/3 quantile at position 10/3: 0.5 + (1/3)(0.7 - 0.5) = 0.567
    assert high_entropy_mask(ENTROPY, MASK, 1 / 3).tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]
    # quantile 1: the mask itself (padding's high entropy never counts)
    assert torch.equal(high_entropy_mask(ENTROPY, MASK, 1.0), MASK)
    assert high_entropy_mask(ENTROPY, MASK, 0.01).tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]


def test_only_the_policy_term_is_masked_and_the_denominator_stays():
    term = PolicyTerm(torch.ones(2, 4))
    logp, ref = torch.zeros(2, 4), torch.full((2, 4), -0.1)
    keep = high_entropy_mask(ENTROPY, MASK, 0.5)  # 3 of the 6 tokens
    loss, stats = objective_loss(
        term,
        MASK,
        "token_mean",
        Normaliser.of(MASK, 4),
        logp=logp,
        ref_logp=ref,
        kl_coef=1.0,
        policy_mask=keep,
    )
    # policy: 3 tokens of loss 1 over all 6 tokens; KL (k3 at log r = 0.1) on all 6
    k3 = torch.exp(torch.tensor(-0.1)) + 0.1 - 1
    assert stats["loss/policy"] == pytest.approx(0.5)
    assert stats["loss/kl"] == pytest.approx(float(k3))
    assert float(loss) == pytest.approx(0.5 + float(k3))
